"""TrainCell: one independent replica of the trainer (indep-dp), one Ray actor per cell.

A plain class, made remote where it is allocated::

    Cell = ray.remote(**TRAIN_CELL_ACTOR_OPTIONS)(TrainCell)

Each step, alive cells average gradients over a group (gloo, or NCCL when each cell has a
GPU of its own) that the control plane re-forms when membership changes
(:meth:`TrainCell.configure_group`; the mechanism is in :mod:`actors.gradient_group`). The
cell computes on ``device`` in ``dtype`` (:mod:`actors.device`); its state and checkpoints
leave it on the CPU, its weights by the object store or CUDA IPC (:mod:`actors.weight_paths`).

One cell is the publisher (the newest ``cell_promoted`` in the ledger). Its weight update is
:meth:`TrainCell.update_weights`, which runs THE sequence,
:func:`actors.publishing.sequence.update_weights`, with this cell's weights, in the steps of
docs/DESIGN.md section 5:

1. record ``weight_update_started`` (fenced);
2. pause every engine at epoch e (sent now, awaited after 3a);
3. stage and transfer: (3a) stage the weights (copy, checksum, object store or CUDA IPC),
   (3b) load them into every engine (full parameters or LoRA adapters; no label change);
4. commit: ``v = commit_weights(...)`` (fenced, idempotent per cell/epoch/step/checksum);
5. finalize: the one ``finalize_and_resume_engines(v, e)`` stamps, then resumes, every engine;
6. record ``engines_stamped``; the report carries the committed head (v, e).

The ledger writes are :class:`actors.publishing.records.PublisherRecords`'; the engine calls
:mod:`actors.publishing.weight_sync`'s. A drill or test stops the sequence at a named point
(:class:`actors.publishing.sequence.UpdatePoint`) by arming it first
(:meth:`TrainCell.arm_update_fault`) and then letting the normal publish run.

The cell is bound to its run and ledger when it is created (``ledger_url``, ``run_id``), so no
publishing call threads them through. Pushing ``v`` to the RolloutManager is the control plane's
job (``orchestrator.control.publisher``), right after this sequence returns.

A death before step 4 leaves the engines paused with unlabelled weights and the ledger without
that version; the next publisher transfers again. A death after it leaves a committed but
unstamped version, which the audit reports; the next commit is still head + 1.
"""

from __future__ import annotations

import io
import logging
import math
import os
import time
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import torch

from actors.cluster.checkpoint_io import is_readable, read_bytes, to_url, write_bytes_atomic
from actors.cluster.node_info import EngineNodes, node_fields
from actors.device import autocast, cpu_copy, select_device, torch_dtype
from actors.gradient_group import GradientGroup
from actors.optimizer import EagerAdamW
from actors.grpo import GRPOConfig, build_train_batch, grpo_loss
from actors.policies.policy import PolicyConfig, build_policy, load_tensors, tensor_state_dict
from actors.publishing.records import PublisherRecords
from actors.startup_gc import settles_heap
from actors.task import TOKENIZER
from actors.transport import Transport, WeightSwap, is_lora_tensor
from actors.weight_paths import OBJECT_STORE, EngineDevices, local_device_info, select_weight_path
from actors.publishing.weight_sync import StagedWeights, collect_weights, stage_weights, tensors_checksum
from actors.publishing.sequence import FaultAction, UpdateFaults, UpdatePoint, UpdateReport
from actors.publishing.sequence import update_weights as run_update_sequence
from actors.publishing.tail import TailOutcome, UpdateTail
from orchestrator.rollout.types import Group, Sample

__all__ = ["TRAIN_CELL_ACTOR_OPTIONS", "TrainCell", "has_learning_signal"]

logger = logging.getLogger(__name__)

TRAIN_CELL_ACTOR_OPTIONS: dict[str, Any] = {"num_cpus": 0.5, "max_concurrency": 1}


def has_learning_signal(grad_norm: float) -> bool:
    """Whether a step whose averaged gradient has ``grad_norm`` should move the weights.

    No when the gradient is exactly zero: every group's rewards were equal, so every advantage
    is zero and the batch says nothing. AdamW would still move the weights by its momentum,
    for about ten steps more in the direction of the last real gradient; a nearly
    deterministic policy pushed that way can switch its answers into a state where every group
    again scores the same and no gradient ever comes back (chaos seed 17: four such steps moved
    the weights by 0.5 in L2 norm and the reward fell from 0.65 to a constant 0.10). No also
    when the norm is not finite: a NaN or infinite gradient would poison the weights and the
    optimizer state.
    """
    return math.isfinite(grad_norm) and grad_norm > 0.0


