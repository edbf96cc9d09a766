"""Fully-async against --sync on the same short run, and publisher-death-to-next-commit time.

    python bench/async_vs_sync.py [--steps 30] [--kills 3] [--backend torch]
                                  [--device-ms-per-token 15]

Both modes run the same config on a local Ray cluster. Wall time per step is the mean of
steps after a warm-up (the first steps include actor start-up); samples/s counts trained
samples. Target: fully-async at most 0.75x the sync time per step.

Two engine set-ups are measured side by side:

- ``cpu``: the real engines, sampling on the same two CPU cores the trainer cells use. Both
  modes are compute-bound on the same cores, so overlapping generation with training cannot
  shorten a step here: it only moves the contention (the trainer's step time grows by what
  the engines take).
- ``device``: the same engines, plus a fixed wait per decoded token that stands for the decode
  step running on an accelerator of its own (the deployment fully-async RL is built for, and
  the one a CPU-only machine cannot show). The wait holds no core, so generation overlaps
  training as it would on separate GPUs. This engine is a benchmark double, defined here.

The failover figure kills the publisher's worker process (SIGKILL) several times in one run and
measures the time from each kill to the next ``weight_committed`` in the ledger.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import ray

from ledger import Ledger
from actors.rollout_engine import ROLLOUT_ENGINE_ACTOR_OPTIONS, RolloutEngine
from orchestrator.control import launch
from orchestrator.config import RunConfig
from orchestrator.control.driver import JobOptions, TrainingJob, run_job

WARMUP_STEPS = 3


class DeviceLatencyEngine(RolloutEngine):
    """A RolloutEngine whose every decode step also waits ``device_s_per_token``, without
    holding a core: the time an accelerator of its own would spend on that step. Like a real
    engine it notices an abort (a weight update's pause) at the next token."""

    device_s_per_token = 0.015

    def _before_token(self) -> None:
        time.sleep(self.device_s_per_token)


def device_engine_factory(seconds_per_token: float):
    """An ``engine_factory`` for run_job building DeviceLatencyEngine actors."""

    def create(config: RunConfig, engine_id: str):
        engine_class = type("DeviceEngine", (DeviceLatencyEngine,),
                            {"device_s_per_token": seconds_per_token})
        options = {**ROLLOUT_ENGINE_ACTOR_OPTIONS, "num_cpus": launch.ENGINE_CPUS}
        sampling = {"temperature": config.temperature, "top_p": config.top_p,
                    "max_new_tokens": config.max_response_len}
        return ray.remote(**options)(engine_class).remote(
            engine_id, config.backend, launch.policy_config(config), seed=config.seed,
            task=launch.task_for(config), sampling=sampling,
        )

    return create


def step_times(metrics_path: Path) -> tuple[float, float]:
    """Mean seconds per step and trained samples per second, after the warm-up."""
    import json

    records = [json.loads(line) for line in metrics_path.read_text().splitlines()]
    measured = records[WARMUP_STEPS:]
    seconds = sum(r["step_s"] for r in measured)
    samples = sum(r["samples"] for r in measured)
    return seconds / len(measured), samples / seconds


def measure_mode(base: RunConfig, sync: bool, runs_dir: Path, engines: str,
                 engine_factory) -> tuple[float, float]:
    config = base.model_copy(
        update={"run_id": f"bench-{engines}-{'sync' if sync else 'async'}", "sync": sync}
    )
    result = run_job(config, JobOptions(runs_dir=runs_dir, progress=False, plot=False,
                                        engine_factory=engine_factory))
    assert result.ok, result.audit_problems
    return step_times(result.metrics_path)


def measure_failover(base: RunConfig, kills: int, runs_dir: Path) -> list[float]:
    """Seconds from each publisher SIGKILL to the next committed version."""
    kill_steps = {4 + 5 * i for i in range(kills)}
    killed_at: list[datetime] = []

    def kill_publisher(job: TrainingJob, step: int) -> None:
        if step in kill_steps:
            pid = ray.get(job.cells.actor(job.cells.publisher).pid.remote())
            killed_at.append(datetime.now(UTC).replace(tzinfo=None))
            os.kill(pid, signal.SIGKILL)

    config = base.model_copy(update={"run_id": "bench-failover",
                                     "num_rollout": max(kill_steps) + 4})
    result = run_job(config, JobOptions(runs_dir=runs_dir, progress=False, plot=False,
                                        on_step=kill_publisher))
    with Ledger.open(result.ledger_url, readonly=True) as ledger:
        commits = [e.recorded_at for e in ledger.events(config.run_id)
                   if e.kind == "weight_committed"]
    return [
        (min(c for c in commits if c > kill) - kill).total_seconds() for kill in killed_at
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--kills", type=int, default=3)
    parser.add_argument("--backend", choices=["torch", "megatron"], default="torch")
    parser.add_argument("--device-ms-per-token", type=float, default=15.0)
    args = parser.parse_args()
    os.environ.setdefault("RAY_DISABLE_USAGE_STATS", "1")

    base = RunConfig(num_rollout=args.steps, backend=args.backend, save_interval=1000,
                     heartbeat_timeout_s=5.0)
    with tempfile.TemporaryDirectory() as tmp:
        runs_dir = Path(tmp)
        started = time.monotonic()
        setups = {
            "cpu": launch.create_engine,
            "device": device_engine_factory(args.device_ms_per_token / 1000.0),
        }
        rows = {
            (engines, sync): measure_mode(base, sync, runs_dir, engines, factory)
            for engines, factory in setups.items()
            for sync in (True, False)
        }
        recoveries = measure_failover(base, args.kills, runs_dir)
        total = time.monotonic() - started

    print(f"backend {args.backend}, {args.steps} steps, {base.rollout_batch_size} groups x "
          f"{base.n_samples_per_prompt} samples per step, {os.cpu_count()} CPUs, device engine "
          f"{args.device_ms_per_token:g} ms per decoded token")
    print(f"{'engines':8} {'mode':12} {'s/step':>8} {'samples/s':>10}")
    for (engines, sync), (seconds, rate) in rows.items():
        print(f"{engines:8} {'sync' if sync else 'fully-async':12} {seconds:8.3f} {rate:10.1f}")
    for engines in setups:
        ratio = rows[(engines, False)][0] / rows[(engines, True)][0]
        verdict = "meets" if ratio <= 0.75 else "misses"
        print(f"{engines:8} async/sync time per step: {ratio:.2f} ({verdict} the 0.75 target)")
    print(f"publisher death -> next commit over {len(recoveries)} kills: "
          f"median {statistics.median(recoveries):.2f} s, max {max(recoveries):.2f} s")
    print(f"(bench wall time {total:.0f} s)")


if __name__ == "__main__":
    main()
