"""Helpers shared by ledger tests: raw table dumps, worker processes, and damage planted by
raw SQL behind the ledger's back."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import sqlalchemy as sa

from ledger import Ledger
from ledger.schema import metadata


def dump_tables(ledger: Ledger) -> dict[str, list[tuple]]:
    """Every row of every ledger table, in primary-key order: a byte-for-byte comparable view."""
    engine = sa.create_engine(ledger._url)
    try:
        with engine.connect() as conn:
            return {
                table.name: [
                    tuple(json.dumps(v, sort_keys=True, default=str) for v in row)
                    for row in conn.execute(
                        sa.select(table).order_by(*table.primary_key.columns)
                    )
                ]
                for table in metadata.sorted_tables
            }
    finally:
        engine.dispose()


REPO_ROOT = Path(__file__).resolve().parent.parent


def start_commit_loop(
    url: str, run_id: str, epoch: int, count: int, out: Path, cell_id: str = "cell-0"
) -> subprocess.Popen:
    """A writer process running :func:`commit_loop` (``count`` < 0: until killed)."""
    return subprocess.Popen(
        [sys.executable, "-m", "tests.ledger_helpers", url, run_id, cell_id, str(epoch),
         str(count), str(out)],
        cwd=REPO_ROOT,
    )


def named_session_url(url: str, name: str) -> str:
    """``url`` with its PostgreSQL sessions tagged ``application_name=name`` (SQLite: as is)."""
    if sa.make_url(url).get_backend_name() != "postgresql":
        return url
    separator = "&" if "?" in url else "?"
    return f"{url}{separator}application_name={name}"


def server_sessions_named(url: str, name: str) -> int:
    """How many PostgreSQL sessions tagged ``name`` the server still holds (SQLite: 0).

    A SIGKILLed client's last transaction is not over when the client is: the server may still
    be committing it until it notices the closed socket and ends that session.
    """
    if sa.make_url(url).get_backend_name() != "postgresql":
        return 0
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            return conn.execute(sa.text("SELECT count(*) FROM pg_stat_activity "
                                        "WHERE application_name = :name"), {"name": name}
                                ).scalar_one()
    finally:
        engine.dispose()


def read_versions(path: Path) -> list[int]:
    """The versions a :func:`commit_loop` process recorded, in order."""
    return [int(line) for line in path.read_text().splitlines() if line.strip()]


def commit_loop(url: str, run_id: str, cell_id: str, epoch: int, count: int, out: str) -> None:
    """Commit ``count`` versions (``count`` < 0: forever) and record each version returned."""
    ledger = Ledger.open(url)
    versions: list[int] = []
    step = 0
    with open(out, "a", encoding="utf-8") as sink:
        while count < 0 or step < count:
            step += 1
            version = ledger.commit_weights(
                run_id, cell_id=cell_id, epoch=epoch, train_step=step
            )
            versions.append(version)
            sink.write(f"{version}\n")
            sink.flush()
    ledger.close()


# ---------------------------------------------------------------------- planting damage by hand


def execute(url: str, *statements: str, **params) -> None:
    """Run raw SQL statements in one transaction, behind the ledger's back."""
    engine = sa.create_engine(url)
    try:
        with engine.begin() as conn:
            for statement in statements:
                conn.execute(sa.text(statement), params)
    finally:
        engine.dispose()


def without_foreign_keys(url: str, *statements: str, **params) -> None:
    """Like :func:`execute`, with foreign keys not enforced (SQLite does not enforce them on a
    plain connection; PostgreSQL skips its FK triggers as a replica does)."""
    if sa.make_url(url).get_backend_name() == "postgresql":
        statements = ("SET LOCAL session_replication_role = replica", *statements)
    execute(url, *statements, **params)


def derived_rows(run_id: str, seq: int, kind: str, payload: object
                 ) -> tuple[int | None, list[dict]]:
    """The ``train_step`` column and ``version_uses`` rows the append derives from a payload,
    so that a planted row breaks only the invariant it is planted for."""
    if not isinstance(payload, dict):
        return None, []
    step = payload.get("train_step")
    step = step if isinstance(step, int) else None
    versions = payload.get("sample_versions")
    uses = []
    if kind == "batch_trained" and step is not None and isinstance(versions, dict):
        for version, samples in versions.items():
            try:
                uses.append({"run_id": run_id, "version": int(version), "seq": seq,
                             "train_step": step, "samples": int(samples)})
            except (TypeError, ValueError):
                return step, []
    return step, uses


