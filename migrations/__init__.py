"""Alembic environment and revisions: the only way a ledger schema is created or changed."""
