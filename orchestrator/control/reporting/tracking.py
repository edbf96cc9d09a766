"""Experiment tracking: each run also in TensorBoard and/or Weights & Biases (``--tracker``).

``metrics.jsonl`` and the PNG stay the run's record; trackers are views of it in the tools
users already watch. A :class:`RunTracker` fans out to the chosen backends:

- **every metrics.jsonl key, every step** (:meth:`RunTracker.log_step`): numbers as scalars
  under their own key (nested dicts flattened with ``/``, e.g. the ledger-head witness as
  ``ledger_head/version``); text values (``publisher``, ...) as text, logged when they change;
- **the run's identity** at the start (:meth:`RunTracker.start`): the run config (passwords
  redacted, as the ledger stores it), the ledger's run id and head;
- **ledger events as markers** (:meth:`RunTracker.log_ledger_events`): promotions (start,
  failover, resume), ``run_resumed``, cell states, aborted updates, drill events and the end of
  the run, as text at the step they were seen, plus a ``ledger/promotions`` scalar.

Backends: TensorBoard event files under ``<run dir>/tensorboard`` (``torch.utils.tensorboard``);
W&B in ``<run dir>/wandb``, **offline** unless ``WANDB_MODE`` says otherwise (``wandb sync`` it
later), project ``$WANDB_PROJECT`` or ``rl-ledger``, run id = the ledger's run id (a resumed run
continues the same W&B run). A tracker must never fail a run: after it is open, a backend error
is logged once and that backend is dropped.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Protocol

from ledger import redact_secrets
from orchestrator.config import RunConfig, Tracker
from orchestrator.errors import StartupError

__all__ = ["MARKER_KINDS", "RunTracker", "TensorBoardBackend", "WandbBackend", "open_tracker"]

logger = logging.getLogger(__name__)

TENSORBOARD_DIR = "tensorboard"
DEFAULT_WANDB_PROJECT = "rl-ledger"
MARKER_KINDS: frozenset[str] = frozenset({
    "cell_promoted", "run_resumed", "cell_state", "weight_update_aborted", "run_finished",
    "run_failed",
})


class Backend(Protocol):
    """One tracking tool."""

    name: str

    def scalars(self, step: int, values: dict[str, float]) -> None: ...

    def text(self, step: int, tag: str, text: str) -> None: ...

    def close(self) -> None: ...


class TensorBoardBackend:
    """TensorBoard event files in ``log_dir`` (``torch.utils.tensorboard.SummaryWriter``)."""

    name = "tensorboard"

    def __init__(self, log_dir: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.log_dir = log_dir
        self._writer = SummaryWriter(log_dir=str(log_dir))

    def scalars(self, step: int, values: dict[str, float]) -> None:
        for key, value in values.items():
            self._writer.add_scalar(key, value, step)
        self._writer.flush()

    def text(self, step: int, tag: str, text: str) -> None:
        self._writer.add_text(tag, text, step)
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


class WandbBackend:
    """A W&B run (offline unless ``WANDB_MODE`` is set) in ``<run dir>/wandb/`` (W&B makes the
    ``wandb`` folder itself under the directory it is given)."""

    name = "wandb"

    def __init__(self, run_dir: Path, run_id: str, config: dict[str, Any]) -> None:
        import wandb

        run_dir.mkdir(parents=True, exist_ok=True)
        self._wandb = wandb
        self._run = wandb.init(
            project=os.environ.get("WANDB_PROJECT", DEFAULT_WANDB_PROJECT), name=run_id,
            id=run_id, resume="allow", dir=str(run_dir), config=config,
            mode=os.environ.get("WANDB_MODE", "offline"),  # type: ignore[arg-type]
            settings=wandb.Settings(console="off", silent=True),
        )
        self._events: list[list[Any]] = []

    @property
    def run_dir(self) -> Path:
        """The W&B run's own directory (``.../wandb/offline-run-<time>-<id>``)."""
        return Path(self._run.dir).parent

    def scalars(self, step: int, values: dict[str, float]) -> None:
        self._run.log(values, step=step)

    def text(self, step: int, tag: str, text: str) -> None:
        if tag.startswith("ledger/"):
            self._events.append([step, tag, text])
        self._run.summary[tag] = text

    def close(self) -> None:
        if self._events:
            self._run.log({"ledger/events": self._wandb.Table(
                columns=["step", "tag", "text"], data=self._events)})
        self._run.finish()


