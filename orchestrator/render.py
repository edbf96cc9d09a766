"""What the ``orchestrator`` command prints: the end-of-run summary and the drill table.

Presentation only: the figures come from :class:`~orchestrator.control.driver.JobResult` and
:class:`~orchestrator.drills.runner.DrillResult`; nothing here computes or decides.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table

from ledger.cli.args import audit_command
from ledger.redact import redact_url

if TYPE_CHECKING:
    from orchestrator.control.driver import JobResult
    from orchestrator.drills.runner import DrillResult

__all__ = ["DrillTable", "print_run_summary"]

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
