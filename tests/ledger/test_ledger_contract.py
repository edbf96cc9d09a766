"""The ledger contract, run against SQLite (file, WAL) and the real PostgreSQL server.

``LedgerContract`` is not collected by itself; each backend class differs only in its URL.
Schemas are built by ``Ledger.open`` through the Alembic migrations, never ``create_all``.
"""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from ledger import (
    EventKind,
    FencedError,
    IdempotencyConflictError,
    Ledger,
    LedgerError,
    UnknownRunError,
)
from tests.ledger_helpers import dump_tables

RUN = "run-a"


class LedgerContract:
    """Behaviour every backend must show. Subclasses provide the ``url`` fixture."""

    @pytest.fixture
    def ledger(self, url: str):
        with Ledger.open(url) as opened:
            opened.start_run(RUN, config={"lr": 0.1})
            yield opened

    @pytest.fixture
    def published(self, ledger: Ledger) -> tuple[Ledger, int]:
        """A run whose cell-0 is the publisher at epoch 1."""
        return ledger, ledger.promote(RUN, "cell-0", reason="start")

    def test_a_new_run_starts_at_version_zero_with_no_publisher(self, ledger: Ledger):
        head = ledger.head(RUN)
        assert (head.version, head.epoch, head.publisher_cell, head.seq) == (0, 0, None, 1)
        first = next(ledger.events(RUN))
        assert first.kind == EventKind.RUN_STARTED
        assert first.payload == {"config": {"lr": 0.1}}

    def test_start_run_is_idempotent_per_run_id(self, ledger: Ledger):
        again = ledger.start_run(RUN, config={"lr": 99})
        assert again.seq == 1
        assert again.payload == {"config": {"lr": 0.1}}
        assert ledger.head(RUN).seq == 1

    def test_commits_take_consecutive_versions_and_seqs(self, published):
        ledger, epoch = published
        versions = [
            ledger.commit_weights(RUN, cell_id="cell-0", epoch=epoch, train_step=step)
            for step in range(1, 6)
        ]
        assert versions == [1, 2, 3, 4, 5]
        assert [e.seq for e in ledger.events(RUN)] == list(range(1, 8))
        assert ledger.head(RUN).version == 5

    def test_promotion_increments_the_epoch_and_names_the_publisher(self, published):
        ledger, first_epoch = published
        second_epoch = ledger.promote(RUN, "cell-1", reason="failover", previous_cell="cell-0")
        assert (first_epoch, second_epoch) == (1, 2)
        head = ledger.head(RUN)
        assert (head.epoch, head.publisher_cell) == (2, "cell-1")

    def test_retry_with_same_idempotency_key_returns_first_event_and_writes_nothing(
        self, published
    ):
        ledger, epoch = published
        first = ledger.commit_weights(
            RUN, cell_id="cell-0", epoch=epoch, train_step=1, idempotency_key="c0:1:1"
        )
        before = dump_tables(ledger)
        retried = ledger.commit_weights(
            RUN, cell_id="cell-0", epoch=epoch, train_step=1, idempotency_key="c0:1:1"
        )
        assert retried == first == 1
        assert dump_tables(ledger) == before

    def test_idempotency_key_reused_for_another_kind_is_refused(self, published):
        ledger, epoch = published
        ledger.commit_weights(RUN, cell_id="cell-0", epoch=epoch, train_step=1, idempotency_key="k")
        with pytest.raises(IdempotencyConflictError):
            ledger.append(
                RUN, "weight_update_started", {"train_step": 2, "transport": "full"},
                cell_id="cell-0", epoch=epoch, idempotency_key="k",
            )

    @pytest.mark.parametrize(
        "change, field",
        [
            ({"cell_id": "cell-1"}, "cell"),
            ({"epoch": 2}, "epoch"),
            ({"train_step": 2}, "train_step"),
            ({"checksum": "sha256:other"}, "checksum"),
            ({"transport": "lora", "adapter": "lora-r4"}, "transport"),
            ({"adapter": "lora-r8"}, "adapter"),
        ],
    )
    def test_key_reused_with_other_parameters_is_refused_and_writes_nothing(
        self, published, change: dict, field: str
    ):
        ledger, epoch = published
        base = {"cell_id": "cell-0", "epoch": epoch, "train_step": 1, "transport": "lora",
                "adapter": "lora-r4", "checksum": "sha256:one"}
        if field == "transport":
            base.update(transport="full", adapter=None)
        first = ledger.commit_weights(RUN, idempotency_key="commit:1", **base)
        before = dump_tables(ledger)

        with pytest.raises(IdempotencyConflictError) as refused:
            ledger.commit_weights(RUN, idempotency_key="commit:1", **{**base, **change})

        assert first == 1
        assert f"{field} " in str(refused.value) and "at seq 3" in str(refused.value)
        assert dump_tables(ledger) == before
        assert ledger.commit_weights(RUN, idempotency_key="commit:1", **base) == first

    def test_a_retry_may_differ_in_what_it_observed(self, published):
        ledger, epoch = published
        ledger.commit_weights(RUN, cell_id="cell-0", epoch=epoch, train_step=1)
        stamped = ledger.append(
            RUN, "engines_stamped", {"version": 1, "engine_ids": ["e0", "e1"]},
            cell_id="cell-0", epoch=epoch, idempotency_key="stamp:1",
        )
        aborted = ledger.append(
            RUN, "weight_update_aborted",
            {"train_step": 2, "transport": "full", "reason": "engine e1 died"},
            cell_id="cell-0", epoch=epoch, idempotency_key="abort:2",
        )
        before = dump_tables(ledger)

        again_stamped = ledger.append(  # e1 died between the attempts
            RUN, "engines_stamped", {"version": 1, "engine_ids": ["e0"]},
            cell_id="cell-0", epoch=epoch, idempotency_key="stamp:1",
        )
        again_aborted = ledger.append(
            RUN, "weight_update_aborted",
            {"train_step": 2, "transport": "full", "reason": "timeout"},
            cell_id="cell-0", epoch=epoch, idempotency_key="abort:2",
        )

        assert (again_stamped, again_aborted) == (stamped, aborted)
        assert dump_tables(ledger) == before
        with pytest.raises(IdempotencyConflictError, match="version 1 != 0"):
            ledger.append(
                RUN, "engines_stamped", {"version": 0, "engine_ids": ["e0"]},
                cell_id="cell-0", epoch=epoch, idempotency_key="stamp:1",
            )

    def test_a_promotion_retried_with_its_key_returns_its_epoch(self, published):
        ledger, _ = published
        second = ledger.promote(RUN, "cell-1", reason="failover", idempotency_key="promote:2")
        assert ledger.promote(
            RUN, "cell-1", reason="failover", idempotency_key="promote:2"
        ) == second == 2
        with pytest.raises(IdempotencyConflictError, match="cell 'cell-1' != 'cell-2'"):
            ledger.promote(RUN, "cell-2", reason="failover", idempotency_key="promote:2")

    def test_commit_from_fenced_epoch_writes_nothing(self, ledger: Ledger):
        epoch_a = ledger.promote(RUN, "cell-a")
        ledger.commit_weights(RUN, cell_id="cell-a", epoch=epoch_a, train_step=1)
        epoch_b = ledger.promote(RUN, "cell-b", reason="failover")
        before = dump_tables(ledger)

        with pytest.raises(FencedError) as raised:
            ledger.commit_weights(RUN, cell_id="cell-a", epoch=epoch_a, train_step=2)

        assert (raised.value.epoch, raised.value.current_epoch) == (1, epoch_b)
        assert dump_tables(ledger) == before

    def test_every_publisher_kind_is_fenced(self, published):
        ledger, epoch = published
        payloads = {
            "weight_update_started": {"train_step": 1, "transport": "full"},
            "weight_update_aborted": {"train_step": 1, "transport": "lora", "reason": "x"},
            "engines_stamped": {"version": 0, "engine_ids": ["e0"]},
            "checkpoint_saved": {"train_step": 1, "version": 0, "path": "/tmp/c"},
        }
        for kind, payload in payloads.items():
            with pytest.raises(FencedError):
                ledger.append(RUN, kind, payload, cell_id="cell-0", epoch=epoch - 1)
            with pytest.raises(FencedError):
                ledger.append(RUN, kind, payload, cell_id="cell-9", epoch=epoch)
            ledger.append(RUN, kind, payload, cell_id="cell-0", epoch=epoch)

    def test_commit_before_any_promotion_is_fenced(self, ledger: Ledger):
        with pytest.raises(FencedError):
            ledger.commit_weights(RUN, cell_id="cell-0", epoch=0, train_step=1)

    def test_cell_state_is_not_fenced(self, published):
        ledger, _ = published
        stored = ledger.append(RUN, "cell_state", {"state": "errored"}, cell_id="cell-7")
        assert stored.kind == "cell_state"

    def test_engines_cannot_be_stamped_ahead_of_the_head(self, published):
        ledger, epoch = published
        with pytest.raises(LedgerError, match="head is 0"):
            ledger.append(
                RUN, "engines_stamped", {"version": 1, "engine_ids": ["e0"]},
                cell_id="cell-0", epoch=epoch,
            )

    def test_bad_payload_and_unknown_kind_are_refused(self, published):
        ledger, epoch = published
        with pytest.raises(LedgerError, match="unknown event kind"):
            ledger.append(RUN, "weights_yolo", {})
        with pytest.raises(LedgerError, match="transport"):
            ledger.append(
                RUN, "weight_update_started", {"train_step": 1, "transport": "carrier-pigeon"},
                cell_id="cell-0", epoch=epoch,
            )

    def test_unknown_run_is_refused(self, ledger: Ledger):
        with pytest.raises(UnknownRunError):
            ledger.head("nope")
        with pytest.raises(UnknownRunError):
            ledger.promote("nope", "cell-0")

    def test_verify_is_clean_and_notes_unstamped_versions(self, published):
        ledger, epoch = published
        ledger.commit_weights(RUN, cell_id="cell-0", epoch=epoch, train_step=1)
        ledger.append(
            RUN, "engines_stamped", {"version": 1, "engine_ids": ["e0", "e1"]},
            cell_id="cell-0", epoch=epoch,
        )
        ledger.commit_weights(RUN, cell_id="cell-0", epoch=epoch, train_step=2)

        report = ledger.verify(RUN)

        assert report.ok, report.problems
        assert report.unstamped_versions == [2]

    def test_tampered_payload_is_named_by_run_and_seq(self, published):
        ledger, epoch = published
        ledger.commit_weights(RUN, cell_id="cell-0", epoch=epoch, train_step=1)
        ledger.commit_weights(RUN, cell_id="cell-0", epoch=epoch, train_step=2)
        engine = sa.create_engine(ledger._url)
        with engine.begin() as conn:
            conn.execute(
                sa.text(
                    "UPDATE ledger_events SET payload = :p WHERE run_id = :r AND version = 1"
                ),
                {"p": '{"train_step": 1, "transport": "full", "adapter": null, "checksum": "evil"}',
                 "r": RUN},
            )
        engine.dispose()

        report = ledger.verify()

        assert not report.ok
        assert [(p.run_id, p.seq, p.check) for p in report.problems] == [
            (RUN, 3, "hash_mismatch")
        ]

    def test_runs_are_isolated(self, ledger: Ledger):
        ledger.start_run("run-b")
        epoch = ledger.promote("run-b", "cell-0")
        assert ledger.commit_weights("run-b", cell_id="cell-0", epoch=epoch, train_step=1) == 1
        assert ledger.head(RUN).version == 0
        assert [r.run_id for r in ledger.runs()] == [RUN, "run-b"]

    def test_reader_sees_writes_and_cannot_write(self, url: str, published):
        ledger, epoch = published
        ledger.commit_weights(RUN, cell_id="cell-0", epoch=epoch, train_step=1)
        with Ledger.open(url, readonly=True) as reader:
            assert reader.head(RUN).version == 1
            with pytest.raises(LedgerError):
                reader.promote(RUN, "cell-1")
        assert ledger.head(RUN).epoch == epoch


class TestSQLiteLedger(LedgerContract):
    @pytest.fixture
    def url(self, sqlite_url: str) -> str:
        return sqlite_url


@pytest.mark.postgres
class TestPostgresLedger(LedgerContract):
    @pytest.fixture
    def url(self, pg_url: str) -> str:
        return pg_url
