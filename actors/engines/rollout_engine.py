"""RolloutEngine: samples responses with its own inference copy of the policy.

A plain class, made remote where it is allocated, as a threaded actor so that control calls
arrive while ``generate`` runs::

    Engine = ray.remote(**ROLLOUT_ENGINE_ACTOR_OPTIONS)(RolloutEngine)

Control methods (pause, updates, health) run in their own concurrency group, so they are never
queued behind generate calls blocked on a pause. It implements
:class:`~actors.engines.engine_protocol.RolloutEngineProtocol`, where the semantics are stated.

State and its rules:

- ``version``: the label of the loaded weights; 0 at launch, then whatever the publisher
  stamps through :meth:`update_weight_version`. Every response token is stamped with the
  version of the weights that computed it (``Sample.token_versions``, beside its log-prob);
  weights never change under a token being computed: loading needs every call paused.
- ``epoch``: the highest publisher epoch seen. :meth:`begin_update`, :meth:`load_weights`,
  :meth:`update_weight_version` and :meth:`continue_generation` (with an epoch) from a lower
  epoch raise :class:`~actors.errors.StaleEpochError` and change nothing: the ledger fences the
  record, the engines fence the tensors.
- ``paused``: new generate calls wait (up to ``paused_wait_timeout_s``, then come back
  ABORTED). In-flight calls stop at the next token boundary and, by the pause mode
  (``partial_rollout``): come back ABORTED (``abort``), or park there and continue under the
  new weights when resumed (``in_place``; parked longer than ``paused_wait_timeout_s``, they
  come back ABORTED with what they generated).

A decode step extends a key/value cache (:mod:`actors.engines.decoding`); a parked call starts
a new one, so tokens after an update are computed wholly by the new weights, their log-probs
exactly the new policy's.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, fields
from typing import Any

import ray
import torch

from actors.device import select_device, torch_dtype
from actors.engines.decoding import StepDecoder
from actors.engines.engine_protocol import pause_mode
from actors.errors import EngineStateError, StaleEpochError
from actors.policies.policy import PolicyConfig, build_policy, load_tensors, tensor_state_dict
from actors.engines.scoring import score_group
from actors.task import AdditionTask
from actors.weight_paths import open_weights
from actors.weight_sync import TRANSPORTS, tensors_checksum
from orchestrator.rollout.types import Prompt, Sample, SampleStatus, check_weight_version

__all__ = ["ROLLOUT_ENGINE_ACTOR_OPTIONS", "RolloutEngine", "SamplingParams"]

CONTROL = "control"
ROLLOUT_ENGINE_ACTOR_OPTIONS: dict[str, Any] = {
    "num_cpus": 0.5,
    "max_concurrency": 16,  # concurrent generate calls
    "concurrency_groups": {CONTROL: 4},
}


@dataclass(frozen=True)
class SamplingParams:
    """How responses are sampled. ``temperature == 0`` is greedy."""

    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 3

    def __post_init__(self) -> None:
        if self.temperature < 0 or not 0 < self.top_p <= 1 or self.max_new_tokens < 1:
            raise ValueError(f"invalid sampling parameters: {self}")

    @classmethod
    def from_value(cls, value: SamplingParams | dict[str, Any] | None) -> SamplingParams:
        if value is None:
            return cls()
        if isinstance(value, cls):
            return value
        unknown = set(value) - {f.name for f in fields(cls)}
        if unknown:
            raise ValueError(f"unknown sampling keys: {sorted(unknown)}")
        return cls(**value)


def _top_p_filter(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Zero the tail outside the smallest set of tokens whose mass reaches ``top_p``."""
    if top_p >= 1.0:
        return probs
    sorted_probs, order = probs.sort(dim=-1, descending=True)
    # Keep a token if the mass before it is below top_p (so the top token is always kept).
    keep_sorted = (sorted_probs.cumsum(dim=-1) - sorted_probs) < top_p
    keep = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)
    return probs * keep


