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
means a SQLite file; with neither, ``--run RUN`` means ``runs/<RUN>/ledger.db``) and
``--run RUN`` (default: the only or newest run). ``-o table|json`` everywhere (``jsonl`` too
for ``log``; ``export`` takes ``jsonl|csv``; ``plot`` uses ``-o`` for its PNG file and
``--format`` for its summary).
"""

from __future__ import annotations

import enum
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated

import typer

from ledger.cli import query, render
from ledger.errors import LedgerError

__all__ = ["app", "main"]

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
            "--db", envvar="LEDGER_DB", show_envvar=True,
            help="sqlite:///PATH, postgresql+psycopg://..., or a SQLite file path.",
        ),
    ] = None,
    run: RunOption = None,
) -> None:
    ctx.obj = {"db": db, "run": run}


def _target(ctx: typer.Context, db: str | None, run: str | None) -> tuple[str, str | None]:
    """The database URL and run id: the subcommand's options win over the global ones."""
    parent = ctx.find_root().obj or {}
    run_id = run if run is not None else parent.get("run")
    return query.database_url(db if db is not None else parent.get("db"), run_id), run_id


@contextmanager
def _errors() -> Iterator[None]:
    """Every ledger error becomes one line on stderr and exit code 2."""
    try:
        yield
    except LedgerError as exc:
        message = " ".join(str(exc).split()) or type(exc).__name__
        typer.echo(f"ledger: error: {message}", err=True)
        raise typer.Exit(EXIT_ERROR) from None


@app.command()
def runs(ctx: typer.Context, db: DbOption = None, output: OutputOption = Output.table) -> None:
    """Runs with created time, head version, events, publisher cell and epoch."""
    with _errors():
        answer = query.runs(_target(ctx, db, None)[0])
    render.print_runs(answer, output.value, sys.stdout)


@app.command()
def status(
    ctx: typer.Context, db: DbOption = None, run: RunOption = None,
    output: OutputOption = Output.table,
) -> None:
    """Head version, epoch, publisher cell, last seq, head hash, backend, schema revision."""
    with _errors():
        answer = query.status(*_target(ctx, db, run))
    render.print_status(answer, output.value, sys.stdout)


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
    with _errors(), query.log(
        *_target(ctx, db, run), seq_range, kinds=kind, cells=cell, since=since, until=until
    ) as answer:
        render.print_events(
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
        answer = query.show(*_target(ctx, db, run), version=version, seq=seq)
    render.print_show(answer, output.value, sys.stdout)


@app.command()
def verify(
    ctx: typer.Context,
    all_runs: Annotated[bool, typer.Option("--all-runs", help="Audit every run.")] = False,
    db: DbOption = None,
    run: RunOption = None,
    output: OutputOption = Output.table,
) -> None:
    """Check every ledger invariant; exit 1 if any is broken."""
    with _errors():
        url, run_id = _target(ctx, db, run)
        answer = query.verify(url, run_id, all_runs=all_runs)
    render.print_verify(answer, output.value, sys.stdout)
    if not answer["ok"]:
        raise typer.Exit(EXIT_PROBLEMS)


@app.command()
def cells(
    ctx: typer.Context, db: DbOption = None, run: RunOption = None,
    output: OutputOption = Output.table,
) -> None:
    """Per cell: state, epochs held, promotions, last event."""
    with _errors():
        answer = query.cells(*_target(ctx, db, run))
    render.print_cells(answer, output.value, sys.stdout)


@app.command()
def lag(
    ctx: typer.Context, db: DbOption = None, run: RunOption = None,
    output: OutputOption = Output.table,
) -> None:
    """Per engine: last stamped version, head version, LAG = head - stamped."""
    with _errors():
        answer = query.lag(*_target(ctx, db, run))
    render.print_lag(answer, output.value, sys.stdout)


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
    with _errors(), query.log(*_target(ctx, db, run)) as answer:
        render.print_events(answer.header, answer.events, export_format.value, sys.stdout)


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
    render.print_plot(answer, summary_format.value, sys.stdout)


@db_app.command("current")
def db_current(
    ctx: typer.Context, db: DbOption = None, output: OutputOption = Output.table
) -> None:
    """The schema revision stamped in the database (like `alembic current`)."""
    with _errors():
        answer = query.db_current(_target(ctx, db, None)[0])
    render.print_db_current(answer, output.value, sys.stdout)


@db_app.command("upgrade")
def db_upgrade(
    ctx: typer.Context, db: DbOption = None, output: OutputOption = Output.table
) -> None:
    """Create the database or upgrade its schema to head (the only command that writes)."""
    with _errors():
        answer = query.db_upgrade(_target(ctx, db, None)[0])
    render.print_db_upgrade(answer, output.value, sys.stdout)


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
