"""rl-ledger against the peer a user would pick instead: TRL's ``GRPOTrainer``, side by side.

    python bench/vs_peer.py [--seeds 1 2 3] [--steps 60] [--threshold 0.4]
                            [--modes async sync] [--peer-python PY] [--quick]

Both sides train the same tiny HF Llama, made here by ``ensure_task_model`` (one directory per
seed, so both start from byte-identical weights; nothing is downloaded), on the same
``AdditionTask`` prompts and reward, with the same hyper-parameters: 16 prompts x 8 samples,
lr 3e-3, no KL, clip 0.2/0.28, token-mean loss, 3 new tokens (rl-ledger's defaults; its dual
clip and off-policy correction stay at their defaults too). rl-ledger runs as a user would
start it, ``orchestrator run --backend hf --engine vllm --model DIR`` (2 cells, 2 vLLM engines;
``sync`` adds ``--sync``); TRL runs ``bench/_trl_peer.py`` under ``--peer-python`` (default:
this interpreter), one process, HF ``generate``. Each side is one subprocess, timed from its
launch; the sides alternate, the order rotating every seed.

Per run: seconds to a rolling reward (window 5) of ``--threshold`` from launch and from the
end of step 1, steps to it, final reward (mean of the last 5 steps), s/step (after a 3-step
warm-up), start-up (launch to the end of step 1) and the whole process. Per side: medians over
the seeds with their spread, and each median's ratio to TRL's. Prints tables; asserts nothing.

Needs ``trl`` for ``--peer-python`` (``pip install -e '.[bench]'``) and the vllm extra here.
A missing or broken peer python is one line and exit 2.
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
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from _report import machine_line, rotated
from ledger.run_layout import REWARD_KEY

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
PEER = "trl"
WARMUP_STEPS = 3


@dataclass(frozen=True)
class Run:
    """One side's run: when it was launched and exited, and each step's reward and end time
    (``time.time()`` seconds)."""

    launched: float
    exited: float
    rewards: list[float]
    step_times: list[float]


@dataclass(frozen=True)
class Summary:
    """What one run says (None: the run never reached the threshold)."""

    steps_to: int | None
    from_launch_s: float | None
    from_step1_s: float | None
    final_reward: float
    s_per_step: float
    startup_s: float
    whole_s: float


def summarise(run: Run, threshold: float, window: int = 5) -> Summary:
    """The figures of ``run`` (see the module docstring).

    Raises:
        ValueError: the run recorded no step.
    """
    if not run.rewards:
        raise ValueError("the run recorded no step")
    reached = next((end for end in range(window, len(run.rewards) + 1)
                    if statistics.fmean(run.rewards[end - window:end]) >= threshold), None)
    first = run.step_times[0]
    measured = min(WARMUP_STEPS, len(run.step_times) - 1)
    span = len(run.step_times) - 1 - measured
    s_per_step = ((run.step_times[-1] - run.step_times[measured]) / span if span
                  else first - run.launched)
    return Summary(
        steps_to=reached,
        from_launch_s=None if reached is None else run.step_times[reached - 1] - run.launched,
        from_step1_s=None if reached is None else run.step_times[reached - 1] - first,
        final_reward=statistics.fmean(run.rewards[-window:]),
        s_per_step=s_per_step,
        startup_s=first - run.launched,
        whole_s=run.exited - run.launched,
    )


def _spread(values: list[float | None], form: str) -> str:
    """``median (min-max)`` of the runs that got there; ``never`` if fewer than half did."""
    reached = [v for v in values if v is not None]
    if len(reached) * 2 <= len(values):
        return "never"
    text = format(statistics.median(reached), form)
    return text if len(reached) == 1 else (
        f"{text} ({format(min(reached), form)}-{format(max(reached), form)})")


def _median(values: list[float | None]) -> float | None:
    reached = [v for v in values if v is not None]
    return statistics.median(reached) if len(reached) * 2 > len(values) else None


COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("from_launch_s", "s to reward, from launch", ".1f"),
    ("from_step1_s", "s to reward, from step 1", ".1f"),
    ("steps_to", "steps to reward", ".0f"),
    ("final_reward", "final reward", ".3f"),
    ("s_per_step", "s/step", ".3f"),
    ("startup_s", "start-up to step 1 (s)", ".1f"),
    ("whole_s", "whole process (s)", ".1f"),
)


def table(results: dict[str, list[Summary]], threshold: float) -> str:
    """The markdown tables: medians (min-max) per side, then each median over TRL's."""
    head = " | ".join(title.replace("to reward", f"to reward {threshold:g}")
                      for _, title, _ in COLUMNS)
    lines = [f"| side | runs | {head} |", "|---|---|" + "---|" * len(COLUMNS)]
    for side, rows in results.items():
        cells = " | ".join(_spread([getattr(r, key) for r in rows], form)
                           for key, _, form in COLUMNS)
        lines.append(f"| {side} | {len(rows)} | {cells} |")
    peer = results.get(PEER)
    if peer:
        lines += ["", f"| ratio of medians to {PEER} | " + " | ".join(
            t for _, t, _ in COLUMNS) + " |", "|---|" + "---|" * len(COLUMNS)]
        for side, rows in results.items():
            if side == PEER:
                continue
            ratios = []
            for key, _, _ in COLUMNS:
                ours, theirs = (_median([getattr(r, key) for r in rows]),
                                _median([getattr(r, key) for r in peer]))
                ratios.append(f"{ours / theirs:.2f}x" if ours is not None and theirs else "-")
            lines.append(f"| {side} | " + " | ".join(ratios) + " |")
    return "\n".join(lines)


