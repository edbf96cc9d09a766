"""The one seam through which drills and tests observe or act on a running job.

The control plane calls these hooks at named points of a step; the default does nothing.
Faults are injected by a ``JobHooks`` subclass handed to the job (``JobOptions.hooks``), never
by reassigning methods of live objects: a reader of the driver sees every point where outside
code may run.
"""

from __future__ import annotations

from typing import Any, Protocol

from ledger import Ledger
from ledger.run_layout import RunLayout
from orchestrator.config import RunConfig

__all__ = ["JobHooks", "TrainingJob"]


class TrainingJob(Protocol):
    """What a hook sees of the running job (``orchestrator.control.driver.TrainingJob``)."""

    config: RunConfig
    run_id: str
    ledger: Ledger
    layout: RunLayout
    step: int
    supervisor: Any  # orchestrator.control.supervision.Supervisor
    publisher: Any  # orchestrator.control.publisher.Publisher


class JobHooks:
    """Callbacks at the named points of a training step. Subclass and override what you need.

    Hooks run on the driver's thread; a hook that raises ends the run (drills use that to stop
    a job on purpose).
    """

    def before_train_step(self, job: TrainingJob, step: int) -> None:
        """The batch of ``step`` is drained; the cells are about to train on it."""

    def after_train_step(self, job: TrainingJob, step: int) -> None:
        """The cells have applied ``step`` (or it failed and is being raised)."""

    def before_publish(self, job: TrainingJob) -> None:
        """A weight update attempt is about to start (before the publisher is called): once
        per update, and again before each retry of it, once the failed attempt was sorted
        out (a lost publisher failed over, dead engines restarted)."""

    def on_step_end(self, job: TrainingJob, step: int) -> None:
        """``step`` is done: published, checkpointed, metrics written."""
