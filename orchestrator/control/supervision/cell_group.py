"""CellGroup: the run's N independent trainer cells (indep-dp) and their gradient quorum.

This module is mechanism only: it creates cell actors, records their state in the ledger
(``cell_state``), heartbeats them, forms a quorum, runs ONE attempt of a sharded train step,
copies state between cells and replaces a lost cell. Every call on a cell is bounded by the
failure policy (a frozen process answers nothing, so a call without an answer within its
timeout counts as failed with ``GetTimeoutError``). Deciding what a failure means and whether
to try again is cell failover's job (:mod:`.cell_failover`), under the one failure policy.

Gradient averaging runs over the alive cells; each change of membership forms a new quorum (a
fresh quorum id, hence a fresh store prefix: members of an old quorum can never meet members of
the new one). Its backend (gloo, or NCCL when each cell has a GPU of its own) is fixed by the
run's config and recorded in every ``cell_state`` (``gradient_backend``).
"""

from __future__ import annotations

import enum
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import ray
from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError

from actors.errors import EngineSilentError
from ledger import EventKind, Ledger
from orchestrator.config import RunConfig
from orchestrator.control.placement.devices import cell_device_options
from orchestrator.control.supervision.failure_policy import FailurePolicy
from orchestrator.control.sharding import shard_groups
from orchestrator.rollout.types import Sample

__all__ = ["CellGroup", "CellState", "CellStepAttempt", "is_actor_loss", "is_engine_loss"]

logger = logging.getLogger(__name__)

CellFactory = Callable[[RunConfig, str], Any]

# A heartbeat sent ahead (CellGroup.send_heartbeat) is read only this soon after it was sent:
# the loop sends it before a drain, so a fully-async drain (milliseconds) hides its round
# trip, while after a long drain (--sync generates the whole batch) the cells are asked again.
SENT_HEARTBEAT_MAX_AGE_S = 0.05


def is_actor_loss(exc: BaseException) -> bool:
    """True if the actor called is gone or frozen. A ``RayTaskError`` means the actor ran and
    raised (possibly a Ray error from an actor *it* called, such as a dead engine)."""
    if isinstance(exc, RayTaskError):
        return False
    return isinstance(exc, RayActorError | GetTimeoutError)


def is_engine_loss(exc: BaseException) -> bool:
    """True if a cell's call failed because an engine it talked to is gone or silent."""
    return isinstance(exc, RayTaskError) and isinstance(exc, (RayActorError, EngineSilentError))


class CellState(enum.StrEnum):
    """A cell's state as ``cell_state`` events record it."""

    ALIVE = "alive"
    ERRORED = "errored"
    HEALED = "healed"
    STOPPED = "stopped"


@dataclass
class _Cell:
    cell_id: str
    actor: Any
    alive: bool = True


@dataclass
class CellStepAttempt:
    """One attempt of a sharded train step: per-cell results, the shards, and failures."""

    cells: list[str]
    shards: list[list[Sequence[Sample]]]
    results: dict[str, dict[str, float]]
    failed: dict[str, BaseException]


