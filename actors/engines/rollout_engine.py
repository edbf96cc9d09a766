"""RolloutEngine: samples responses with its own inference copy of the policy.

A plain class, made remote where it is allocated as a threaded actor
(``ray.remote(**ROLLOUT_ENGINE_ACTOR_OPTIONS)(RolloutEngine)``) whose control methods (pause,
updates, health) run in a concurrency group of their own, never queued behind generate calls.
It implements :class:`~actors.engines.engine_protocol.RolloutEngineProtocol` (the semantics).
No torch at import (Ray loads an actor's class wherever its handle is deserialized, in the
rollout manager too): ``__init__`` imports it, and ``WeightBuffers`` handle the tensors.

Its label, epoch fence, pause flag and staged update live in the one
:class:`~actors.engines.engine_state.EngineState` (shared with the vLLM engine). Every token is
stamped with the version of the weights that computed it (``Sample.token_versions``, beside
its log-prob). A paused update loads in place with every call paused (``abort``: in-flight
calls come back ABORTED; ``in_place``: they park and restart their key/value cache). An
in-flight one (``--weight-swap in-flight``) loads a standby copy while the engine generates
and swaps it in without waiting for a step (:mod:`actors.engines.weight_buffers`).
"""

from __future__ import annotations

import os
import threading
import time
from typing import TYPE_CHECKING, Any

import ray

from actors.engines.engine_protocol import pause_mode
from actors.engines.engine_state import EngineState, StagedUpdate
from actors.engines.group_batches import GroupBatches
from actors.engines.sampling import Decoding, SamplingParams, build_samples
from actors.engines.scoring import load_task
from actors.errors import EngineStateError
from actors.startup_gc import settles_heap
from actors.task import AdditionTask
from actors.transport import Transport
from orchestrator.rollout.types import GroupRequest, Prompt, Sample

if TYPE_CHECKING:
    import torch

    from actors.engines.decoding import StepDecoder
    from actors.engines.weight_buffers import Serving

__all__ = ["ROLLOUT_ENGINE_ACTOR_OPTIONS", "RolloutEngine", "SamplingParams"]

CONTROL = "control"
ROLLOUT_ENGINE_ACTOR_OPTIONS: dict[str, Any] = {
    "num_cpus": 0.5, "max_concurrency": 16,  # max_concurrency: concurrent generate calls
    "concurrency_groups": {CONTROL: 4},
}


