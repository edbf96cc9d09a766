"""Start-up of the default job (issue 25 item 2): launch of ``orchestrator run --num-rollout 3``
to the time step 1 is recorded in the run's ``metrics.jsonl``, and where it goes.

Each run is a fresh process (a fresh local Ray cluster), launched the way a user launches it.
Variants run alternately (:func:`_report.rotated`), so a machine that gets busier part-way
through loads every variant alike:

- engines: ``builtin`` (the default job) and, when vLLM is installed, ``vllm``
  (``--backend hf --engine vllm``: the job makes its task model first) and ``vllm-model``
  (the same with ``--model DIR``, a task model made once beforehand, as ``bench/vs_peer.py``
  runs it); ``--engines builtin`` runs the default job alone;
- checkouts: ``--source DIR`` (repeatable; default this one) runs the CLI of each checkout of
  this project given (``git worktree`` of two commits, say), to compare start-ups side by side.

The phases come from the driver's own ``start-up:`` log lines (absent in a checkout that
predates them, shown as ``-``) and from step 1's metrics line:

- ``interpreter + imports``: launch to ``run_job`` entered;
- ``checks + ledger``: the pre-flight checks and opening the ledger (torch starts loading in the
  background here);
- ``ray.init``: starting the local cluster;
- ``actors``: after ``ray.init`` to the start of step 1 (engines, cells and the rollout
  manager start, the first quorum, the first promotion);
- ``step 1``: the first step itself (its drain, train step and weight update).

``--quick``: the default job once (the bench smoke test). Prints a markdown table, seconds.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from _report import machine_line, median_spread, rotated

ROOT = Path(__file__).resolve().parents[1]
ENGINE_ARGS = {"builtin": [], "vllm": ["--backend", "hf", "--engine", "vllm"],
               "vllm-model": ["--backend", "hf", "--engine", "vllm", "--model", "{model}"]}
PHASES = ("interpreter + imports", "checks + ledger", "ray.init", "actors", "step 1")
# The CLI, with the driver's start-up lines on stderr (the CLI itself configures no logging).
LAUNCHER = ("import logging, sys; logging.basicConfig(level=logging.WARNING, format='%(message)s');"
            " logging.getLogger('orchestrator.control.driver').setLevel(logging.INFO);"
            " from orchestrator.cli import main; main(sys.argv[1:])")
MARK = re.compile(r"^start-up: (.+) at (\d+\.\d+)$", re.MULTILINE)


@dataclass
class Run:
    """One launch: its total and its phases, seconds."""

    total_s: float
    wall_s: float
    phases: dict[str, float] = field(default_factory=dict)


def launch_once(source: Path, engine: str, runs_dir: Path, steps: int, timeout: float,
                model: Path | None = None) -> Run:
    """Launch ``orchestrator run`` from ``source`` once and time it to step 1 (``model``: the
    directory of the ``vllm-model`` variant).

    Raises:
        RuntimeError: the run failed or wrote no step.
    """
    env = {**os.environ, "RAY_DISABLE_USAGE_STATS": "1", "PYTHONPATH": str(source)}
    command = [sys.executable, "-c", LAUNCHER, "run", "--num-rollout", str(steps),
               "--runs-dir", str(runs_dir), "--no-progress",
               *(argument.format(model=model) for argument in ENGINE_ARGS[engine])]
    launched = time.time()
    done = subprocess.run(command, cwd=source, env=env, capture_output=True, text=True,
                          timeout=timeout, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{engine} run from {source} failed ({done.returncode}): "
                           f"{done.stderr[-2000:]}")
    metrics = sorted(runs_dir.glob("*/metrics.jsonl"), key=lambda path: path.stat().st_mtime)
    if not metrics:
        raise RuntimeError(f"{engine} run from {source} wrote no metrics: {done.stderr[-2000:]}")
    step = json.loads(metrics[-1].read_text().splitlines()[0])
    step_at = datetime.datetime.fromisoformat(step["time"]).timestamp()
    run = Run(total_s=step_at - launched, wall_s=float(step["wall_s"]))
    marks = {name: float(at) for name, at in MARK.findall(done.stderr)}
    step_s = float(step["step_s"])
    if {"run_job entered", "ray.init called", "ray.init returned"} <= marks.keys():
        run.phases = {
            "interpreter + imports": marks["run_job entered"] - launched,
            "checks + ledger": marks["ray.init called"] - marks["run_job entered"],
            "ray.init": marks["ray.init returned"] - marks["ray.init called"],
            "actors": step_at - step_s - marks["ray.init returned"],
        }
    run.phases["step 1"] = step_s
    return run


def task_model(directory: Path) -> Path:
    """The task's tiny Llama for the ``vllm-model`` variant, made once by this checkout."""
    sys.path.insert(0, str(ROOT))
    from actors.policies.hf_policy import ensure_task_model
    from actors.task import TOKENIZER

    return ensure_task_model(directory, TOKENIZER.symbols, seed=1)


def _cell(values: list[float]) -> str:
    if not values:
        return "-"
    middle, low, high = median_spread(values)
    return f"{middle:.2f} ({low:.2f}-{high:.2f})" if len(values) > 1 else f"{middle:.2f}"


def table(results: dict[str, list[Run]]) -> str:
    """The markdown table: one row per variant, medians (min-max) over its runs."""
    head = ["variant", "runs", "launch -> step 1", "driver wall_s at step 1", *PHASES]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for label, runs in results.items():
        row = [label, str(len(runs)), _cell([run.total_s for run in runs]),
               _cell([run.wall_s for run in runs])]
        row += [_cell([run.phases[phase] for run in runs if phase in run.phases])
                for phase in PHASES]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="runs per variant")
    parser.add_argument("--engines", default=None,
                        help="comma-separated: builtin,vllm,vllm-model (default: builtin and "
                             "vllm, vllm when installed)")
    parser.add_argument("--source", action="append", type=Path, default=[],
                        help="a checkout to run (repeatable; default: this one)")
    parser.add_argument("--steps", type=int, default=3, help="--num-rollout of each run")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per run")
    parser.add_argument("--quick", action="store_true", help="the default job once")
    args = parser.parse_args()
    engines = (args.engines.split(",") if args.engines else
               ["builtin", *(["vllm"] if importlib.util.find_spec("vllm") else [])])
    if args.quick:
        engines, args.repeats, args.source = ["builtin"], 1, []
    sources = [path.resolve() for path in args.source] or [ROOT]
    variants = [(source, engine) for source in sources for engine in engines]

    def label(source: Path, engine: str) -> str:
        return engine if len(sources) == 1 else f"{engine} @ {source.name}"

    print(f"start-up of `orchestrator run --num-rollout {args.steps}`; {machine_line()}")
    results: dict[str, list[Run]] = {label(*variant): [] for variant in variants}
    with tempfile.TemporaryDirectory(prefix="startup-bench-") as scratch:
        model = task_model(Path(scratch) / "model") if "vllm-model" in engines else None
        for repeat in range(args.repeats):
            for number, (source, engine) in enumerate(rotated(variants, repeat)):
                runs_dir = Path(scratch) / f"r{repeat}-{number}"
                run = launch_once(source, engine, runs_dir, args.steps, args.timeout, model)
                results[label(source, engine)].append(run)
                print(f"  {label(source, engine)}: {run.total_s:.2f} s", file=sys.stderr,
                      flush=True)
    print()
    print(table(results))


if __name__ == "__main__":
    main()
