"""The run's progress bar: step, reward, version, staleness and cells alive (rich).

The staleness shown is the largest the step's loss saw (train time), not the drain-time one
the screen bounds: fully-async trains its prefetched batch one version later than it drained.
"""

from __future__ import annotations

from typing import Any

from rich.console import Console

from orchestrator.metric_keys import REWARD_KEY, TRAIN_STALENESS_MAX_KEY
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

__all__ = ["RunProgress"]



class RunProgress:
    """A context manager that shows one bar for the run; a no-op when ``enabled`` is False."""

    def __init__(self, total_steps: int, first_step: int = 0, *, enabled: bool = True,
                 console: Console | None = None) -> None:
        self.enabled = enabled
        self._progress = Progress(
            TextColumn("[bold]step"),
            MofNCompleteColumn(),
            BarColumn(bar_width=24),
            TextColumn("reward {task.fields[reward]:.3f}"),
            TextColumn("version {task.fields[version]}"),
            TextColumn("staleness<= {task.fields[staleness]}"),
            TextColumn("cells {task.fields[cells]}"),
            TimeElapsedColumn(),
            console=console or Console(stderr=True),
            disable=not enabled,
        )
        self._task = self._progress.add_task(
            "run", total=total_steps, completed=first_step,
            reward=0.0, version=0, staleness=0, cells="-",
        )

    def __enter__(self) -> RunProgress:
        self._progress.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._progress.stop()

    def update(self, record: dict[str, Any]) -> None:
        """Advance one step with the values of one metrics record."""
        self._progress.update(
            self._task,
            advance=1,
            reward=float(record.get(REWARD_KEY, 0.0)),
            version=record.get("weight_version", 0),
            staleness=record.get(TRAIN_STALENESS_MAX_KEY, 0),
            cells=record.get("cells_alive", "-"),
        )
