"""Integer ids as ranges: the compact form prompt ids are stored in, and a map over ranges.

A step trains prompts that are nearly always one contiguous run of the stream, so ids are
stored as ``[[start, end], ...]`` (both ends included, single ids as plain ints allowed) and
folded into an :class:`IdMap`, which holds one entry per run of ids that share a value (the
step that trained them, the reason they were dropped) instead of one per id. Memory is then
bounded by the number of gaps, not by the number of prompts.

The JSON of a map (what a snapshot stores) is bounded by the gaps alone: a run of entries that
follow each other with the same width and values counting up by one (step 1 trained ids
0-255, step 2 256-511, ...) is one progression row ``[start, end, first_value, width]``, so a
100k-step run's account is a few rows, not one per step.
"""

from __future__ import annotations

import bisect
import itertools
import operator
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, Generic, TypeVar

__all__ = ["IdMap", "RangeItem", "compact", "expand", "gaps_between", "iter_ranges", "to_ranges"]

V = TypeVar("V")
RangeItem = int | list[int]


def to_ranges(ids: Iterable[int]) -> list[RangeItem]:
    """Sorted, de-duplicated ``ids`` as ranges: ``[0, 1, 2, 5]`` -> ``[[0, 2], 5]``."""
    out: list[list[int]] = []
    for index in sorted(set(ids)):
        if out and index == out[-1][1] + 1:
            out[-1][1] = index
        else:
            out.append([index, index])
    return [start if start == end else [start, end] for start, end in out]


def _is_compact(items: list[Any]) -> bool:
    """Already in stored form: sorted, disjoint, non-adjacent ranges (the common read)."""
    previous_end = None
    for item in items:
        if type(item) is int:
            start = end = item
        elif (type(item) is list and len(item) == 2 and type(item[0]) is int
              and type(item[1]) is int and item[0] < item[1]):
            start, end = item
        else:
            return False
        if previous_end is not None and start <= previous_end + 1:
            return False
        previous_end = end
    return True


def compact(items: list[Any]) -> list[RangeItem]:
    """``items`` (ids and ranges, any order) in the stored form :func:`to_ranges` writes;
    returned as is when already in it.

    Raises:
        ValueError: an item that is neither an id nor a ``[start, end]`` range.
    """
    if _is_compact(items):
        return list(items)
    return to_ranges(expand(items))


def iter_ranges(items: Iterable[Any]) -> Iterator[tuple[int, int]]:
    """``(start, end)`` of each item of either stored form (an int, or ``[start, end]``).

    Raises:
        ValueError: an item that is neither (or a range whose end is below its start).
    """
    for item in items:
        if isinstance(item, int) and not isinstance(item, bool):
            yield item, item
        elif (isinstance(item, list | tuple) and len(item) == 2
              and all(isinstance(v, int) and not isinstance(v, bool) for v in item)
              and item[0] <= item[1]):
            yield item[0], item[1]
        else:
            raise ValueError(f"not a prompt id or [start, end] range: {item!r}")


def expand(items: Iterable[Any]) -> list[int]:
    """Every id the items name, in stored order (either form)."""
    return [index for start, end in iter_ranges(items) for index in range(start, end + 1)]


def _counts(value: object) -> bool:
    """A value a progression row can count up from (an int, not a bool)."""
    return type(value) is int


def gaps_between(ranges: Iterable[tuple[int, int]], limit: int) -> Iterator[tuple[int, int]]:
    """The ranges of ``[0, limit)`` that none of ``ranges`` (sorted by start; they may
    overlap) holds."""
    cursor = 0
    for start, end in ranges:
        if start >= limit:
            break
        if cursor < start:
            yield cursor, start - 1
        cursor = max(cursor, end + 1)
    if cursor < limit:
        yield cursor, limit - 1


