"""The tail of a weight update (steps 5 and 6), run beside the cell's next train step.

Once step 4 has committed ``v``, the publisher's part is done: the version is the ledger's
head, and what is left (stamping and resuming every engine, then recording
``engines_stamped``) only waits on the engines. :class:`UpdateTail` runs it on a thread of its
own, so the cell answers the control plane right after the commit and trains the next step
while the engines take the stamp.

The cell settles the tail (:meth:`UpdateTail.settle`) before anything that must come after it:
its next update (so ``engines_stamped`` of ``v`` is recorded before ``weight_update_started``
of ``v + 1``, and no engine is paused for ``v + 1`` before it was stamped with ``v``), a
checkpoint, and closing. The control plane settles it too before it evaluates on the engines,
hands restarted engines to the rollout manager, or finishes the run.

What a failure of the tail means is what it meant before: steps 5 and 6 come after the
commit, so the version stays committed, and an engine that was not stamped is reported
unstamped (the audit lists it). A tail that finds its cell superseded (a newer epoch at an
engine, or in the ledger) is dropped with a warning: the cell's next fenced write fails as it
should. Any other error is raised by the next :meth:`UpdateTail.settle`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from actors.errors import StaleEpochError
from ledger import FencedError

__all__ = ["TailOutcome", "UpdateTail"]

logger = logging.getLogger(__name__)


@dataclass
class TailOutcome:
    """What the tail of the update of ``version`` did: the engines it stamped, those that
    failed (engine index -> error), and its wall seconds (``step_seconds``: stamp, stamped)."""

    version: int
    stamped_engine_ids: list[str] = field(default_factory=list)
    failed: dict[int, str] = field(default_factory=dict)
    step_seconds: dict[str, float] = field(default_factory=dict)


class UpdateTail:
    """At most one update's steps 5-6, running on their own thread.

    Not for concurrent callers: the cell runs one call at a time; only the tail's own thread
    runs beside it.
    """

    def __init__(self) -> None:
        self._thread: threading.Thread | None = None
        self._version = 0
        self._outcome: TailOutcome | None = None
        self._error: BaseException | None = None

    @property
    def pending(self) -> bool:
        """Whether a tail was started and not settled yet."""
        return self._thread is not None

    def start(self, version: int, work: Callable[[], TailOutcome]) -> None:
        """Run ``work`` (steps 5-6 of the update of ``version``) on a thread of its own.

        Precondition: no tail is pending (:meth:`settle` first).
        """
        if self._thread is not None:
            raise RuntimeError(f"the tail of v{self._version} is not settled")
        self._version, self._outcome, self._error = version, None, None
        self._thread = threading.Thread(target=self._run, args=(work,), daemon=True,
                                        name=f"update-tail-v{version}")
        self._thread.start()

    def _run(self, work: Callable[[], TailOutcome]) -> None:
        try:
            self._outcome = work()
        except BaseException as exc:  # noqa: BLE001 - handed to the settling caller
            self._error = exc

    def settle(self, timeout_s: float | None = None) -> TailOutcome | None:
        """Wait for the pending tail and return its outcome (None: nothing pending, or the
        tail found its cell superseded).

        Raises:
            TimeoutError: the tail did not end within ``timeout_s``; it stays pending.
            Exception: what the tail raised, other than its cell being superseded.
        """
        thread = self._thread
        if thread is None:
            return None
        started = time.perf_counter()
        thread.join(timeout_s)
        if thread.is_alive():
            raise TimeoutError(f"the tail of the update of v{self._version} did not end "
                               f"within {timeout_s} s")
        self._thread = None
        error, outcome = self._error, self._outcome
        self._error = self._outcome = None
        if isinstance(error, FencedError | StaleEpochError):
            logger.warning("the tail of v%d found this cell superseded: %s", self._version, error)
            return None
        if error is not None:
            raise error
        assert outcome is not None
        outcome.step_seconds["tail_wait"] = time.perf_counter() - started
        return outcome
