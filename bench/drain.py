"""Drain overhead of the staleness filter: off, ledger-backed, and per-group HTTP polling.

    python bench/drain.py [--drains 200] [--repeats 3] [--quick]

The same producer and drain (``FullyAsyncRolloutFn`` over a ``DataBuffer``, admission control
on) run over an engine pool that answers at once with ready-made groups (16 groups of 8
three-token samples per drain), so what is timed is the rollout path itself. Only the drain
calls are timed; between drains a "publish" moves the version on (untimed), as the trainer
would. Three ways to know the current version:

- ``off``: no staleness filter; the version is a number in memory (no I/O at all).
- ``ledger``: the real ``RolloutManager``, version from the ledger on SQLite: the head is read
  once per drain, and again only when a group is newer than what the manager knows.
- ``http-poll``: the design it replaces (miles before #2244): the filter asks a local HTTP
  ``/model_info`` endpoint for the version, per group, through a 1 s cache.

``http-poll (no cache)`` is shown for scale. Variants alternate (the order rotates every
repeat); per variant the median over repeats of groups/s and microseconds per group, the
ratio of its time per group to ``off``'s, and the groups screened with a negative staleness
(a cached version older than the engines' stamps: what the ledger-backed version removes;
those groups are recycled, not trained, and their regeneration is part of the time).

Prints a table; asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import statistics
import tempfile
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from _report import machine_line, rotated
from ledger import Ledger
from orchestrator.metric_keys import NEGATIVE_STALENESS_KEY
from orchestrator.config import RunConfig
from orchestrator.rollout.data_buffer import DataBuffer
from orchestrator.rollout.data_source import PromptSource
from orchestrator.rollout.manager import RolloutManager
from orchestrator.rollout.producer import FullyAsyncRolloutFn
from orchestrator.rollout.types import Prompt, RolloutFnTrainInput, Sample

RUN = "bench-drain"
CONFIG = RunConfig(run_id=RUN, rollout_batch_size=16, n_samples_per_prompt=8,
                   max_weight_staleness=2, async_max_concurrent_samples=16)
VARIANTS = ("off", "ledger", "http-poll", "http-poll (no cache)")


def make_prompt(index: int) -> Prompt:
    return Prompt(index=index, tokens=(3, 13, 4, 16), label="7")


class InstantPool:
    """Engines that answer at once, stamping ``version`` on every sample."""

    def __init__(self) -> None:
        self.version = 0

    async def generate(self, prompt: Prompt, n_samples: int, group_index: int) -> list[Sample]:
        await asyncio.sleep(0)
        version = self.version
        return [
            Sample(index=group_index * n_samples + i, group_index=group_index,
                   prompt_tokens=list(prompt.tokens), response_tokens=[10, 1, 0],
                   rollout_log_probs=[-0.1, -0.2, -0.3], reward=float(i % 2),
                   weight_versions=[version], token_versions=[version] * 3)
            for i in range(n_samples)
        ]


class ModelInfoServer:
    """A local ``GET /model_info`` -> ``{"weight_version": v}`` endpoint, in a thread."""

    def __init__(self) -> None:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                body = json.dumps({"weight_version": server.version}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args) -> None:
                pass

        self.version = 0
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_port}/model_info"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class PolledVersion:
    """The version as the HTTP-polling filter saw it: asked per group, cached ``ttl_s``."""

    def __init__(self, url: str, ttl_s: float) -> None:
        self.url, self.ttl_s = url, ttl_s
        self.value, self.fetched_at, self.requests = 0, float("-inf"), 0

    def __call__(self, _at_least: int = 0) -> int:
        if time.monotonic() - self.fetched_at >= self.ttl_s:
            with urllib.request.urlopen(self.url, timeout=5) as response:
                self.value = int(json.loads(response.read())["weight_version"])
            self.fetched_at = time.monotonic()
            self.requests += 1
        return self.value


async def _time_drains(drain, publish, drains: int) -> float:
    """Seconds spent inside ``drain(i)`` over ``drains`` calls, with ``publish()`` between."""
    spent = 0.0
    for rollout_id in range(drains):
        started = time.perf_counter()
        await drain(rollout_id)
        spent += time.perf_counter() - started
        publish()
    return spent


def _rollout(pool: InstantPool, staleness: int | None, version) -> FullyAsyncRolloutFn:
    """The manager's producer and drain, its admission bound always at the config's
    staleness (so every variant generates alike); ``staleness`` is the screen's."""
    buffer = DataBuffer(CONFIG.buffer_capacity, max_weight_staleness=staleness,
                        unused_samples_handler=CONFIG.async_unused_samples_handler,
                        max_recycles=CONFIG.max_recycles)
    return FullyAsyncRolloutFn.from_config(CONFIG, pool, PromptSource(make_prompt), buffer,
                                           current_version=version)


