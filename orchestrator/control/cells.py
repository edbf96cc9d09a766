"""CellGroup: N independent trainer cells (indep-dp) with fenced failover through the ledger.

Liveness comes from Ray (``ActorDiedError``, ``ActorUnavailableError`` on any call) and from
heartbeats with a timeout (a frozen process answers nothing). Every change of a cell's state is
a ``cell_state`` event. The publisher is whoever the ledger's newest ``cell_promoted`` names;
when it is lost the group promotes the lowest alive cell (epoch + 1) *through the ledger*, so the
old publisher is fenced from that moment whether it is dead or only frozen.

Gradient averaging runs over the alive cells; each change of membership forms a new quorum (a
fresh quorum id, hence a fresh store prefix: members of an old quorum can never meet members of
the new one). A step that fails because a cell died is retried on the survivors, never
half-applied: if some survivors had already stepped, the others adopt their state instead.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import ray
from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError

from ledger import FencedError, Ledger
from orchestrator.config import RunConfig
from orchestrator.rollout.types import Sample

__all__ = ["CellGroup", "EngineLostError", "NoCellAliveError", "StepFailedError"]

logger = logging.getLogger(__name__)

CellFactory = Callable[[RunConfig, str], Any]

# A step waits this long past the collective timeout (= heartbeat timeout) before a cell that
# has not answered is deemed lost: survivors report a failed all-reduce by then.
_STEP_GRACE_S = 5.0


class StepFailedError(RuntimeError):
    """A step (training or weight update) failed on every attempt; the message says why."""


class NoCellAliveError(StepFailedError):
    """Every cell is lost: nothing can train or publish."""


class EngineLostError(RuntimeError):
    """A weight update failed because a rollout engine died during it. The publisher is fine
    and nothing was committed; restart the engine and publish again."""


@dataclass
class _Cell:
    cell_id: str
    actor: Any
    alive: bool = True
    incarnation: int = 0


@dataclass
class CellEvents:
    """Counters of what the group has seen (for metrics and drills)."""

    deaths: int = 0
    promotions: int = 0
    heals: int = 0
    retried_steps: int = 0
    quorums: int = 0
    lost: list[str] = field(default_factory=list)


def _is_actor_loss(exc: BaseException) -> bool:
    """True if the actor called is gone or frozen. A ``RayTaskError`` means the actor ran and
    raised (possibly a Ray error from an actor *it* called, such as a dead engine)."""
    if isinstance(exc, RayTaskError):
        return False
    return isinstance(exc, RayActorError | GetTimeoutError)


def _is_engine_loss(exc: BaseException) -> bool:
    """True if a cell's call failed because an engine it talked to is gone."""
    return isinstance(exc, RayTaskError) and isinstance(exc, RayActorError)


