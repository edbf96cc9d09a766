"""The read commands a user runs most (``status``, ``lag``, ``show``, ``lineage``, ``prompts``,
``verify``), parsed without building the typer app: typer, click and the pydantic typer imports
for its own parameters are most of a command's start-up, and these answers take milliseconds.

:func:`run` accepts only the plain spellings (``--db``/``--run`` before or after the command,
``-o``/``--output table|json``, the command's own ``--seq``/``--step``, one VERSION, and
``verify --since-verified``); for anything else (help, a bad value, an option it does not
know, ``verify --witness``) it returns None and the typer app answers, so every error message
and usage text stays the app's. The answer and its
rendering are the app's own functions (:mod:`ledger.cli.query`, :mod:`ledger.cli.render`),
and a test checks both paths print the same bytes. Both read through the driver alone
(:mod:`ledger.cli.session`), without SQLAlchemy.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable

from ledger.run_layout import LEDGER_DB_ENV

__all__ = ["run"]

EXIT_PROBLEMS = 1  # as the app's verify: the ledger has problems
EXIT_ERROR = 2
_GLOBAL = ("--db", "--run")
# command -> (its own value option, whether it takes one VERSION argument, its own flags)
_COMMANDS: dict[str, tuple[str | None, bool, tuple[str, ...]]] = {
    "status": (None, False, ()), "lag": (None, False, ()), "show": ("--seq", True, ()),
    "lineage": ("--step", True, ()), "prompts": (None, False, ()),
    "verify": (None, False, ("--since-verified",)),
}


def _parse(argv: list[str]) -> tuple[str, dict[str, str], dict[str, str]] | None:
    """(command, global options, command options incl. ``version``), or None: not plain."""
    options: list[dict[str, str]] = [{}, {}]
    command: str | None = None
    tokens = list(argv)
    while tokens:
        token = tokens.pop(0)
        name, equals, value = token.partition("=")
        allowed = _GLOBAL if command is None else (
            *_GLOBAL, "-o", "--output", *([_COMMANDS[command][0]] if _COMMANDS[command][0]
                                         else []))
        if command is not None and token in _COMMANDS[command][2]:
            options[1][token] = "true"
        elif name in allowed and token.startswith("--") or token in ("-o",) and command:
            if not equals:
                if not tokens:
                    return None
                value = tokens.pop(0)
            options[command is not None]["--output" if name == "-o" else name] = value
        elif command is None and token in _COMMANDS:
            command = token
        elif command is not None and _COMMANDS[command][1] and not token.startswith("-") \
                and "version" not in options[1]:
            options[1]["version"] = token
        else:
            return None
    if command is None:
        return None
    own = options[1]
    if own.get("--output", "table") not in ("table", "json"):
        return None
    for key in ("version", "--seq", "--step"):
        if key in own and not own[key].isdigit():
            return None
    return command, options[0], own


def run(argv: list[str]) -> int | None:
    """Answer ``argv`` if it is a plain read command (exit code), else None (ask the app)."""
    parsed = _parse(argv)
    if parsed is None:
        return None
    command, global_options, own = parsed
    from ledger.cli.args import database_url
    from ledger.errors import LedgerError
    from ledger.redact import redact_text

    run_id = own.get("--run", global_options.get("--run"))
    db = own.get("--db", global_options.get("--db", os.environ.get(LEDGER_DB_ENV) or None))
    output = own.get("--output", "table")
    version = int(own["version"]) if "version" in own else None
    try:
        url = database_url(db, run_id)
        answer, render = _ANSWERS[command](url, run_id, version, own)
    except LedgerError as exc:
        message = redact_text(" ".join(str(exc).split())) or type(exc).__name__
        print(f"ledger: error: {message}", file=sys.stderr)
        return EXIT_ERROR
    render(answer, output, sys.stdout)
    return EXIT_PROBLEMS if command == "verify" and not answer["ok"] else 0


def _module(name: str):
    return importlib.import_module(f"ledger.cli.{name}")


def _int(own: dict[str, str], key: str) -> int | None:
    return int(own[key]) if key in own else None


_ANSWERS: dict[str, Callable] = {
    "status": lambda url, run_id, version, own: (
        _module("query").status(url, run_id), _module("render").print_status),
    "lag": lambda url, run_id, version, own: (
        _module("query").lag(url, run_id), _module("render").print_lag),
    "show": lambda url, run_id, version, own: (
        _module("query").show(url, run_id, version=version, seq=_int(own, "--seq")),
        _module("render").print_show),
    "lineage": lambda url, run_id, version, own: (
        _module("lineage_query").lineage(url, run_id, version=version,
                                         step=_int(own, "--step")),
        _module("render_lineage").print_lineage),
    "prompts": lambda url, run_id, version, own: (
        _module("lineage_query").prompts(url, run_id), _module("render_lineage").print_prompts),
    "verify": lambda url, run_id, version, own: (
        _module("query").verify(url, run_id, None, "--since-verified" in own),
        _module("render").print_verify),
}
