"""The JSON of an id map (what snapshots and audit checkpoints store): runs of entries that
count up by one with one width are one progression row, and either form reads back exactly.
Its blocks and gaps (what the prompt account's in-flight ids come from) are exactly the mapped
and unmapped ids."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ledger.id_ranges import IdMap

_ADDS = st.lists(st.tuples(st.integers(0, 400), st.integers(0, 20),
                           st.one_of(st.integers(0, 12), st.sampled_from(["stale", "aborted"]),
                                     st.booleans())),
                 max_size=40)


def _built(adds: list[tuple[int, int, object]]) -> IdMap:
    mapping: IdMap = IdMap()
    for start, width, value in adds:
        mapping.add(start, start + width, value)
    return mapping


@settings(max_examples=300, deadline=None)
@given(_ADDS)
def test_either_json_form_reads_back_the_same_map(adds):
    mapping = _built(adds)

    for progressions in (True, False):
        rows = json.loads(json.dumps(mapping.to_json(progressions)))
        back = IdMap.from_json(rows)
        assert back == mapping
        assert list(back.ranges()) == list(mapping.ranges()) and len(back) == len(mapping)
    assert len(mapping.to_json()) <= len(mapping.to_json(progressions=False))


def test_a_run_of_steps_is_one_row():
    trained: IdMap[int] = IdMap()
    for step in range(1, 100_001):
        start = (step - 1) * 256
        trained.add(start, start + 255, step)

    assert trained.to_json() == [[0, 100_000 * 256 - 1, 1, 256]]
    assert trained[256 * 70_000 + 3] == 70_001
    assert IdMap.from_json(trained.to_json()) == trained


def test_a_gap_or_another_width_starts_a_new_row():
    trained: IdMap[int] = IdMap()
    for start, end, step in [(0, 3, 1), (4, 7, 2), (8, 11, 3), (14, 17, 4), (18, 21, 5),
                             (22, 24, 6), (25, 27, 8), (28, 30, 9)]:
        trained.add(start, end, step)
    flags: IdMap[bool] = IdMap()
    flags.add(0, 0, True)
    flags.add(2, 2, True)  # bools never count up: one row each

    assert trained.to_json() == [[0, 11, 1, 4], [14, 21, 4, 4], [22, 24, 6], [25, 30, 8, 3]]
    assert flags.to_json() == [[0, 0, True], [2, 2, True]]


def test_a_progression_row_that_does_not_divide_is_refused():
    with pytest.raises(ValueError, match="not a progression row"):
        IdMap.from_json([[0, 9, 1, 4]])


@settings(max_examples=300, deadline=None)
@given(adds=_ADDS, limit=st.integers(min_value=0, max_value=400))
def test_blocks_and_gaps_are_the_mapped_and_unmapped_ids_whatever_the_values(adds, limit):
    mapping = _built(adds)
    mapped = set(mapping)

    blocks = mapping.blocks()
    gaps = list(mapping.gaps(limit))

    assert [i for start, end in blocks for i in range(start, end + 1)] == sorted(mapped)
    assert all(later[0] > earlier[1] + 1 for earlier, later in zip(blocks, blocks[1:]))
    assert [i for start, end in gaps for i in range(start, end + 1)] == [
        i for i in range(limit) if i not in mapped]
