"""The engine side of a weight update: what the publisher cell asks of every rollout engine.

The steps are numbered as in docs/DESIGN.md section 5 and the one sequence,
:func:`actors.publishing.sequence.update_weights` (and :mod:`actors.train_cell`); the ledger
steps (1, 4, 6) are not here:

2. :func:`request_engine_pause` / :func:`await_engine_pause`: every engine adopts epoch ``e``
   and pauses (sent before step 3a, awaited after it).
3a. :func:`stage_weights`: checksum the tensors and, for actor engines, put them in the object
   store once, packed into one buffer (or share them by CUDA IPC, :func:`actors.weight_paths.select_weight_path`).
3b. :func:`send_staged_weights` / :func:`await_loaded`: every engine loads them; every engine's
   checksum of what it received must equal the sender's.
5. :func:`finalize_and_resume_engines`: stamp every engine with the committed version, then
   resume it (one ``stamp_and_resume`` call per engine).

With ``WeightSwap.IN_FLIGHT`` step 2 is skipped: step 3b sends the weights to engines that
keep generating (``stage_weights``: held beside the serving ones), and step 5 is one
``swap_and_stamp`` per engine, which loads them at the engine's next token boundary, stamps
and resumes.

Two transports (:class:`actors.transport.Transport`): ``full`` moves every tensor of the
policy, ``lora`` only the LoRA adapter tensors; the engines' frozen base is never touched.

Whatever the transport, an update ends in the ONE :func:`finalize_and_resume_engines`, which
stamps every engine with the committed version and then resumes it. There is deliberately no
transport-specific finalize: a LoRA path that skipped the stamp (the review finding in miles
PR #2244) would leave engines serving new adapters under an old label.

``engines`` may be Ray actor handles (calls go out in parallel) or plain
:class:`~actors.engines.rollout_engine.RolloutEngine` objects (called in order; used by in-process
tests and tools). Each call names the engine method it makes (no dispatch by name).

Every wait on actor engines is bounded by the update's :class:`EngineDeadline`: an engine that
gives no answer in time (frozen, hung) is reported as :class:`~actors.errors.EngineSilentError`,
an engine loss, so the cell answers its own caller before it looks silent itself.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import ray
import torch
from ray.actor import ActorHandle
from ray.exceptions import GetTimeoutError, RayTaskError
from torch import nn

from actors.errors import EngineSilentError, StaleEpochError, TransferError
from actors.policies.policy import adapter_state_dict, tensor_state_dict
from actors.publishing.packed import pack_tensors
from actors.transport import TRANSPORTS, Transport, WeightSwap
from actors.weight_paths import CUDA_IPC, OBJECT_STORE, share_cuda_tensors

__all__ = [
    "TRANSPORTS",
    "EngineDeadline",
    "FinalizeReport",
    "PendingCalls",
    "StagedWeights",
    "await_engine_pause",
    "await_loaded",
    "begin_engine_update",
    "collect_weights",
    "finalize_and_resume_engines",
    "load_staged_weights",
    "request_engine_pause",
    "send_staged_weights",
    "stage_weights",
    "tensors_checksum",
    "transfer_weights",
]


def tensors_checksum(tensors: dict[str, torch.Tensor]) -> str:
    """sha256 over (name, dtype, shape, bytes) of every tensor, in name order."""
    digest = hashlib.sha256()
    for name in sorted(tensors):
        tensor = tensors[name].detach().cpu().contiguous()
        digest.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}|".encode())
        if tensor.numel():  # reshape first: a 0-d tensor has no byte view of its own
            digest.update(tensor.reshape(-1).view(torch.uint8).numpy())
    return digest.hexdigest()


def collect_weights(model: nn.Module, transport: str) -> dict[str, torch.Tensor]:
    """A detached copy of what ``transport`` moves (all tensors, or adapter tensors only).

    Raises:
        ValueError: unknown transport.
        PolicyError: ``lora`` on a model without adapters.
    """
    if Transport.parse(transport) is Transport.FULL:
        tensors = tensor_state_dict(model)
    else:
        tensors = adapter_state_dict(model)
    return {name: tensor.clone() for name, tensor in tensors.items()}


# ------------------------------------------------------------------------------ engine calls


def _unwrap(exc: BaseException) -> BaseException:
    if isinstance(exc, RayTaskError) and getattr(exc, "cause", None) is not None:
        return exc.cause  # type: ignore[return-value]
    return exc


PendingCalls = list[tuple[bool, Any]]
"""Calls sent to engines: ``(is_object_ref, ref_or_result)`` per engine."""

EngineMethod = Callable[[Any], Any]
"""Picks the engine method a call makes, e.g. ``lambda engine: engine.load_weights``."""


def _send_all(engines: Sequence[Any], method: EngineMethod, *args: Any) -> PendingCalls:
    """Call ``method(engine)`` on every engine with ``args`` (actors: sent, not awaited; plain
    objects: called now)."""
    pending: PendingCalls = []
    for engine in engines:
        if isinstance(engine, ActorHandle):
            pending.append((True, method(engine).remote(*args)))
            continue
        try:
            pending.append((False, method(engine)(*args)))
        except Exception as exc:  # noqa: BLE001 - reported per engine to the caller
            pending.append((False, exc))
    return pending


@dataclass(frozen=True)
class EngineDeadline:
    """When an update stops waiting for its engines: ``timeout_s`` after it was made (a
    monotonic instant), or never (``None``: in-process engines, tools and tests)."""

    timeout_s: float | None = None
    _at: float | None = None

    @classmethod
    def after(cls, timeout_s: float | None) -> EngineDeadline:
        """A deadline ``timeout_s`` from now (``None``: no deadline)."""
        if timeout_s is None:
            return cls()
        return cls(timeout_s, time.monotonic() + timeout_s)

    def remaining_s(self) -> float | None:
        """Seconds left (never negative), or ``None`` without a deadline."""
        if self._at is None:
            return None
        return max(0.0, self._at - time.monotonic())


NO_DEADLINE = EngineDeadline()


def _gather(pending: PendingCalls, operation: str, deadline: EngineDeadline = NO_DEADLINE,
            engine_indices: Sequence[int] | None = None) -> list[Any]:
    """Wait for :func:`_send_all`'s calls of ``operation`` until ``deadline``; the result or
    the (unwrapped) exception of each, :class:`EngineSilentError` for an engine that gave no
    answer in time (named by its index in ``engine_indices``, default the call order)."""
    indices = list(engine_indices) if engine_indices is not None else range(len(pending))
    results: list[Any] = []
    for index, (is_ref, value) in zip(indices, pending):
        if not is_ref:
            results.append(value)
            continue
        try:
            results.append(ray.get(value, timeout=deadline.remaining_s()))
        except GetTimeoutError:
            results.append(EngineSilentError(index, operation, deadline.timeout_s or 0.0))
        except Exception as exc:  # noqa: BLE001 - a dead engine is reported, not fatal here
            results.append(_unwrap(exc))
    return results


def _call_all(engines: Sequence[Any], method: EngineMethod, operation: str,
              deadline: EngineDeadline, *args: Any,
              engine_indices: Sequence[int] | None = None) -> list[Any]:
    """:func:`_send_all`, then :func:`_gather`."""
    return _gather(_send_all(engines, method, *args), operation, deadline, engine_indices)


def _raise_first(results: Sequence[Any]) -> None:
    """Raise a StaleEpochError if any (the caller is fenced), else the first other error."""
    errors = [r for r in results if isinstance(r, BaseException)]
    for error in errors:
        if isinstance(error, StaleEpochError):
            raise error
    if errors:
        raise errors[0]


# ------------------------------------------------------------------------------ step 2: pause


def request_engine_pause(engines: Sequence[Any], epoch: int) -> PendingCalls:
    """Step 2, sent: every engine adopts ``epoch`` and pauses; does not wait. Engines finish
    their decode step in progress meanwhile (step 3a, :func:`stage_weights`, runs then).

    What happens to generation in flight is each engine's pause mode
    (:mod:`actors.engines.engine_protocol`): ``abort`` returns it ABORTED, ``in_place`` (partial
    rollout) parks it at a token boundary to continue under the new weights after
    :func:`finalize_and_resume_engines`.
    """
    return _send_all(engines, lambda engine: engine.begin_update, epoch)


def await_engine_pause(pending: PendingCalls,
                       deadline: EngineDeadline = NO_DEADLINE) -> list[dict[str, Any]]:
    """Step 2, awaited: wait until every engine has paused (no engine computes when this
    returns); their health.

    Raises:
        StaleEpochError: an engine has seen a newer epoch (the caller is a zombie publisher);
            engines that accepted stay paused until the newer publisher resumes them.
        ray.exceptions.RayActorError: an engine died.
        EngineSilentError: an engine gave no answer before ``deadline``.
    """
    results = _gather(pending, "begin_update", deadline)
    _raise_first(results)
    return results


def begin_engine_update(engines: Sequence[Any], epoch: int) -> list[dict[str, Any]]:
    """Step 2 whole: :func:`request_engine_pause`, then :func:`await_engine_pause`.

    Raises:
        As :func:`await_engine_pause`.
    """
    return await_engine_pause(request_engine_pause(engines, epoch))


# ------------------------------------------------------------------------------ step 3a: stage


@dataclass(frozen=True)
class StagedWeights:
    """Tensors ready to load: their checksum, what engines are sent (one object-store copy of
    CPU tensors for actor engines, CUDA IPC handles on the ``cuda_ipc`` path, the dict itself
    for in-process ones), the path, and the tensors (kept alive while IPC handles are open)."""

    checksum: str
    payload: Any
    path: str = OBJECT_STORE
    source: dict[str, torch.Tensor] | None = None


def stage_weights(engines: Sequence[Any], tensors: dict[str, torch.Tensor],
                  path: str = OBJECT_STORE) -> StagedWeights:
    """Step 3a: checksum ``tensors`` and, for actor engines, put them in the object store once
    (as CPU tensors: an engine without a GPU must read them) or, on the ``cuda_ipc`` path,
    share them by CUDA IPC handle.

    Raises:
        ValueError: ``cuda_ipc`` with tensors that are not on CUDA.
    """
    checksum = tensors_checksum(tensors)
    if path == CUDA_IPC:
        return StagedWeights(checksum, share_cuda_tensors(tensors), CUDA_IPC, tensors)
    payload: Any = tensors
    if any(isinstance(engine, ActorHandle) for engine in engines):
        on_cpu = {name: tensor if tensor.device.type == "cpu" else tensor.to("cpu")
                  for name, tensor in tensors.items()}
        # One packed buffer in the object store, shared by every engine (not one pickled
        # tensor at a time: actors.publishing.packed says why).
        payload = ray.put(pack_tensors(on_cpu))
    return StagedWeights(checksum, payload)


# ------------------------------------------------------------------------------ step 3b: load


def _receive_operation(swap: WeightSwap) -> str:
    """The name of the engine method that receives weights at step 3b."""
    return "stage_weights" if swap is WeightSwap.IN_FLIGHT else "load_weights"


def send_staged_weights(engines: Sequence[Any], staged: StagedWeights, epoch: int,
                        transport: str, swap: WeightSwap = WeightSwap.PAUSE) -> PendingCalls:
    """Step 3b, sent: every engine receives ``staged``; does not wait. The version label does
    not change. ``pause``: the (paused) engines load it (``load_weights``); ``in-flight``:
    they hold it beside the serving weights and keep generating (``stage_weights``)."""
    method: EngineMethod = ((lambda engine: engine.stage_weights)
                            if swap is WeightSwap.IN_FLIGHT else
                            (lambda engine: engine.load_weights))
    return _send_all(engines, method, staged.payload, epoch, str(Transport.parse(transport)))


def await_loaded(pending: PendingCalls, staged: StagedWeights,
                 deadline: EngineDeadline = NO_DEADLINE,
                 swap: WeightSwap = WeightSwap.PAUSE) -> str:
    """Step 3b, awaited: every engine received the weights (loaded them, or staged them
    ``in-flight``); returns the checksum they all received.

    Raises:
        StaleEpochError: an engine has seen a newer epoch.
        TransferError: an engine received something else than was sent.
        EngineStateError, PolicyError: an engine was not paused, or the tensors do not match
            its model (nothing loaded in that engine).
        ray.exceptions.RayActorError: an engine died.
        EngineSilentError: an engine gave no answer before ``deadline``.
    """
    results = _gather(pending, _receive_operation(swap), deadline)
    _raise_first(results)
    mismatched = [i for i, received in enumerate(results) if received != staged.checksum]
    if mismatched:
        raise TransferError(f"engines {mismatched} received weights with another checksum")
    return staged.checksum


def load_staged_weights(engines: Sequence[Any], staged: StagedWeights, epoch: int,
                        transport: str) -> str:
    """Step 3b whole: :func:`send_staged_weights`, then :func:`await_loaded`.

    Raises:
        As :func:`await_loaded`.
    """
    return await_loaded(send_staged_weights(engines, staged, epoch, transport), staged)


def transfer_weights(engines: Sequence[Any], tensors: dict[str, torch.Tensor], epoch: int,
                     transport: str) -> str:
    """Steps 3a and 3b for tools that hold tensors but no cell: stage, then load; returns the
    checksum.

    Raises:
        As :func:`await_loaded`.
    """
    return load_staged_weights(engines, stage_weights(engines, tensors), epoch, transport)


# ------------------------------------------------------------------------------ step 5: finalize


@dataclass
class FinalizeReport:
    """Which engines were stamped and resumed, and which failed (engine index -> error), and
    how long it took (``stamp_s``: wall seconds of the one stamp-and-resume round, all
    engines)."""

    version: int
    stamped_engine_ids: list[str] = field(default_factory=list)
    failed: dict[int, str] = field(default_factory=dict)
    stamp_s: float = 0.0


def finalize_and_resume_engines(engines: Sequence[Any], version: int, epoch: int,
                                deadline: EngineDeadline = NO_DEADLINE,
                                swap: WeightSwap = WeightSwap.PAUSE) -> FinalizeReport:
    """Step 5, for every transport: stamp every engine with ``version``, then resume it, in
    one call per engine (``stamp_and_resume``: the engine resumes only once its stamp is
    accepted, so no engine serves new weights under an old label). ``in-flight``, the call is
    ``swap_and_stamp``: the engine pauses at its next token boundary, loads the weights it
    staged at ``epoch``, stamps them and resumes (never new weights under an old label, nor
    an old label moved onto new weights).

    Precondition: ``version`` was committed by the ledger for the caller's cell at ``epoch``,
    and the engines hold the weights of that commit. Every engine is attempted: one dead
    engine does not keep the others paused. An engine silent past ``deadline`` is reported
    failed (:class:`EngineSilentError`), like a dead one: the control plane's probe replaces
    it before the next step. An engine that was stamped but could not resume is reported both
    stamped and failed.

    Raises:
        StaleEpochError: an engine has seen a newer epoch (the caller is fenced; engines that
            were stamped are still resumed by the newer publisher, not here).
    """
    started = time.perf_counter()
    if swap is WeightSwap.IN_FLIGHT:
        results = _call_all(engines, lambda engine: engine.swap_and_stamp, "swap_and_stamp",
                            deadline, version, epoch)
    else:
        results = _call_all(engines, lambda engine: engine.stamp_and_resume,
                            "stamp_and_resume", deadline, version, epoch)
    for result in results:
        if isinstance(result, StaleEpochError):
            raise result
    report = FinalizeReport(version=version, stamp_s=time.perf_counter() - started)
    for index, result in enumerate(results):
        if isinstance(result, BaseException):
            report.failed[index] = f"{type(result).__name__}: {result}"
            continue
        report.stamped_engine_ids.append(str(result["engine_id"]))
        if result.get("resume_error"):
            report.failed[index] = f"resume: {result['resume_error']}"
    return report