def _flatten(values: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in values.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(_flatten(value, f"{name}/"))
        else:
            flat[name] = value
    return flat


class RunTracker:
    """The run's trackers (possibly none). Every method is a no-op without backends."""

    def __init__(self, backends: list[Backend]) -> None:
        self.backends = list(backends)
        self._last_text: dict[str, str] = {}
        self._next_seq = 1
        self._promotions = 0

    def _each(self, action: str, call: Any) -> None:
        for backend in list(self.backends):
            try:
                call(backend)
            except Exception:  # noqa: BLE001 - a tracker must never fail the run
                logger.warning("tracker %s failed to %s; it is dropped", backend.name, action,
                               exc_info=True)
                self.backends.remove(backend)

    def start(self, config: RunConfig, run_id: str, head: Any) -> None:
        """Record the run config and the ledger's run id and head (step 0)."""
        dump = json.dumps(redact_secrets(config.model_dump(mode="json")), indent=2, default=str)
        identity = (f"run id `{run_id}`; ledger head: version {head.version}, epoch "
                    f"{head.epoch}, publisher {head.publisher_cell}, seq {head.seq}")
        self._each("record the run", lambda b: (
            b.text(0, "run/config", f"```\n{dump}\n```"), b.text(0, "run/ledger", identity)))

    def log_step(self, step: int, record: Mapping[str, Any]) -> None:
        """Log one metrics.jsonl record: numbers as scalars, changed text values as text."""
        numbers: dict[str, float] = {}
        texts: dict[str, str] = {}
        for key, value in _flatten(record).items():
            if isinstance(value, bool):
                numbers[key] = float(value)
            elif isinstance(value, int | float):
                numbers[key] = float(value)
            elif value is not None and key != "time" and self._last_text.get(key) != str(value):
                texts[key] = str(value)
        self._last_text.update(texts)
        self._each("log a step", lambda b: b.scalars(step, numbers))
        for key, text in texts.items():
            self._each("log text", lambda b, k=key, t=text: b.text(step, k, t))

    def follow_ledger(self, ledger: Any, run_id: str, step: int) -> None:
        """Log the marker events the ledger recorded since the last call, at ``step``. Reads
        the ledger only if there is a backend to log to."""
        if self.backends:
            self.log_ledger_events(ledger.events(run_id, start_seq=self._next_seq), step)

    def log_ledger_events(self, events: Iterable[Any], step: int) -> None:
        """Log the marker events among ``events`` (each once, by seq) at ``step``."""
        for event in events:
            if event.seq < self._next_seq:
                continue
            self._next_seq = event.seq + 1
            kind = str(getattr(event.kind, "value", event.kind))
            if kind not in MARKER_KINDS and not kind.startswith("drill_"):
                continue
            if kind == "cell_promoted":
                self._promotions += 1
                self._each("log a marker", lambda b: b.scalars(
                    step, {"ledger/promotions": float(self._promotions)}))
            payload = json.dumps(event.payload, default=str, sort_keys=True)
            text = (f"seq {event.seq} {kind} cell={event.cell_id} epoch={event.epoch} "
                    f"{payload}")
            self._each("log a marker", lambda b, t=text, k=kind: b.text(step, f"ledger/{k}", t))

    @property
    def next_seq(self) -> int:
        """The first ledger seq not yet looked at."""
        return self._next_seq

    def finish(self, ledger: Any, run_id: str, step: int) -> None:
        """Log the events not seen yet (``run_finished`` / ``run_failed``) and the final head,
        then close. Best effort: an unreadable ledger is logged, never raised."""
        if self.backends:
            try:
                self.log_ledger_events(ledger.events(run_id, start_seq=self._next_seq), step)
                head = ledger.head(run_id)
                self._each("record the head", lambda b: b.text(
                    step, "run/ledger_head", f"version {head.version}, epoch {head.epoch}, "
                    f"publisher {head.publisher_cell}, seq {head.seq}"))
            except Exception:  # noqa: BLE001 - the run's own outcome is what counts
                logger.warning("tracker could not read the ledger of %s", run_id, exc_info=True)
        self.close()

    def close(self) -> None:
        """Flush and close every backend (idempotent)."""
        self._each("close", lambda b: b.close())
        self.backends = []


def open_tracker(config: RunConfig, run_dir: Path) -> RunTracker:
    """The trackers ``config.tracker`` names, writing under ``run_dir``.

    Raises:
        StartupError: a tracker's package is not installed (``pip install -e '.[tracking]'``).
    """
    backends: list[Backend] = []
    chosen = set(config.tracker) - {Tracker.NONE}
    try:
        if Tracker.TENSORBOARD in chosen:
            backends.append(TensorBoardBackend(run_dir / TENSORBOARD_DIR))
        if Tracker.WANDB in chosen:
            backends.append(WandbBackend(run_dir, str(config.run_id),
                                         redact_secrets(config.model_dump(mode="json"))))
    except ImportError as exc:
        for backend in backends:
            backend.close()
        raise StartupError(f"--tracker needs {exc.name or 'its package'}: "
                           "pip install -e '.[tracking]'") from None
    return RunTracker(backends)
