"""What a resume checks before it writes anything: the run exists, and the ledger is not behind
what the run's checkpoints and metrics witnessed."""

from __future__ import annotations

from ledger import Ledger, LedgerError, UnknownRunError
from ledger.audit.witness import check_witnesses as check_against_ledger
from ledger.audit.witness import read_witnesses
from ledger.redact import redact_text
from ledger.run_layout import RunLayout
from orchestrator.errors import StartupError

__all__ = ["check_witnesses", "require_run"]


def require_run(ledger_url: str, run_id: str, layout: RunLayout) -> None:
    """Raise :class:`StartupError` unless ``run_id`` is in the ledger at ``ledger_url``. Opens
    it read-only and writes nothing (an embedded ledger that does not exist is not created)."""
    missing = StartupError(f"run {run_id} is not in {redact_text(ledger_url)}; nothing to resume")
    if ledger_url == layout.ledger_url and not layout.ledger_path.exists():
        raise missing
    with Ledger.open(ledger_url, readonly=True) as ledger:
        try:
            ledger.head(run_id)
        except UnknownRunError:
            raise missing from None


def check_witnesses(ledger: Ledger, run_id: str, layout: RunLayout) -> None:
    """Refuse to resume on a ledger behind what the run's checkpoints and metrics saw
    (the database was restored from an older backup): it would hand out version numbers
    engines, checkpoints and metrics have already seen. Reads only.

    Raises:
        StartupError: a witness is ahead of the ledger or diverges from it (one line).
    """
    if not layout.run_dir.is_dir():
        return
    try:
        witnesses = [w for w in read_witnesses(layout.run_dir) if w.run_id == run_id]
    except LedgerError:
        return  # nothing witnessed yet
    problems = check_against_ledger(ledger, witnesses)
    if problems:
        raise StartupError(f"refusing to resume {run_id}: {problems[0].message} "
                           f"({len(problems)} witness problem(s); `ledger verify --witness "
                           f"{layout.run_dir}` lists them)")
