"""The ``orchestrator`` command: ``run`` (the main job), ``drill`` (recovery drills) and
``chaos`` (a long run under a seeded nemesis, judged by the history checker).

Thin by design, like the ``ledger`` command (:mod:`ledger.cli.app`), and on the same stack
(typer): parse, build a :class:`RunConfig`, call one public function, render
(:mod:`orchestrator.render`), map errors to exit codes.

``run`` options: every ``RunConfig`` field is a flag (``--max-weight-staleness 2``, booleans
as ``--sync/--no-sync``, ``Literal`` fields as choices) whose help is the field's
``description``; ``--config FILE.yaml`` supplies values that flags override
(:meth:`RunConfig.from_yaml`). The flags are built from ``RunConfig.model_fields`` by
:func:`_with_run_config_options`: it writes the command's signature and typer turns each
annotation into an option, so the only mapping written here is name -> ``--kebab-case``.

Why not pydantic-settings (considered, not used): its CLI source (``CliSettingsSource``) is
argparse, a second CLI stack beside the ``ledger`` command's typer, with argparse's own usage
errors (a usage line, then the message) instead of our one line; its YAML source would replace
one ``yaml.safe_load`` yet still need our checks (it skips a missing file silently) and our
one-line errors; and a ``BaseSettings`` model reads environment variables into every
``RunConfig()`` unless told not to. Typer already maps annotations to options (``int``,
``float``, ``Literal`` -> choice, ``bool`` -> flag pair), which is all the reflection needed.

Help is click-style plain text (``rich_markup_mode=None``): the rich option table truncates long
option names on narrow terminals. A ``[default: (16)]`` in the help is the RunConfig default:
the options themselves default to None ("not given"), so a value from ``--config`` survives
unless a flag is given.

Exit codes: 0 done; 1 the job or a drill failed; 2 bad input (unknown option or command, bad
value, unreadable or invalid config, unknown config key, unreachable database, fewer CPUs than
actors, unknown drill), always as one line ``orchestrator: error: ...`` on stderr, never a
traceback; 130 interrupted. A run that fails (a step failed on every attempt, a replacement
limit of the failure policy reached) prints ``orchestrator: run failed: ...`` and exits 1; its
ledger ends with ``run_failed``.
"""

from __future__ import annotations

import dataclasses
import inspect
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from pydantic.fields import FieldInfo

from ledger.redact import redact_text
from ledger.run_layout import DEFAULT_RUNS_DIR
from orchestrator.config import ALIASES, RunConfig
from orchestrator.errors import ConfigError, UserError
from orchestrator.render import DrillTable, print_run_summary

__all__ = ["app", "main"]

EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130



app = typer.Typer(
    name="orchestrator",
    help="rl-ledger: fully-async RL post-training on a durable, fenced weight-version ledger.",
    no_args_is_help=False,  # no command is a usage error ("Missing command."), one line like all
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # plain help: never truncates an option name (see module doc)
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _run_config_option(name: str, field: FieldInfo) -> Any:
    """``Annotated[T | None, typer.Option(...)]`` for one RunConfig field; None = not given."""
    flag = name.replace("_", "-")
    aliases = [f"--{alias.replace('_', '-')}" for alias in ALIASES.get(name, ())]
    if field.annotation is bool:
        declaration = f"--{flag}/--no-{flag}"
        shown_default: str | bool = flag if field.default else f"no-{flag}"
    else:
        declaration = f"--{flag}"
        shown_default = False if field.default is None else str(field.default)
    option = typer.Option(declaration, *aliases, help=field.description,
                          show_default=shown_default)
    return Annotated[field.annotation | None, option]


def _with_run_config_options(command: Callable[..., None]) -> Callable[..., None]:
    """Give ``command`` one option per RunConfig field, passed in its ``**fields``.

    Typer reads options from the signature, so this replaces ``**fields`` with one keyword
    parameter per field, typed with the field's annotation; an option not given is None.
    """
    signature = inspect.signature(command, eval_str=True)
    fixed = [p for p in signature.parameters.values() if p.kind is not p.VAR_KEYWORD]
    generated = [
        inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=None,
                          annotation=_run_config_option(name, field))
        for name, field in RunConfig.model_fields.items()
    ]
    command.__signature__ = signature.replace(  # type: ignore[attr-defined]
        parameters=[*fixed, *generated]
    )
    return command


