"""The rows the append derives from payloads (the ``train_step`` column, ``version_uses``) are
outside the hash chain; `ledger verify` re-derives them, so an edit, a deletion or a planted
row is named by run, seq and check on SQLite and PostgreSQL."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import sqlalchemy as sa

from ledger import Ledger
from tests.cli_scenario import LINEAGE_RUN_ID as RUN, build_lineage_run
from tests.ledger_helpers import execute


@pytest.fixture
def lineage(ledger_url: str) -> str:
    """The lineage story (4 steps, one batch_trained each) on either backend."""
    with Ledger.open(ledger_url) as writer:
        build_lineage_run(writer)
    return ledger_url


def _seq(url: str, kind: str, step: int) -> int:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            return conn.execute(sa.text(
                "SELECT seq FROM ledger_events WHERE run_id = :run AND kind = :kind "
                "AND train_step = :step"), {"run": RUN, "kind": kind, "step": step}).scalar_one()
    finally:
        engine.dispose()


def _problems(url: str) -> set[tuple[int, str]]:
    with Ledger.open(url, readonly=True) as reader:
        return {(p.seq, p.check) for p in reader.verify(RUN).problems}


# name -> (the seq it damages, given the url; the SQL that damages it, given that seq)
Plant = Callable[[str, int], None]
DAMAGE: dict[str, tuple[Callable[[str], int], Plant, str]] = {
    "a batch's step column edited": (
        lambda url: _seq(url, "batch_trained", 2),
        lambda url, seq: execute(url, "UPDATE ledger_events SET train_step = 99 "
                                 "WHERE run_id = :run AND seq = :seq", run=RUN, seq=seq),
        "train_step_column",
    ),
    "a commit's step column nulled": (
        lambda url: _seq(url, "weight_committed", 3),
        lambda url, seq: execute(url, "UPDATE ledger_events SET train_step = NULL "
                                 "WHERE run_id = :run AND seq = :seq", run=RUN, seq=seq),
        "train_step_column",
    ),
    "a version_uses row with other samples": (
        lambda url: _seq(url, "batch_trained", 3),
        lambda url, seq: execute(url, "UPDATE version_uses SET samples = samples + 1 "
                                 "WHERE run_id = :run AND seq = :seq", run=RUN, seq=seq),
        "version_uses_mismatch",
    ),
    "a step's version_uses rows deleted": (
        lambda url: _seq(url, "batch_trained", 4),
        lambda url, seq: execute(url, "DELETE FROM version_uses WHERE run_id = :run "
                                 "AND seq = :seq", run=RUN, seq=seq),
        "version_uses_mismatch",
    ),
    "a version_uses row planted on a commit": (
        lambda url: _seq(url, "weight_committed", 1),
        lambda url, seq: execute(url, "INSERT INTO version_uses (run_id, version, seq, "
                                 "train_step, samples) VALUES (:run, 1, :seq, 1, 4)",
                                 run=RUN, seq=seq),
        "version_uses_mismatch",
    ),
    "a version_uses row past the last event": (
        lambda url: 500,
        lambda url, seq: execute(url, "INSERT INTO version_uses (run_id, version, seq, "
                                 "train_step, samples) VALUES (:run, 1, :seq, 9, 4)",
                                 run=RUN, seq=seq),
        "version_uses_mismatch",
    ),
}


def test_a_clean_run_has_no_derived_row_problems(lineage: str):
    assert _problems(lineage) == set()


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_verify_names_a_derived_row_that_disagrees_with_its_payload(lineage: str, damage: str):
    where, plant, check = DAMAGE[damage]
    seq = where(lineage)

    plant(lineage, seq)

    assert _problems(lineage) == {(seq, check)}