class RolloutEngine:
    """One inference engine: a policy copy, a sampler, a version label and an epoch fence.

    Thread-safe: ``generate`` may run in many threads while control methods arrive.
    """

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
        device: str = "cpu",
        dtype: str = "float32",
    ) -> None:
        """Build the engine's policy from ``(backend, policy_config, seed)``: the trainer must
        use the same triple so version 0 means the same weights everywhere. It is held on
        ``device`` in ``dtype`` (:mod:`actors.device`; loaded weights are cast to it).
        ``partial_rollout`` chooses the pause mode: ``in_place`` if true, else ``abort``.
        ``task`` has ``tokenizer.eos_id`` / ``pad_id`` and ``score_group(prompt, responses)``
        (default: the addition task; a data set's is ``actors.dataset_task.DatasetTask``).

        Raises:
            PolicyError, ValueError: the policy, sampling parameters, device or dtype are
                invalid. DeviceError: ``"cuda"`` without a CUDA device.
        """
        torch.set_num_threads(1)  # a fraction of a core per actor on a small machine
        self.engine_id = engine_id
        self.backend = backend
        self.task = task or AdditionTask()
        self.sampling = SamplingParams.from_value(sampling)
        self.paused_wait_timeout_s = paused_wait_timeout_s
        self.partial_rollout = partial_rollout
        self.pause_mode = pause_mode(partial_rollout)
        config = PolicyConfig.from_value(policy_config)
        self.device = select_device(device)
        self.model = build_policy(backend, config, seed).to(self.device, torch_dtype(dtype)).eval()
        self.max_sequence_length = config.max_sequence_length
        self._generator = torch.Generator(device=self.device).manual_seed(seed * 1_000_003 + 17)
        self._rng_lock = threading.Lock()
        self._state = threading.Condition()
        self._version = 0
        self._epoch = 0
        self._paused = False
        self._in_flight = 0  # calls not yet returned (parked ones included)
        self._running = 0  # calls computing a token (not parked)
        self._abort_token = 0
        self._updating = False
        self._counters = {"generate_calls": 0, "aborted_calls": 0, "weight_loads": 0,
                          "parked_calls": 0, "resumed_calls": 0, "decode_steps": 0}

    # ---------------------------------------------------------------------------- helpers

    def pid(self) -> int:
        """The process id of this engine (tests kill it from outside)."""
        return os.getpid()

    def _check_epoch(self, operation: str, epoch: int) -> None:
        """Must hold ``self._state``. Raises StaleEpochError, else adopts a higher epoch."""
        if epoch < self._epoch:
            raise StaleEpochError(self.engine_id, operation, epoch, self._epoch)
        self._epoch = epoch

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
        if n_samples < 1:
            raise ValueError(f"n_samples must be >= 1, got {n_samples}")
        if len(prompt.tokens) >= self.max_sequence_length:
            raise ValueError(f"prompt of {len(prompt.tokens)} tokens leaves no room to answer")
        with self._state:
            deadline = time.monotonic() + self.paused_wait_timeout_s
            while self._paused and time.monotonic() < deadline:
                self._state.wait(timeout=max(0.0, deadline - time.monotonic()))
            self._counters["generate_calls"] += 1
            if self._paused:
                self._counters["aborted_calls"] += 1
                empty = _Rollout.empty(n_samples, self._version)
                return self._samples(prompt, group_index, empty, aborted=True)
            self._in_flight += 1
            self._running += 1
            abort_token, version = self._abort_token, self._version
        rollout = _Rollout.empty(n_samples, version)
        aborted = True
        try:
            aborted = self._sample(prompt, rollout, abort_token, max_new_tokens)
        finally:
            with self._state:
                self._in_flight -= 1
                self._running -= 1
                self._counters["aborted_calls"] += aborted
                self._state.notify_all()
        return self._samples(prompt, group_index, rollout, aborted)

    def _before_token(self) -> None:
        """Called before each decode step, while the call counts as running (a pause waits
        for it). A hook for engines that model extra per-step time (tests, benchmarks)."""

    def _forward_step(self, tokens: torch.Tensor, decoder: StepDecoder) -> torch.Tensor:
        """One decode step of the model: the last position's logits ``[rows, vocab]``. A
        pause waits for the step in progress (benchmark doubles model a device step here)."""
        return decoder.logits(tokens)

    def _park(self) -> int | None:
        """Wait at a token boundary while paused (``in_place``). Returns the version to go on
        with, or None if the pause outlasted ``paused_wait_timeout_s`` (the call aborts)."""
        with self._state:
            if not self._paused:
                return self._version
            self._running -= 1
            self._counters["parked_calls"] += 1
            self._state.notify_all()  # a pause waiting for running calls may now return
            deadline = time.monotonic() + self.paused_wait_timeout_s
            while self._paused and time.monotonic() < deadline:
                self._state.wait(timeout=max(0.0, deadline - time.monotonic()))
            self._running += 1
            if self._paused:
                return None
            self._counters["resumed_calls"] += 1
            return self._version

    @torch.inference_mode()
    def _sample(self, prompt: Prompt, rollout: _Rollout, abort_token: int,
                max_new_tokens: int | None = None) -> bool:
        """Decode into ``rollout`` token by token; True if the call was aborted."""
        eos_id, pad_id = self.task.tokenizer.eos_id, self.task.tokenizer.pad_id
        n_samples = len(rollout.responses)
        tokens = torch.tensor([list(prompt.tokens)] * n_samples, dtype=torch.long,
                              device=self.device)
        responses, log_probs, finished = rollout.responses, rollout.log_probs, rollout.finished
        temperature = self.sampling.temperature
        version, decoder = rollout.start_version, StepDecoder(self.model)
        for _ in range(max_new_tokens or self.sampling.max_new_tokens):
            if self._paused:  # read without the lock: a pause is seen at the next boundary
                if not self.partial_rollout:
                    return True
                resumed = self._park()
                if resumed is None:
                    return True
                version = resumed
                decoder.restart()  # the weights may have changed while it was parked
            if self._abort_token != abort_token:
                return True
            if tokens.shape[1] >= self.max_sequence_length:
                break
            self._before_token()
            logits = self._forward_step(tokens, decoder)
            step_log_probs = torch.log_softmax(logits / (temperature or 1.0), dim=-1)
            if temperature == 0:
                next_tokens = logits.argmax(dim=-1)
            else:
                probs = _top_p_filter(step_log_probs.exp(), self.sampling.top_p)
                with self._rng_lock:
                    next_tokens = torch.multinomial(probs, 1, generator=self._generator)[:, 0]
            chosen = step_log_probs.gather(-1, next_tokens[:, None])[:, 0].tolist()
            with self._state:
                self._counters["decode_steps"] += 1
            picked = next_tokens.tolist()  # one device-to-host copy per step
            for row in range(n_samples):
                if not finished[row]:
                    responses[row].append(picked[row])
                    log_probs[row].append(chosen[row])
                    rollout.token_versions[row].append(version)
                    finished[row] = picked[row] == eos_id
            if all(finished):
                break
            done = torch.tensor(finished, device=self.device)
            next_tokens = next_tokens.masked_fill(done, pad_id)
            tokens = torch.cat([tokens, next_tokens[:, None]], dim=1)
        return False

    def _samples(self, prompt: Prompt, group_index: int, rollout: _Rollout,
                 aborted: bool) -> list[Sample]:
        samples = []
        responses, finished = rollout.responses, rollout.finished
        unfinished = SampleStatus.ABORTED if aborted else SampleStatus.TRUNCATED
        statuses = [SampleStatus.COMPLETED if done else unfinished for done in finished]
        rewards, reward_error = score_group(self.task, prompt, responses, statuses)
        for row, (response, row_log_probs) in enumerate(zip(responses, rollout.log_probs)):
            status, reward = statuses[row], rewards[row]
            samples.append(Sample(
                index=group_index * len(responses) + row,
                group_index=group_index,
                prompt_tokens=list(prompt.tokens),
                response_tokens=list(response),
                rollout_log_probs=list(row_log_probs),
                reward=reward,
                status=status,
                weight_versions=_distinct([rollout.start_version, *rollout.token_versions[row]]),
                token_versions=list(rollout.token_versions[row]),
                metadata={"engine_id": self.engine_id, "prompt_index": prompt.index,
                          "label": prompt.label},
                reward_error=None if status is SampleStatus.ABORTED else reward_error,
            ))
        return samples

    # ---------------------------------------------------------------------------- control

    @ray.method(concurrency_group=CONTROL)
    def pause(self) -> int:
        """Stop serving; new calls wait. In-flight calls stop at the next token boundary: in
        ``abort`` mode they come back ABORTED, in ``in_place`` mode they park and keep their
        tokens. Returns when no call computes (so weights can be swapped safely), with the
        number of calls aborted (``abort``) or parked (``in_place``)."""
        with self._state:
            self._paused = True
            if not self.partial_rollout:
                self._abort_token += 1
            interrupted = self._in_flight
            while self._running:
                self._state.wait()
            return interrupted

    @ray.method(concurrency_group=CONTROL)
    def continue_generation(self, epoch: int | None = None) -> None:
        """Resume serving. With ``epoch``, fenced like the weight calls (a zombie publisher
        must not resume engines a newer publisher paused).

        Raises:
            StaleEpochError: ``epoch`` is lower than the highest seen; the engine stays paused.
        """
        with self._state:
            if epoch is not None:
                self._check_epoch("continue_generation", epoch)
            self._paused = False
            self._updating = False
            self._state.notify_all()

    @ray.method(concurrency_group=CONTROL)
    def begin_update(self, epoch: int) -> dict[str, Any]:
        """Step 2 of a weight update: adopt ``epoch``, pause and drain. Returns :meth:`health`.

        Raises:
            StaleEpochError: ``epoch`` is lower than the highest seen; nothing changes.
        """
        with self._state:
            self._check_epoch("begin_update", epoch)
            self._updating = True
        self.pause()
        return self.health()

    @ray.method(concurrency_group=CONTROL)
    def load_weights(self, tensors: dict[str, torch.Tensor], epoch: int,
                     transport: str = "full") -> str:
        """Step 3: copy the transferred tensors in place; returns their checksum as received.

        ``full`` needs every tensor of the model, ``lora`` exactly its adapter tensors. The
        version label does not change (that is the stamp's job, after the commit).

        Raises:
            StaleEpochError: ``epoch`` is lower than the highest seen; nothing changes.
            EngineStateError: the engine is not paused (no :meth:`begin_update` first).
            PolicyError: the tensors do not match the model; nothing changes.
            ValueError: unknown transport.
        """
        if transport not in TRANSPORTS:
            raise ValueError(f"unknown transport {transport!r}; expected one of {TRANSPORTS}")
        tensors = open_weights(tensors)  # CUDA IPC handles from a publisher on our GPU
        with self._state:
            self._check_epoch("load_weights", epoch)
            if not self._paused or self._running:
                raise EngineStateError(
                    f"engine {self.engine_id} must be paused with no call computing to "
                    "load weights"
                )
            load_tensors(self.model, tensors, adapters_only=transport == "lora")
            self._counters["weight_loads"] += 1
            return tensors_checksum(tensors)

    @ray.method(concurrency_group=CONTROL)
    def update_weight_version(self, version: int, epoch: int) -> str:
        """Step 5: stamp the loaded weights with the committed ``version``; returns the
        engine id (for the ``engines_stamped`` event). Does not resume.

        Raises:
            StaleEpochError: ``epoch`` is lower than the highest seen; nothing changes.
            VersionLabelError: ``version`` is not a non-negative int; nothing changes.
        """
        with self._state:
            if epoch < self._epoch:
                raise StaleEpochError(self.engine_id, "update_weight_version", epoch, self._epoch)
            version = check_weight_version(version)
            self._epoch = epoch
            self._version = version
            return self.engine_id

    @ray.method(concurrency_group=CONTROL)
    def weights_checksum(self, adapters_only: bool = False) -> str:
        """sha256 of the engine's tensors (all, or adapters only) in name order."""
        tensors = tensor_state_dict(self.model)
        if adapters_only:
            tensors = {k: v for k, v in tensors.items() if k.endswith((".lora_a", ".lora_b"))}
        return tensors_checksum(tensors)

    @ray.method(concurrency_group=CONTROL)
    def health(self) -> dict[str, Any]:
        """A snapshot: id, pid, version, epoch, pause mode, paused, updating, in flight
        (parked calls included), running, counters."""
        with self._state:
            return {
                "engine_id": self.engine_id,
                "pid": os.getpid(),
                "backend": self.backend,
                "version": self._version,
                "epoch": self._epoch,
                "pause_mode": self.pause_mode,
                "paused": self._paused,
                "updating": self._updating,
                "in_flight": self._in_flight,
                "running": self._running,
                **self._counters,
            }


@dataclass
class _Rollout:
    """What one generate call has decoded so far, row by row."""

    start_version: int
    responses: list[list[int]]
    log_probs: list[list[float]]
    token_versions: list[list[int]]
    finished: list[bool]

    @classmethod
    def empty(cls, n_samples: int, start_version: int) -> _Rollout:
        return cls(start_version, [[] for _ in range(n_samples)],
                   [[] for _ in range(n_samples)], [[] for _ in range(n_samples)],
                   [False] * n_samples)


def _distinct(versions: list[int]) -> list[int]:
    """``versions`` without repeats, in the order first seen."""
    return list(dict.fromkeys(versions))