class RolloutEngine:
    """One inference engine: a policy copy, a sampler, a version label and an epoch fence.

    Thread-safe: ``generate`` may run in many threads while control methods arrive.
    """

    @settles_heap
    def __init__(
        self,
        engine_id: str,
        backend: str = "torch",
        policy_config: Any = None,
        seed: int = 0,
        task: Any = None,
        sampling: SamplingParams | dict[str, Any] | None = None,
        paused_wait_timeout_s: float = 60.0,
        partial_rollout: bool = False,
        device: str = "cpu", dtype: str = "float32",
    ) -> None:
        """Build the engine's policy from ``(backend, policy_config, seed)``: the trainer must
        use the same triple so version 0 means the same weights everywhere. It is held on
        ``device`` in ``dtype`` (:mod:`actors.device`; loaded weights are cast to it).
        ``partial_rollout`` chooses the pause mode: ``in_place`` if true, else ``abort``.
        ``task`` has ``tokenizer.eos_id`` / ``pad_id`` and ``score_group(prompt, responses)``
        (default: the addition task; a data set's is ``actors.dataset_task.DatasetTask``).

        Raises:
            PolicyError, ValueError: the policy, sampling parameters, device or dtype are
                invalid. DeviceError: ``"cuda"`` without a CUDA device. TokenizerError.
        """
        import torch

        from actors.device import select_device, torch_dtype
        from actors.engines.weight_buffers import WeightBuffers
        from actors.policies.policy import PolicyConfig, build_policy

        torch.set_num_threads(1)  # a fraction of a core per actor on a small machine
        self.engine_id = engine_id
        self.backend = backend
        self.task = load_task(task or AdditionTask())
        self.sampling = SamplingParams.from_value(sampling)
        self.paused_wait_timeout_s = paused_wait_timeout_s
        self.partial_rollout = partial_rollout
        self.pause_mode = pause_mode(partial_rollout)
        config = PolicyConfig.from_value(policy_config)
        self.device = select_device(device)
        model = build_policy(backend, config, seed).to(self.device, torch_dtype(dtype)).eval()
        self.max_sequence_length = config.max_sequence_length
        self._generator = torch.Generator(device=self.device).manual_seed(seed * 1_000_003 + 17)
        self._rng_lock = threading.Lock()
        self.state = EngineState(engine_id, ROLLOUT_ENGINE_ACTOR_OPTIONS["max_concurrency"])
        self._buffers = WeightBuffers(model, self.state.lock)  # serving copy, its version
        self.state.counters.update(parked_calls=0, resumed_calls=0, decode_steps=0)
        self._running = 0  # calls computing a token (not parked); under state.lock
        self._abort_token = 0  # bumped by an abort-mode pause; under state.lock
        self._batches = GroupBatches(self._generate,
                                     ROLLOUT_ENGINE_ACTOR_OPTIONS["max_concurrency"])

    # ---------------------------------------------------------------------------- helpers

    @property
    def model(self) -> torch.nn.Module:
        """The policy copy that serves."""
        return self._buffers.serving.model

    def pid(self) -> int:
        """The process id of this engine (tests kill it from outside)."""
        return os.getpid()

    # ---------------------------------------------------------------------------- sampling

    def generate(self, prompt: Prompt, n_samples: int, group_index: int,
                 max_new_tokens: int | None = None) -> list[Sample]:
        """Sample ``n_samples`` responses to ``prompt``, each token stamped with its version
        (at most ``max_new_tokens`` each; default: the engine's sampling parameters).

        Waits while the engine is paused (up to ``paused_wait_timeout_s``). A call that is
        aborted (pause in ``abort`` mode, or parked too long in ``in_place`` mode) returns its
        samples with status ABORTED: unfinished responses as far as they got, reward 0. In
        ``in_place`` mode a call paused by an update continues under the new weights after
        it. Never raises for a pause.

        Raises:
            ValueError: ``n_samples < 1`` or the prompt does not fit the context.
        """
        with self.state.receiving([group_index]):
            return self._generate(prompt, n_samples, group_index, max_new_tokens)

    def generate_batch(self, requests: list[GroupRequest]) -> list[list[Sample]]:
        """:meth:`generate` for every request at once (:mod:`actors.engines.group_batches`)."""
        with self.state.receiving(request.group_index for request in requests):
            return self._batches.run(requests)

    def _generate(self, prompt: Prompt, n_samples: int, group_index: int,
                  max_new_tokens: int | None = None) -> list[Sample]:
        if n_samples < 1:
            raise ValueError(f"n_samples must be >= 1, got {n_samples}")
        if len(prompt.tokens) >= self.max_sequence_length:
            raise ValueError(f"prompt of {len(prompt.tokens)} tokens leaves no room to answer")
        state = self.state
        with state.lock:
            unpaused = state.wait_unpaused(time.monotonic() + self.paused_wait_timeout_s)
            state.counters["generate_calls"] += 1
            if not unpaused:
                state.counters["aborted_calls"] += 1
                empty = Decoding.empty(n_samples, state.version)
                return self._samples(prompt, group_index, empty, aborted=True)
            state.in_flight += 1
            self._running += 1
            abort_token, serving = self._abort_token, self._buffers.serving
        rollout = Decoding.empty(n_samples, serving.version)
        aborted = True
        try:
            aborted = self._sample(prompt, rollout, serving, abort_token, max_new_tokens)
        finally:
            with state.lock:
                state.in_flight -= 1
                self._running -= 1
                state.counters["aborted_calls"] += aborted
                state.lock.notify_all()
        return self._samples(prompt, group_index, rollout, aborted)

    def _before_token(self) -> None:
        """Called before each decode step, while the call counts as running (a pause waits
        for it). A hook for engines that model extra per-step time (tests, benchmarks)."""

    def _forward_step(self, tokens: torch.Tensor, decoder: StepDecoder) -> torch.Tensor:
        """One decode step: the last position's logits ``[rows, vocab]`` (a pause waits for
        it; a swap does not; benchmark doubles model a device step here)."""
        return decoder.logits(tokens)

    def _park(self) -> bool:
        """Wait at a token boundary while paused (``in_place``). Returns False if the pause
        outlasted ``paused_wait_timeout_s`` (the call aborts)."""
        state = self.state
        with state.lock:
            if not state.paused:
                return True
            self._running -= 1
            state.counters["parked_calls"] += 1
            state.lock.notify_all()  # a pause waiting for running calls may now return
            unpaused = state.wait_unpaused(time.monotonic() + self.paused_wait_timeout_s)
            self._running += 1
            state.counters["resumed_calls"] += unpaused
            return unpaused

    def _sample(self, prompt: Prompt, rollout: Decoding, serving: Serving, abort_token: int,
                max_new_tokens: int | None = None) -> bool:
        """Decode into ``rollout`` token by token, starting on ``serving``; True if the call
        was aborted. Each step takes the serving copy and version anew: after a swap, the
        call goes on on the new copy with a new key/value cache."""
        import torch

        from actors.engines.decoding import StepDecoder, sample_next

        with torch.inference_mode():
            eos_id, pad_id = self.task.tokenizer.eos_id, self.task.tokenizer.pad_id
            n_samples = len(rollout.responses)
            tokens = torch.tensor([list(prompt.tokens)] * n_samples, dtype=torch.long,
                                  device=self.device)
            decoder = StepDecoder(serving.model)
            for _ in range(max_new_tokens or self.sampling.max_new_tokens):
                if self.state.paused:  # read without the lock: seen at the next boundary
                    if not self.partial_rollout or not self._park():
                        return True
                    decoder.restart()  # the weights may have changed while it was parked
                if tokens.shape[1] >= self.max_sequence_length:
                    break
                self._before_token()
                with self._buffers.step() as now:
                    if self._abort_token != abort_token:  # read after the copy: never both new
                        return True
                    if now.model is not serving.model:  # an in-flight swap
                        decoder = StepDecoder(now.model)
                    serving = now
                    logits = self._forward_step(tokens, decoder)
                next_tokens, chosen = sample_next(logits, self.sampling, self._generator,
                                                  self._rng_lock)
                with self.state.lock:
                    self.state.counters["decode_steps"] += 1
                if rollout.extend(next_tokens.tolist(), chosen, serving.version, eos_id):
                    break
                done = torch.tensor(rollout.finished, device=self.device)
                next_tokens = next_tokens.masked_fill(done, pad_id)
                tokens = torch.cat([tokens, next_tokens[:, None]], dim=1)
            return False

    def _samples(self, prompt: Prompt, group_index: int, rollout: Decoding,
                 aborted: bool) -> list[Sample]:
        return build_samples(self.task, self.engine_id, prompt, group_index,
                             rollout.rows(aborted))

    # ---------------------------------------------------------------------------- control

    @ray.method(concurrency_group=CONTROL)
    def pause(self) -> int:
        """Stop serving; new calls wait. In-flight calls stop at the next token boundary: in
        ``abort`` mode they come back ABORTED, in ``in_place`` mode they park and keep their
        tokens. Returns when no call computes (so weights can be swapped safely), with the
        number of calls aborted (``abort``) or parked (``in_place``)."""
        with self.state.lock:
            self.state.pause()
            if not self.partial_rollout:
                self._abort_token += 1
            interrupted = self.state.in_flight
            while self._running:
                self.state.lock.wait()
            return interrupted

    @ray.method(concurrency_group=CONTROL)
    def continue_generation(self, epoch: int | None = None) -> None:
        """Resume serving. With ``epoch``, fenced like the weight calls (a zombie publisher
        must not resume engines a newer publisher paused).

        Raises:
            StaleEpochError: ``epoch`` is lower than the highest seen; the engine stays paused.
        """
        with self.state.lock:
            if epoch is not None:
                self.state.check_epoch("continue_generation", epoch)
            self.state.resume()

    @ray.method(concurrency_group=CONTROL)
    def begin_update(self, epoch: int) -> dict[str, Any]:
        """Step 2 of a weight update: adopt ``epoch``, pause and drain. Returns :meth:`health`.

        Raises:
            StaleEpochError: ``epoch`` is lower than the highest seen; nothing changes.
        """
        with self.state.lock:
            self.state.check_epoch("begin_update", epoch)
            self.state.updating = True
        self.pause()
        return self.health()

    @ray.method(concurrency_group=CONTROL)
    def load_weights(self, tensors: dict[str, torch.Tensor], epoch: int,
                     transport: str = "full") -> str:
        """Step 3 (3b): copy the transferred tensors in place (``full``: every tensor of the
        model, ``lora``: exactly its adapters); returns their checksum as received. The label
        does not change (that is the stamp's job, after the commit).

        Raises:
            StaleEpochError: ``epoch`` is lower than the highest seen; nothing changes.
            EngineStateError: the engine is not paused (no :meth:`begin_update` first).
            PolicyError: the tensors do not match the model; nothing changes.
            ValueError: unknown transport.
        """
        transport = Transport.parse(transport)
        tensors, checksum = self._buffers.receive(tensors)
        with self.state.lock:
            self.state.check_epoch("load_weights", epoch)
            if not self.state.paused or self._running:
                raise EngineStateError(
                    f"engine {self.engine_id} must be paused with no call computing to "
                    "load weights"
                )
            self._buffers.load_serving(tensors, adapters_only=transport is Transport.LORA)
            self.state.counters["weight_loads"] += 1
            return checksum

    @ray.method(concurrency_group=CONTROL)
    def stage_weights(self, tensors: dict[str, torch.Tensor], epoch: int,
                      transport: str = "full") -> str:
        """In-flight step 3b: write the next weights into the standby copy
        (:mod:`actors.engines.weight_buffers`) without pausing; returns their checksum as
        received. Generation goes on under the serving copy and its label until
        :meth:`swap_and_stamp`. A newer stage replaces this one.

        Raises:
            StaleEpochError: ``epoch`` is lower than the highest seen; nothing changes.
            PolicyError: the tensors do not match the model; nothing changes.
            ValueError: unknown transport.
        """
        transport = Transport.parse(transport)
        tensors, checksum = self._buffers.receive(tensors)
        adapters_only = transport is Transport.LORA
        self._buffers.check(tensors, adapters_only)
        staged = StagedUpdate(None, str(transport), epoch, checksum)
        with self.state.lock:
            self.state.check_epoch("stage_weights", epoch)  # refused before any wait
            self._buffers.wait_standby_idle()  # releases the lock while it waits
            self.state.stage(staged)  # checks the epoch again: a newer stage may have come
            self._buffers.load_standby(tensors, adapters_only)
        return staged.checksum

    @ray.method(concurrency_group=CONTROL)
    def swap_and_stamp(self, version: int, epoch: int) -> dict[str, Any]:
        """In-flight step 5: make the copy staged at ``epoch`` serve as ``version`` (resuming
        the engine if it was paused). Waits for no decode step: a step in progress finishes
        on the old copy under the old label; each call takes the new copy at its next step
        (``in_place``: its later tokens carry ``version``; ``abort``: it comes back ABORTED).
        Returns what :meth:`stamp_and_resume` returns.

        Raises:
            StaleEpochError: ``epoch`` is lower than the highest seen; nothing changes.
            VersionLabelError: ``version`` is not a non-negative int; nothing changes.
            EngineStateError: nothing was staged at ``epoch``; nothing changes.
        """
        with self.state.lock:
            self.state.check_swap(version, epoch)
            self._buffers.swap(version)
            self.state.swapped(version, epoch)
            if not self.partial_rollout:
                self._abort_token += 1  # no sample may span versions
            self.state.resume()
            return {"engine_id": self.engine_id, "resume_error": None}

    @ray.method(concurrency_group=CONTROL)
    def update_weight_version(self, version: int, epoch: int) -> str:
        """Step 5: stamp the loaded weights with the committed ``version``; returns the
        engine id (for the ``engines_stamped`` event). Does not resume.

        Raises:
            StaleEpochError: ``epoch`` is lower than the highest seen; nothing changes.
            VersionLabelError: ``version`` is not a non-negative int; nothing changes.
        """
        with self.state.lock:
            self.state.stamp(version, epoch)
            self._buffers.relabel(version)
            return self.engine_id

    @ray.method(concurrency_group=CONTROL)
    def stamp_and_resume(self, version: int, epoch: int) -> dict[str, Any]:
        """Step 5 in one call: :meth:`update_weight_version`, then :meth:`continue_generation`,
        under one lock (so no call runs between the two). Returns ``engine_id`` and
        ``resume_error`` (always ``None`` here: resuming cannot fail once stamped).

        Raises: as :meth:`update_weight_version`; the engine then stays paused.
        """
        with self.state.lock:
            self.state.stamp(version, epoch)
            self._buffers.relabel(version)
            self.state.resume()
            return {"engine_id": self.engine_id, "resume_error": None}

    @ray.method(concurrency_group=CONTROL)
    def weights_checksum(self, adapters_only: bool = False) -> str:
        """sha256 of the engine's tensors (all, or adapters only) in name order."""
        return self._buffers.checksum(adapters_only)

    @ray.method(concurrency_group=CONTROL)
    def health(self) -> dict[str, Any]:
        """:meth:`EngineState.snapshot`, the backend, pause mode and calls computing."""
        with self.state.lock:
            return {**self.state.snapshot(), "backend": self.backend,
                    "pause_mode": self.pause_mode, "running": self._running}
