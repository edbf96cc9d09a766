"""The event hash has one canonical encoder: the envelope built field by field equals the
canonical JSON of the whole event (what every ledger so far was hashed with), for any text
and numbers, so old ledgers verify unchanged. The audit's faster rendering (msgspec) accepts
exactly what the canonical one accepts."""

from __future__ import annotations

import hashlib
from datetime import datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ledger.events import Event, EventKind, canonical_json, event_hash, hash_matches

_TEXT = st.text(max_size=12)
_OPTIONAL_INT = st.none() | st.integers(min_value=-(2**63), max_value=2**63)
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | _TEXT,
    lambda children: st.lists(children, max_size=3)
    | st.dictionaries(_TEXT, children, max_size=3),
    max_leaves=8,
)


def _whole_event_hash(**fields) -> str:
    body = canonical_json({**fields, "recorded_at": fields["recorded_at"].isoformat()})
    return hashlib.sha256(body.encode("utf-8")).hexdigest()


@settings(max_examples=300, deadline=None)
@given(
    prev_hash=_TEXT, run_id=_TEXT, seq=st.integers(min_value=0, max_value=2**62),
    kind=st.sampled_from(list(EventKind)) | _TEXT, version=_OPTIONAL_INT,
    cell_id=st.none() | _TEXT, epoch=_OPTIONAL_INT, idempotency_key=st.none() | _TEXT,
    payload=st.dictionaries(_TEXT, _JSON, max_size=4),
    recorded_at=st.datetimes(min_value=datetime(1970, 1, 2)),
)
def test_envelope_hash_equals_the_canonical_json_of_the_whole_event(**fields) -> None:
    expected = _whole_event_hash(**{**fields, "kind": str(fields["kind"])})
    assert event_hash(**fields) == expected
    assert event_hash(**fields, payload_json=canonical_json(fields["payload"])) == expected


def test_a_kind_hashes_as_its_stored_string() -> None:
    fields = dict(prev_hash="0" * 64, run_id="r", seq=1, version=None, cell_id=None,
                  epoch=None, idempotency_key="k", payload={"b": 1, "a": "é"},
                  recorded_at=datetime(2026, 1, 1, 12, 0, 0, 5))
    assert event_hash(kind=EventKind.RUN_STARTED, **fields) == \
        event_hash(kind="run_started", **fields) == \
        _whole_event_hash(kind="run_started", **fields)


def _event_hashed_over(written: dict, stored: dict) -> Event:
    """An event whose hash was computed over ``written`` and whose row now holds ``stored``."""
    fields = dict(prev_hash="0" * 64, run_id="r", seq=2, kind="cell_state", version=None,
                  cell_id="c", epoch=None, idempotency_key="k",
                  recorded_at=datetime(2026, 1, 1, 12, 0, 0, 5))
    return Event(payload=stored, hash=event_hash(**fields, payload=written), **fields)


@settings(max_examples=300, deadline=None)
@given(payload=st.dictionaries(_TEXT, _JSON | st.floats(), max_size=4))
def test_the_audit_accepts_every_payload_hashed_as_it_is_stored(payload) -> None:
    matches, payload_json = hash_matches(_event_hashed_over(payload, payload))

    assert matches
    assert payload_json == canonical_json(payload)


@pytest.mark.parametrize("written, stored", [
    ({"a": None}, {"a": float("nan")}),  # msgspec writes NaN and infinities as null
    ({"a": None}, {"a": float("inf")}),
    ({"a": [None, 1]}, {"a": [float("-inf"), 1]}),
    ({"a": 1}, {"a": 1.0}),
    ({"a": 1}, {"a": True}),
    ({"a": "x"}, {"a": "y"}),
    ({"a": 1e16}, {"a": 10**16}),
])
def test_a_stored_payload_that_is_not_the_one_hashed_never_matches(written, stored) -> None:
    matches, payload_json = hash_matches(_event_hashed_over(written, stored))

    assert not matches
    assert payload_json == canonical_json(stored)