def plant_event(
    url: str,
    run_id: str,
    *,
    kind: str,
    payload: dict,
    cell_id: str | None = None,
    epoch: int | None = None,
    version: int | None = None,
    idempotency_key: str | None = "",
    seq: int | None = None,
    move_head: bool = True,
) -> int:
    """Append a row with a *valid* hash (chained to the head row),
    bypassing every check of the ledger; move the head row to it. Returns its seq.

    ``idempotency_key=""`` means ``planted:<seq>``; None plants a NULL key.
    """
    from ledger.events import GENESIS_HASH, event_hash
    from ledger.schema import ledger_events, run_heads, version_uses

    engine = sa.create_engine(url)
    try:
        with engine.begin() as conn:
            if conn.dialect.name == "postgresql":
                conn.execute(sa.text("SET LOCAL session_replication_role = replica"))
            head = conn.execute(
                sa.select(run_heads).where(run_heads.c.run_id == run_id)
            ).first()
            seq = seq if seq is not None else (head.last_seq + 1 if head else 1)
            prev = head.head_hash if head else GENESIS_HASH
            key = f"planted:{seq}" if idempotency_key == "" else idempotency_key
            recorded_at = datetime(2026, 11, 29, 12, 0, 0)
            digest = event_hash(
                prev_hash=prev, run_id=run_id, seq=seq, kind=kind, version=version,
                cell_id=cell_id, epoch=epoch, idempotency_key=key, payload=payload,
                recorded_at=recorded_at,
            )
            step, uses = derived_rows(run_id, seq, kind, payload)
            conn.execute(ledger_events.insert().values(
                run_id=run_id, seq=seq, kind=kind, version=version, cell_id=cell_id,
                epoch=epoch, idempotency_key=key, payload=payload,
                hash=digest, recorded_at=recorded_at, train_step=step,
            ))
            if uses:
                conn.execute(version_uses.insert(), uses)
            if move_head and head is not None:
                values = {"last_seq": seq, "head_hash": digest}
                if version is not None:
                    values["head_version"] = version
                conn.execute(
                    run_heads.update().where(run_heads.c.run_id == run_id).values(**values)
                )
        return seq
    finally:
        engine.dispose()


def loosen_idempotency_key(url: str) -> None:
    """Drop NOT NULL and UNIQUE from ``ledger_events.idempotency_key`` by raw DDL, as a
    hand-edited database might have them (SQLite cannot drop a constraint: the table is
    rebuilt from its own DDL without them)."""
    if sa.make_url(url).get_backend_name() == "postgresql":
        execute(
            url,
            "ALTER TABLE ledger_events DROP CONSTRAINT uq_ledger_events_idempotency",
            "ALTER TABLE ledger_events ALTER COLUMN idempotency_key DROP NOT NULL",
        )
        return
    engine = sa.create_engine(url)
    try:
        with engine.begin() as conn:
            ddl = conn.execute(sa.text(
                "SELECT sql FROM sqlite_master WHERE type = 'table' AND name = 'ledger_events'"
            )).scalar_one()
            loose = re.sub(
                r"idempotency_key VARCHAR\(256\) NOT NULL", "idempotency_key VARCHAR(256)", ddl
            )
            loose = re.sub(r",\s*CONSTRAINT uq_ledger_events_idempotency UNIQUE \([^)]*\)", "",
                           loose)
            assert loose != ddl, ddl
            loose = re.sub(
                r'CREATE TABLE "?ledger_events"?', "CREATE TABLE ledger_events_loose", loose,
                count=1,
            )
            conn.execute(sa.text(loose))
            conn.execute(sa.text("INSERT INTO ledger_events_loose SELECT * FROM ledger_events"))
            conn.execute(sa.text("DROP TABLE ledger_events"))
            conn.execute(sa.text("ALTER TABLE ledger_events_loose RENAME TO ledger_events"))
    finally:
        engine.dispose()


if __name__ == "__main__":
    # python -m tests.ledger_helpers URL RUN CELL EPOCH COUNT OUT
    url, run_id, cell_id, epoch, count, out = sys.argv[1:7]
    Path(out).touch()
    commit_loop(url, run_id, cell_id, int(epoch), int(count), out)
