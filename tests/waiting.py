"""Bounded waits for tests: a condition that never comes true fails the test with a message
saying what did not happen, instead of hanging until the suite's timeout."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

__all__ = ["wait_until", "wait_until_async"]


def wait_until(predicate: Callable[[], object], *, what: str, timeout_s: float = 30.0,
               interval_s: float = 0.005) -> None:
    """Poll ``predicate`` until it is true.

    Raises:
        AssertionError: it was still false after ``timeout_s`` (the message names ``what``).
    """
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"{what}: not seen within {timeout_s:g} s"
        time.sleep(interval_s)


async def wait_until_async(predicate: Callable[[], object], *, what: str,
                           timeout_s: float = 10.0, interval_s: float = 0.005) -> None:
    """:func:`wait_until` inside an event loop: yields to the loop between polls."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not predicate():
        assert loop.time() < deadline, f"{what}: not seen within {timeout_s:g} s"
        await asyncio.sleep(interval_s)