def run_peer(python: str, model: Path, seed: int, steps: int, work: Path) -> Run:
    """TRL's side: ``bench/_trl_peer.py`` under ``python``.

    Raises:
        RuntimeError: the peer failed (its stderr's tail is in the message).
    """
    out = work / f"trl-seed{seed}.jsonl"
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1"}
    launched = time.time()
    done = subprocess.run([python, str(BENCH / "_trl_peer.py"), "--model", str(model),
                           "--seed", str(seed), "--steps", str(steps), "--out", str(out)],
                          env=env, capture_output=True, text=True, check=False)
    exited = time.time()
    if done.returncode != 0 or not out.exists():
        raise RuntimeError(f"TRL peer failed ({done.returncode}): {done.stderr[-2000:]}")
    records = [json.loads(line) for line in out.read_text().splitlines()]
    return Run(launched, exited, [r["reward"] for r in records], [r["time"] for r in records])


def run_ours(mode: str, model: Path, seed: int, steps: int, work: Path) -> Run:
    """rl-ledger's side: ``orchestrator run`` as a user starts it, on ``model``.

    Raises:
        RuntimeError: the run failed (its output's tail is in the message).
    """
    run_id = f"peer-{mode}-seed{seed}"
    command = [sys.executable, "-c", "from orchestrator.cli import main; main()", "run",
               "--backend", "hf", "--engine", "vllm", "--model", str(model),
               "--seed", str(seed), "--num-rollout", str(steps), "--run-id", run_id,
               "--runs-dir", str(work), "--save-interval", str(10**6),
               "--rollout-batch-size", "16", "--n-samples-per-prompt", "8", "--lr", "3e-3",
               "--eps-clip", "0.2", "--eps-clip-high", "0.28", *(["--sync"] if mode == "sync"
                                                                  else [])]
    env = {**os.environ, "PYTHONPATH": str(REPO), "RAY_DISABLE_USAGE_STATS": "1"}
    launched = time.time()
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False,
                          cwd=work)
    exited = time.time()
    metrics = work / run_id / "metrics.jsonl"
    if done.returncode != 0 or not metrics.exists():
        raise RuntimeError(f"rl-ledger {mode} failed ({done.returncode}): "
                           f"{(done.stdout + done.stderr)[-2000:]}")
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    return Run(launched, exited, [r[REWARD_KEY] for r in records],
               [datetime.fromisoformat(r["time"]).timestamp() for r in records])


def check_peer_python(python: str) -> str | None:
    """None if ``python`` runs and imports ``trl``; else the one line that says why not."""
    try:
        done = subprocess.run([python, "-c", "import trl, datasets"], capture_output=True,
                              text=True, timeout=300, check=False)
    except OSError as exc:
        return f"--peer-python {python}: cannot run it ({exc.strerror})"
    if done.returncode != 0:
        return (f"--peer-python {python}: cannot import trl (pip install -e '.[bench]' "
                "installs it)")
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--threshold", type=float, default=0.4)
    parser.add_argument("--modes", nargs="+", choices=["async", "sync"], default=["async"])
    parser.add_argument("--peer-python", default=sys.executable,
                        help="the python that runs TRL (a venv with trl installed)")
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: 8 steps, seed 1, threshold 0.05")
    args = parser.parse_args(argv)
    if args.quick:
        args.steps, args.seeds, args.threshold = 8, [1], 0.05
    problem = check_peer_python(args.peer_python)
    if problem is not None:
        print(problem, file=sys.stderr)
        return 2
    from actors.policies.hf_policy import ensure_task_model
    from actors.task import TOKENIZER

    sides = [PEER, *(f"rl-ledger {mode}" for mode in args.modes)]
    print(f"{machine_line()}; {args.steps} steps per run, seeds {args.seeds}, threshold "
          f"{args.threshold:g} (rolling mean over 5 steps); sides alternate")
    results: dict[str, list[Summary]] = {side: [] for side in sides}
    with tempfile.TemporaryDirectory(prefix="vs-peer-") as tmp:
        work = Path(tmp)
        for index, seed in enumerate(args.seeds):
            model = ensure_task_model(work / f"model-seed{seed}", TOKENIZER.symbols, seed=seed)
            for side in rotated(sides, index):
                try:
                    run = (run_peer(args.peer_python, model, seed, args.steps, work)
                           if side == PEER
                           else run_ours(side.split()[-1], model, seed, args.steps, work))
                except RuntimeError as exc:
                    print(f"seed {seed} {side}: {exc}", file=sys.stderr)
                    return 1
                summary = summarise(run, args.threshold)
                results[side].append(summary)
                print(f"  seed {seed} {side:17} " + ", ".join(
                    f"{key} {'never' if value is None else format(value, form)}"
                    for key, _, form in COLUMNS
                    for value in [getattr(summary, key)]), flush=True)
    print()
    print(table(results, args.threshold))
    return 0


if __name__ == "__main__":
    sys.exit(main())