class CellGroup:
    """The run's train cells, their quorum, and the publisher role.

    Args:
        config: the run's config (``num_cells``, ``heartbeat_timeout_s``, ...).
        ledger: an open writer ledger; the group appends ``cell_state`` / ``cell_promoted``.
        ledger_url: handed to cells, which open the ledger themselves to publish.
        run_id: a started run.
        create_cell: builds one cell actor (``orchestrator.control.launch.create_cell``).
        max_attempts: attempts of one step before :class:`StepFailedError`.
    """

    def __init__(
        self,
        config: RunConfig,
        ledger: Ledger,
        ledger_url: str,
        run_id: str,
        create_cell: CellFactory,
        *,
        max_attempts: int = 3,
    ) -> None:
        self.config = config
        self.ledger = ledger
        self.ledger_url = ledger_url
        self.run_id = run_id
        self._create_cell = create_cell
        self.max_attempts = max_attempts
        self.heartbeat_timeout_s = config.heartbeat_timeout_s
        self._cells: dict[str, _Cell] = {}
        self._quorum_id = 0
        self._store: Any = None
        self._store_addr: str | None = None
        self.events = CellEvents()

    # ------------------------------------------------------------------ membership

    def start(self) -> None:
        """Create ``num_cells`` cells, record them alive, and form the first quorum."""
        from actors.train_cell import create_rendezvous_store

        self._store, self._store_addr = create_rendezvous_store()
        for index in range(self.config.num_cells):
            cell_id = f"cell-{index}"
            self._cells[cell_id] = _Cell(cell_id, self._create_cell(self.config, cell_id))
        ray.get([cell.actor.pid.remote() for cell in self._cells.values()])
        for cell_id in self._cells:
            self._record_state(cell_id, "alive")
        self.reform()

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

    def _record_state(self, cell_id: str, state: str) -> None:
        self.ledger.append(
            self.run_id, "cell_state", {"state": state, "quorum_id": self._quorum_id},
            cell_id=cell_id,
        )

    def mark_lost(self, cell_id: str, why: str) -> None:
        """Take ``cell_id`` out of the group (``cell_state`` errored); idempotent."""
        cell = self._cells[cell_id]
        if not cell.alive:
            return
        cell.alive = False
        self.events.deaths += 1
        self.events.lost.append(cell_id)
        logger.warning("cell %s lost: %s", cell_id, why)
        self._record_state(cell_id, "errored")

    def check_liveness(self) -> list[str]:
        """Heartbeat every alive cell; mark those that die or miss the timeout. Returns them."""
        alive = self.alive_ids()
        refs = {cell_id: self._cells[cell_id].actor.pid.remote() for cell_id in alive}
        ready, _ = ray.wait(list(refs.values()), num_returns=len(refs),
                            timeout=self.heartbeat_timeout_s)
        lost = []
        for cell_id, ref in refs.items():
            if ref not in ready:
                lost.append((cell_id, f"no heartbeat within {self.heartbeat_timeout_s:g}s"))
                continue
            try:
                ray.get(ref)
            except RayActorError as exc:
                lost.append((cell_id, type(exc).__name__))
        for cell_id, why in lost:
            self.mark_lost(cell_id, why)
        return [cell_id for cell_id, _ in lost]

    def reform(self) -> int:
        """Form a new quorum over the alive cells (a fresh quorum id); returns its id.

        Cells that fail to join are marked lost and the quorum is formed again without them.

        Raises:
            NoCellAliveError: no cell is left.
            StepFailedError: ``max_attempts`` quorums failed although every cell answered
                (a broken collective backend, not a lost cell).
        """
        attempts_without_loss = 0
        while True:
            alive = self.alive_ids()
            if not alive:
                raise NoCellAliveError("no train cell is alive")
            self._quorum_id += 1
            self.events.quorums += 1
            refs = {
                cell_id: self._cells[cell_id].actor.configure_group.remote(
                    self._quorum_id, rank, len(alive), self._store_addr
                )
                for rank, cell_id in enumerate(alive)
            }
            _, failed = self._call_each(refs, self._step_timeout_s)
            if not failed:
                logger.info("quorum %d: %s", self._quorum_id, alive)
                return self._quorum_id
            self._sort_out_failures(failed)
            if self.alive_ids() == alive:
                attempts_without_loss += 1
                if attempts_without_loss >= self.max_attempts:
                    error = next(iter(failed.values()))
                    raise StepFailedError(
                        f"quorum {self._quorum_id} of {alive} could not be formed: {error}"
                    ) from error

    @property
    def _step_timeout_s(self) -> float:
        return self.heartbeat_timeout_s + max(self.heartbeat_timeout_s, _STEP_GRACE_S)

    def _call_each(
        self, calls: dict[str, Any], timeout: float
    ) -> tuple[dict[str, Any], dict[str, BaseException]]:
        """Wait up to ``timeout`` for every cell's call; return results and failures by cell.

        A call that has not returned by then counts as failed with ``GetTimeoutError``: its
        cell is frozen or gone, and is never waited for without a bound.
        """
        ready, _ = ray.wait(list(calls.values()), num_returns=len(calls), timeout=timeout)
        results: dict[str, Any] = {}
        failed: dict[str, BaseException] = {}
        for cell_id, ref in calls.items():
            if ref not in ready:
                failed[cell_id] = GetTimeoutError(f"cell {cell_id}: no answer in {timeout:g}s")
                continue
            try:
                results[cell_id] = ray.get(ref)
            except Exception as exc:  # noqa: BLE001 - sorted out by the caller
                failed[cell_id] = exc
        return results, failed

    def _sort_out_failures(self, failed: dict[str, BaseException]) -> None:
        """Mark cells that are really gone; a survivor's collective error only means a peer
        died, which the heartbeat tells apart."""
        for cell_id, exc in failed.items():
            if _is_actor_loss(exc):
                self.mark_lost(cell_id, f"{type(exc).__name__}")
        self.check_liveness()
        self.ensure_publisher()

    # ------------------------------------------------------------------ publisher

    def ensure_publisher(self, reason: str = "failover") -> int:
        """Make sure an alive cell holds the newest epoch; promote the lowest alive one if not.

        Returns the publisher's epoch. The promotion goes through the ledger, so from here on
        the previous publisher's writes raise ``FencedError``.
        """
        return self._ensure_publisher(reason)[1]

    def _ensure_publisher(self, reason: str = "failover") -> tuple[str, int]:
        """:meth:`ensure_publisher`, returning ``(publisher cell, epoch)`` from one head read."""
        head = self.ledger.head(self.run_id)
        alive = self.alive_ids()
        if head.publisher_cell in alive:
            return head.publisher_cell, head.epoch
        if not alive:
            raise NoCellAliveError("no train cell is alive to publish")
        epoch = self.ledger.promote(
            self.run_id, alive[0], reason=reason if head.epoch else "start",
            previous_cell=head.publisher_cell,
        )
        self.events.promotions += 1
        log_level = logging.INFO if reason == "start" else logging.WARNING
        logger.log(log_level, "cell %s promoted to publisher, epoch %d", alive[0], epoch)
        return alive[0], epoch

    def _call_publisher(
        self, method: str, **kwargs: Any
    ) -> tuple[str, Any, BaseException | None]:
        """Call ``method(**kwargs, epoch=...)`` on the publisher (promoting one first if
        needed), with the step timeout. Returns ``(publisher, result, error)``; one of result
        and error is set."""
        publisher, epoch = self._ensure_publisher()
        ref = getattr(self._cells[publisher].actor, method).remote(**kwargs, epoch=epoch)
        results, failed = self._call_each({publisher: ref}, self._step_timeout_s)
        return publisher, results.get(publisher), failed.get(publisher)

    def take_over(self, reason: str = "resume") -> int:
        """Promote the lowest alive cell even if the ledger's publisher looks alive: a new
        process (a resumed job) must not write under an epoch an older process may still
        hold. Returns the new epoch."""
        alive = self.alive_ids()
        if not alive:
            raise NoCellAliveError("no train cell is alive to publish")
        head = self.ledger.head(self.run_id)
        epoch = self.ledger.promote(self.run_id, alive[0], reason=reason,
                                    previous_cell=head.publisher_cell)
        self.events.promotions += 1
        return epoch

    @property
    def publisher(self) -> str | None:
        return self.ledger.head(self.run_id).publisher_cell

    # ------------------------------------------------------------------ steps

    def train_step(self, groups: Sequence[Sequence[Sample]]) -> dict[str, float]:
        """One synchronous GRPO step over ``groups``, sharded across the alive cells.

        A cell lost mid-step is marked errored (and replaced as publisher if it was one), the
        quorum is re-formed over the survivors and the step is retried. If some survivors had
        already applied it, the rest adopt their state: the step is applied exactly once.

        Raises:
            StepFailedError: ``max_attempts`` attempts failed; NoCellAliveError if none is left.
        """
        last_error: BaseException | None = None
        for attempt in range(1, self.max_attempts + 1):
            alive = self.alive_ids()
            if not alive:
                raise NoCellAliveError("no train cell is alive")
            before, failed = self._progress(alive)
            if not failed:
                shards = _shard(groups, len(alive))
                refs = {
                    cell_id: self._cells[cell_id].actor.train_step.remote(shard)
                    for cell_id, shard in zip(alive, shards)
                }
                results, failed = self._call_each(refs, self._step_timeout_s)
                if not failed:
                    return _merge_metrics([results[c] for c in alive], shards)
            last_error = next(iter(failed.values()))
            self.events.retried_steps += 1
            logger.warning("train step attempt %d failed: %s", attempt, last_error)
            self._sort_out_failures(failed)
            if before and self._complete_half_applied_step(self.alive_ids(), before):
                done = [c for c in self.alive_ids() if c in results]
                self.reform()
                return _merge_metrics(
                    [results[c] for c in done], [shards[alive.index(c)] for c in done]
                )
            self.reform()
        raise StepFailedError(
            f"train step failed {self.max_attempts} times; last error: {last_error}"
        )

    def _progress(self, cell_ids: list[str]) -> tuple[dict[str, int], dict[str, BaseException]]:
        """Optimizer steps applied per cell (within the heartbeat timeout), and failures."""
        calls = {c: self._cells[c].actor.progress.remote() for c in cell_ids}
        return self._call_each(calls, self.heartbeat_timeout_s)

    def _complete_half_applied_step(self, survivors: list[str], before: dict[str, int]) -> bool:
        """If any survivor applied the failed step, copy its state to the others; say so."""
        now, _ = self._progress(survivors)
        advanced = [c for c in now if now[c] > before.get(c, now[c])]
        if not advanced:
            return False
        state = self._cells[advanced[0]].actor.get_state.remote()
        laggards = [c for c in now if c not in advanced]
        ray.get([self._cells[c].actor.set_state.remote(state) for c in laggards])
        logger.warning("step was applied by %s; %s adopted their state", advanced, laggards)
        return True

    def update_weights(self, engines: Sequence[Any], rollout_manager: Any = None) -> int:
        """Publish the publisher's weights as the next version; returns it (head + 1).

        If the publisher is lost mid-update (before the commit: engines stay paused, no
        version; after it: a committed-but-unstamped version), the lowest alive cell is
        promoted and publishes again.

        Raises:
            EngineLostError: an engine died before the commit; the publisher stays, nothing
                was committed, the other engines stay paused until the next update.
            StepFailedError: ``max_attempts`` attempts failed.
        """
        last_error: BaseException | None = None
        for attempt in range(1, self.max_attempts + 1):
            publisher, version, last_error = self._call_publisher(
                "update_weights", engines=list(engines), ledger_url=self.ledger_url,
                run_id=self.run_id, rollout_manager=rollout_manager,
            )
            if last_error is None:
                return version
            self.events.retried_steps += 1
            logger.warning("weight update attempt %d by %s failed: %s", attempt, publisher,
                           last_error)
            if _is_engine_loss(last_error):
                message = f"an engine died during the update: {last_error}"
                raise EngineLostError(message) from last_error
            if _is_actor_loss(last_error):
                self.mark_lost(publisher, type(last_error).__name__)
                self.check_liveness()
                self.reform()
            elif not isinstance(_cause(last_error), FencedError):
                raise last_error
        raise StepFailedError(
            f"weight update failed {self.max_attempts} times; last error: {last_error}"
        )

    # ------------------------------------------------------------------ healing

    def heal(self, cell_id: str) -> None:
        """Replace a lost cell with a new actor holding a survivor's weights and optimizer
        state; it rejoins as a follower (``cell_state`` healed) and a new quorum forms.

        Raises:
            NoCellAliveError: no survivor to copy state from.
        """
        survivors = self.alive_ids()
        if not survivors:
            raise NoCellAliveError(f"no survivor to heal {cell_id} from")
        old = self._cells[cell_id]
        try:
            ray.kill(old.actor, no_restart=True)  # a frozen zombie must not come back
        except Exception:  # noqa: BLE001 - it may be gone already
            pass
        actor = self._create_cell(self.config, cell_id)
        state = self._cells[survivors[0]].actor.get_state.remote()
        ray.get(actor.set_state.remote(state))
        self._cells[cell_id] = _Cell(cell_id, actor, alive=True,
                                     incarnation=old.incarnation + 1)
        self.events.heals += 1
        self._record_state(cell_id, "healed")
        self.reform()

    def heal_lost(self) -> list[str]:
        """Heal every lost cell; returns their ids."""
        lost = self.errored_ids()
        for cell_id in lost:
            self.heal(cell_id)
        return lost

    # ------------------------------------------------------------------ checkpoints

    def save_checkpoint(self, path: str) -> dict[str, Any]:
        """The publisher writes its state to ``path`` and records ``checkpoint_saved``."""
        for _ in range(self.max_attempts):
            publisher, summary, error = self._call_publisher(
                "save_checkpoint", path=path, ledger_url=self.ledger_url, run_id=self.run_id
            )
            if error is None:
                return summary
            self._sort_out_failures({publisher: error})
            self.reform()
        raise StepFailedError(f"checkpoint {path} could not be saved")

    def load_checkpoint(self, path: str) -> dict[str, Any]:
        """Every alive cell loads ``path``; returns the checkpoint's summary."""
        summaries = ray.get(
            [self._cells[c].actor.load_checkpoint.remote(path) for c in self.alive_ids()]
        )
        return summaries[0]

    def stop(self) -> None:
        """Record every alive cell stopped and release the actors."""
        for cell_id in self.alive_ids():
            try:
                self._record_state(cell_id, "stopped")
            except FencedError:  # pragma: no cover - cell_state is never fenced
                pass
        for cell in self._cells.values():
            try:
                ray.kill(cell.actor, no_restart=True)
            except Exception:  # noqa: BLE001 - already gone
                pass
        self._store = None


def _cause(exc: BaseException) -> BaseException:
    """The user exception inside a Ray task error."""
    if isinstance(exc, RayTaskError):
        return exc.as_instanceof_cause()
    return exc


def _shard(groups: Sequence[Sequence[Sample]], parts: int) -> list[list[Sequence[Sample]]]:
    """Split groups into ``parts`` contiguous shards of near-equal size (none empty)."""
    if len(groups) < parts:
        raise ValueError(f"{len(groups)} groups cannot feed {parts} cells")
    size, extra = divmod(len(groups), parts)
    shards, start = [], 0
    for index in range(parts):
        end = start + size + (1 if index < extra else 0)
        shards.append(list(groups[start:end]))
        start = end
    return shards


def _merge_metrics(results: list[dict[str, float]], shards: list[list]) -> dict[str, float]:
    """Average per-cell metrics weighted by their shard's group count."""
    total = sum(len(s) for s in shards)
    merged: dict[str, float] = {}
    for metrics, shard in zip(results, shards, strict=True):
        weight = len(shard) / total
        for key, value in metrics.items():
            merged[key] = merged.get(key, 0.0) + weight * float(value)
    merged["cells_in_step"] = float(len(results))
    return merged
