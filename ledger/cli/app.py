"""The ``ledger`` command: audit a run's weight versions (read-only unless ``db upgrade``).

Thin by design: each subcommand parses its options, calls one function of
:mod:`ledger.cli.query` (or :func:`ledger.cli.plot.plot_run`), prints the answer with
:mod:`ledger.cli.render`, and maps errors to exit codes:

    0  the answer was printed (``verify``: no problems)
    1  ``verify`` found problems (each printed as ``run R seq N: check: message``)
    2  a user error, printed as one line ``ledger: error: ...`` on stderr: no database,
       a bad URL, an unknown run, an old or missing schema, a bad range, a corrupt row,
       an unreachable server; or a usage error (typer/click)

Global options (before or after the subcommand): ``--db URL`` (or ``LEDGER_DB``; a bare path
means a SQLite file; with neither, ``--run RUN`` means ``runs/<RUN>/ledger.db``, and
``verify --witness RUN_DIR`` the ledger in that directory) and ``--run RUN`` (default: the
only or newest run; ``verify`` checks every run unless given one).

``-o table|json`` everywhere (``jsonl`` too for ``log``; ``export`` takes ``jsonl|csv``;
``plot`` uses ``-o`` for its PNG file and ``--format`` for its summary).

A URL never needs a password: libpq reads ``PGPASSWORD`` or ``~/.pgpass``. Every URL this
command prints, in answers and in errors, has its password replaced by ``***``.
"""

from __future__ import annotations

import enum
import importlib
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType
from typing import Annotated

import typer

from ledger.cli.args import QueryError, database_url, ledger_beside
from ledger.errors import LedgerError
from ledger.redact import redact_text
from ledger.run_layout import LEDGER_DB_ENV

__all__ = ["app", "main"]


def _module(name: str) -> ModuleType:
    """``ledger.cli.<name>``, imported on first use: each command loads only what it needs
    (``status`` neither the audit nor the lineage builders)."""
    return importlib.import_module(f"ledger.cli.{name}")

EXIT_PROBLEMS = 1
EXIT_ERROR = 2


class Output(str, enum.Enum):
    table = "table"
    json = "json"


class StreamOutput(str, enum.Enum):
    table = "table"
    json = "json"
    jsonl = "jsonl"


class ExportFormat(str, enum.Enum):
    jsonl = "jsonl"
    csv = "csv"


