"""Shared fixtures: real SQLite files, schemas on the real PostgreSQL server, one Ray cluster.

PostgreSQL: ``LEDGER_TEST_PG_URL`` (default: the local server). Each test gets its own schema,
so tests never see each other's rows. With ``CI=true`` an unreachable server fails the test;
elsewhere the test is skipped with a one-line reason.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

os.environ.setdefault("RAY_DISABLE_USAGE_STATS", "1")

DEFAULT_PG_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
RAY_TEST_CPUS = 8  # logical CPUs; actors take fractions of them on the 2-core machine


def pytest_collection_modifyitems(config, items) -> None:
    """``gpu``-marked tests are skipped, with one reason, where torch sees no CUDA device."""
    if not any(item.get_closest_marker("gpu") for item in items):
        return
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (make gpu-check on a GPU machine)")
    for item in items:
        if item.get_closest_marker("gpu"):
            item.add_marker(skip)


def pg_base_url() -> str:
    return os.environ.get("LEDGER_TEST_PG_URL", DEFAULT_PG_URL)


def _with_search_path(url: str, schema: str) -> str:
    separator = "&" if "?" in url else "?"
    return f"{url}{separator}options=-csearch_path%3D{schema}"


@pytest.fixture(scope="session")
def pg_admin_engine():
    """An engine on the test database, or a skip (a failure under CI) if it is unreachable.

    It pools nothing: the ``database-outage`` drill restarts the server mid-session, and a
    pooled connection the server ended would fail the next test's schema setup.
    """
    import sqlalchemy as sa
    from sqlalchemy.pool import NullPool

    engine = sa.create_engine(pg_base_url(), isolation_level="AUTOCOMMIT", poolclass=NullPool)
    try:
        with engine.connect() as conn:
            conn.execute(sa.text("SELECT 1"))
    except Exception as exc:  # noqa: BLE001 - any connection failure means "no server"
        engine.dispose()
        reason = f"PostgreSQL unreachable at {pg_base_url()}: {type(exc).__name__}"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(reason)
        pytest.skip(reason)
    yield engine
    engine.dispose()


@pytest.fixture
def pg_url(pg_admin_engine) -> Iterator[str]:
    """A URL whose search_path is a fresh schema, dropped after the test."""
    import sqlalchemy as sa

    schema = f"t_{uuid.uuid4().hex[:12]}"
    with pg_admin_engine.connect() as conn:
        conn.execute(sa.text(f'CREATE SCHEMA "{schema}"'))
    try:
        yield _with_search_path(pg_base_url(), schema)
    finally:
        with pg_admin_engine.connect() as conn:
            conn.execute(sa.text(f'DROP SCHEMA "{schema}" CASCADE'))


@pytest.fixture
def sqlite_path(tmp_path: Path) -> Path:
    return tmp_path / "ledger.db"


@pytest.fixture
def sqlite_url(sqlite_path: Path) -> str:
    """A file-backed SQLite URL (WAL mode is set by the ledger; in-memory would hide locking)."""
    return f"sqlite:///{sqlite_path}"


@pytest.fixture(params=["sqlite", "postgresql"])
def ledger_url(request) -> str:
    """Both backends, for tests that are not written as a contract class."""
    if request.param == "sqlite":
        return request.getfixturevalue("sqlite_url")
    return request.getfixturevalue("pg_url")


@pytest.fixture(scope="session")
def ray_cluster():
    """One local Ray cluster for the whole test session."""
    import ray

    from orchestrator.control.lean_ray import start_local_ray

    if not ray.is_initialized():
        # A private cluster, whatever `ray start` left on the machine, started as a job's own.
        start_local_ray(num_cpus=RAY_TEST_CPUS)
    yield ray
    ray.shutdown()
