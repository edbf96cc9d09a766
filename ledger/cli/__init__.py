"""The ``ledger`` command: parsing (app, args), queries over the read model (query; db for
schema revisions), rendering (render), plots (plot)."""

from ledger.cli.app import app, main

__all__ = ["app", "main"]
