"""Database outages for the drills: the local PostgreSQL server stopped, or the SQLite file's
write lock held by another process, for ``hold_s`` seconds.

Each outage is ``begin()`` (the database is unavailable when it returns) then ``end()`` (waits
out ``hold_s`` and brings the database back; ``seconds`` is then the outage's length). The run's
writers meet the outage in between and must wait and retry.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Protocol

from sqlalchemy.engine import make_url
from tenacity import RetryError, Retrying, retry_if_result, stop_after_delay, wait_fixed

from orchestrator.drills.context import DrillError

__all__ = ["DatabaseOutage", "PostgresOutage", "SqliteLock", "database_outage"]

PG_CLUSTER_NAME = "main"
PG_READY_TIMEOUT_S = 60.0


class DatabaseOutage(Protocol):
    """An outage of the ledger's database (see the module docstring)."""

    hold_s: float
    seconds: float

    def begin(self) -> None:
        """Make the database unavailable. Raises DrillError if that cannot be done here."""

    def end(self) -> None:
        """Wait out ``hold_s`` from ``begin``, then bring the database back."""


def database_outage(ledger_url: str, hold_s: float) -> DatabaseOutage:
    """The outage that fits ``ledger_url``'s backend.

    Raises:
        DrillError: a PostgreSQL URL without a local cluster to stop.
    """
    url = make_url(ledger_url)
    if url.get_backend_name() == "postgresql":
        return PostgresOutage(hold_s)
    return SqliteLock(Path(url.database or ""), hold_s)


def _pg_ready() -> bool:
    return subprocess.run(["pg_isready", "-h", "127.0.0.1"], capture_output=True).returncode == 0


class PostgresOutage:
    """Stop the local PostgreSQL cluster, and start it again ``hold_s`` later."""

    def __init__(self, hold_s: float) -> None:
        versions = sorted(os.listdir("/etc/postgresql")) if os.path.isdir("/etc/postgresql") else []
        if not versions:
            raise DrillError("database-outage on PostgreSQL needs a local cluster "
                             "(/etc/postgresql); none found")
        self.version = versions[-1]
        self.hold_s = hold_s
        self.seconds = 0.0
        self._started = 0.0

    def _ctl(self, action: str) -> None:
        subprocess.run(["pg_ctlcluster", "--skip-systemctl-redirect", self.version,
                        PG_CLUSTER_NAME, action], check=True, capture_output=True, timeout=120)

    def begin(self) -> None:
        """Stop the cluster.

        Raises:
            DrillError: the server still answers after the stop.
            subprocess.CalledProcessError: ``pg_ctlcluster`` failed.
        """
        self._ctl("stop")
        self._started = time.monotonic()
        if _pg_ready():
            raise DrillError("PostgreSQL still answers after pg_ctlcluster stop")

    def end(self) -> None:
        """Start the cluster once ``hold_s`` has passed and wait (bounded) until it answers;
        a server that does not answer within ``PG_READY_TIMEOUT_S`` is left to the run's
        writers, whose retries then fail the drill."""
        try:
            time.sleep(max(0.0, self.hold_s - (time.monotonic() - self._started)))
        finally:
            self._ctl("start")
            until_ready = Retrying(stop=stop_after_delay(PG_READY_TIMEOUT_S),
                                   wait=wait_fixed(0.2), retry=retry_if_result(lambda ok: not ok))
            try:
                until_ready(_pg_ready)
            except RetryError:
                pass
            self.seconds = time.monotonic() - self._started


_LOCK_SCRIPT = """\
import sqlite3, sys, time
c = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=60)
c.execute('BEGIN EXCLUSIVE')
print('locked', flush=True)
time.sleep(float(sys.argv[2]))
c.execute('COMMIT')
"""


class SqliteLock:
    """Another process holds the SQLite file's write lock (``BEGIN EXCLUSIVE``) for
    ``hold_s``: the run's writers wait on the busy timeout, then retry."""

    def __init__(self, path: Path, hold_s: float) -> None:
        self.path, self.hold_s, self.seconds = path, hold_s, 0.0
        self._process: subprocess.Popen[str] | None = None
        self._started = 0.0

    def begin(self) -> None:
        """Start the locking process and wait until it holds the lock.

        Raises:
            DrillError: it could not take the lock.
        """
        self._process = subprocess.Popen(
            [sys.executable, "-c", _LOCK_SCRIPT, str(self.path), str(self.hold_s)],
            stdout=subprocess.PIPE, text=True,
        )
        assert self._process.stdout is not None
        if self._process.stdout.readline().strip() != "locked":
            raise DrillError(f"could not lock {self.path}")
        self._started = time.monotonic()

    def end(self) -> None:
        """Wait for the locking process to commit and exit."""
        if self._process is None:
            raise DrillError("SqliteLock.end() before begin()")
        self._process.wait(timeout=self.hold_s + 120)
        self.seconds = time.monotonic() - self._started
