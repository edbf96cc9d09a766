"""The GPU check: does a real job run on this machine's CUDA, and how fast? (issue 21)

    python bench/gpu_check.py [--quick] [--dry-run]      # make gpu-check [ARGS=--quick]

Without a CUDA device it prints one line and exits 0 (nothing is run). With one, in order:

1. the ``gpu``-marked tests (``tests/actors/test_gpu.py``): placement on the GPU, a 2-cell quorum
   (NCCL with a GPU per cell, gloo when they share one), a CUDA IPC weight transfer whose
   log-probs match the trainer's, a CUDA <-> CPU checkpoint round trip;
2. a phased weight update on the GPU (a CUDA cell, two CUDA engines sharing its GPU), once per
   path (object store, CUDA IPC), alternating: milliseconds per phase;
3. ``orchestrator run --device cuda --engine vllm --backend hf`` on a tiny Llama made locally
   (nothing is downloaded), async then sync, each followed by ``ledger verify --witness``;
4. one kill-publisher drill (``orchestrator drill --scenario kill-publisher-mid-train``), on
   CUDA since drills resolve ``--device auto`` from Ray's GPUs.

Budget: at most 8 minutes on one GPU from a fresh machine with the wheels installed
(``make install-gpu``); ``--quick`` (3 minutes) runs 1, 2 with fewer updates, and an async run
of fewer steps. ``--dry-run`` prints the plan and runs nothing. Prints one table; exits 1 if
any step failed (its output tail is printed), else 0.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
PHASES = ("pause", "stage", "transfer", "stamp")  # stamp: stamp and resume, one call


def _plan(quick: bool, runs_dir: Path) -> list[tuple[str, list[str], float]]:
    """``(name, command, timeout_s)`` of every subprocess step, in order."""
    steps = 8 if quick else 20
    tests = [sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-x", "-p", "no:cacheprovider",
             "tests/actors/test_gpu.py"]
    plan = [("gpu tests", tests, 150.0)]
    for mode in ("async",) if quick else ("async", "sync"):
        run = [str(BIN / "orchestrator"), "run", "--device", "cuda", "--engine", "vllm",
               "--backend", "hf", "--num-rollout", str(steps), "--run-id", f"gpu-check-{mode}",
               "--runs-dir", str(runs_dir), "--no-progress", *(["--sync"] if mode == "sync"
                                                                else [])]
        verify = [str(BIN / "ledger"), "verify", "--witness", str(runs_dir / f"gpu-check-{mode}")]
        plan += [(f"run {mode}", run, 150.0 if quick else 120.0), (f"verify {mode}", verify, 30.0)]
    if not quick:
        drill = [str(BIN / "orchestrator"), "drill", "--scenario", "kill-publisher-mid-train",
                 "--runs-dir", str(runs_dir / "drills")]
        plan.append(("drill kill-publisher", drill, 150.0))
    return plan


def _phased_updates(updates: int) -> dict[str, dict[str, float]]:
    """Median ms per phase of a weight update from a CUDA cell to two CUDA engines on its GPU,
    per path, the paths alternating."""
    import ray
    import torch

    from actors.engines.rollout_engine import ROLLOUT_ENGINE_ACTOR_OPTIONS, RolloutEngine
    from actors.policies.policy import PolicyConfig
    from actors.task import TOKENIZER
    from actors.train_cell import TrainCell
    from actors.weight_paths import CUDA_IPC, OBJECT_STORE
    from actors.publishing.weight_sync import (
        begin_engine_update,
        finalize_and_resume_engines,
        load_staged_weights,
        stage_weights,
    )

    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False,
             configure_logging=False)
    policy = PolicyConfig(vocab_size=TOKENIZER.vocab_size)
    options = {**ROLLOUT_ENGINE_ACTOR_OPTIONS, "num_cpus": 0.5, "num_gpus": 0.25}
    engines = [ray.remote(**options)(RolloutEngine).remote(f"engine-{i}", "torch", policy,
                                                          device="cuda", dtype="float32")
               for i in range(2)]
    cell = TrainCell("cell-0", "torch", policy, device="cuda", dtype="float32")
    timings: dict[str, list[dict[str, float]]] = {OBJECT_STORE: [], CUDA_IPC: []}
    try:
        for index in range(updates + 1):  # the first round warms up
            order = [OBJECT_STORE, CUDA_IPC] if index % 2 == 0 else [CUDA_IPC, OBJECT_STORE]
            for path in order:
                row: dict[str, float] = {}
                started = time.perf_counter()
                begin_engine_update(engines, 1)
                row["pause"] = time.perf_counter() - started
                started = time.perf_counter()
                staged = stage_weights(engines, cell.outgoing_weights(), path)
                torch.cuda.synchronize()
                row["stage"] = time.perf_counter() - started
                started = time.perf_counter()
                load_staged_weights(engines, staged, 1, "full")
                row["transfer"] = time.perf_counter() - started
                report = finalize_and_resume_engines(engines, index + 1, 1)
                row["stamp"] = report.stamp_s
                if index:
                    timings[path].append(row)
    finally:
        ray.shutdown()
    return {path: {phase: 1000 * statistics.median(r[phase] for r in rows) for phase in PHASES}
            for path, rows in timings.items()}


def _run_figures(runs_dir: Path, mode: str) -> dict[str, float]:
    """tokens/s, median step s and median update ms of one run, from its metrics.jsonl."""
    lines = (runs_dir / f"gpu-check-{mode}" / "metrics.jsonl").read_text().splitlines()
    rows = [json.loads(line) for line in lines if line.strip()]
    tokens = sum(row.get("train/num_tokens", 0.0) for row in rows)
    seconds = sum(row.get("step_s", 0.0) for row in rows)
    return {"tokens/s": tokens / seconds if seconds else 0.0,
            "step s": statistics.median(row["step_s"] for row in rows),
            "update ms": 1000 * statistics.median(row.get("time/update_weights_s", 0.0)
                                                  for row in rows)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the 3-minute variant")
    parser.add_argument("--dry-run", action="store_true", help="print the plan, run nothing")
    args = parser.parse_args()
    os.environ.setdefault("RAY_DISABLE_USAGE_STATS", "1")
    if args.dry_run:
        for name, command, timeout_s in _plan(args.quick, Path(tempfile.gettempdir(), "RUNS")):
            print(f"{name} (<= {timeout_s:g}s): {' '.join(command)}")
        return 0
    import torch

    if not torch.cuda.is_available():
        print(f"gpu-check: skipped: no CUDA device (torch {torch.__version__}); nothing was run")
        return 0
    runs_dir = Path(tempfile.mkdtemp(prefix="rl-ledger-gpu-check-"))
    plan = _plan(args.quick, runs_dir)
    started, failed = time.monotonic(), []
    rows: dict[str, dict[str, float | str]] = {}
    for name, command, timeout_s in plan:
        step_started = time.monotonic()
        try:
            result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True,
                                    timeout=timeout_s, check=False)
            ok, tail = result.returncode == 0, (result.stdout + result.stderr)[-3000:]
        except subprocess.TimeoutExpired:
            ok, tail = False, f"timed out after {timeout_s:g}s"
        rows[name] = {"s": time.monotonic() - step_started, "result": "ok" if ok else "FAILED"}
        if not ok:
            failed.append(name)
            print(f"--- {name} failed:\n{tail}", file=sys.stderr)
        elif name.startswith("run "):
            rows[name].update(_run_figures(runs_dir, name.split()[1]))
        if name == "gpu tests":
            phases_started = time.monotonic()
            for path, phases in _phased_updates(3 if args.quick else 10).items():
                rows[f"update {path}"] = {"s": time.monotonic() - phases_started,
                                          "result": "ok", **phases}
    print(f"gpu-check{' --quick' if args.quick else ''}: {torch.cuda.get_device_name(0)}, "
          f"torch {torch.__version__}, {time.monotonic() - started:.0f}s in all")
    columns = ("result", "s", "tokens/s", "step s", "update ms", *(f"{p} ms" for p in PHASES))
    print("| step | " + " | ".join(columns) + " |")
    print("|---|" + "---|" * len(columns))
    for name, row in rows.items():
        cells = [row.get(column, row.get(column.removesuffix(" ms"), "")) for column in columns]
        print(f"| {name} | " + " | ".join(f"{c:.2f}" if isinstance(c, float) else str(c)
                                          for c in cells) + " |")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
