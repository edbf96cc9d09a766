"""``ledger plot``: committed version over time, promotions marked, and the staleness histogram.

What is read:

- the ledger (read-only): every event of the run up to its head. The top panel steps through
  the committed versions against seconds since ``run_started``; each ``cell_promoted`` is a
  dashed vertical line labelled ``<cell> e<epoch>``; each ``weight_update_aborted`` is a red
  ``x`` at the version then current; committed-but-unstamped versions are hollow circles.
- the run's metrics, if found: a JSON-lines file, one object per training step, as
  ``orchestrator run`` writes it (``runs/<run-id>/metrics.jsonl``; the names come from
  :mod:`ledger.run_layout`). Any key named ``staleness_hist`` or ``staleness_histogram``, bare
  or at the end of a ``/`` path (so ``rollout/fully_async/staleness_hist``, the layout's
  ``STALENESS_HISTOGRAM_KEY``), at the top level or one object down (e.g. under
  ``"metrics"``), holding ``{lag: count}`` (lag as an int or a string of one) or a list of
  counts indexed by lag, is summed over all lines into the bottom panel. Negative lags (a bug,
  DESIGN 4.6) are drawn in red. Lines that are not JSON objects are skipped and counted.
  Without ``--metrics``, the file is looked for beside a SQLite database (``metrics.jsonl``,
  then ``<run-id>/metrics.jsonl``); PostgreSQL has no "beside", so pass ``--metrics``.

Lines with an integer ``step`` and a number under ``reward/mean`` (as ``orchestrator run``
writes them) add a middle panel: mean reward per training step.

matplotlib is imported inside :func:`draw` (Agg canvas, no pyplot state), so the other
commands never pay for it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from ledger.cli.args import QueryError
from ledger.cli.query import replay, sqlite_path
from ledger.projections import RunState
from ledger.run_layout import METRICS_FILE, REWARD_KEY, STALENESS_HISTOGRAM_KEY, STEP_KEY

__all__ = ["Histogram", "default_metrics_path", "draw", "plot_run", "read_histogram"]

# The layout's key, by its last path part, and the longer spelling older runs wrote.
_HISTOGRAM_NAMES = (STALENESS_HISTOGRAM_KEY.rsplit("/", 1)[-1], "staleness_histogram")


@dataclass
class Histogram:
    """Staleness lag -> count, summed over a metrics file."""

    path: Path
    counts: dict[int, int] = field(default_factory=dict)
    rewards: list[tuple[int, float]] = field(default_factory=list)  # (step, mean reward)
    lines: int = 0
    skipped_lines: int = 0

    @property
    def found(self) -> bool:
        return bool(self.counts)


def default_metrics_path(url: str, run_id: str) -> Path | None:
    """``metrics.jsonl`` beside a SQLite database, or under ``<run-id>/`` beside it."""
    database = sqlite_path(url)
    if database is None:
        return None
    for candidate in (database.parent / METRICS_FILE, database.parent / run_id / METRICS_FILE):
        if candidate.is_file():
            return candidate
    return None


def _is_histogram_key(key: str) -> bool:
    return key.rsplit("/", 1)[-1] in _HISTOGRAM_NAMES


def _add(counts: dict[int, int], value: Any) -> bool:
    items = enumerate(value) if isinstance(value, list) else value.items()
    added = False
    for lag, count in items:
        try:
            lag_int, count_int = int(lag), int(count)
        except (TypeError, ValueError):
            continue
        counts[lag_int] = counts.get(lag_int, 0) + count_int
        added = True
    return added


def read_histogram(path: Path) -> Histogram:
    """Sum every staleness histogram in the JSON-lines file at ``path``, and collect the
    per-step mean reward (``REWARD_KEY`` beside an integer ``STEP_KEY``) where lines have one.

    Raises:
        QueryError: the file cannot be read.
    """
    histogram = Histogram(path)
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise QueryError(f"cannot read metrics {path}: {exc.strerror or exc}") from None
    for line in text.splitlines():
        if not line.strip():
            continue
        histogram.lines += 1
        try:
            record = json.loads(line)
        except ValueError:
            record = None
        if not isinstance(record, dict):
            histogram.skipped_lines += 1
            continue
        reward = record.get(REWARD_KEY)
        if isinstance(reward, int | float) and isinstance(record.get(STEP_KEY), int):
            histogram.rewards.append((record[STEP_KEY], float(reward)))
        scopes = [record] + [value for value in record.values() if isinstance(value, dict)]
        for scope in scopes:
            for key, value in scope.items():
                if _is_histogram_key(str(key)) and isinstance(value, dict | list):
                    _add(histogram.counts, value)
    return histogram


def draw(state: RunState, histogram: Histogram | None, out: Path, title: str) -> None:
    """Render the PNG (Agg canvas; matplotlib imported here, not at module import)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    show_histogram = histogram is not None and histogram.found
    show_rewards = histogram is not None and bool(histogram.rewards)
    panels = 1 + show_histogram + show_rewards
    figure = Figure(figsize=(9, 3.6 * panels), layout="constrained")
    FigureCanvasAgg(figure)
    axes = list(figure.subplots(panels, 1, squeeze=False)[:, 0])
    start = state.started_at

    def seconds(moment: datetime) -> float:
        return (moment - start).total_seconds() if start is not None else 0.0

    commits = sorted(state.commits.values(), key=lambda commit: commit.seq)
    times = [0.0] + [seconds(commit.recorded_at) for commit in commits]
    versions = [0] + [commit.version for commit in commits]
    top = axes[0]
    top.step(times, versions, where="post", color="tab:blue", label="committed version")
    top.plot(times, versions, "o", color="tab:blue", markersize=3)
    for promotion in state.promotions:
        at = seconds(promotion.recorded_at)
        top.axvline(at, color="tab:orange", linestyle="--", linewidth=1)
        top.annotate(
            f"{promotion.cell_id} e{promotion.epoch}", (at, 1), xycoords=("data", "axes fraction"),
            rotation=90, va="top", ha="right", fontsize=8, color="tab:orange",
        )
    if state.aborts:
        top.plot(
            [seconds(abort.recorded_at) for abort in state.aborts],
            [abort.head_version for abort in state.aborts],
            "x", color="tab:red", markersize=8, label="aborted update",
        )
    unstamped = [state.commits[v] for v in state.unstamped_versions]
    if unstamped:
        top.plot(
            [seconds(commit.recorded_at) for commit in unstamped],
            [commit.version for commit in unstamped],
            "o", markerfacecolor="none", markeredgecolor="tab:red", markersize=9,
            label="committed, not stamped",
        )
    top.yaxis.set_major_locator(MaxNLocator(integer=True))
    top.set_xlabel("seconds since run_started")
    top.set_ylabel("weight version")
    top.set_title(title)
    top.legend(loc="lower right", fontsize=8)
    if show_rewards:
        assert histogram is not None
        steps, rewards = zip(*sorted(histogram.rewards))
        reward_axis = axes[1]
        reward_axis.plot(steps, rewards, color="tab:purple", marker=".", markersize=4)
        reward_axis.xaxis.set_major_locator(MaxNLocator(integer=True))
        reward_axis.set_xlabel("training step")
        reward_axis.set_ylabel("mean reward")
        reward_axis.set_title("reward of the trained samples")
        _draw_evals(reward_axis, state)
    if show_histogram:
        assert histogram is not None
        lags = sorted(histogram.counts)
        bottom = axes[-1]
        bottom.bar(
            lags, [histogram.counts[lag] for lag in lags],
            color=["tab:red" if lag < 0 else "tab:green" for lag in lags],
        )
        bottom.xaxis.set_major_locator(MaxNLocator(integer=True))
        bottom.yaxis.set_major_locator(MaxNLocator(integer=True))
        bottom.set_xlabel("staleness (head version - oldest sample version)")
        bottom.set_ylabel("groups trained")
        bottom.set_title(f"staleness histogram ({histogram.path.name}, {histogram.lines} lines)")
    figure.savefig(out, format="png", dpi=100)


