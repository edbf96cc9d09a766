"""THE weight-update sequence (docs/DESIGN.md section 5): one function, used by production
(``TrainCell.update_weights``, which the control plane's publisher calls), drills, tests and
benchmarks alike.

:func:`update_weights` runs, for the publisher cell at epoch ``e``, the steps of docs/DESIGN.md
section 5 with the same numbers:

1. record ``weight_update_started`` (fenced by the ledger);
2. pause every engine at ``e`` (engines refuse a lower epoch); sent now, awaited after 3a, so
   engines finish their decode step in progress while the cell stages;
3. stage and transfer: (3a) stage the weights (copy, checksum, one object-store copy or CUDA
   IPC handles); (3b) load them into every engine (full parameters, or only LoRA adapter
   tensors), every engine's checksum of what it received checked; no label changes;
4. commit: ``v = commit_weights(...)`` (fenced, idempotent per cell/epoch/step/checksum);
5. finalize: the one ``finalize_and_resume_engines(v, e)`` stamps every engine with ``v``,
   then resumes it;
6. record ``engines_stamped`` and return an :class:`UpdateReport` carrying the committed head
   ``(v, e)``; pushing it to the rollout manager is the control plane's next move.

Steps 5 and 6 only wait on the engines, so a caller may run them on an
:class:`~actors.publishing.tail.UpdateTail` (the train cell does): the call then returns right
after step 4, and the tail is settled before the next update.

In-flight (``swap=WeightSwap.IN_FLIGHT``) the engines never stop for steps 1-4: step 2 is
skipped, step 3b stages the weights in engines that keep generating, and step 5 is one
``swap_and_stamp`` per engine, which loads them at its next token boundary, stamps and resumes
(``AFTER_PAUSE`` is never reached). A death before step 4 then leaves every engine serving
its old weights under its old label; one after it, the same, with the version committed and
unstamped.

Paused (the default here), a death before step 4 leaves engines paused with unlabelled
weights and no new version; the next publisher transfers again. A death after it leaves a committed but unstamped version,
which the audit reports; the next commit is still head + 1. A failure in steps 2-3 records
``weight_update_aborted`` (best effort) before it is raised.

Fault points are named hooks inside the sequence (:class:`UpdatePoint`): the sequence calls
``at_point(point)`` after each step, so a drill that arms a fault on the cell
(:class:`UpdateFaults`, ``TrainCell.arm_update_fault``) and then lets the normal publish run
stops or fails the production path exactly there.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from actors.errors import InjectedFault
from actors.publishing.records import PublisherRecords
from actors.publishing.tail import TailOutcome, UpdateTail
from actors.transport import Transport, WeightSwap
from actors.publishing.weight_sync import (
    EngineDeadline,
    StagedWeights,
    await_engine_pause,
    await_loaded,
    finalize_and_resume_engines,
    request_engine_pause,
    send_staged_weights,
)
from ledger import FencedError, Head

__all__ = ["DELAY_S", "FaultAction", "UpdateFaults", "UpdatePoint", "UpdateReport",
           "update_weights"]

logger = logging.getLogger(__name__)


class UpdatePoint(StrEnum):
    """The named points of the sequence, in the order it passes them (after the step named)."""

    AFTER_STARTED = "after-started"  # 1 recorded; the pause (2) is being sent
    AFTER_STAGE = "after-stage"  # 3a staged; engines may still be draining their step
    AFTER_PAUSE = "after-pause"  # 2 awaited: no engine computes (never reached in flight)
    MID_TRANSFER = "mid-transfer"  # 3b sent to every engine, not yet acknowledged
    AFTER_TRANSFER = "after-transfer"  # 3b every engine loaded (or staged); nothing committed
    AFTER_COMMIT = "after-commit"  # 4 committed; no engine stamped
    AFTER_FINALIZE = "after-finalize"  # 5 engines stamped and resumed; 6 not recorded


class FaultAction(StrEnum):
    """What an armed point does when the sequence reaches it."""

    STOP = "stop"  # SIGSTOP this process: frozen there, for the caller to SIGKILL or SIGCONT
    RAISE = "raise"  # raise InjectedFault: the update fails at that point
    DELAY = "delay"  # sleep DELAY_S there: a slow step (what waits for the update's tail)


DELAY_S = 1.0
"""How long a ``delay`` fault holds its point."""


class UpdateFaults:
    """The points armed on one cell, each firing once (then disarmed). Callable as the
    sequence's ``at_point``.

    Precondition for ``stop``: the cell runs in its own process (a Ray actor); in-process
    callers arm ``raise``.
    """

    def __init__(self) -> None:
        self._armed: dict[UpdatePoint, FaultAction] = {}
        self.fired: list[UpdatePoint] = []

    def arm(self, point: UpdatePoint | str, action: FaultAction | str = FaultAction.STOP) -> None:
        """Arm ``point`` with ``action`` for the next update that reaches it.

        Raises:
            ValueError: unknown point or action.
        """
        self._armed[UpdatePoint(point)] = FaultAction(action)

    def armed(self) -> dict[str, str]:
        """The points still armed and their actions."""
        return {str(point): str(action) for point, action in self._armed.items()}

    def __call__(self, point: UpdatePoint) -> None:
        action = self._armed.pop(point, None)
        if action is None:
            return
        self.fired.append(point)
        if action is FaultAction.STOP:
            os.kill(os.getpid(), signal.SIGSTOP)
        elif action is FaultAction.DELAY:
            time.sleep(DELAY_S)
        else:
            raise InjectedFault(f"fault injected at {point}")


def _no_fault(point: UpdatePoint) -> None:
    """The production ``at_point``: nothing armed."""


@dataclass
class UpdateReport:
    """What one update did: the committed head, which engines were stamped and resumed, which
    failed (engine index -> error), and each step's wall seconds (``step_seconds``: started,
    stage, pause (the wait after staging; absent in flight), load (in flight: staged in the
    engines), commit, stamp (stamp and resume, or swap and stamp, one call per engine),
    stamped).

    ``committed`` is the head the commit made: ``version`` v, ``epoch`` e, this cell, and the
    seq and hash of the ``weight_committed`` event (a witness the ledger must still hold).

    ``finishing``: steps 5 and 6 still run on an :class:`~actors.publishing.tail.UpdateTail`;
    the stamped and failed engines and their seconds are its outcome, not this report's.
    """

    committed: Head
    checksum: str
    stamped_engine_ids: list[str] = field(default_factory=list)
    failed: dict[int, str] = field(default_factory=dict)
    step_seconds: dict[str, float] = field(default_factory=dict)
    finishing: bool = False

    @property
    def version(self) -> int:
        """The committed version."""
        return self.committed.version

    @property
    def epoch(self) -> int:
        """The publisher's epoch the version was committed under."""
        return self.committed.epoch

    @property
    def stamp_s(self) -> float:
        return self.step_seconds.get("stamp", 0.0)



