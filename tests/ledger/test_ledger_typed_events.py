"""Events are typed on read as on write: a kind is an EventKind (an unknown one stays the
stored string, for the audit to name), and a payload read through its model raises on a
missing field instead of reading it as 0."""

from __future__ import annotations

import pickle
from datetime import datetime

import pytest

from ledger import Ledger
from ledger.errors import LedgerError, PayloadError
from ledger.events import Event, EventKind
from ledger.payloads import WeightCommitted, payload_model
from ledger.projections import RunState, fold
from tests.ledger_helpers import plant_event


def _event(kind: str, payload: dict, **fields) -> Event:
    return Event(run_id="r", seq=fields.pop("seq", 1), kind=kind, payload=payload,
                 recorded_at=datetime(2026, 12, 1), prev_hash="0" * 64, hash="1" * 64,
                 **fields)


def test_a_known_kind_read_as_a_string_is_an_event_kind():
    event = _event("weight_committed", {})

    assert event.kind is EventKind.WEIGHT_COMMITTED
    assert f"{event.kind}" == str(event.kind) == "weight_committed"


def test_an_unknown_kind_stays_the_stored_string():
    event = _event("from_the_future", {})

    assert type(event.kind) is str and event.kind == "from_the_future"


def test_payload_as_reads_declared_fields_typed():
    commit = _event("weight_committed", {"train_step": 3, "transport": "lora",
                                         "adapter": "v3", "checksum": None})

    payload = commit.payload_as(payload_model(EventKind.WEIGHT_COMMITTED))

    assert (payload.train_step, payload.transport, payload.adapter) == (3, "lora", "v3")


def test_a_missing_field_raises_instead_of_reading_as_zero():
    commit = _event("weight_committed", {"transport": "full"}, seq=7)

    with pytest.raises(PayloadError, match=r"run 'r' seq 7: weight_committed payload: "
                                           r"train_step: Field required") as raised:
        commit.payload_as(WeightCommitted)

    assert isinstance(raised.value, LedgerError)
    assert str(pickle.loads(pickle.dumps(raised.value))) == str(raised.value)


def test_the_fold_refuses_a_commit_without_its_train_step():
    state = RunState("r")
    commit = _event("weight_committed", {"transport": "full"}, version=1, cell_id="c0",
                    epoch=1)

    with pytest.raises(PayloadError):
        state.apply(commit)


def test_the_fold_moves_the_head_past_kinds_it_does_not_fold():
    state = fold("r", [_event("drill_started", {"scenario": "x"}, seq=1),
                       _event("from_the_future", {}, seq=2)])

    assert state.last_seq == 2 and state.head_version == 0


def test_verify_names_an_unknown_kind_read_from_the_database(sqlite_url: str):
    with Ledger.open(sqlite_url) as writer:
        writer.start_run("r", config={})
    seq = plant_event(sqlite_url, "r", kind="from_the_future", payload={"x": 1})

    with Ledger.open(sqlite_url, readonly=True) as reader:
        events = list(reader.events("r"))
        problems = {(p.seq, p.check) for p in reader.verify("r").problems}

    assert events[-1].kind == "from_the_future"
    assert problems == {(seq, "unknown_kind")}
