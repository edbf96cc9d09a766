"""What a weight update moves (:class:`Transport`, and the one "is this a LoRA tensor" rule)
and how engines take it (:class:`WeightSwap`).

- ``full``: every tensor of the policy.
- ``lora``: only the LoRA adapter tensors, named ``<projection>.lora_a`` / ``.lora_b``
  (:func:`is_lora_tensor`); an engine's frozen base is never touched.

- ``pause``: engines pause before the transfer and resume after the stamp (idle for the
  whole transfer and commit).
- ``in-flight``: engines receive the weights while they generate and swap them in at their
  next token boundary after the commit (idle for one in-memory copy).

``Transport`` and ``WeightSwap`` are ``str`` enums whose values are those strings: configurations still accept
``"full"`` / ``"lora"``, a member compares equal to its string, and ledger payloads (JSON)
are unchanged. Imports nothing heavy.
"""

from __future__ import annotations

from enum import StrEnum

__all__ = ["LORA_SUFFIXES", "TRANSPORTS", "Transport", "WeightSwap", "is_lora_tensor"]


class Transport(StrEnum):
    """The weights a publish sends: all parameters, or the LoRA adapters only."""

    FULL = "full"
    LORA = "lora"

    @classmethod
    def parse(cls, value: str | Transport) -> Transport:
        """``value`` as a transport.

        Raises:
            ValueError: not ``"full"`` or ``"lora"`` (one line naming the value).
        """
        try:
            return cls(value)
        except ValueError:
            raise ValueError(f"unknown transport {value!r}; expected one of {TRANSPORTS}"
                             ) from None


TRANSPORTS: tuple[str, ...] = tuple(transport.value for transport in Transport)
"""The transport names, as configurations spell them."""


class WeightSwap(StrEnum):
    """When engines take new weights (docs/DESIGN.md section 5): paused for the whole update,
    or staged while generating and swapped in at a token boundary after the commit."""

    PAUSE = "pause"
    IN_FLIGHT = "in-flight"

LORA_SUFFIXES: tuple[str, ...] = (".lora_a", ".lora_b")
"""How a LoRA adapter tensor's name ends (``down`` ``[r, in]`` and ``up`` ``[out, r]``)."""


def is_lora_tensor(name: str) -> bool:
    """Whether the tensor named ``name`` is a LoRA adapter tensor (what ``lora`` moves)."""
    return name.endswith(LORA_SUFFIXES)
