"""What the ``orchestrator`` command prints: the end-of-run summary, the drill table and the
chaos campaign's verdict.

Presentation only: the figures come from :class:`~orchestrator.control.driver.JobResult` and
:class:`~orchestrator.drills.runner.DrillResult` and
:class:`~orchestrator.chaos.campaign.CampaignResult`; nothing here computes or decides.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TextIO

from rich.console import Console
from rich.table import Table

from ledger.cli.args import audit_command
from ledger.redact import redact_url

if TYPE_CHECKING:
    from orchestrator.chaos.campaign import CampaignResult
    from orchestrator.control.driver import JobResult
    from orchestrator.drills.runner import DrillResult

__all__ = ["ChaosTable", "DrillTable", "print_run_summary"]

_DRILL_COLUMNS = ("scenario", "fault point", "step", "recover s", "versions", "neg. staleness",
                  "groups lost", "verdict")
_PROBLEMS_SHOWN = 10
_AUDIT_PROBLEMS_SHOWN = 20


class DrillTable:
    """The verdict table: one row per drill, problems of failed drills below it.

    Rows are added as drills finish (``add`` is the runner's ``on_result`` callback) and the
    table is printed once, at the end.
    """

    def __init__(self) -> None:
        self.table = Table(title="recovery drills")
        for column in _DRILL_COLUMNS:
            self.table.add_column(column)
        self.failures: list[tuple[str, list[str]]] = []

    def add(self, result: DrillResult) -> None:
        """Add one drill's row; remember its problems if it failed."""
        plan = result.plan
        self.table.add_row(
            plan.scenario, plan.point, str(plan.step + 1),
            "-" if result.recover_s is None else f"{result.recover_s:.2f}",
            f"{result.version_before} -> {result.version_after}",
            _dash(result.negative_staleness), _dash(result.groups_lost),
            "[green]pass[/green]" if result.passed else "[red]FAIL[/red]",
        )
        if not result.passed:
            self.failures.append((f"{plan.scenario} ({result.run_id})", result.problems))

    def print(self) -> None:
        """Print the table, then the first problems of each failed drill."""
        console = Console()
        if not console.is_terminal:
            console = Console(width=150)  # a log file or pipe: do not truncate the columns
        console.print(self.table)
        for name, problems in self.failures:
            for problem in problems[:_PROBLEMS_SHOWN]:
                console.print(f"[red]{name}:[/red] {problem}", markup=True, highlight=False)


def _dash(value: object) -> str:
    return "-" if value is None else str(value)


def print_run_summary(result: JobResult) -> None:
    """The end-of-run summary: figures in a table, artefact paths on lines of their own."""
    table = Table(title=f"run {result.run_id}", show_header=False, box=None)
    table.add_row("steps", str(result.steps))
    table.add_row("wall time", f"{result.wall_s:.1f} s")
    table.add_row("mean reward", f"{result.reward_first:.3f} (first steps) -> "
                                 f"{result.reward_last:.3f} (last steps)")
    table.add_row("committed versions", f"1..{result.head_version}")
    table.add_row("promotions", str(result.promotions))
    table.add_row("negative staleness", str(result.negative_staleness_total))
    table.add_row("audit", "clean" if not result.audit_problems
                  else f"{len(result.audit_problems)} problems")
    console = Console()
    console.print(table)
    # Paths go on lines of their own, never wrapped, so they can be copied or grepped.
    ledger_url = redact_url(result.ledger_url)  # never print a password
    console.print(f"ledger:  {ledger_url}", soft_wrap=True, highlight=False)
    console.print(f"metrics: {result.metrics_path}", soft_wrap=True, highlight=False)
    console.print(f"plot:    {result.plot_path or '-'}", soft_wrap=True, highlight=False)
    for problem in result.audit_problems[:_AUDIT_PROBLEMS_SHOWN]:
        console.print(f"[red]audit:[/red] {problem}", soft_wrap=True)
    # Runnable and safe to print: no password (libpq reads PGPASSWORD or ~/.pgpass).
    hint = "audit it: " + audit_command(result.ledger_url, result.run_id, result.run_dir)
    console.print(hint, soft_wrap=True, highlight=False)


_CHAOS_COLUMNS = ("fault kind", "planned", "planned in a recovery", "fired", "in a recovery",
                  "recovered", "recover p50 s", "recover p99 s")
_BREACHES_SHOWN = 20


class ChaosTable:
    """The campaign verdict: one line per campaign (seed, steps, faults, breaches, reward
    against fault-free), then one table of faults by kind over every campaign added (planned,
    planned into another's recovery, fired, fired while an earlier fault was still recovering
    as the ledger shows it, recovered, recovery time p50/p99), then the breaches, each naming
    its fault."""

    def __init__(self) -> None:
        self.results: list[CampaignResult] = []

    def add(self, result: CampaignResult) -> None:
        """Add one campaign (the runner's ``on_result`` callback)."""
        self.results.append(result)

    def print(self, file: TextIO | None = None) -> None:
        """Print the campaign lines, the faults-by-kind table and every campaign's breaches
        (to ``file``, default standard output)."""
        from orchestrator.chaos.nemesis import FaultKind
        from orchestrator.chaos.recovery import percentile

        console = Console(file=file)
        if not console.is_terminal:
            console = Console(file=file, width=150)
        runs = Table(title="chaos campaigns")
        for column in ("seed", "backend", "steps", "processes", "faults fired", "breaches",
                       "reward (fault-free)", "wall s", "verdict"):
            runs.add_column(column)
        for result in self.results:
            reward = "-" if result.final_reward is None else f"{result.final_reward:.3f}"
            if result.baseline_reward is not None:
                reward += f" ({result.baseline_reward:.3f})"
            runs.add_row(str(result.options.seed), result.ledger_url.split(":", 1)[0],
                         f"{result.verdict.steps_trained}/{result.options.steps}",
                         str(result.job_processes),
                         f"{len(result.fired)}/{len(result.schedule)}",
                         str(len(result.verdict.breaches)), reward, f"{result.wall_s:.0f}",
                         "[green]pass[/green]" if result.ok else "[red]FAIL[/red]")
        kinds = Table(title="faults by kind")
        for column in _CHAOS_COLUMNS:
            kinds.add_column(column)
        for kind in FaultKind:
            planned = [f for r in self.results for f in r.schedule if f.kind is kind]
            fired = [f for r in self.results for f in r.fired if f.kind is kind]
            times = [f.recovery_s for f in fired if f.recovery_s is not None]
            if planned or fired:
                chained = sum(1 for f in planned if f.after is not None)
                overlapping = sum(1 for f in fired if f.during_recovery_of is not None)
                kinds.add_row(kind.value, str(len(planned)), str(chained), str(len(fired)),
                              str(overlapping), str(len(times)),
                              _seconds(percentile(times, 0.5)), _seconds(percentile(times, 0.99)))
        console.print(runs)
        console.print(kinds)
        seeds_by_note: dict[str, list[int]] = {}
        for result in self.results:
            for note in result.notes:
                seeds_by_note.setdefault(note, []).append(result.options.seed)
        for note, seeds in sorted(seeds_by_note.items()):
            named = "seed" if len(seeds) == 1 else "seeds"
            console.print(f"note ({named} {', '.join(map(str, seeds))}): {note}",
                          highlight=False)
        for result in self.results:
            for breach in result.verdict.breaches[:_BREACHES_SHOWN]:
                console.print(f"[red]breach[/red] seed {result.options.seed} "
                              f"({result.run_id}): {breach}", highlight=False, soft_wrap=True)


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"
