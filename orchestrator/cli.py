"""The ``orchestrator`` command: ``run`` (the main job) and ``drill`` (recovery drills).

Thin by design: parse, build a :class:`RunConfig`, call one public function, render, map
errors to exit codes. Every ``RunConfig`` field is a flag (``--max-weight-staleness 2``,
``--indep-dp/--no-indep-dp``); ``--config FILE.yaml`` supplies defaults that flags override.

Exit codes: 0 done, 1 the job or a drill failed, 2 bad input (unknown option, unreadable
config, unreachable database, fewer CPUs than actors), always as one line on stderr.
"""

from __future__ import annotations

import sys
import types
import typing
from pathlib import Path
from typing import Any

import click

from orchestrator.config import ConfigError, RunConfig

__all__ = ["main"]

EXIT_FAILED = 1
EXIT_USAGE = 2


class UserError(Exception):
    """Bad input from the person at the terminal: one line, exit 2."""


def _click_type(annotation: Any) -> tuple[Any, bool]:
    """The click type for a RunConfig annotation, and whether the field is a boolean flag."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType) and len(args) == 1:
        return _click_type(args[0])
    if origin is typing.Literal:
        return click.Choice([str(a) for a in typing.get_args(annotation)]), False
    if annotation is bool:
        return bool, True
    if annotation in (int, float, str):
        return annotation, False
    return str, False


def _config_options(command):
    """Decorate ``command`` with one option per RunConfig field."""
    for name, field in reversed(list(RunConfig.model_fields.items())):
        flag = name.replace("_", "-")
        click_type, is_flag = _click_type(field.annotation)
        help_text = field.description or f"RunConfig.{name} (default: {field.default!r})"
        if is_flag:
            option = click.option(
                f"--{flag}/--no-{flag}", name, default=None, help=help_text
            )
        else:
            option = click.option(f"--{flag}", name, type=click_type, default=None, help=help_text)
        command = option(command)
    return command


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def cli() -> None:
    """rl-ledger: fully-async RL post-training on a durable, fenced weight-version ledger."""


@cli.command("run")
@click.option("--config", "config_path", type=click.Path(path_type=Path), default=None,
              help="YAML file of RunConfig options; flags override it.")
@click.option("--resume", is_flag=True, help="Continue RUN_ID from its newest checkpoint.")
@click.option("--ray-address", default=None, help="Join this Ray cluster instead of starting one.")
@click.option("--runs-dir", type=click.Path(path_type=Path), default=Path("runs"),
              show_default=True, help="Where runs/<run-id>/ (ledger, metrics, plot) go.")
@click.option("--progress/--no-progress", default=True, help="Show the progress bar.")
@_config_options
def run_command(
    config_path: Path | None,
    resume: bool,
    ray_address: str | None,
    runs_dir: Path,
    progress: bool,
    **overrides: Any,
) -> None:
    """Run the main job: fully-async GRPO across cells and engines on a local Ray cluster."""
    from orchestrator.driver import JobOptions, run_job

    config = RunConfig.from_yaml(config_path, overrides)
    if resume and config.run_id is None:
        raise UserError("--resume needs --run-id of the run to continue")
    result = run_job(
        config,
        JobOptions(resume=resume, ray_address=ray_address, runs_dir=runs_dir, progress=progress),
    )
    _print_summary(result)
    if not result.ok:
        sys.exit(EXIT_FAILED)


@cli.command("drill")
@click.option("--scenario", "scenarios", multiple=True, required=True,
              help="A drill scenario, or 'all'; repeat the option for several.")
@click.option("--db", default=None,
              help="Ledger URL for every drill (default: one SQLite file per drill).")
@click.option("--seed", type=int, default=None,
              help="Chaos mode: draw fault steps and points from this seed (reproducible).")
@click.option("--repeat", type=int, default=1, show_default=True,
              help="Run each scenario K times (chaos mode: fresh draws each time).")
@click.option("--runs-dir", type=click.Path(path_type=Path), default=Path("runs/drills"),
              show_default=True, help="Where each drill's run directory goes.")
@click.option("--ray-address", default=None, help="Join this Ray cluster instead of starting one.")
def drill_command(scenarios: tuple[str, ...], db: str | None, seed: int | None, repeat: int,
                  runs_dir: Path, ray_address: str | None) -> None:
    """Inject real faults into short runs and check the ledger's invariants (exit 1 if any
    drill fails)."""
    from orchestrator.drills import DrillError, DrillOptions, plan_drills, run_drills

    try:
        plans = plan_drills(list(scenarios), seed=seed, repeat=repeat)
    except DrillError as exc:
        raise UserError(str(exc)) from None
    options = DrillOptions(runs_dir=runs_dir, db=db, ray_address=ray_address,
                           seed=seed if seed is not None else DrillOptions.seed)
    table = _DrillTable()
    try:
        results = run_drills(plans, options, on_result=table.add)
    except DrillError as exc:
        raise UserError(str(exc)) from None
    table.print()
    if not all(result.passed for result in results):
        sys.exit(EXIT_FAILED)


class _DrillTable:
    """The verdict table: one row per drill, problems of failed drills below it."""

    def __init__(self) -> None:
        from rich.table import Table

        self.table = Table(title="recovery drills")
        for column in ("scenario", "fault point", "step", "recover s", "versions",
                       "neg. staleness", "groups lost", "verdict"):
            self.table.add_column(column)
        self.failures: list[tuple[str, list[str]]] = []

    def add(self, result) -> None:
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
        from rich.console import Console

        console = Console()
        if not console.is_terminal:
            console = Console(width=150)  # a log file or pipe: do not truncate the columns
        console.print(self.table)
        for name, problems in self.failures:
            for problem in problems[:10]:
                console.print(f"[red]{name}:[/red] {problem}", markup=True, highlight=False)


def _dash(value) -> str:
    return "-" if value is None else str(value)


def _print_summary(result) -> None:
    from rich.console import Console
    from rich.table import Table

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
    console.print(f"ledger:  {result.ledger_url}", soft_wrap=True, highlight=False)
    console.print(f"metrics: {result.metrics_path}", soft_wrap=True, highlight=False)
    console.print(f"plot:    {result.plot_path or '-'}", soft_wrap=True, highlight=False)
    for problem in result.audit_problems[:20]:
        console.print(f"[red]audit:[/red] {problem}", soft_wrap=True)
    console.print(f"audit it: ledger --db {result.ledger_url} verify", soft_wrap=True,
                  highlight=False)


def main(argv: list[str] | None = None) -> None:
    """Entry point: run the CLI and turn user errors into one line and exit code 2."""
    from ledger import LedgerError

    from orchestrator.driver import StartupError

    try:
        cli.main(args=argv, prog_name="orchestrator", standalone_mode=False)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.exceptions.Abort:
        click.echo("orchestrator: aborted", err=True)
        sys.exit(130)
    except click.UsageError as exc:
        click.echo(f"orchestrator: error: {exc.format_message()}", err=True)
        sys.exit(EXIT_USAGE)
    except (UserError, ConfigError, StartupError, LedgerError) as exc:
        click.echo(f"orchestrator: error: {exc}", err=True)
        sys.exit(EXIT_USAGE)