@app.command("run")
@_with_run_config_options
def run_command(
    config_path: Annotated[
        Path | None,
        typer.Option("--config", help="YAML file of run config options; flags override it."),
    ] = None,
    resume: Annotated[
        bool, typer.Option("--resume", help="Continue RUN_ID from its newest checkpoint.")
    ] = False,
    ray_address: Annotated[
        str | None,
        typer.Option("--ray-address", help="Join this Ray cluster instead of starting one."),
    ] = None,
    runs_dir: Annotated[
        Path, typer.Option("--runs-dir", help="Where <run-id>/ (ledger, metrics, plot) goes.")
    ] = DEFAULT_RUNS_DIR,
    progress: Annotated[
        bool, typer.Option("--progress/--no-progress", help="Show the progress bar.")
    ] = True,
    **fields: Any,
) -> None:
    """Run the main job: fully-async GRPO across cells and engines on a local Ray cluster."""
    from ledger import LedgerError
    from orchestrator.control.driver import JobOptions, StartupError, run_job

    _working_directory_importable()
    config = RunConfig.from_yaml(config_path, fields)
    if resume and config.run_id is None:
        raise UserError("--resume needs --run-id of the run to continue")
    options = JobOptions(resume=resume, ray_address=ray_address, runs_dir=runs_dir,
                         progress=progress)
    from orchestrator.errors import StepFailedError, SupervisionLimitError

    try:
        with _as_user_error(StartupError, LedgerError):
            result = run_job(config, options)
    except (StepFailedError, SupervisionLimitError) as exc:  # recorded as run_failed
        _fail(f"run failed: {' '.join(str(exc).split())}", EXIT_FAILED)
    print_run_summary(result)
    if not result.ok:
        raise typer.Exit(EXIT_FAILED)


@app.command("drill")
def drill_command(
    scenarios: Annotated[
        list[str],
        typer.Option("--scenario", metavar="<name>",
                     help="A drill scenario, or 'all'; repeat for several."),
    ],
    db: Annotated[
        str | None,
        typer.Option("--db", help="Ledger URL for every drill (default: one SQLite file per "
                                  "drill)."),
    ] = None,
    seed: Annotated[
        int | None,
        typer.Option("--seed", help="Chaos mode: draw fault steps and points from this seed "
                                    "(reproducible)."),
    ] = None,
    repeat: Annotated[
        int,
        typer.Option("--repeat", help="Run each scenario K times (chaos mode: fresh draws "
                                      "each time)."),
    ] = 1,
    runs_dir: Annotated[
        Path, typer.Option("--runs-dir", help="Where each drill's run directory goes.")
    ] = DEFAULT_RUNS_DIR / "drills",
    ray_address: Annotated[
        str | None,
        typer.Option("--ray-address", help="Join this Ray cluster instead of starting one."),
    ] = None,
    local_nodes: Annotated[
        int,
        typer.Option("--local-nodes", metavar="N",
                     help="Run the drills on a local multi-node Ray cluster: a driver-only head "
                          "plus N worker nodes (ray.cluster_utils.Cluster; a lost node is seen "
                          "in about 1.5 s). kill-node needs it, with a PostgreSQL --db."),
    ] = 0,
) -> None:
    """Inject real faults into short runs and check the ledger's invariants (exit 1 if any
    drill fails)."""
    from ledger import LedgerError
    from orchestrator.control.driver import StartupError
    from orchestrator.drills.runner import DrillError, DrillOptions, plan_drills, run_drills

    if local_nodes and ray_address:
        raise UserError("--local-nodes builds a cluster of its own: drop --ray-address")
    options = DrillOptions(runs_dir=runs_dir, db=db, ray_address=ray_address,
                           seed=seed if seed is not None else DrillOptions.seed,
                           local_nodes=local_nodes)
    table = DrillTable()
    with _as_user_error(DrillError, StartupError, LedgerError):
        plans = plan_drills(list(scenarios), seed=seed, repeat=repeat)
        results = run_drills(plans, options, on_result=table.add)
    table.print()
    if not all(result.passed for result in results):
        raise typer.Exit(EXIT_FAILED)


