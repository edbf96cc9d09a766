"""One weight update, full against LoRA, split into its steps, and the ledger's share of it.

    python bench/weight_update.py [--updates 30] [--engines 2] [--quick] [--transactions-only]

The publisher's sequence (DESIGN section 5: ``TrainCell.update_weights``, which runs THE
sequence :func:`actors.publishing.sequence.update_weights`) with each step timed by the sequence
itself (``UpdateReport.step_seconds``): ``weight_update_started`` (ledger), stage (copy,
checksum, one shared ``ray.put`` of all tensors or only the LoRA adapters), the wait for the
engines' pause (sent before staging), load into the engines, ``commit_weights`` (ledger), stamp
the engines with the version, resume them, ``engines_stamped`` (ledger). A trainer cell in this
process runs the production sequence against real engine actors on a local Ray cluster, the
ledger on SQLite. Updates alternate between the transports; the
engines are idle (the pause then waits for no decode step). LoRA uses the run's defaults
(``RunConfig(transport="lora")``: rank, alpha).

Per transport: the median (and min-max) milliseconds of each step and of the whole update,
the bytes moved, and the ledger's share (its three writes over the whole update).

Then the ledger transactions of one publishing step of a real job, counted by a SQLAlchemy
listener in every process (``bench/_transactions.py``): median (min-max) over the job's steps,
and the driver's share.

Prints a table and a line; asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
from pathlib import Path

import ray

from _report import machine_line
from _transactions import count_transactions
from actors.policies.policy import PolicyConfig
from actors.engines.rollout_engine import ROLLOUT_ENGINE_ACTOR_OPTIONS, RolloutEngine
from actors.task import TOKENIZER, AdditionTask
from actors.train_cell import TrainCell
from actors.publishing.weight_sync import collect_weights
from ledger import Ledger
from orchestrator.config import RunConfig
from orchestrator.control.launch import policy_config

STEPS = ("started", "stage", "pause", "load", "commit", "stamp", "stamped")
LEDGER_STEPS = ("started", "commit", "stamped")
TASK = AdditionTask(seed=0)


class Publisher:
    """One transport's cell, engines and ledger run, and its timed update."""

    def __init__(self, transport: str, config: PolicyConfig, engines: int, url: str) -> None:
        self.transport = transport
        self.run_id = f"bench-{transport}"
        self.ledger = Ledger.open(url)
        self.ledger.start_run(self.run_id)
        self.epoch = self.ledger.promote(self.run_id, "cell-0", reason="start")
        Engine = ray.remote(**ROLLOUT_ENGINE_ACTOR_OPTIONS)(RolloutEngine)
        self.engines = [Engine.remote(f"engine-{i}", "torch", config, 0, TASK,
                                      partial_rollout=True) for i in range(engines)]
        ray.get([engine.health.remote() for engine in self.engines])
        self.cell = TrainCell("cell-0", "torch", config, seed=0, transport=transport,
                              ledger_url=url, run_id=self.run_id)
        self.bytes = sum(t.numel() * t.element_size()
                         for t in collect_weights(self.cell.model, transport).values())

    def update(self) -> dict[str, float]:
        """One update through ``TrainCell.update_weights``; seconds per step."""
        self.cell.train_step_count += 1  # a new step each time: new idempotency keys
        report = self.cell.update_weights(self.engines, self.epoch)
        return {step: report.step_seconds[step] for step in STEPS}

    def close(self) -> None:
        self.cell.close()
        for engine in self.engines:
            ray.kill(engine)
        assert self.ledger.verify(self.run_id).ok
        self.ledger.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--updates", type=int, default=30)
    parser.add_argument("--engines", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="smoke run: 3 updates each")
    parser.add_argument("--transactions-only", action="store_true",
                        help="only count the ledger transactions per publishing step")
    args = parser.parse_args()
    if args.quick:
        args.updates = 3
    os.environ.setdefault("RAY_DISABLE_USAGE_STATS", "1")
    if not args.transactions_only:
        time_updates(args)
    counted = count_transactions(steps=4 if args.quick else 8)
    print(f"ledger transactions per publishing step: {counted['median']:g} "
          f"({counted['min']}-{counted['max']} over {counted['steps']} steps), "
          f"{counted['driver']:g} of them in the driver")


def time_updates(args: argparse.Namespace) -> None:
    """The timed updates, full against LoRA, alternating; prints the table."""
    ray.init(address="local", num_cpus=max(4, os.cpu_count() or 1), include_dashboard=False,
             log_to_driver=False, configure_logging=False)

    lora_defaults = RunConfig(transport="lora")
    configs = {"full": PolicyConfig(vocab_size=TOKENIZER.vocab_size),
               "lora": policy_config(lora_defaults)}
    timings: dict[str, list[dict[str, float]]] = {transport: [] for transport in configs}
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{Path(tmp) / 'ledger.db'}"
        publishers = {transport: Publisher(transport, config, args.engines, url)
                      for transport, config in configs.items()}
        for transport in configs:  # warm-up: first calls, first puts
            publishers[transport].update()
        for index in range(args.updates):
            order = list(configs) if index % 2 == 0 else list(reversed(configs))
            for transport in order:
                timings[transport].append(publishers[transport].update())
        for publisher in publishers.values():
            publisher.close()
    ray.shutdown()

    print(f"{machine_line()}; {args.updates} updates per transport, {args.engines} idle "
          f"engines, ledger on SQLite; LoRA rank {lora_defaults.lora_rank}, alpha "
          f"{lora_defaults.lora_alpha:g}")
    print("| transport | bytes moved | " + " | ".join(f"{step} ms" for step in STEPS)
          + " | total ms (min-max) | ledger share |")
    print("|---|---|" + "---|" * len(STEPS) + "---|---|")
    for transport, rows in timings.items():
        medians = {step: statistics.median(row[step] for row in rows) for step in STEPS}
        totals = [sum(row.values()) for row in rows]
        shares = [sum(row[step] for step in LEDGER_STEPS) / sum(row.values()) for row in rows]
        print(f"| {transport} | {publishers[transport].bytes:,} | "
              + " | ".join(f"{1000 * medians[step]:.2f}" for step in STEPS)
              + f" | {1000 * statistics.median(totals):.1f} ({1000 * min(totals):.1f}-"
              f"{1000 * max(totals):.1f}) | {statistics.median(shares):.0%} |")


if __name__ == "__main__":
    main()