class TrainCell:
    """One trainer replica: policy, plain torch optimizer, gradient group, publisher steps.

    Not thread-safe: the actor runs one call at a time (``max_concurrency=1``).
    """

    @settles_heap
    def __init__(
        self,
        cell_id: str,
        backend: str = "torch",
        policy_config: PolicyConfig | dict[str, Any] | None = None,
        seed: int = 0,
        transport: Transport | str = Transport.FULL,
        learning_rate: float = 3e-3,
        grpo: GRPOConfig | None = None,
        max_grad_norm: float = 1.0,
        collective_timeout_s: float = 30.0,
        *,
        ledger_url: str | None = None,
        run_id: str | None = None,
        device: str = "cpu",
        dtype: str = "float32",
        gradient_backend: str = "gloo",
    ) -> None:
        """Build the policy from ``(backend, policy_config, seed)`` (engines must use the same
        triple) on ``device`` and an AdamW over its trainable parameters (adapters only with
        LoRA); forward and backward run in ``dtype`` (:func:`actors.device.autocast`).

        ``ledger_url`` and ``run_id`` bind the cell to the run it publishes for; a cell built
        without them trains but cannot publish or record a checkpoint. ``gradient_backend``
        ("gloo" or "nccl") is what the gradient group is formed over.

        Raises:
            ValueError: unknown transport, device, dtype or gradient backend, or ``lora``
                without ``policy_config.lora_rank > 0``.
            PolicyError: the policy cannot be built. DeviceError: no CUDA for ``"cuda"``.
        """
        torch.set_num_threads(1)
        config = PolicyConfig.from_value(policy_config)
        transport = Transport.parse(transport)
        if transport is Transport.LORA and config.lora_rank < 1:
            raise ValueError("the lora transport needs policy_config.lora_rank > 0")
        self.cell_id = cell_id
        self.backend = backend
        self.policy_config = config
        self.transport = transport
        self.grpo = grpo or GRPOConfig()
        self.max_grad_norm = max_grad_norm
        self.device, self.compute_dtype = select_device(device), torch_dtype(dtype)
        self.model = build_policy(backend, config, seed).to(self.device).train()
        self._parameters = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = EagerAdamW(self._parameters, lr=learning_rate, weight_decay=0.0)
        self.train_step_count = 0
        self.weight_version = 0  # the last version this cell's weights were committed as
        self._gradients = GradientGroup(cell_id, timedelta(seconds=collective_timeout_s),
                                        gradient_backend)
        logger.info("cell %s: %s %s, gradients over %s", cell_id, self.device, dtype,
                    gradient_backend)
        self.ledger_url = ledger_url
        self.run_id = run_id
        self.records = PublisherRecords(cell_id, ledger_url, run_id)
        self._faults = UpdateFaults()
        self._tail = UpdateTail()  # steps 5-6 of the last update, when run in the background
        self._engine_nodes = EngineNodes()
        self._engine_devices = EngineDevices()

    def pid(self) -> int:
        """The process id of this cell (tests kill it from outside)."""
        return os.getpid()

    def node(self) -> dict[str, str]:
        """``{"node_id", "host"}`` of the node this cell runs on (``{}`` outside Ray)."""
        return node_fields()

    def progress(self) -> int:
        """How many optimizer steps this cell has applied (compare cells after a failed step)."""
        return self.train_step_count

    # ---------------------------------------------------------------------------- group

    def configure_group(self, quorum_id: int, rank: int, world_size: int,
                        store_addr: str | None = None) -> None:
        """Join the gradient group of quorum ``quorum_id`` as ``rank`` of ``world_size``
        (:meth:`actors.gradient_group.GradientGroup.join`).

        Raises:
            CollectiveError: the group could not be formed; the cell has no group afterwards.
        """
        self._gradients.join(quorum_id, rank, world_size, store_addr)

    # ---------------------------------------------------------------------------- training

    def train_step(self, groups: Sequence[Group | Sequence[Sample]]) -> dict[str, float]:
        """One GRPO step on ``groups`` (the samples of each prompt), averaged across the group.

        Every member of the gradient group must call it once per step. On failure the weights
        and optimizer are unchanged. A step without learning signal (:func:`has_learning_signal`)
        counts as a step but leaves the weights and optimizer alone; every cell sees the same
        averaged gradient, so all of them skip it together.

        Raises:
            ValueError: the batch has no trainable sample.
            CollectiveError: averaging failed (a peer died or timed out); the cell leaves its
                group and the control plane must call :meth:`configure_group` again.
        """
        started = time.perf_counter()
        sample_groups = [g.samples if isinstance(g, Group) else list(g) for g in groups]
        batch = build_train_batch(sample_groups, TOKENIZER.pad_id, self.grpo.advantage_eps)
        batch = batch.to(self.device)
        self.optimizer.zero_grad(set_to_none=True)
        with autocast(self.device, self.compute_dtype):
            loss, metrics = grpo_loss(self.model, batch, self.grpo)
        loss.backward()
        self._gradients.average(self._parameters)
        grad_norm = float(torch.nn.utils.clip_grad_norm_(self._parameters, self.max_grad_norm))
        stepped = has_learning_signal(grad_norm)
        if stepped:
            self.optimizer.step()
        self.train_step_count += 1
        versions = [v for g in sample_groups for s in g for v in s.weight_versions]
        metrics.update({
            "train_step": float(self.train_step_count),
            "grad_norm": grad_norm,
            "optimizer_step_skipped": 0.0 if stepped else 1.0,
            "world_size": float(self._gradients.world_size),
            "oldest_sample_version": float(min(versions)) if versions else -1.0,
            "step_seconds": time.perf_counter() - started,
        })
        return metrics

    # ---------------------------------------------------------------------------- publishing

    def outgoing_weights(self) -> dict[str, torch.Tensor]:
        """A copy of what a publish sends engines (all tensors, or the LoRA adapters)."""
        return collect_weights(self.model, self.transport)

    def stage(self, engines: Sequence[Any]) -> StagedWeights:
        """Step 3a of the update sequence: this cell's outgoing weights staged for ``engines``
        (object store, or CUDA IPC when the cell and every engine share one GPU)."""
        path = OBJECT_STORE  # a CPU cell never asks engines where they run
        if self.device.type == "cuda":
            path = select_weight_path(local_device_info(self.device),
                                      self._engine_devices.of(engines))
        return stage_weights(engines, self.outgoing_weights(), path)

    def arm_update_fault(self, point: UpdatePoint | str,
                         action: FaultAction | str = FaultAction.STOP) -> dict[str, str]:
        """Arm a fault at ``point`` of the next weight update (drills, tests): ``stop`` freezes
        this process there (SIGSTOP; the caller kills or continues it), ``raise`` fails the
        update there with :class:`~actors.errors.InjectedFault`, ``delay`` holds it there for
        ``DELAY_S`` (a slow step). Returns what is armed.

        Raises:
            ValueError: unknown point or action.
        """
        self._faults.arm(point, action)
        return self._faults.armed()

    def update_weights(self, engines: Sequence[Any], epoch: int,
                       engine_timeout_s: float | None = None,
                       swap: str = WeightSwap.PAUSE,
                       finish_in_background: bool = False) -> UpdateReport:
        """Publish this cell's weights as the next version: THE sequence
        (:func:`actors.publishing.sequence.update_weights`, steps 1-6 in the module docstring).

        Precondition: this cell is the publisher at ``epoch``. Returns the report: the
        committed head (version, epoch), the stamped engines, the engines that failed. If
        pausing the engines or the transfer fails, a ``weight_update_aborted`` is recorded
        (best effort) and the engines stay paused for the next attempt. Retrying the whole
        call is safe (every event is idempotent). ``engine_timeout_s`` bounds every wait on
        the engines (the control plane passes its failure policy's
        ``engine_call_timeout_s``). ``swap``: ``pause`` the engines for the update, or let
        them take it ``in-flight`` (:class:`~actors.transport.WeightSwap`).

        ``finish_in_background``: return right after the commit, with steps 5-6 left running
        beside this cell's next calls (the report is ``finishing``; :meth:`settle_update`
        waits for them and says what they did). The last update's tail is settled first, so
        its wait is in this report's ``step_seconds`` as ``tail_wait``.

        Raises:
            ledger.FencedError: this cell was superseded; nothing more is written.
            StaleEpochError: an engine has seen a newer epoch.
            TransferError, EngineStateError: the transfer failed; nothing committed.
            EngineSilentError: an engine gave no answer in time; nothing committed.
            ValueError: the cell is not bound to a run.
            Exception: what the last update's tail raised (:meth:`settle_update`).
        """
        settled = self.settle_update(engine_timeout_s)
        adapter = (f"lora-r{self.policy_config.lora_rank}"
                   if self.transport is Transport.LORA else None)
        report = run_update_sequence(
            self.records, engines, epoch, train_step=self.train_step_count,
            transport=self.transport, adapter=adapter, stage=self.stage,
            engine_nodes=self._engine_nodes.of, at_point=self._faults,
            engine_timeout_s=engine_timeout_s, swap=WeightSwap(swap),
            tail=self._tail if finish_in_background else None)
        if settled is not None:
            report.step_seconds["tail_wait"] = settled.step_seconds["tail_wait"]
        self.weight_version = report.version
        return report

    def settle_update(self, timeout_s: float | None = None) -> TailOutcome | None:
        """Wait for the last update's steps 5-6 if they run in the background
        (``update_weights(finish_in_background=True)``); returns what they did, or None when
        nothing was pending or the tail found this cell superseded
        (:meth:`actors.publishing.tail.UpdateTail.settle`).

        Raises:
            TimeoutError: the tail did not end within ``timeout_s``.
            Exception: what the tail raised (its version stays committed; engines it did not
                stamp are the audit's unstamped ones).
        """
        return self._tail.settle(timeout_s)

    # ---------------------------------------------------------------------------- state

    def get_state(self) -> dict[str, Any]:
        """Weights, optimizer state, train step and weight version (to heal another cell), as
        CPU copies whatever the cell's device (a CUDA cell's state loads in a CPU cell)."""
        return {
            "backend": self.backend,
            "policy_config": self.policy_config.to_dict(),
            "model": cpu_copy(tensor_state_dict(self.model)),
            # A copy: optimizer state tensors are live and updated in place.
            "optimizer": cpu_copy(self.optimizer.state_dict()),
            "train_step": self.train_step_count,
            "weight_version": self.weight_version,
        }

    def set_state(self, state: dict[str, Any]) -> None:
        """Adopt another cell's :meth:`get_state` (healing). Checks everything first.

        Raises:
            PolicyError: the weights do not fit this cell's model; nothing changed.
            ValueError: the optimizer state does not fit; weights may already be loaded, so
                retry with a good state before training.
        """
        if PolicyConfig.from_value(state["policy_config"]) != self.policy_config:
            raise ValueError("state comes from a cell with another policy config")
        load_tensors(self.model, state["model"], adapters_only=False)  # copied to our device
        # load_state_dict moves state to each parameter's device, but may keep the given
        # tensors (same dtype and device): never share them.
        self.optimizer.load_state_dict(cpu_copy(state["optimizer"]))
        self.train_step_count = int(state["train_step"])
        self.weight_version = int(state["weight_version"])

    def weights_checksum(self, adapters_only: bool = False) -> str:
        """sha256 of the cell's tensors (all, or LoRA adapters only) in name order."""
        tensors = tensor_state_dict(self.model)
        if adapters_only:
            tensors = {k: v for k, v in tensors.items() if is_lora_tensor(k)}
        return tensors_checksum(tensors)

    def save_checkpoint(self, path: str, epoch: int | None = None) -> dict[str, Any]:
        """Write weights + optimizer state to ``path``, an absolute path or an fsspec URL
        (atomically: :func:`actors.cluster.checkpoint_io.write_bytes_atomic`).

        With ``epoch``, also appends ``checkpoint_saved`` to the cell's run
        (fenced: only the publisher at ``epoch``), after the file is complete. Returns the
        checkpoint's summary ``{"train_step", "version", "path"}``; ``path`` is the full URL
        (``file:///...`` for a path), as the ledger records it.

        Raises:
            ledger.FencedError: not the publisher; the file is written, the event is not.
            OSError: the file could not be written (StorageError: a relative path).
        """
        self.settle_update()  # its engines_stamped before checkpoint_saved
        buffer = io.BytesIO()
        torch.save(self.get_state(), buffer)
        target = write_bytes_atomic(to_url(path), buffer.getvalue())
        summary = {"train_step": self.train_step_count, "version": self.weight_version,
                   "path": target}
        if epoch is not None:
            self.records.checkpoint_saved(epoch, self.train_step_count, summary)
        return summary

    def load_checkpoint(self, path: str) -> dict[str, Any]:
        """Restore weights, optimizer state, train step and version from ``path`` (an
        absolute path or an fsspec URL). The file is read onto the CPU (``map_location``):
        one written by a CUDA cell loads here on any device, then moves to this cell's.

        Raises:
            OSError: unreadable file. PolicyError, ValueError: see :meth:`set_state`.
        """
        url = to_url(path)
        state = torch.load(io.BytesIO(read_bytes(url)), map_location="cpu", weights_only=True)
        self.set_state(state)
        return {"train_step": self.train_step_count, "version": self.weight_version,
                "path": url}

    def checkpoint_readable(self, path: str) -> bool:
        """Whether this cell's node can read ``path`` (a resume checks before promoting)."""
        return is_readable(path)

    def close(self) -> None:
        """Let the last update's tail end (its failure is logged), leave the gradient group
        and close ledger connections."""
        try:
            self.settle_update()
        except Exception:  # noqa: BLE001 - closing goes on; the version stays committed
            logger.warning("cell %s: the last update's tail failed", self.cell_id, exc_info=True)
        self._gradients.leave()
        self.records.close()
