"""Run conventions shared by the orchestrator (which writes a run) and the ledger CLI (which
reads one): the run directory layout, its file names, the few metric keys the ledger CLI reads
back (step, reward, staleness histogram), the default ledger URL. The orchestrator's own metric
vocabulary is ``orchestrator.metric_keys``.

This is the one place these names live; nothing else spells ``metrics.jsonl``. It imports
nothing from the project, so both sides may use it.

A run directory (``runs/<run-id>/`` by default)::

    ledger.db        the embedded SQLite ledger (when no --db is given)
    metrics.jsonl    one JSON object per training step, each with the ledger head it saw
                     under "ledger_head" ({"run_id", "seq", "version", "hash"})
    run.png          the run's plot
    checkpoints/     step-NNNNNN.pt (cells), beside it step-NNNNNN.witness.json (the ledger
                     head the checkpoint saw, the same four keys)

The ledger URL itself may come from ``LEDGER_DB`` (``LEDGER_DB_ENV``); a PostgreSQL password
belongs in ``PGPASSWORD`` or ``~/.pgpass``, never in the URL (see :mod:`ledger.redact`).
"""

from __future__ import annotations

from pathlib import Path

__all__ = [
    "CHECKPOINT_DIR",
    "DEFAULT_RUNS_DIR",
    "LEDGER_DB_ENV",
    "LEDGER_FILE",
    "LEDGER_HEAD_KEY",
    "METRICS_FILE",
    "PLOT_FILE",
    "REWARD_KEY",
    "STALENESS_HISTOGRAM_KEY",
    "STEP_KEY",
    "WITNESS_KEYS",
    "WITNESS_SUFFIX",
    "RunLayout",
    "checkpoint_witness_path",
    "default_ledger_url",
]

DEFAULT_RUNS_DIR = Path("runs")
LEDGER_FILE = "ledger.db"
METRICS_FILE = "metrics.jsonl"
PLOT_FILE = "run.png"
CHECKPOINT_DIR = "checkpoints"
LEDGER_DB_ENV = "LEDGER_DB"  # the environment variable the `ledger` command reads its URL from

# Witnesses (what a run's files saw of the ledger): a metrics line holds one under this key, a
# checkpoint has one in a sidecar file with this suffix; both have exactly these keys.
LEDGER_HEAD_KEY = "ledger_head"
WITNESS_SUFFIX = ".witness.json"
WITNESS_KEYS = ("run_id", "seq", "version", "hash")

# Keys of a metrics.jsonl line the ledger CLI reads: the training step it records, its mean
# reward, and the staleness histogram (``orchestrator.metric_keys`` names the rest).
STEP_KEY = "step"
REWARD_KEY = "reward/mean"
STALENESS_HISTOGRAM_KEY = "rollout/fully_async/staleness_hist"


def checkpoint_witness_path(checkpoint: Path) -> Path:
    """The witness sidecar of a checkpoint: ``step-000010.pt`` -> ``step-000010.witness.json``."""
    checkpoint = Path(checkpoint)
    return checkpoint.with_name(checkpoint.stem + WITNESS_SUFFIX)


def default_ledger_url(run_dir: Path) -> str:
    """The embedded SQLite ledger of a run directory: ``sqlite:///<run_dir>/ledger.db``."""
    return f"sqlite:///{Path(run_dir) / LEDGER_FILE}"


class RunLayout:
    """Where a run's files go, given its directory (``runs_dir / run_id``)."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = Path(run_dir)

    @classmethod
    def of(cls, runs_dir: Path, run_id: str) -> RunLayout:
        """The layout of ``run_id`` under ``runs_dir``."""
        return cls(Path(runs_dir) / run_id)

    @property
    def ledger_path(self) -> Path:
        return self.run_dir / LEDGER_FILE

    @property
    def ledger_url(self) -> str:
        """The default (embedded SQLite) ledger URL of this run."""
        return default_ledger_url(self.run_dir)

    @property
    def metrics_path(self) -> Path:
        return self.run_dir / METRICS_FILE

    @property
    def plot_path(self) -> Path:
        return self.run_dir / PLOT_FILE

    @property
    def checkpoint_dir(self) -> Path:
        return self.run_dir / CHECKPOINT_DIR

    def checkpoint_path(self, train_step: int) -> Path:
        """The cells' checkpoint after ``train_step`` steps."""
        return self.checkpoint_dir / f"step-{train_step:06d}.pt"

    def witness_path(self, train_step: int) -> Path:
        """The ledger head that the checkpoint after ``train_step`` steps saw."""
        return checkpoint_witness_path(self.checkpoint_path(train_step))
