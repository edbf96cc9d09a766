"""Small helpers every benchmark's report uses: the machine line, medians, alternation.

Imports only the standard library, so light benchmarks (ledger, drain) stay light.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
from collections.abc import Sequence
from typing import TypeVar

__all__ = ["COLLAPSED_BELOW", "machine_line", "median_spread", "rotated", "seed_list"]

T = TypeVar("T")

# A run of the default task that ends below this mean reward has collapsed (its answers stop
# ending, reward 0 from then on): a learned policy scores 0.3-0.6.
COLLAPSED_BELOW = 0.15


def machine_line() -> str:
    """Date, CPU count and the load average at start, for the head of a results table."""
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return (f"{datetime.date.today().isoformat()}, {platform.machine()} {os.cpu_count()} CPUs "
            f"({platform.system()}), load average {load:.1f} at start")


def median_spread(values: Sequence[float]) -> tuple[float, float, float]:
    """``(median, min, max)`` of ``values``."""
    return statistics.median(values), min(values), max(values)


def rotated(items: Sequence[T], repeat: int) -> list[T]:
    """``items`` in the order of round ``repeat``: rotated by one each round, so that no
    variant always runs first (or always right after a given other one)."""
    shift = repeat % len(items)
    return list(items[shift:]) + list(items[:shift])


def seed_list(text: str) -> set[int]:
    """``1-4,7,101-105`` as a set of seeds (an argparse ``type``)."""
    seeds: set[int] = set()
    for part in text.split(","):
        first, _, last = part.strip().partition("-")
        try:
            seeds.update(range(int(first), int(last or first) + 1))
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a seed or a range of seeds: {part!r}")
    return seeds
