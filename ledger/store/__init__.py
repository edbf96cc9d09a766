"""The store: the :class:`Ledger` facade (:mod:`ledger.store.ledger`) over one database (many
runs), SQLite or PostgreSQL, and the modules it is built from.

Names are imported on first use (PEP 562): the modules that read without SQLAlchemy
(:mod:`ledger.store.codecs`, :mod:`ledger.store.reads`, :mod:`ledger.store.plain`) are in this
package, and importing one of them must not import the facade and SQLAlchemy with it.
"""

from typing import TYPE_CHECKING, Any

__all__ = ["DEFAULT_SNAPSHOT_EVERY", "Ledger", "RunSummary"]

if TYPE_CHECKING:
    from ledger.store.ledger import DEFAULT_SNAPSHOT_EVERY, Ledger, RunSummary


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module 'ledger.store' has no attribute {name!r}")
    from ledger.store import ledger as facade

    value = getattr(facade, name)
    globals()[name] = value
    return value