def plot_run(
    url: str, run_id: str | None, out: str, metrics: str | None = None
) -> dict[str, Any]:
    """Draw the run's PNG at ``out`` and return what was drawn (the database is only read).

    Raises:
        QueryError: an explicit ``metrics`` file that cannot be read; ``out`` not writable.
    """
    header, state = replay(url, run_id)
    if metrics is not None:
        metrics_path: Path | None = Path(metrics)
        if not metrics_path.is_file():
            raise QueryError(f"no metrics file at {metrics}")
    else:
        metrics_path = default_metrics_path(url, header["run_id"])
    histogram = read_histogram(metrics_path) if metrics_path is not None else None
    target = Path(out)
    try:
        draw(state, histogram, target, f"run {header['run_id']}: committed weight versions")
    except OSError as exc:
        raise QueryError(f"cannot write {out}: {exc.strerror or exc}") from None
    return {
        "header": header,
        "file": str(target),
        "commits": len(state.commits),
        "promotions": len(state.promotions),
        "aborted": len(state.aborts),
        "unstamped_versions": state.unstamped_versions,
        "metrics": None if metrics_path is None else str(metrics_path),
        "histogram": (
            None if histogram is None or not histogram.found
            else {str(lag): histogram.counts[lag] for lag in sorted(histogram.counts)}
        ),
    }


def _draw_evals(axis: Any, state: RunState) -> None:
    """Each eval set's mean reward at the step it was scored (``eval_finished``), over the
    training reward; nothing for a run without evals."""
    curves: dict[str, list[tuple[int, float]]] = {}
    for event in state.evals:
        metrics = event.payload.get("metrics")
        step, name = event.payload.get("train_step"), event.payload.get("name")
        if isinstance(metrics, dict) and isinstance(step, int) and "mean_reward" in metrics:
            curves.setdefault(str(name), []).append((step, float(metrics["mean_reward"])))
    for name, points in curves.items():
        steps, rewards = zip(*points)
        axis.plot(steps, rewards, marker="s", linestyle="--", label=f"eval {name}")
    if curves:
        axis.legend(loc="lower right", fontsize=8)
