"""The ``ledger`` command: parsing (app, args), queries over the read model (query), rendering
(render), plots (plot)."""

from ledger.cli.app import app, main

__all__ = ["app", "main"]