@app.command("chaos")
def chaos_command(
    steps: Annotated[int, typer.Option("--steps", min=1, help="Training steps of the run.")] = 200,
    seed: Annotated[int, typer.Option("--seed", min=0, help="Seed of the nemesis schedule and "
                                                            "the run (reproducible).")] = 1,
    seeds: Annotated[int, typer.Option("--seeds", min=1, help="Run this many campaigns, seeds "
                                       "SEED, SEED+1, ...; one table over all.")] = 1,
    mean_interval: Annotated[
        float, typer.Option("--mean-interval", help="Mean steps between faults (Poisson).")
    ] = 10.0,
    overlap: Annotated[
        bool, typer.Option("--overlap", help="Let a fault land inside the recovery from the "
                                             "one before.")
    ] = False,
    exclude: Annotated[
        list[str] | None,
        typer.Option("--exclude", metavar="<kind>", help="A fault kind not to inject; repeat "
                                                         "for several."),
    ] = None,
    db: Annotated[
        str | None, typer.Option("--db", help="Ledger URL (default: one SQLite file per run).")
    ] = None,
    local_nodes: Annotated[
        int, typer.Option("--local-nodes", metavar="N", min=0,
                          help="Run on a local multi-node cluster of N worker nodes (kill-node "
                               "needs 2 or more, with a PostgreSQL --db).")
    ] = 0,
    deadline: Annotated[
        float | None, typer.Option("--deadline", metavar="S", help="Seconds the run may take "
                                   "(default 600 + 15 a step).")
    ] = None,
    reward_tolerance: Annotated[
        float | None, typer.Option("--reward-tolerance", metavar="X", help="Also run the seed "
                                   "fault-free; the final reward may be at most X below it.")
    ] = None,
    runs_dir: Annotated[
        Path, typer.Option("--runs-dir", help="Where each campaign's run directory goes.")
    ] = DEFAULT_RUNS_DIR / "chaos",
) -> None:
    """A long run under a seeded nemesis of every fault kind, judged afterwards by the history
    checker (exit 1 on any breach)."""
    from ledger import LedgerError
    from orchestrator.chaos.campaign import CampaignOptions, campaign_kinds, run_campaign
    from orchestrator.chaos.nemesis import FaultKind, draw_schedule
    from orchestrator.render import ChaosTable

    if mean_interval <= 0:
        raise UserError(f"--mean-interval must be positive, got {mean_interval:g}")
    if deadline is not None and deadline <= 0:
        raise UserError(f"--deadline must be positive, got {deadline:g}")
    if reward_tolerance is not None and reward_tolerance < 0:
        raise UserError(f"--reward-tolerance must be 0 or more, got {reward_tolerance:g}")
    if local_nodes and not (db or "").startswith("postgresql"):
        raise UserError("--local-nodes needs a PostgreSQL --db (a SQLite ledger cannot be "
                        "shared by several nodes)")
    with _as_user_error(ValueError):
        options = CampaignOptions(
            steps=steps, seed=seed, mean_interval=mean_interval, overlap=overlap,
            exclude=tuple(FaultKind.parse(exclude or [])), db=db, local_nodes=local_nodes,
            deadline_s=deadline, reward_tolerance=reward_tolerance, runs_dir=runs_dir)
        kinds, notes = campaign_kinds(options)
        draw_schedule(seed, steps, mean_interval=mean_interval, kinds=kinds, overlap=overlap)
    for note in notes:
        typer.echo(f"orchestrator chaos: {note}")
    table = ChaosTable()
    with _as_user_error(LedgerError):
        for number in range(seeds):
            table.add(run_campaign(dataclasses.replace(options, seed=seed + number)))
    table.print()
    if not all(result.ok for result in table.results):
        raise typer.Exit(EXIT_FAILED)


def _working_directory_importable() -> None:
    """Make modules under the working directory (a ``--custom-rm-path`` module such as
    ``examples.math.reward``) importable here and in the Ray workers this process starts, as
    ``python -m`` would: a console script does not put the working directory on the path.
    On a cluster joined with ``--ray-address`` the module must be importable on every node."""
    here = os.getcwd()
    if here not in sys.path:
        sys.path.insert(0, here)
    paths = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    if here not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([here, *filter(None, paths)])


@contextmanager
def _as_user_error(*kinds: type[Exception]) -> Iterator[None]:
    """Errors of these kinds mean bad input, not a bug: re-raised as a one-line UserError."""
    try:
        yield
    except kinds as exc:
        raise UserError(" ".join(str(exc).split()) or type(exc).__name__) from None


def _fail(message: str, code: int) -> NoReturn:
    # A database URL in an error must not print its password.
    typer.echo(f"orchestrator: {redact_text(message)}", err=True)
    sys.exit(code)


def _ray_is_up() -> bool:
    ray = sys.modules.get("ray")  # a command that never imported Ray started none
    return ray is not None and ray.is_initialized()


@contextmanager
def _ray_stopped_when_done() -> Iterator[None]:
    """Stop the Ray cluster a command started (disconnect from one it joined) when the command
    is done, not at interpreter exit, where Ray first sleeps 0.5 s so that forwarded worker
    logs can print: this CLI forwards none (``log_to_driver=False``). Ray already up when the
    command began (a caller's, in-process) is left as it is."""
    was_up = _ray_is_up()
    try:
        yield
    finally:
        if not was_up and _ray_is_up():
            sys.modules["ray"].shutdown()


def main(argv: list[str] | None = None) -> None:
    """Entry point: run the CLI; returns on success, else exits with 1 or 2 (see module doc)."""
    try:
        with _ray_stopped_when_done():
            code = app(args=argv, prog_name="orchestrator", standalone_mode=False)
    except typer.TyperException as exc:  # (typer >= 0.27.2) unknown option, bad value, ...
        _fail(f"error: {' '.join(exc.format_message().split())}", EXIT_USAGE)
    except (UserError, ConfigError) as exc:
        _fail(f"error: {exc}", EXIT_USAGE)
    except typer.Abort:
        _fail("aborted", EXIT_INTERRUPTED)
    if code == EXIT_INTERRUPTED:  # typer turns Ctrl-C into this code
        _fail("aborted", EXIT_INTERRUPTED)
    if code:  # typer.Exit(EXIT_FAILED) from a command
        sys.exit(code)