class IdMap(Mapping[int, V], Generic[V]):
    """A map id -> value held as sorted, disjoint ranges ``[start, end] -> value``.

    :meth:`add` keeps the first value of an id (a later add of an id already mapped is
    returned as a clash, not stored). ``len`` is the number of ids, in O(1). Iterating yields
    every id (use :meth:`ranges` for the compact form).
    """

    def __init__(self) -> None:
        self._starts: list[int] = []
        self._ends: list[int] = []
        self._values: list[V] = []
        self._count = 0

    # -- Mapping
    def __len__(self) -> int:
        return self._count

    def __iter__(self) -> Iterator[int]:
        for start, end in zip(self._starts, self._ends, strict=True):
            yield from range(start, end + 1)

    def __getitem__(self, index: int) -> V:
        position = bisect.bisect_right(self._starts, index) - 1
        if position >= 0 and index <= self._ends[position]:
            return self._values[position]
        raise KeyError(index)

    def __contains__(self, index: object) -> bool:
        if not isinstance(index, int):
            return False
        position = bisect.bisect_right(self._starts, index) - 1
        return position >= 0 and index <= self._ends[position]

    # -- ranges
    def ranges(self) -> Iterator[tuple[int, int, V]]:
        """``(start, end, value)`` in id order."""
        return zip(self._starts, self._ends, self._values, strict=True)

    def overlaps(self, start: int, end: int) -> list[tuple[int, int, V]]:
        """The stored ranges (clipped to ``[start, end]``) that hold ids in ``[start, end]``."""
        position = max(bisect.bisect_right(self._starts, start) - 1, 0)
        found = []
        while position < len(self._starts) and self._starts[position] <= end:
            if self._ends[position] >= start:
                found.append((max(start, self._starts[position]),
                              min(end, self._ends[position]), self._values[position]))
            position += 1
        return found

    def add(self, start: int, end: int, value: V) -> list[tuple[int, int, V]]:
        """Map the ids of ``[start, end]`` not mapped yet to ``value``; return the clashes
        (ids already mapped, with their value), which keep their first value."""
        clashes = self.overlaps(start, end)
        cursor = start
        for clash_start, clash_end, _ in clashes:
            if cursor < clash_start:
                self._insert(cursor, clash_start - 1, value)
            cursor = clash_end + 1
        if cursor <= end:
            self._insert(cursor, end, value)
        return clashes

    def _insert(self, start: int, end: int, value: V) -> None:
        position = bisect.bisect_left(self._starts, start)
        self._count += end - start + 1
        # Join a neighbour with the same value, so runs of one step stay one entry.
        if position > 0 and self._ends[position - 1] == start - 1 \
                and self._values[position - 1] == value:
            self._ends[position - 1] = end
            if position < len(self._starts) and self._starts[position] == end + 1 \
                    and self._values[position] == value:
                self._ends[position - 1] = self._ends[position]
                del self._starts[position], self._ends[position], self._values[position]
            return
        if position < len(self._starts) and self._starts[position] == end + 1 \
                and self._values[position] == value:
            self._starts[position] = start
            return
        self._starts.insert(position, start)
        self._ends.insert(position, end)
        self._values.insert(position, value)

    def blocks(self) -> list[tuple[int, int]]:
        """The mapped ids as maximal ``(start, end)`` ranges, whatever their values (entries
        that touch are joined). Found at C speed: a run's trained prompts are one entry per
        step (100k at 100k steps) and nearly always one block."""
        starts, ends = self._starts, self._ends
        if not starts:
            return []
        breaks = list(itertools.compress(
            range(1, len(starts)),
            map(operator.ne, map((1).__add__, ends), itertools.islice(starts, 1, None))))
        firsts = [0, *breaks]
        lasts = [position - 1 for position in breaks] + [len(starts) - 1]
        return [(starts[first], ends[last]) for first, last in zip(firsts, lasts)]

    def gaps(self, limit: int) -> Iterator[tuple[int, int]]:
        """The ranges of ``[0, limit)`` that hold no mapped id."""
        return gaps_between(self.blocks(), limit)

    def count_in(self, start: int, end: int) -> int:
        """How many ids of ``[start, end]`` are mapped."""
        return sum(e - s + 1 for s, e, _ in self.overlaps(start, end))

    def to_json(self, progressions: bool = True) -> list[list[Any]]:
        """``[[start, end, value], ...]`` (values must be JSON-ready), with each run of two or
        more entries that form a progression as one ``[start, end, first_value, width]`` row
        (``progressions=False``: one row per entry, the form before progressions)."""
        if not progressions:
            return [[s, e, v] for s, e, v in self.ranges()]
        rows: list[list[Any]] = []
        starts, ends, values = self._starts, self._ends, self._values
        position, total = 0, len(starts)
        while position < total:
            last = position
            width = ends[position] - starts[position] + 1
            if _counts(values[position]):
                while (last + 1 < total and starts[last + 1] == ends[last] + 1
                       and ends[last + 1] - starts[last + 1] + 1 == width
                       and _counts(values[last + 1])
                       and values[last + 1] == values[last] + 1):
                    last += 1
            if last > position:
                rows.append([starts[position], ends[last], values[position], width])
            else:
                rows.append([starts[position], ends[position], values[position]])
            position = last + 1
        return rows

    @classmethod
    def from_json(cls, rows: Iterable[list[Any]]) -> IdMap[Any]:
        """The inverse of :meth:`to_json`, either form (rows sorted and disjoint, as written).

        Raises:
            TypeError, ValueError: a row of neither shape.
        """
        mapping: IdMap[Any] = cls()
        for row in rows:
            if len(row) == 3:
                start, end, value = int(row[0]), int(row[1]), row[2]
                mapping._starts.append(start)
                mapping._ends.append(end)
                mapping._values.append(value)
            else:
                start, end, first, width = (int(item) for item in row)
                if width < 1 or (end - start + 1) % width:
                    raise ValueError(f"not a progression row: {row!r}")
                # range() fills each list at C speed: a 100k-entry progression in milliseconds.
                mapping._starts.extend(range(start, end + 1, width))
                mapping._ends.extend(range(start + width - 1, end + 1, width))
                mapping._values.extend(range(first, first + (end - start + 1) // width))
            mapping._count += end - start + 1
        return mapping

    def __eq__(self, other: object) -> bool:
        if isinstance(other, IdMap):
            return (self._starts, self._ends, self._values) == (
                other._starts, other._ends, other._values)
        return Mapping.__eq__(self, other)

    def __repr__(self) -> str:
        return f"IdMap({self.to_json()!r})"