class CellGroup:
    """The run's train cells and their quorum.

    Args:
        config: the run's config (``num_cells``, ...).
        ledger: an open writer ledger; the group appends ``cell_state``.
        run_id: a started run.
        create_cell: builds one cell actor (``orchestrator.control.launch.create_cell``).
        policy: the bounds on every wait.
        node_of: the node a cell was placed on (recorded in every ``cell_state``).
    """

    def __init__(self, config: RunConfig, ledger: Ledger, run_id: str,
                 create_cell: CellFactory, policy: FailurePolicy, *,
                 node_of: Callable[[str], dict[str, str]] = lambda cell_id: {}) -> None:
        self.config = config
        self._node_of = node_of  # cell id -> {"node_id", "host"} for its cell_state events
        self.ledger = ledger
        self.run_id = run_id
        self.policy = policy
        self._create_cell = create_cell
        self._cells: dict[str, _Cell] = {}
        self._quorum_id = 0
        self._store: Any = None
        self._store_addr: str | None = None
        self._heartbeat_progress: dict[str, int] | None = None  # see take_heartbeat_progress
        self._sent_heartbeat: tuple[float, dict[str, Any]] | None = None  # see send_heartbeat
        self.gradient_backend: str = cell_device_options(config)["gradient_backend"]

    # ------------------------------------------------------------------ membership

    def start(self) -> None:
        """Create ``num_cells`` cells and record them alive (the supervisor forms the quorum)."""
        self.create()
        self.wait_started()

    def create(self) -> None:
        """Create ``num_cells`` cells without waiting for them (they load meanwhile), then
        host the store they rendezvous on (the first quorum needs it, their start does not:
        the seconds this process may spend importing torch for it pass while they load)."""
        from actors.gradient_group import create_rendezvous_store

        for index in range(self.config.num_cells):
            cell_id = f"cell-{index}"
            self._cells[cell_id] = _Cell(cell_id, self._create_cell(self.config, cell_id))
        self._store, self._store_addr = create_rendezvous_store(self.config.rendezvous_host)

    def wait_started(self) -> None:
        """Wait until each cell :meth:`create` made answers, and record it alive.

        Raises:
            GetTimeoutError: a cell did not answer within ``first_start_timeout_s`` (or the
                first other failure of a cell, as it was raised).
        """
        calls = {cell_id: cell.actor.pid.remote() for cell_id, cell in self._cells.items()}
        self._all_or_raise(calls, self.policy.first_start_timeout_s)
        for cell_id in self._cells:
            self.record_state(cell_id, CellState.ALIVE)

    @property
    def cell_ids(self) -> list[str]:
        return sorted(self._cells)

    def alive_ids(self) -> list[str]:
        """Cells believed alive, lowest id first (the promotion order)."""
        return [c for c in self.cell_ids if self._cells[c].alive]

    def errored_ids(self) -> list[str]:
        return [c for c in self.cell_ids if not self._cells[c].alive]

    def actor(self, cell_id: str) -> Any:
        """The current actor handle of ``cell_id`` (tests and drills signal its process)."""
        return self._cells[cell_id].actor

    @property
    def quorum_id(self) -> int:
        return self._quorum_id

    def record_state(self, cell_id: str, state: CellState) -> None:
        """Append ``cell_state`` (alive, errored, healed, stopped) with the current quorum and
        the gradient backend."""
        self.ledger.append(
            self.run_id, EventKind.CELL_STATE,
            {"state": CellState(state).value, "quorum_id": self._quorum_id,
             "gradient_backend": self.gradient_backend, **self._node_of(cell_id)},
            cell_id=cell_id,
        )

    def mark_lost(self, cell_id: str, why: str) -> bool:
        """Take ``cell_id`` out of the group (``cell_state`` errored); returns False if it was
        out already."""
        cell = self._cells[cell_id]
        if not cell.alive:
            return False
        cell.alive = False
        logger.warning("cell %s lost: %s", cell_id, why)
        self.record_state(cell_id, CellState.ERRORED)
        return True

    def send_heartbeat(self) -> None:
        """Ask every alive cell its optimizer-step count now, without waiting: the next
        :meth:`heartbeat` reads these answers if it comes within ``SENT_HEARTBEAT_MAX_AGE_S``
        and no cell changed meanwhile (else it asks again)."""
        self._sent_heartbeat = (time.monotonic(), self._progress_calls(self.alive_ids()))

    def heartbeat(self) -> list[str]:
        """Heartbeat every alive cell; mark those that die or stay silent past the heartbeat
        timeout. Returns them. A cell's answer is its optimizer-step count, kept (when every
        cell answered) for the next train attempt (:meth:`take_heartbeat_progress`): the
        step boundary's heartbeat then also serves as the count a failed step is judged by."""
        calls = self._take_sent_heartbeat() or self._progress_calls(self.alive_ids())
        answers, failed = self.call_each(calls, self.policy.heartbeat_timeout_s)
        self._heartbeat_progress = None if failed else answers
        lost = [cell_id for cell_id, exc in failed.items() if is_actor_loss(exc)]
        for cell_id in lost:
            self.mark_lost(cell_id, type(failed[cell_id]).__name__)
        return lost

    def _take_sent_heartbeat(self) -> dict[str, Any] | None:
        """The calls :meth:`send_heartbeat` made, once, if still fresh and to exactly the
        alive cells."""
        sent, self._sent_heartbeat = self._sent_heartbeat, None
        if sent is None or time.monotonic() - sent[0] > SENT_HEARTBEAT_MAX_AGE_S:
            return None
        return sent[1] if sorted(sent[1]) == self.alive_ids() else None

    def _progress_calls(self, cell_ids: list[str]) -> dict[str, Any]:
        return {cell_id: self._cells[cell_id].actor.progress.remote() for cell_id in cell_ids}

    def _forget_answers(self) -> None:
        """A cell's state changes: no step count heard before stands."""
        self._heartbeat_progress = None
        self._sent_heartbeat = None

    def take_heartbeat_progress(self, cell_ids: list[str]) -> dict[str, int] | None:
        """The optimizer-step counts of ``cell_ids`` from the last heartbeat, once, if no
        cell's state changed since and it heard exactly these cells; else None (ask
        :meth:`progress`)."""
        seen, self._heartbeat_progress = self._heartbeat_progress, None
        return seen if seen is not None and sorted(seen) == sorted(cell_ids) else None

    def call_each(self, calls: dict[str, Any], timeout: float
                  ) -> tuple[dict[str, Any], dict[str, BaseException]]:
        """Wait up to ``timeout`` for every cell's call; return results and failures by cell.

        A call that has not returned by then counts as failed with ``GetTimeoutError``: its
        cell is frozen or gone, and is never waited for without a bound.
        """
        if not calls:
            return {}, {}
        ready, _ = ray.wait(list(calls.values()), num_returns=len(calls), timeout=timeout)
        results: dict[str, Any] = {}
        failed: dict[str, BaseException] = {}
        for cell_id, ref in calls.items():
            if ref not in ready:
                failed[cell_id] = GetTimeoutError(f"cell {cell_id}: no answer in {timeout:g}s")
                continue
            try:
                results[cell_id] = ray.get(ref)
            except Exception as exc:  # noqa: BLE001 - sorted out by the supervisor
                failed[cell_id] = exc
        return results, failed

    def _all_or_raise(self, calls: dict[str, Any], timeout: float) -> dict[str, Any]:
        """:meth:`call_each`, raising the first failure (``GetTimeoutError`` for a silent cell)."""
        results, failed = self.call_each(calls, timeout)
        if failed:
            raise next(iter(failed.values()))
        return results

    # ------------------------------------------------------------------ one attempt each

    def form_quorum(self) -> dict[str, BaseException]:
        """Form a new quorum (a fresh quorum id) over the alive cells; returns the cells that
        failed to join (empty: the quorum stands)."""
        alive = self.alive_ids()
        self._quorum_id += 1
        calls = {
            cell_id: self._cells[cell_id].actor.configure_group.remote(
                self._quorum_id, rank, len(alive), self._store_addr
            )
            for rank, cell_id in enumerate(alive)
        }
        _, failed = self.call_each(calls, self.policy.step_timeout_s)
        if not failed:
            logger.info("quorum %d: %s over %s", self._quorum_id, alive, self.gradient_backend)
        return failed

    def train_once(self, groups: Sequence[Sequence[Sample]]) -> CellStepAttempt:
        """One attempt of a GRPO step over ``groups``, sharded across the alive cells."""
        alive = self.alive_ids()
        shards = shard_groups(groups, len(alive))
        calls = {
            cell_id: self._cells[cell_id].actor.train_step.remote(shard)
            for cell_id, shard in zip(alive, shards)
        }
        results, failed = self.call_each(calls, self.policy.step_timeout_s)
        return CellStepAttempt(alive, shards, results, failed)

    def progress(self, cell_ids: list[str]) -> tuple[dict[str, int], dict[str, BaseException]]:
        """Optimizer steps applied per cell (within the heartbeat timeout), and failures."""
        return self.call_each(self._progress_calls(cell_ids), self.policy.heartbeat_timeout_s)

    def copy_state(self, source: str, targets: list[str]) -> None:
        """Every cell in ``targets`` adopts ``source``'s weights and optimizer state.

        Raises:
            GetTimeoutError: a cell did not answer within the policy's transfer timeout.
            RayActorError: a cell died.
        """
        self._forget_answers()
        state = self._cells[source].actor.get_state.remote()
        self._all_or_raise({c: self._cells[c].actor.set_state.remote(state) for c in targets},
                           self.policy.transfer_timeout_s)

    def replace(self, cell_id: str, source: str) -> None:
        """Replace lost ``cell_id`` by a new actor holding ``source``'s state; it rejoins as a
        follower (``cell_state`` healed). The caller forms a new quorum afterwards.

        Raises:
            GetTimeoutError, RayActorError: the new cell or ``source`` did not take part in
                time; ``cell_id`` stays lost.
        """
        actor = self._new_actor(cell_id)
        state = self._cells[source].actor.get_state.remote()
        self._all_or_raise({cell_id: actor.set_state.remote(state)},
                           self.policy.transfer_timeout_s + self.policy.actor_start_timeout_s)
        self._cells[cell_id] = _Cell(cell_id, actor, alive=True)
        self.record_state(cell_id, CellState.HEALED)

    def restart(self, cell_id: str) -> None:
        """Replace lost ``cell_id`` by a new actor with its initial weights, for when no
        survivor is left to copy from; it is alive once it answers. The caller loads a
        checkpoint into it, records it healed and forms a new quorum.

        Raises:
            GetTimeoutError, RayActorError: the new cell did not start in time; ``cell_id``
                stays lost.
        """
        actor = self._new_actor(cell_id)
        self._all_or_raise({cell_id: actor.pid.remote()}, self.policy.actor_start_timeout_s)
        self._cells[cell_id] = _Cell(cell_id, actor, alive=True)

    def _new_actor(self, cell_id: str) -> Any:
        """Kill ``cell_id``'s actor (a frozen zombie must die) and create its successor."""
        self._forget_answers()
        try:
            ray.kill(self._cells[cell_id].actor, no_restart=True)
        except Exception:  # noqa: BLE001 - it may be gone already
            pass
        return self._create_cell(self.config, cell_id)

    def load_checkpoint(self, path: str) -> dict[str, Any]:
        """Every alive cell loads ``path``; returns the checkpoint's summary.

        Raises:
            GetTimeoutError: a cell did not load it within the policy's transfer timeout.
            RayTaskError: a cell could not read it.
        """
        self._forget_answers()
        alive = self.alive_ids()
        results = self._all_or_raise(
            {c: self._cells[c].actor.load_checkpoint.remote(path) for c in alive},
            self.policy.transfer_timeout_s)
        return results[alive[0]]

    def stop(self) -> None:
        """Record every alive cell stopped and release the actors."""
        for cell_id in self.alive_ids():
            self.record_state(cell_id, CellState.STOPPED)
        for cell in self._cells.values():
            try:
                ray.kill(cell.actor, no_restart=True)
            except Exception:  # noqa: BLE001 - already gone
                pass
        self._store = None