class _Clock:
    """Wall seconds per step name."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._last = time.perf_counter()

    def lap(self, step: str) -> None:
        now = time.perf_counter()
        self.seconds[step] = now - self._last
        self._last = now


def update_weights(records: PublisherRecords, engines: Sequence[Any], epoch: int, *,
                   train_step: int, transport: Transport, adapter: str | None,
                   stage: Callable[[Sequence[Any]], StagedWeights],
                   engine_nodes: Callable[[Sequence[Any]], dict[str, dict[str, str]]],
                   at_point: Callable[[UpdatePoint], None] = _no_fault,
                   engine_timeout_s: float | None = None,
                   swap: WeightSwap = WeightSwap.PAUSE,
                   tail: UpdateTail | None = None) -> UpdateReport:
    """Publish the cell's weights to ``engines`` as the next version (steps 1-6 above).

    Precondition: the cell of ``records`` is the publisher at ``epoch``. ``stage`` makes step
    3a's :class:`StagedWeights` (the cell picks the path), ``engine_nodes`` names the nodes of
    the stamped engines for step 6, ``swap`` says whether engines pause for the update or
    take it in flight (the module docstring). Retrying the whole call is safe: every event is
    idempotent, pausing twice is harmless, loading again overwrites with the same tensors.

    With ``tail``, steps 5 and 6 run on it, and the call returns right after the commit (the
    report is ``finishing``); the caller settles the tail before its next update.

    Every wait on the engines (steps 2, 3b, 5) ends ``engine_timeout_s`` after the update
    began (``None``: no bound). An engine silent past it before the commit fails the update
    with :class:`~actors.errors.EngineSilentError`; after the commit, it is reported unstamped
    in the report's ``failed``.

    Raises:
        ledger.FencedError: the cell was superseded; nothing more is written.
        StaleEpochError: an engine has seen a newer epoch.
        EngineSilentError: an engine gave no answer in time before the commit; nothing
            committed.
        TransferError, EngineStateError, PolicyError: the load failed; nothing committed.
        InjectedFault: a ``raise`` fault armed at a point.
    """
    clock = _Clock()
    deadline = EngineDeadline.after(engine_timeout_s)
    swap = WeightSwap(swap)
    try:
        records.update_started(epoch, train_step, transport)  # 1
        clock.lap("started")
        pausing = (request_engine_pause(engines, epoch)  # 2 (sent)
                   if swap is WeightSwap.PAUSE else None)
        at_point(UpdatePoint.AFTER_STARTED)
        staged = stage(engines)  # 3a
        clock.lap("stage")
        at_point(UpdatePoint.AFTER_STAGE)
        if pausing is not None:
            await_engine_pause(pausing, deadline)  # 2 (awaited)
            clock.lap("pause")
            at_point(UpdatePoint.AFTER_PAUSE)
        loading = send_staged_weights(engines, staged, epoch, transport, swap)  # 3b (sent)
        at_point(UpdatePoint.MID_TRANSFER)
        checksum = await_loaded(loading, staged, deadline, swap)  # 3b (awaited)
        clock.lap("load")
        at_point(UpdatePoint.AFTER_TRANSFER)
    except FencedError:
        raise  # superseded: there is nothing this cell may record
    except Exception as exc:
        records.update_aborted(epoch, train_step, transport, f"{type(exc).__name__}: {exc}")
        raise
    committed = records.commit(epoch, train_step, transport, adapter, checksum)  # 4
    clock.lap("commit")
    at_point(UpdatePoint.AFTER_COMMIT)

    def finish() -> TailOutcome:  # 5 and 6
        tail_clock = _Clock()
        finalized = finalize_and_resume_engines(engines, committed.version, epoch, deadline,
                                                swap)  # 5
        tail_clock.lap("stamp")  # stamp (in flight: swap and stamp) and resume, per engine
        if finalized.failed:
            logger.warning("cell %s: engines not stamped with v%d: %s", records.cell_id,
                           committed.version, finalized.failed)
        at_point(UpdatePoint.AFTER_FINALIZE)
        records.engines_stamped(committed.version, epoch, finalized.stamped_engine_ids,
                                engine_nodes(engines))  # 6
        tail_clock.lap("stamped")
        return TailOutcome(committed.version, finalized.stamped_engine_ids, finalized.failed,
                           tail_clock.seconds)

    if tail is not None:
        tail.start(committed.version, finish)
        return UpdateReport(committed, checksum, step_seconds=clock.seconds, finishing=True)
    finished = finish()
    return UpdateReport(committed, checksum, finished.stamped_engine_ids, finished.failed,
                        {**clock.seconds, **finished.step_seconds})
