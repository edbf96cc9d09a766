"""Helpers shared by ledger tests: raw table dumps and worker processes."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import sqlalchemy as sa

from ledger import Ledger
from ledger.schema import metadata


def dump_tables(ledger: Ledger) -> dict[str, list[tuple]]:
    """Every row of every ledger table, in primary-key order: a byte-for-byte comparable view."""
    engine = sa.create_engine(ledger._url)
    try:
        with engine.connect() as conn:
            return {
                table.name: [
                    tuple(json.dumps(v, sort_keys=True, default=str) for v in row)
                    for row in conn.execute(
                        sa.select(table).order_by(*table.primary_key.columns)
                    )
                ]
                for table in metadata.sorted_tables
            }
    finally:
        engine.dispose()


def commit_loop(url: str, run_id: str, cell_id: str, epoch: int, count: int, out: str) -> None:
    """Commit ``count`` versions (``count`` < 0: forever) and record each version returned."""
    ledger = Ledger.open(url)
    versions: list[int] = []
    step = 0
    with open(out, "a", encoding="utf-8") as sink:
        while count < 0 or step < count:
            step += 1
            version = ledger.commit_weights(
                run_id, cell_id=cell_id, epoch=epoch, train_step=step
            )
            versions.append(version)
            sink.write(f"{version}\n")
            sink.flush()
    ledger.close()


if __name__ == "__main__":
    # python -m tests.ledger_helpers URL RUN CELL EPOCH COUNT OUT
    url, run_id, cell_id, epoch, count, out = sys.argv[1:7]
    Path(out).touch()
    commit_loop(url, run_id, cell_id, int(epoch), int(count), out)
