"""The ``ledger`` command: parsing (app, args; fast: the plain read commands without the
app), queries over the read model (query; db for schema revisions), rendering (render), plots
(plot)."""

from __future__ import annotations

import os
import sys

__all__ = ["app", "main"]


def main() -> None:
    """Console-script entry point: the plain read commands (:mod:`ledger.cli.fast`) answer
    without building the typer app; everything else goes to the app."""
    from ledger.cli.fast import run

    try:
        code = run(sys.argv[1:])
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        sys.exit(1)
    if code is not None:
        sys.exit(code)
    from ledger.cli.app import main as app_main

    app_main()


def __getattr__(name: str):
    if name == "app":  # the typer app, built on first use
        from ledger.cli.app import app

        return app
    raise AttributeError(name)
