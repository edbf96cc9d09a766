"""VLLMEngine: a rollout engine on a real vLLM, behind the engine interface.

The same interface as the built-in :class:`~actors.engines.rollout_engine.RolloutEngine` (see
:mod:`actors.engines.engine_protocol` for the contract): generate with per-token log-probs and
versions, ``begin_update`` / ``load_weights`` / ``update_weight_version`` /
``continue_generation`` under the epoch fence, ``weights_checksum``, ``health``, ``pid``. A
plain class, made remote where it is allocated, as a threaded actor::

    Engine = ray.remote(**VLLM_ENGINE_ACTOR_OPTIONS)(VLLMEngine)

How it drives vLLM (0.32, V1, CPU or CUDA: :mod:`actors.engines.vllm.args`): one in-process
``LLMEngine`` (no engine-core subprocess: ``VLLM_ENABLE_V1_MULTIPROCESSING=0``, so killing the
actor kills the engine), stepped by one thread of ours (:mod:`actors.engines.vllm.serving`).

- **Weights**: ``collective_rpc("reload_weights", weights_iterator=[(hf_name, tensor)])``, then
  ``reset_prefix_cache(reset_running_requests=True)``: without it a cached prefix computed
  under the old weights is reused (log-prob errors of 0.7 were seen by hand). With requests
  parked in flight, the reset preempts them, so their KV is recomputed under the new weights
  when they continue: their later tokens' log-probs are exactly the new weights' over the whole
  sequence, which is what the trainer recomputes. LoRA updates are merged
  (:mod:`actors.engines.vllm.weights`).
- **Pause modes** (fixed at build, ``partial_rollout``): ``in_place`` freezes requests
  mid-sequence with vLLM's scheduler pause in ``keep`` mode (``EngineCore.pause_scheduler``,
  what ``AsyncLLM.pause_generation(mode="keep")`` calls) and stops stepping; ``abort`` aborts
  them through ``LLMEngine.abort_request`` and returns them ABORTED with their tokens so far.
- **Log-probs** are vLLM's ``processed_logprobs``: ``log_softmax(logits / temperature)`` of the
  sampled token, as the trainer computes them (with ``top_p < 1`` vLLM reports the
  log-prob renormalised over the nucleus; the built-in engine reports the unfiltered one).

The version label, the epoch fence and the stamp are exactly the built-in engine's: the ONE
``finalize_and_resume_engines`` stamps this engine like any other.
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Any

import ray

from actors.engines.engine_protocol import pause_mode
from actors.engines.engine_state import EngineState, StagedUpdate
from actors.engines.group_batches import GroupBatches
from actors.engines.sampling import SamplingParams
from actors.engines.scoring import load_task
from actors.engines.vllm.args import (
    DEFAULT_KV_CACHE_BYTES,
    VLLM_ENVIRONMENT,
    engine_arguments,
    start_vllm,
)
from actors.engines.vllm.serving import VLLMServing
from actors.errors import EngineStateError, PolicyError
from actors.startup_gc import freeze_heap, settles_heap
from actors.task import AdditionTask
from orchestrator.rollout.types import GroupRequest, Prompt, Sample

if TYPE_CHECKING:
    from actors.policies.hf_policy import HFPolicyConfig

__all__ = ["VLLM_ENGINE_ACTOR_OPTIONS", "VLLM_ENVIRONMENT", "VLLMEngine"]

CONTROL = "control"
VLLM_ENGINE_ACTOR_OPTIONS: dict[str, Any] = {
    "num_cpus": 0.5,
    "max_concurrency": 32,  # concurrent generate calls (they wait on the stepping thread)
    "concurrency_groups": {CONTROL: 4},
}


class VLLMEngine:
    """One vLLM engine: the model of ``policy.model_dir``, a sampler, a version and a fence.

    Thread-safe: ``generate`` runs in many threads while control calls arrive. Lock order:
    the vLLM lock (every call into vLLM, taken with ``VLLMServing.exclusive``) before
    ``state.lock``.
    """

    @settles_heap
    def __init__(
        self,
        engine_id: str,
        policy: HFPolicyConfig | dict[str, Any],
        seed: int = 0,
        task: Any = None,
        sampling: SamplingParams | dict[str, Any] | None = None,
        partial_rollout: bool = False,
        paused_wait_timeout_s: float = 60.0,
        kv_cache_bytes: int = DEFAULT_KV_CACHE_BYTES,
        device: str = "cpu",
        dtype: str = "float32",
        gpu_memory_utilization: float | None = None,
    ) -> None:
        """Start vLLM on ``policy.model_dir`` (eager, in-process) on ``device`` in ``dtype``
        (:func:`actors.engines.vllm.args.engine_arguments`); version 0 = the directory's
        weights, which the trainer must also start from.

        Raises:
            PolicyError: no Llama checkpoint in the directory.
            ValueError: invalid sampling parameters or device.
            TokenizerError: the task's tokenizer cannot be loaded
                (:func:`~actors.engines.scoring.load_task`).
        """
        # Here, not at import: every holder of this actor's handle loads this module (the
        # rollout manager too), and only the engine's own process needs torch.
        from actors.engines.vllm.weights import EngineWeights
        from actors.policies.hf_policy import HFPolicyConfig, hf_config, read_checkpoint

        os.environ.update(VLLM_ENVIRONMENT)
        self.engine_id = engine_id
        self.policy = HFPolicyConfig.from_value(policy)
        self.task = load_task(task or AdditionTask())
        self.sampling = SamplingParams.from_value(sampling)
        self.pause_mode = pause_mode(partial_rollout)
        self.paused_wait_timeout_s = paused_wait_timeout_s
        config = hf_config(self.policy.model_dir)
        self.max_model_len = int(config.max_position_embeddings)
        self.weights = EngineWeights(read_checkpoint(self.policy.model_dir),
                                     self.policy.lora_alpha,
                                     bool(getattr(config, "tie_word_embeddings", False)))
        self.device = device
        arguments = engine_arguments(self.policy.model_dir, seed, self.max_model_len,
                                     kv_cache_bytes, device, dtype, gpu_memory_utilization)
        started = time.monotonic()
        freeze_heap()  # vLLM's own collections then scan only what it builds
        self._llm = start_vllm(**arguments)
        self.startup_s = time.monotonic() - started
        self.state = EngineState(engine_id, VLLM_ENGINE_ACTOR_OPTIONS["max_concurrency"])
        self.state.counters["generated_tokens"] = 0
        self._serving = VLLMServing(self._llm, self.state, engine_id, self.task, self.sampling,
                                    self.max_model_len, paused_wait_timeout_s,
                                    on_outputs=self._deliver)
        self._tracks = self._serving.tracks  # the requests in flight, by request id
        self._batches = GroupBatches(self._serving.generate,
                                     VLLM_ENGINE_ACTOR_OPTIONS["max_concurrency"])

    def pid(self) -> int:
        """The process id of this engine (tests and drills kill it from outside)."""
        return os.getpid()

    # ---------------------------------------------------------------------------- sampling

    def generate(self, prompt: Prompt, n_samples: int, group_index: int,
                 max_new_tokens: int | None = None) -> list[Sample]:
        """Sample ``n_samples`` responses to ``prompt`` (see :mod:`actors.engines.engine_protocol`),
        at most ``max_new_tokens`` each (default: the engine's sampling parameters).

        Raises:
            ValueError: ``n_samples < 1`` or the prompt leaves no room for a response.
        """
        with self.state.receiving([group_index]):
            return self._serving.generate(prompt, n_samples, group_index, max_new_tokens)

    def generate_batch(self, requests: list[GroupRequest]) -> list[list[Sample]]:
        """:meth:`generate` for every request at once (each waits on the stepping thread, so
        vLLM batches them); the samples in request order once all finished."""
        with self.state.receiving(request.group_index for request in requests):
            return self._batches.run(requests)

    def _deliver(self, outputs: list[Any], version: int) -> None:
        """Called by the stepping thread, holding both locks, with one step's outputs: append
        each request's new tokens, stamped with ``version`` (a seam for test doubles)."""
        self._serving.deliver(outputs, version)

    # ---------------------------------------------------------------------------- control

    @ray.method(concurrency_group=CONTROL)
    def begin_update(self, epoch: int) -> dict[str, Any]:
        """Adopt ``epoch`` and pause per the pause mode; returns when no step runs.

        Raises:
            StaleEpochError: ``epoch`` is below the highest seen; nothing changes.
        """
        with self.state.lock:
            self.state.check_epoch("begin_update", epoch)
            self.state.updating = True
        self.pause()
        return self.health()

    @ray.method(concurrency_group=CONTROL)
    def pause(self) -> int:
        """Stop stepping at the next token boundary: in-flight requests are aborted (pause mode
        ``abort``) or frozen in vLLM's scheduler (``in_place``). Returns the calls in flight."""
        with self.state.lock:
            self.state.pause()
        with self._serving.exclusive():
            if self.pause_mode == "abort":
                return self._serving.abort_unfinished()
            with self.state.lock:
                in_flight = self.state.in_flight
            self._core().pause_scheduler(mode="keep", clear_cache=False)
        return in_flight

    @ray.method(concurrency_group=CONTROL)
    def load_weights(self, tensors: dict[str, Any], epoch: int, transport: str = "full") -> str:
        """Reload the paused engine's weights in place (HF names); returns the sha256 of the
        tensors as received. The version label does not change.

        Raises:
            StaleEpochError: ``epoch`` is below the highest seen; nothing changes.
            EngineStateError: the engine is not paused.
            PolicyError: names or shapes do not match the model; nothing changes.
            ValueError: unknown transport.
        """
        with self._serving.exclusive():
            with self.state.lock:
                self.state.check_epoch("load_weights", epoch)
                self.state.require_paused("load weights")
            plan, checksum = self.weights.receive(tensors, transport)
            self._reload(plan)
            with self.state.lock:
                self.state.counters["weight_loads"] += 1
        return checksum

    def _reload(self, plan: Any) -> None:
        """Load ``plan`` into vLLM and drop every cached prefix (the caller holds the engine
        lock, the engine is paused)."""
        self._wake()  # a sleeping engine's weights are offloaded: reload onto the GPU
        self._llm.collective_rpc("reload_weights",
                                 kwargs={"weights_iterator": list(plan.reload.items())})
        if not self._llm.reset_prefix_cache(reset_running_requests=True):
            raise PolicyError(f"engine {self.engine_id}: vLLM refused to reset its prefix "
                              "cache after a weight reload")
        self.weights.record(plan)

    @ray.method(concurrency_group=CONTROL)
    def stage_weights(self, tensors: dict[str, Any], epoch: int, transport: str = "full") -> str:
        """In-flight step 3b: receive and check the next weights (HF names) while vLLM keeps
        generating; returns their sha256 as received. Nothing reaches vLLM until
        :meth:`swap_and_stamp`; a newer stage replaces this one.

        Raises:
            StaleEpochError: ``epoch`` is below the highest seen; nothing changes.
            PolicyError: names or shapes do not match the model; nothing changes.
            ValueError: unknown transport.
        """
        plan, checksum = self.weights.receive(tensors, transport)  # checks; changes nothing
        # Not under the vLLM lock (that would wait for the device step in progress): the
        # state holds a stage back while a swap loads (EngineState.begin_swap).
        with self.state.lock:
            self.state.stage(StagedUpdate(plan.received, str(plan.transport), epoch, checksum))
        return checksum

    @ray.method(concurrency_group=CONTROL)
    def swap_and_stamp(self, version: int, epoch: int) -> dict[str, Any]:
        """In-flight step 5: pause at the next step boundary (per the pause mode), reload the
        weights staged at ``epoch``, stamp ``version`` and resume. Returns ``engine_id`` and
        ``resume_error`` as :meth:`stamp_and_resume` does.

        If vLLM fails to reload, the engine stays paused and the error is raised: the update
        reports this engine unstamped.

        Raises:
            StaleEpochError: ``epoch`` is below the highest seen; nothing changes.
            VersionLabelError: ``version`` is not an int >= 0; nothing changes.
            EngineStateError: nothing was staged at ``epoch``; nothing changes.
        """
        with self.state.lock:
            self.state.check_swap(version, epoch)
            paused_before = self.state.paused
        self.pause()
        with self._serving.exclusive():
            try:
                with self.state.lock:  # again: a newer stage may have come meanwhile
                    staged = self.state.begin_swap(version, epoch)  # stages wait from here
            except Exception:
                if not paused_before:
                    self._resume()  # nothing was loaded: serve on under the old label
                raise
            try:
                # Planned again: a LoRA plan restores what the current state changed. A
                # failed reload leaves the engine paused (its weights are unknown): reported
                # unstamped, the control plane's probe replaces it.
                self._reload(self.weights.plan(staged.weights, staged.transport))
                with self.state.lock:
                    self.state.swapped(version, epoch)
            finally:
                with self.state.lock:
                    self.state.end_swap()
            return self._resume_stamped()

    @ray.method(concurrency_group=CONTROL)
    def update_weight_version(self, version: int, epoch: int) -> str:
        """Stamp the loaded weights with the committed ``version``; returns the engine id.

        Raises:
            StaleEpochError: ``epoch`` is below the highest seen; nothing changes.
            VersionLabelError: ``version`` is not an int >= 0; nothing changes.
        """
        with self.state.lock:
            self.state.stamp(version, epoch)
        return self.engine_id

    @ray.method(concurrency_group=CONTROL)
    def continue_generation(self, epoch: int | None = None) -> None:
        """Resume: waiting calls start, frozen requests continue under the loaded weights.

        Raises:
            StaleEpochError: ``epoch`` is below the highest seen; the engine stays paused.
        """
        with self._serving.exclusive():
            with self.state.lock:
                if epoch is not None:
                    self.state.check_epoch("continue_generation", epoch)
            self._resume()

    @ray.method(concurrency_group=CONTROL)
    def stamp_and_resume(self, version: int, epoch: int) -> dict[str, Any]:
        """Step 5 in one call: stamp with ``version``, then resume. Returns ``engine_id`` and
        ``resume_error``: ``None``, or why vLLM's scheduler did not resume (the engine is
        stamped but paused; the control plane's probe replaces it).

        Raises:
            StaleEpochError: ``epoch`` is below the highest seen; nothing changes.
            VersionLabelError: ``version`` is not an int >= 0; nothing changes.
        """
        with self._serving.exclusive():
            with self.state.lock:
                self.state.stamp(version, epoch)
            return self._resume_stamped()

    def _resume_stamped(self) -> dict[str, Any]:
        """Resume a stamped engine (the caller holds the engine lock); the step-5 answer, with
        a failed resume reported, not raised: the caller must hear that the stamp landed."""
        try:
            self._resume()
        except Exception as exc:  # noqa: BLE001 - stamped: the caller must still hear so
            return {"engine_id": self.engine_id, "resume_error": f"{type(exc).__name__}: {exc}"}
        return {"engine_id": self.engine_id, "resume_error": None}

    def _resume(self) -> None:
        """Resume vLLM's scheduler and serve (the caller holds the engine lock)."""
        self._wake()
        self._core().resume_scheduler()
        with self.state.lock:
            self.state.resume()

    @ray.method(concurrency_group=CONTROL)
    def weights_checksum(self, adapters_only: bool = False) -> str:
        """sha256 of the engine's logical weights (all, or the last adapters) by HF name."""
        with self._serving.exclusive():
            return self.weights.checksum(adapters_only)

    @ray.method(concurrency_group=CONTROL)
    def health(self) -> dict[str, Any]:
        """A snapshot: id, pid, engine, version, epoch, paused, pause mode, in flight, ..."""
        with self.state.lock:
            return {**self.state.snapshot(), "backend": "vllm", "engine": "vllm",
                    "pause_mode": self.pause_mode, "startup_s": round(self.startup_s, 3)}

    @ray.method(concurrency_group=CONTROL)
    def sleep(self, level: int = 1) -> None:
        """Free the GPU's memory while paused (vLLM's sleep mode: level 1 offloads the weights
        to CPU memory and drops the KV cache); :meth:`wake_up` before resuming.

        Raises:
            EngineStateError: not paused, or not on CUDA (vLLM's sleep mode is CUDA only).
        """
        with self._serving.exclusive():
            with self.state.lock:
                self.state.require_paused("sleep")
            if self.device != "cuda":
                raise EngineStateError(f"engine {self.engine_id}: sleep mode needs CUDA")
            self._llm.sleep(level, mode="abort" if self.pause_mode == "abort" else "keep")

    @ray.method(concurrency_group=CONTROL)
    def wake_up(self) -> None:
        """Take the GPU's memory back after :meth:`sleep` (no-op when awake);
        :meth:`load_weights` and :meth:`continue_generation` do it too."""
        with self._serving.exclusive():
            self._wake()

    def _wake(self) -> None:
        """Must hold the vLLM lock. Wake vLLM if it sleeps (resuming or loading always
        does: a sleeping engine cannot step or reload)."""
        if self.device == "cuda" and self._llm.is_sleeping():
            self._llm.wake_up()

    def close(self) -> None:
        """Stop the stepping thread (the engine is freed with the actor)."""
        self._serving.close()

    def _core(self) -> Any:
        """The in-process ``EngineCore`` (its scheduler pause has no ``LLMEngine`` wrapper)."""
        return self._llm.engine_core.engine_core
