"""Per-epoch prompt accounting of a data-set run, from the ledger alone.

A data-set run's prompt stream position ``p`` is row ``order(e)[p % rows]`` of epoch
``e = p // rows`` (``rows``: the data set's ``total_rows`` that ``run_started`` records under
``config["dataset"]``). Since the ledger records every position trained or dropped at most
once (``PromptLedger.twice`` lists any repeat), each epoch's rows are each trained, dropped
with a reason, in flight, or not yet issued: :func:`epoch_account` counts them per epoch.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from ledger.provenance import PromptLedger

__all__ = ["EpochAccount", "dataset_rows", "epoch_account"]


@dataclass(frozen=True)
class EpochAccount:
    """One epoch: its rows, and where each of them is."""

    epoch: int
    rows: int
    trained: int
    dropped: dict[str, int] = field(default_factory=dict)
    in_flight: int = 0
    not_issued: int = 0
    trained_twice: int = 0

    @property
    def balanced(self) -> bool:
        """Every row of the epoch in exactly one place."""
        accounted = self.trained + sum(self.dropped.values()) + self.in_flight + self.not_issued
        return accounted == self.rows and self.trained_twice == 0

    def to_json(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "rows": self.rows, "trained": self.trained,
                "dropped": dict(self.dropped), "in_flight": self.in_flight,
                "not_issued": self.not_issued, "trained_twice": self.trained_twice,
                "balanced": self.balanced}


def dataset_rows(run_started_config: dict[str, Any] | None) -> int | None:
    """The data set's rows per epoch recorded in ``run_started``; None for a run without one."""
    dataset = (run_started_config or {}).get("dataset")
    rows = dataset.get("total_rows") if isinstance(dataset, dict) else None
    return rows if isinstance(rows, int) and not isinstance(rows, bool) and rows > 0 else None


def epoch_account(prompts: PromptLedger, rows: int) -> list[EpochAccount]:
    """One :class:`EpochAccount` per epoch the stream reached (0-based)."""
    epochs = max(1, -(-prompts.issued // rows))
    trained = Counter(index // rows for index in prompts.trained)
    twice = Counter(index // rows for index in prompts.twice)
    dropped: dict[int, Counter[str]] = {}
    for index, reason in prompts.dropped.items():
        dropped.setdefault(index // rows, Counter())[reason] += 1
    in_flight = Counter(index // rows for index in prompts.in_flight)
    accounts = []
    for epoch in range(epochs):
        issued_here = min(rows, max(0, prompts.issued - epoch * rows))
        accounts.append(EpochAccount(
            epoch=epoch, rows=rows, trained=trained[epoch],
            dropped=dict(sorted(dropped.get(epoch, Counter()).items())),
            in_flight=in_flight[epoch], not_issued=rows - issued_here,
            trained_twice=twice[epoch]))
    return accounts
