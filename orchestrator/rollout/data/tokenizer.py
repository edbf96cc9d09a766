"""HFTokenizer: a local Hugging Face tokenizer directory behind the task's tokenizer interface.

The interface the engines and trainer use (the built-in ``actors.task.Tokenizer`` has it too):
``pad_id``, ``eos_id``, ``vocab_size``, ``encode(text)``, ``decode(ids)``. Here it is backed by
``transformers.AutoTokenizer.from_pretrained(directory, local_files_only=True)``: nothing is
downloaded. The tokenizer is loaded lazily in each process and is not pickled (only the
directory is), so a task holding one ships cheaply to Ray actors; each process loads it once.

EOS is the tokenizer's ``eos_token_id``; the pad id is its ``pad_token_id``, else EOS (padding
is masked by length, so any id of the vocabulary serves).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from orchestrator.rollout.errors import TokenizerError

__all__ = ["SPECIAL_TOKENS", "HFTokenizer", "TokenizerError", "build_char_tokenizer"]

SPECIAL_TOKENS = ("<pad>", "<eos>", "<bos>")
"""Ids 0, 1, 2 of a tokenizer :func:`build_char_tokenizer` makes."""



class HFTokenizer:
    """The tokenizer saved in ``directory`` (``save_pretrained`` layout).

    Raises (on first use, or from :meth:`check`):
        TokenizerError: no tokenizer there, or it has no EOS token.
    """

    def __init__(self, directory: str | Path) -> None:
        self.directory = str(directory)
        self._tokenizer: Any = None

    def __getstate__(self) -> dict[str, Any]:
        return {"directory": self.directory}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.directory = state["directory"]
        self._tokenizer = None

    # One load per process at a time: engines ask from many threads at once, and concurrent
    # first imports of transformers' lazy module fail ("cannot import name 'AutoTokenizer'").
    _load_lock = threading.Lock()

    @property
    def hf(self) -> Any:
        """The loaded ``transformers`` tokenizer (thread-safe)."""
        if self._tokenizer is not None:
            return self._tokenizer
        with HFTokenizer._load_lock:
            if self._tokenizer is not None:
                return self._tokenizer
            try:
                from transformers import AutoTokenizer

                tokenizer = AutoTokenizer.from_pretrained(self.directory, local_files_only=True)
            except Exception as exc:  # OSError, ValueError, ImportError: all mean "cannot load"
                detail = " ".join(str(exc).split())[:300]
                raise TokenizerError(f"{self.directory}: no loadable tokenizer: {detail}") from None
            if tokenizer.eos_token_id is None:
                raise TokenizerError(f"{self.directory}: the tokenizer has no EOS token")
            self._tokenizer = tokenizer
        return self._tokenizer

    def check(self) -> HFTokenizer:
        """Load now (fail fast before a run writes anything); returns self."""
        _ = self.hf
        return self

    @property
    def eos_id(self) -> int:
        return int(self.hf.eos_token_id)

    @property
    def pad_id(self) -> int:
        pad = self.hf.pad_token_id
        return int(pad) if pad is not None else self.eos_id

    @property
    def vocab_size(self) -> int:
        """Ids the model must be able to emit: ``len(tokenizer)`` (added tokens included)."""
        return len(self.hf)

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` without special tokens added (a chat template adds its own)."""
        return list(self.hf.encode(text, add_special_tokens=False))

    def decode(self, token_ids: Sequence[int], stop_at_eos: bool = True) -> str:
        """Text of ``token_ids`` up to the first EOS, special tokens skipped."""
        ids = list(token_ids)
        if stop_at_eos and self.eos_id in ids:
            ids = ids[: ids.index(self.eos_id)]
        return str(self.hf.decode(ids, skip_special_tokens=True))

    def render_chat(self, messages: Sequence[Mapping[str, str]],
                    template_kwargs: Mapping[str, Any]) -> str:
        """``messages`` rendered by the tokenizer's own chat template, ready for the answer.

        Raises:
            TokenizerError: the tokenizer has no chat template, or it failed to render.
        """
        if not getattr(self.hf, "chat_template", None):
            raise TokenizerError(f"{self.directory}: --apply-chat-template, but the tokenizer "
                                 "has no chat template")
        try:
            return str(self.hf.apply_chat_template(
                [dict(message) for message in messages], tokenize=False,
                add_generation_prompt=True, **dict(template_kwargs)))
        except Exception as exc:  # jinja2 errors, TypeError from a bad kwarg
            raise TokenizerError(f"{self.directory}: chat template failed: {exc}") from None


def build_char_tokenizer(directory: str | Path, alphabet: str,
                         chat_template: str | None = None) -> Path:
    """Save a one-token-per-character Hugging Face tokenizer for ``alphabet`` in ``directory``
    (made locally with ``tokenizers``; nothing downloaded); returns the directory.

    Ids: :data:`SPECIAL_TOKENS` first, then each distinct character of ``alphabet`` in order
    (unknown characters read as ``<pad>``). ``chat_template``, when given, is saved as the
    tokenizer's own template (``--apply-chat-template`` uses it).
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    symbols = list(SPECIAL_TOKENS) + [c for c in dict.fromkeys(alphabet) if c not in "\n\r"]
    symbols.append("\n")
    core = Tokenizer(models.WordLevel(vocab={s: i for i, s in enumerate(symbols)},
                                      unk_token="<pad>"))
    core.pre_tokenizer = pre_tokenizers.Split("", "isolated")  # one token per character
    core.decoder = decoders.Fuse()  # characters joined as they are (no spaces between)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>",
                                        eos_token="<eos>", bos_token="<bos>", unk_token="<pad>")
    if chat_template is not None:
        tokenizer.chat_template = chat_template
    Path(directory).mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(str(directory))
    return Path(directory)
