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
from orchestrator.render import DrillTable, print_run_summary

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
    from orchestrator.control.driver import JobOptions, run_job

    config = RunConfig.from_yaml(config_path, overrides)
    if resume and config.run_id is None:
        raise UserError("--resume needs --run-id of the run to continue")
    result = run_job(
        config,
        JobOptions(resume=resume, ray_address=ray_address, runs_dir=runs_dir, progress=progress),
    )
    print_run_summary(result)
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
    from orchestrator.drills.runner import DrillError, DrillOptions, plan_drills, run_drills

    try:
        plans = plan_drills(list(scenarios), seed=seed, repeat=repeat)
    except DrillError as exc:
        raise UserError(str(exc)) from None
    options = DrillOptions(runs_dir=runs_dir, db=db, ray_address=ray_address,
                           seed=seed if seed is not None else DrillOptions.seed)
    table = DrillTable()
    try:
        results = run_drills(plans, options, on_result=table.add)
    except DrillError as exc:
        raise UserError(str(exc)) from None
    table.print()
    if not all(result.passed for result in results):
        sys.exit(EXIT_FAILED)


def main(argv: list[str] | None = None) -> None:
    """Entry point: run the CLI and turn user errors into one line and exit code 2."""
    from ledger import LedgerError

    from orchestrator.control.driver import StartupError

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
