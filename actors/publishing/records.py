"""What a publisher cell writes to the ledger, in one place: the fenced events of a weight
update (DESIGN section 5) and of a checkpoint, with their idempotency keys.

Every write is fenced by the ledger (only the cell of the newest ``cell_promoted``, with its
epoch) and idempotent: a key names the run, the event, the cell, the epoch and the train
step, so a retry after an unknown outcome returns the stored event and writes nothing new.
"""

from __future__ import annotations

import logging
from typing import Any

from actors.cluster.node_info import node_fields
from actors.transport import Transport
from ledger import EventKind, Head, Ledger

__all__ = ["PublisherRecords"]

logger = logging.getLogger(__name__)

_MAX_REASON = 500


class PublisherRecords:
    """The ledger writes of cell ``cell_id`` for run ``run_id`` (a connection opened on first
    use, from ``ledger_url``). Not thread-safe; one per cell.

    A cell built without a run (``ledger_url`` or ``run_id`` None) trains but cannot publish:
    every write raises ``ValueError``.
    """

    def __init__(self, cell_id: str, ledger_url: str | None, run_id: str | None) -> None:
        self.cell_id = cell_id
        self.ledger_url = ledger_url
        self.run_id = run_id
        self._ledger: Ledger | None = None

    def ledger(self) -> Ledger:
        """The cell's ledger connection.

        Raises:
            ValueError: the cell is not bound to a run.
        """
        if self.ledger_url is None or self.run_id is None:
            raise ValueError(f"cell {self.cell_id} is not bound to a run: pass ledger_url "
                             "and run_id when creating it")
        if self._ledger is None:
            self._ledger = Ledger.open(self.ledger_url)
        return self._ledger

    def _key(self, what: str, epoch: int, train_step: int) -> str:
        return f"{self.run_id}:{what}:{self.cell_id}:e{epoch}:s{train_step}"

    def update_started(self, epoch: int, train_step: int, transport: Transport) -> None:
        """``weight_update_started`` (step 1 of the update).

        Raises:
            ledger.FencedError: not the publisher at ``epoch``; nothing written.
        """
        self.ledger().append(
            self.run_id, EventKind.WEIGHT_UPDATE_STARTED,
            {"train_step": train_step, "transport": str(transport)},
            cell_id=self.cell_id, epoch=epoch,
            idempotency_key=self._key("update_started", epoch, train_step),
        )

    def update_aborted(self, epoch: int, train_step: int, transport: Transport,
                       reason: str) -> None:
        """``weight_update_aborted``, best effort: a failure to record it is logged, never
        raised (the error that aborted the update is what the caller needs)."""
        try:
            self.ledger().append(
                self.run_id, EventKind.WEIGHT_UPDATE_ABORTED,
                {"train_step": train_step, "transport": str(transport),
                 "reason": reason[:_MAX_REASON]},
                cell_id=self.cell_id, epoch=epoch,
                idempotency_key=self._key("update_aborted", epoch, train_step),
            )
        except Exception:  # noqa: BLE001 - see the docstring
            logger.warning("cell %s: could not record the aborted update", self.cell_id,
                           exc_info=True)

    def commit(self, epoch: int, train_step: int, transport: Transport, adapter: str | None,
               checksum: str) -> Head:
        """``weight_committed`` (step 4): returns the head the commit made (its version is
        ledger head + 1, its seq and hash those of the commit event).

        Idempotent per (cell, epoch, train step, checksum): a retry returns the same head.

        Raises:
            ledger.FencedError: not the publisher at ``epoch``; nothing written.
        """
        stored = self.ledger().append(
            self.run_id, EventKind.WEIGHT_COMMITTED,
            {"train_step": train_step, "transport": str(transport), "adapter": adapter,
             "checksum": checksum},
            cell_id=self.cell_id, epoch=epoch,
            idempotency_key=self._key(f"commit:{checksum[:16]}", epoch, train_step),
        )
        assert stored.version is not None  # the ledger numbers every commit
        return Head(stored.version, epoch, self.cell_id, stored.seq, stored.hash)

    def engines_stamped(self, version: int, epoch: int, engine_ids: list[str],
                        engine_nodes: dict[str, dict[str, str]]) -> None:
        """``engines_stamped`` (step 6) for the engines that took the stamp, with the node of
        the cell and of each engine.

        Raises:
            ledger.FencedError: a newer publisher was promoted meanwhile; nothing written.
        """
        self.ledger().append(
            self.run_id, EventKind.ENGINES_STAMPED,
            {"version": version, "engine_ids": engine_ids, **node_fields(),
             "engine_nodes": {engine_id: engine_nodes[engine_id]
                              for engine_id in engine_ids if engine_id in engine_nodes}},
            cell_id=self.cell_id, epoch=epoch,
            idempotency_key=f"{self.run_id}:engines_stamped:v{version}:{self.cell_id}:e{epoch}",
        )

    def checkpoint_saved(self, epoch: int, train_step: int, summary: dict[str, Any]) -> None:
        """``checkpoint_saved`` with ``summary`` (``train_step``, ``version``, ``path``).

        Raises:
            ledger.FencedError: not the publisher at ``epoch``; nothing written.
        """
        self.ledger().append(
            self.run_id, EventKind.CHECKPOINT_SAVED, summary, cell_id=self.cell_id,
            epoch=epoch, idempotency_key=self._key(f"checkpoint:{summary['path']}", epoch,
                                                   train_step),
        )

    def close(self) -> None:
        """Close the connection (a later write opens a new one)."""
        if self._ledger is not None:
            self._ledger.close()
            self._ledger = None