app = typer.Typer(
    name="ledger",
    help="Audit the weight-version ledger of an rl-ledger run (read-only by default).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)
db_app = typer.Typer(
    help="Schema migrations (Alembic through the ledger's own environment).",
    no_args_is_help=True,
)
app.add_typer(db_app, name="db")

DbOption = Annotated[
    str | None,
    typer.Option("--db", help="Database URL or SQLite path (default: the global --db)."),
]
RunOption = Annotated[
    str | None, typer.Option("--run", help="Run id (default: the only or newest run).")
]
OutputOption = Annotated[Output, typer.Option("-o", "--output", help="Output format.")]


@app.callback()
def _global(
    ctx: typer.Context,
    db: Annotated[
        str | None,
        typer.Option(
            "--db", envvar=LEDGER_DB_ENV, show_envvar=True,
            help="sqlite:///PATH, postgresql+psycopg://USER@HOST/DB (password from PGPASSWORD "
            "or ~/.pgpass), or a SQLite file path.",
        ),
    ] = None,
    run: RunOption = None,
) -> None:
    ctx.obj = {"db": db, "run": run}


def _target(
    ctx: typer.Context, db: str | None, run: str | None, near: list[str] | None = None
) -> tuple[str, str | None]:
    """The database URL and run id: the subcommand's options win over the global ones; with
    neither a database nor a run, the ledger in a run directory among ``near`` (witnesses)."""
    parent = ctx.find_root().obj or {}
    run_id = run if run is not None else parent.get("run")
    db = db if db is not None else parent.get("db")
    if db is None and run_id is None:
        db = next((found for path in near or () if (found := ledger_beside(path))), None)
    return database_url(db, run_id), run_id


@contextmanager
def _errors() -> Iterator[None]:
    """Every ledger error becomes one line on stderr and exit code 2."""
    try:
        yield
    except LedgerError as exc:
        message = redact_text(" ".join(str(exc).split())) or type(exc).__name__
        typer.echo(f"ledger: error: {message}", err=True)
        raise typer.Exit(EXIT_ERROR) from None


@app.command()
def runs(ctx: typer.Context, db: DbOption = None, output: OutputOption = Output.table) -> None:
    """Runs with created time, head version, events, publisher cell, epoch and state (a run
    that lost a row is listed as broken, never hidden)."""
    with _errors():
        answer = _module("query").runs(_target(ctx, db, None)[0])
    _module("render").print_runs(answer, output.value, sys.stdout)


@app.command()
def status(
    ctx: typer.Context, db: DbOption = None, run: RunOption = None,
    output: OutputOption = Output.table,
) -> None:
    """Head version, epoch, publisher cell, last seq, head hash, backend, schema revision."""
    with _errors():
        answer = _module("query").status(*_target(ctx, db, run))
    _module("render").print_status(answer, output.value, sys.stdout)


@app.command()
def log(
    ctx: typer.Context,
    seq_range: Annotated[
        str | None,
        typer.Option("-r", "--range", help="Seq range: A:B, A:, :B, N, -N (last N); head, head-N."),
    ] = None,
    kind: Annotated[
        list[str] | None, typer.Option("--kind", help="Only this event kind (repeatable).")
    ] = None,
    cell: Annotated[
        list[str] | None, typer.Option("--cell", help="Only events of this cell (repeatable).")
    ] = None,
    since: Annotated[
        str | None, typer.Option("--since", help="Recorded at or after (ISO time; naive = UTC).")
    ] = None,
    until: Annotated[
        str | None, typer.Option("--until", help="Recorded at or before (ISO time).")
    ] = None,
    db: DbOption = None,
    run: RunOption = None,
    output: Annotated[
        StreamOutput, typer.Option("-o", "--output", help="table: one line per event.")
    ] = StreamOutput.table,
) -> None:
    """Events, one stable line each: SEQ HASH TIME KIND key=value..."""
    with _errors(), _module("query").log(
        *_target(ctx, db, run), seq_range, kinds=kind, cells=cell, since=since, until=until
    ) as answer:
        _module("render").print_events(
            answer.header, answer.events, output.value, sys.stdout,
            seq_range=(answer.first_seq, answer.last_seq),
        )


@app.command()
def show(
    ctx: typer.Context,
    version: Annotated[
        int | None, typer.Argument(help="Weight version (0: the run_started event).")
    ] = None,
    seq: Annotated[int | None, typer.Option("--seq", help="The event at this seq.")] = None,
    db: DbOption = None,
    run: RunOption = None,
    output: OutputOption = Output.table,
) -> None:
    """One event whole: the commit of VERSION, or the event at --seq N."""
    with _errors():
        answer = _module("query").show(*_target(ctx, db, run), version=version, seq=seq)
    _module("render").print_show(answer, output.value, sys.stdout)


@app.command()
def lineage(
    ctx: typer.Context,
    version: Annotated[
        int | None, typer.Argument(help="Weight version (0: the initial weights).")
    ] = None,
    step: Annotated[int | None, typer.Option("--step", help="A train step instead.")] = None,
    db: DbOption = None,
    run: RunOption = None,
    output: OutputOption = Output.table,
) -> None:
    """Who produced VERSION (cell, epoch, train step, checksum), the steps that trained on its
    samples, the engines that served it; or, with --step N, the versions that fed step N."""
    with _errors():
        answer = _module("lineage_query").lineage(*_target(ctx, db, run), version=version, step=step)
    _module("render_lineage").print_lineage(answer, output.value, sys.stdout)


@app.command()
def prompts(
    ctx: typer.Context, db: DbOption = None, run: RunOption = None,
    output: OutputOption = Output.table,
) -> None:
    """Prompts issued, trained, dropped by reason, recycled, and in flight at the last event
    (from the ledger's batch_trained and run_resumed events alone)."""
    with _errors():
        answer = _module("lineage_query").prompts(*_target(ctx, db, run))
    _module("render_lineage").print_prompts(answer, output.value, sys.stdout)


@app.command()
def evals(
    ctx: typer.Context, db: DbOption = None, run: RunOption = None,
    output: OutputOption = Output.table,
) -> None:
    """Eval scores over versions (each eval_finished event: set, version, metrics)."""
    with _errors():
        answer = _module("lineage_query").evals(*_target(ctx, db, run))
    _module("render_lineage").print_evals(answer, output.value, sys.stdout)


@app.command()
def verify(
    ctx: typer.Context,
    witness: Annotated[
        list[str] | None,
        typer.Option(
            "--witness", metavar="PATH",
            help="Also check what a run's files saw of the ledger: a run directory, a "
            "checkpoint, a witness file or a metrics file (repeatable). Exit 1 if the ledger "
            "is behind or diverges from any of them.",
        ),
    ] = None,
    all_runs: Annotated[
        bool, typer.Option("--all-runs", hidden=True, help="Every run (the default).")
    ] = False,
    since_verified: Annotated[
        bool,
        typer.Option(
            "--since-verified",
            help="Check each run from its newest audit checkpoint (the seq and hash last "
            "verified clean, hash re-checked against the chain) instead of from event 1.",
        ),
    ] = False,
    db: DbOption = None,
    run: Annotated[
        str | None, typer.Option("--run", help="Only this run (default: every run).")
    ] = None,
    output: OutputOption = Output.table,
) -> None:
    """Check every ledger invariant of every run; exit 1 if any is broken."""
    with _errors():
        url, run_id = _target(ctx, db, run, witness)
        if all_runs and run_id is not None:
            raise QueryError("verify: give --run RUN or --all-runs, not both")
        answer = _module("query").verify(url, run_id, witness, since_verified)
    _module("render").print_verify(answer, output.value, sys.stdout)
    if not answer["ok"]:
        raise typer.Exit(EXIT_PROBLEMS)


@app.command()
def cells(
    ctx: typer.Context, db: DbOption = None, run: RunOption = None,
    output: OutputOption = Output.table,
) -> None:
    """Per cell: state, epochs held, promotions, last event."""
    with _errors():
        answer = _module("query").cells(*_target(ctx, db, run))
    _module("render").print_cells(answer, output.value, sys.stdout)


@app.command()
def lag(
    ctx: typer.Context, db: DbOption = None, run: RunOption = None,
    output: OutputOption = Output.table,
) -> None:
    """Per engine: last stamped version, head version, LAG = head - stamped."""
    with _errors():
        answer = _module("query").lag(*_target(ctx, db, run))
    _module("render").print_lag(answer, output.value, sys.stdout)


@app.command()
def export(
    ctx: typer.Context,
    export_format: Annotated[
        ExportFormat,
        typer.Option("--format", "-o", "--output", help="jsonl is lossless (Event.to_dict())."),
    ] = ExportFormat.jsonl,
    db: DbOption = None,
    run: RunOption = None,
) -> None:
    """Every event of the run to stdout, as JSON lines or CSV."""
    with _errors(), _module("query").log(*_target(ctx, db, run)) as answer:
        _module("render").print_events(answer.header, answer.events, export_format.value, sys.stdout)


@app.command()
def plot(
    ctx: typer.Context,
    out: Annotated[str, typer.Option("-o", "--out", help="PNG file to write.")],
    metrics: Annotated[
        str | None,
        typer.Option("--metrics", help="metrics.jsonl (default: beside the SQLite file)."),
    ] = None,
    db: DbOption = None,
    run: RunOption = None,
    summary_format: Annotated[
        Output, typer.Option("--format", help="Format of the summary printed.")
    ] = Output.table,
) -> None:
    """Committed version over time, promotions marked, and the staleness histogram."""
    from ledger.cli.plot import plot_run

    with _errors():
        answer = plot_run(*_target(ctx, db, run), out=out, metrics=metrics)
    _module("render").print_plot(answer, summary_format.value, sys.stdout)


@db_app.command("current")
def db_current(
    ctx: typer.Context, db: DbOption = None, output: OutputOption = Output.table
) -> None:
    """The schema revision stamped in the database (like `alembic current`)."""
    with _errors():
        answer = _module("db").db_current(_target(ctx, db, None)[0])
    _module("render").print_db_current(answer, output.value, sys.stdout)


@db_app.command("upgrade")
def db_upgrade(
    ctx: typer.Context, db: DbOption = None, output: OutputOption = Output.table
) -> None:
    """Create the database or upgrade its schema to head (the only command that writes)."""
    with _errors():
        answer = _module("db").db_upgrade(_target(ctx, db, None)[0])
    _module("render").print_db_upgrade(answer, output.value, sys.stdout)


def main() -> None:
    """Console-script entry point (``ledger = ledger.cli.app:main``)."""
    try:
        app(prog_name="ledger")
    except BrokenPipeError:
        # `ledger log | head`: the reader left; stop quietly, as git does.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        sys.exit(EXIT_PROBLEMS)


if __name__ == "__main__":
    main()
