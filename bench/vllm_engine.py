"""The vLLM engine beside the built-in one, in the same run: start-up, tokens/s, weight update,
async/sync.

    python bench/vllm_engine.py [--updates 10] [--groups 32] [--steps 12] [--quick]

Needs the vllm extra (``make install-vllm``). Each engine is a Ray actor with the same CPU
share; the built-in engine serves the built-in GPT policy (hidden 64, 4 heads, MLP 256), the
vLLM engine the tiny task Llama (hidden 64, 2 heads, SwiGLU 128), both ~0.1M parameters, the
task's 18-token vocabulary, float32.

- **start-up**: from creating the actor to its first answer (vLLM: import, ``LLMEngine``
  build, KV cache), and vLLM's own ``LLMEngine`` build time.
- **tokens/s**: ``--groups`` generate calls of 8 samples in flight at once; response tokens
  over wall time.
- **update**: one full weight update through the real cell sequence (``weight_update_started``,
  pause, transfer, ``commit_weights``, the one finalize, ``engines_stamped``) into one engine,
  median and spread over ``--updates``; vLLM's includes ``reload_weights`` and
  ``reset_prefix_cache``.
- **async/sync**: ``orchestrator run`` for ``--steps`` steps (1 cell, 1 engine, 8 groups of 8)
  in ``--sync`` and fully-async mode; seconds per step after a 3-step warm-up, and the ratio.

Prints tables; asserts nothing (a shared machine is noisy: read the spread).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import ray

from actors.policies.hf_policy import HFPolicyConfig, ensure_task_model
from actors.llama_cell import LlamaTrainCell
from actors.policies.policy import PolicyConfig
from actors.engines.rollout_engine import ROLLOUT_ENGINE_ACTOR_OPTIONS, RolloutEngine
from actors.task import TOKENIZER, AdditionTask
from actors.train_cell import TrainCell
from actors.engines.vllm.engine import VLLM_ENGINE_ACTOR_OPTIONS, VLLMEngine
from ledger import Ledger
from orchestrator.config import RunConfig
from orchestrator.control.driver import JobOptions, run_job

ENGINE_CPUS = 0.25
TASK = AdditionTask(seed=0)
WARMUP_STEPS = 3


def start_engine(kind: str, model_dir: str):
    """(actor, seconds to first answer, vLLM's own build seconds or None)."""
    started = time.monotonic()
    if kind == "builtin":
        options = {**ROLLOUT_ENGINE_ACTOR_OPTIONS, "num_cpus": ENGINE_CPUS}
        engine = ray.remote(**options)(RolloutEngine).remote(
            "builtin-0", "torch", PolicyConfig(vocab_size=TOKENIZER.vocab_size), seed=0,
            task=TASK)
    else:
        options = {**VLLM_ENGINE_ACTOR_OPTIONS, "num_cpus": ENGINE_CPUS}
        engine = ray.remote(**options)(VLLMEngine).remote("vllm-0", HFPolicyConfig(model_dir),
                                                          seed=0, task=TASK)
    health = ray.get(engine.health.remote())
    return engine, time.monotonic() - started, health.get("startup_s")


def tokens_per_second(engine, groups: int) -> float:
    ray.get(engine.generate.remote(TASK.make_prompt(0), 8, 0))  # warm
    started = time.monotonic()
    calls = [engine.generate.remote(TASK.make_prompt(i), 8, i) for i in range(groups)]
    tokens = sum(len(s.response_tokens) for samples in ray.get(calls) for s in samples)
    return tokens / (time.monotonic() - started)


def update_seconds(kind: str, engine, model_dir: str, updates: int, work: Path) -> list[float]:
    url = f"sqlite:///{work / f'{kind}-updates.db'}"
    if kind == "builtin":
        cell = TrainCell("cell-0", "torch", PolicyConfig(vocab_size=TOKENIZER.vocab_size),
                         ledger_url=url, run_id=kind)
    else:
        cell = LlamaTrainCell("cell-0", "hf", HFPolicyConfig(model_dir), ledger_url=url,
                              run_id=kind)
    ledger = Ledger.open(url)
    ledger.start_run(kind)
    epoch = ledger.promote(kind, "cell-0", reason="start")
    seconds = []
    for _ in range(updates):
        started = time.monotonic()
        cell.update_weights([engine], epoch)
        seconds.append(time.monotonic() - started)
    ledger.close()
    cell.close()
    return seconds


def seconds_per_step(kind: str, sync: bool, steps: int, runs_dir: Path) -> float:
    engine_fields = {"engine": "vllm", "backend": "hf"} if kind == "vllm" else {}
    config = RunConfig(run_id=f"{kind}-{'sync' if sync else 'async'}", num_rollout=steps,
                       num_cells=1, num_engines=1, rollout_batch_size=8,
                       n_samples_per_prompt=8, sync=sync, **engine_fields)
    result = run_job(config, JobOptions(runs_dir=runs_dir, progress=False, plot=False))
    if not result.ok:
        raise RuntimeError(f"{config.run_id} failed its audit: {result.audit_problems}")
    records = [json.loads(line) for line in result.metrics_path.read_text().splitlines()]
    measured = records[WARMUP_STEPS:] or records
    return sum(r["step_s"] for r in measured) / len(measured)


def spread(values: list[float]) -> str:
    return f"{statistics.median(values) * 1000:7.1f} ms ({min(values) * 1000:.1f}-" \
           f"{max(values) * 1000:.1f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--updates", type=int, default=10)
    parser.add_argument("--groups", type=int, default=32)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--quick", action="store_true", help="3 updates, 8 groups, 6 steps")
    args = parser.parse_args()
    if args.quick:
        args.updates, args.groups, args.steps = 3, 8, 6
    os.environ.setdefault("RAY_DISABLE_USAGE_STATS", "1")
    ray.init(address="local", num_cpus=os.cpu_count() or 1, include_dashboard=False,
             log_to_driver=False, configure_logging=False)
    print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}")
    with tempfile.TemporaryDirectory(prefix="bench-vllm-") as scratch:
        work = Path(scratch)
        model_dir = str(ensure_task_model(work / "model", TOKENIZER.symbols, seed=3))
        rows = {}
        for kind in ("builtin", "vllm"):
            engine, ready_s, build_s = start_engine(kind, model_dir)
            rate = tokens_per_second(engine, args.groups)
            updates = update_seconds(kind, engine, model_dir, args.updates, work)
            ray.kill(engine, no_restart=True)
            rows[kind] = (ready_s, build_s, rate, updates)
        print(f"\n{'engine':8} {'start-up':>10} {'(LLMEngine)':>12} {'tokens/s':>9}  "
              f"{'full update: median (min-max)':>32}")
        for kind, (ready_s, build_s, rate, updates) in rows.items():
            build = f"{build_s:.1f} s" if build_s is not None else "-"
            print(f"{kind:8} {ready_s:8.1f} s {build:>12} {rate:9.0f}  {spread(updates):>32}")
        print(f"\n{'engine':8} {'sync s/step':>12} {'async s/step':>13} {'async/sync':>11}")
        for kind in ("builtin", "vllm"):
            sync_s = seconds_per_step(kind, True, args.steps, work / "runs")
            async_s = seconds_per_step(kind, False, args.steps, work / "runs")
            print(f"{kind:8} {sync_s:12.3f} {async_s:13.3f} {async_s / sync_s:11.2f}")
    ray.shutdown()


if __name__ == "__main__":
    main()