async def run_off(drains: int) -> tuple[float, int]:
    pool, version = InstantPool(), [0]
    rollout = _rollout(pool, None, lambda: version[0])

    def publish() -> None:
        version[0] += 1
        pool.version = version[0]
        rollout.notify()

    try:
        spent = await _time_drains(
            lambda i: rollout.drain(RolloutFnTrainInput(i, version[0]), lambda _: version[0]),
            publish, drains)
        return spent, rollout.buffer.negative_staleness_total
    finally:
        await rollout.stop()


async def run_ledger(drains: int, tmp: Path) -> tuple[float, int]:
    url = f"sqlite:///{tmp / f'drain-{time.monotonic_ns()}.db'}"
    with Ledger.open(url) as ledger:
        ledger.start_run(RUN)
        epoch = ledger.promote(RUN, "cell-0", reason="start")
        pool = InstantPool()
        manager = RolloutManager(url, RUN, CONFIG, make_prompt, pool)

        def publish() -> None:
            version = ledger.commit_weights(RUN, cell_id="cell-0", epoch=epoch,
                                            train_step=pool.version + 1)
            pool.version = version
            manager.set_weight_version(version)

        try:
            spent = await _time_drains(manager.generate, publish, drains)
            return spent, manager.metrics()[NEGATIVE_STALENESS_KEY]
        finally:
            await manager.shutdown()


async def run_http(drains: int, ttl_s: float) -> tuple[float, int]:
    server, pool = ModelInfoServer(), InstantPool()
    # The baseline screens millions of groups with a negative staleness: the table counts
    # them, one error line each would bury it.
    logging.getLogger("orchestrator.rollout").setLevel(logging.CRITICAL)
    polled = PolledVersion(server.url, ttl_s)
    rollout = _rollout(pool, CONFIG.max_weight_staleness, lambda: server.version)

    def publish() -> None:
        server.version += 1
        pool.version = server.version
        rollout.notify()

    try:
        spent = await _time_drains(
            lambda i: rollout.drain(RolloutFnTrainInput(i, polled.value), polled),
            publish, drains)
        return spent, rollout.buffer.negative_staleness_total
    finally:
        await rollout.stop()
        server.close()
        logging.getLogger("orchestrator.rollout").setLevel(logging.NOTSET)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--drains", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="smoke run: 10 drains, 1 repeat")
    args = parser.parse_args()
    if args.quick:
        args.drains, args.repeats = 10, 1

    groups = args.drains * CONFIG.rollout_batch_size
    seconds: dict[str, list[float]] = {variant: [] for variant in VARIANTS}
    negative: dict[str, int] = {variant: 0 for variant in VARIANTS}
    with tempfile.TemporaryDirectory() as tmp:
        runners = {
            "off": lambda: run_off(args.drains),
            "ledger": lambda: run_ledger(args.drains, Path(tmp)),
            "http-poll": lambda: run_http(args.drains, ttl_s=1.0),
            "http-poll (no cache)": lambda: run_http(args.drains, ttl_s=0.0),
        }
        for repeat in range(args.repeats):
            for variant in rotated(VARIANTS, repeat):
                spent, negative_total = asyncio.run(runners[variant]())
                seconds[variant].append(spent)
                negative[variant] += negative_total

    print(f"{machine_line()}; {args.drains} drains x {CONFIG.rollout_batch_size} groups x "
          f"{CONFIG.n_samples_per_prompt} samples, {args.repeats} repeats")
    print("| staleness filter | groups/s (median) | us/group (median, min-max) | "
          "ratio to off | negative staleness (all repeats) |")
    print("|---|---|---|---|---|")
    off = statistics.median(seconds["off"]) / groups
    for variant in VARIANTS:
        per_group = [s / groups for s in seconds[variant]]
        median = statistics.median(per_group)
        print(f"| {variant} | {1 / median:.0f} | {median * 1e6:.1f} "
              f"({min(per_group) * 1e6:.1f}-{max(per_group) * 1e6:.1f}) | {median / off:.2f} | "
              f"{negative[variant]} |")


if __name__ == "__main__":
    main()
