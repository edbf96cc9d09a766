"""How a :class:`~actors.engines.vllm.engine.VLLMEngine` serves ``generate``: one vLLM request
per sample (:mod:`actors.engines.vllm.requests`), and the one thread that steps vLLM.

Each ``step()`` is one token for every running request, so "between tokens" is "between
steps", and every token is stamped with the version the engine held during its step. The
stepping thread stops while the engine is paused (:class:`~actors.engines.engine_state.
EngineState`); a call parked past the paused-wait timeout is aborted with its tokens so far.

Lock order: :attr:`VLLMServing.lock` (every call into vLLM) before ``state.lock``. The
engine's control calls take the same two locks. Everyone but the stepping thread takes the
vLLM lock with :meth:`VLLMServing.exclusive`, which gets it at the next step boundary: a
``threading.Lock`` is not fair, and the stepper, taking it again right after each step, would
otherwise win it back step after step while a weight swap or a new request waits.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from actors.engines.engine_state import EngineState
from actors.engines.sampling import SamplingParams, build_samples
from actors.engines.vllm.requests import Track, deliver, request_params, track_rows
from orchestrator.rollout.types import Prompt, Sample

__all__ = ["VLLMServing"]


class VLLMServing:
    """The requests in flight on one vLLM ``LLMEngine`` and the thread that steps it.

    Thread-safe: :meth:`generate` runs in many threads while control calls arrive.
    """

    def __init__(self, llm: Any, state: EngineState, engine_id: str, task: Any,
                 sampling: SamplingParams, max_model_len: int, paused_wait_timeout_s: float,
                 on_outputs: Callable[[list[Any], int], None] | None = None) -> None:
        """``on_outputs(outputs, version)`` is called by the stepping thread with each step's
        outputs, holding both locks (default: :meth:`deliver`); the engine passes its own
        method, a seam test doubles override."""
        self.llm = llm
        self.state = state
        self.engine_id = engine_id
        self.task = task
        self.sampling = sampling
        self.max_model_len = max_model_len
        self.paused_wait_timeout_s = paused_wait_timeout_s
        self.lock = threading.Lock()  # every call into vLLM; others take it by exclusive()
        self._waiting = 0  # calls waiting in exclusive(): the stepper lets them in first
        self.tracks: dict[str, Track] = {}
        self._request_ids = itertools.count()
        self._on_outputs = on_outputs or self.deliver
        self._closed = False
        self._stepper = threading.Thread(target=self._step_loop, name="vllm-step", daemon=True)
        self._stepper.start()

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        """Hold :attr:`lock` (for a call into vLLM), ahead of the stepping thread: the call
        waits for the step in progress at most, never for the steps after it."""
        with self.state.lock:
            self._waiting += 1
        try:
            self.lock.acquire()
        finally:
            with self.state.lock:
                self._waiting -= 1
                if not self._waiting:
                    self.state.lock.notify_all()  # nobody waits: the stepper may go on
        try:
            yield
        finally:
            self.lock.release()

    def generate(self, prompt: Prompt, n_samples: int, group_index: int,
                 max_new_tokens: int | None = None) -> list[Sample]:
        """Sample ``n_samples`` responses to ``prompt`` (see :mod:`actors.engines.engine_protocol`),
        at most ``max_new_tokens`` each (default: the engine's sampling parameters).

        Raises:
            ValueError: ``n_samples < 1`` or the prompt leaves no room for a response.
        """
        if n_samples < 1:
            raise ValueError(f"n_samples must be >= 1, got {n_samples}")
        room = min(max_new_tokens or self.sampling.max_new_tokens,
                   self.max_model_len - len(prompt.tokens))
        if room < 1:
            raise ValueError(f"prompt of {len(prompt.tokens)} tokens leaves no room to answer")
        tracks = self._submit(prompt, n_samples, room)
        if tracks is None:  # still paused after the wait: nothing was started
            version = self.state.version
            empty = [Track("", version, versions=[version], finish_reason="abort")
                     for _ in range(n_samples)]
            return self._samples(prompt, group_index, empty)
        try:
            self._wait(tracks)
        finally:
            with self.state.lock:
                for track in tracks:
                    self.tracks.pop(track.request_id, None)
                self.state.in_flight -= 1
                if any(t.finish_reason == "abort" for t in tracks):
                    self.state.counters["aborted_calls"] += 1
                self.state.lock.notify_all()
        return self._samples(prompt, group_index, tracks)

    def _submit(self, prompt: Prompt, n_samples: int, max_tokens: int) -> list[Track] | None:
        """Add the requests once the engine is not paused; None if it stayed paused."""
        from vllm.inputs import TokensPrompt

        params = request_params(self.sampling, self.task.tokenizer.eos_id, max_tokens)
        deadline = time.monotonic() + self.paused_wait_timeout_s
        while True:
            with self.state.lock:
                if not self.state.wait_unpaused(deadline):
                    self.state.counters["generate_calls"] += 1
                    self.state.counters["aborted_calls"] += 1
                    return None
            with self.exclusive(), self.state.lock:
                if self.state.paused:
                    continue  # paused again in between: wait again
                self.state.counters["generate_calls"] += 1
                self.state.in_flight += 1
                version = self.state.version
                tracks = [Track(f"{self.engine_id}-{next(self._request_ids)}", version,
                                 versions=[version]) for _ in range(n_samples)]
                for track in tracks:
                    self.tracks[track.request_id] = track
                    self.llm.add_request(track.request_id,
                                         TokensPrompt(prompt_token_ids=list(prompt.tokens)),
                                         params)
                self.state.lock.notify_all()  # wake the stepping thread
                return tracks

    def _wait(self, tracks: list[Track]) -> None:
        """Until every track finished; a call parked past the paused-wait timeout is aborted
        with its tokens so far."""
        while True:
            with self.state.lock:
                if all(t.finish_reason for t in tracks):
                    return
                if not self.state.parked_too_long(self.paused_wait_timeout_s):
                    self.state.lock.wait(timeout=0.5)
                    continue
            self._abort(tracks)

    def _abort(self, tracks: list[Track]) -> None:
        with self.exclusive(), self.state.lock:
            unfinished = [t for t in tracks if t.finish_reason is None]
            if unfinished:
                self.llm.abort_request([t.request_id for t in unfinished])
            for track in unfinished:
                track.finish_reason = "abort"
            self.state.lock.notify_all()

    def _step_loop(self) -> None:
        """The one thread that steps vLLM: one token per running request per step."""
        while True:
            with self.state.lock:
                while not self._closed and (self.state.paused or self._waiting
                                            or not self._unfinished()):
                    self.state.lock.wait(timeout=1.0)
                if self._closed:
                    return
            with self.lock:
                with self.state.lock:
                    if self.state.paused:
                        continue
                    version = self.state.version
                outputs = self.llm.step()
                with self.state.lock:
                    self._on_outputs(outputs, version)

    def _unfinished(self) -> bool:
        return any(t.finish_reason is None for t in self.tracks.values())

    def deliver(self, outputs: list[Any], version: int) -> None:
        """Must hold both locks. Append each request's new tokens, stamped with ``version``."""
        self.state.counters["generated_tokens"] += deliver(self.tracks, outputs, version)
        self.state.lock.notify_all()

    def _samples(self, prompt: Prompt, group_index: int, tracks: list[Track]) -> list[Sample]:
        return build_samples(self.task, self.engine_id, prompt, group_index,
                             track_rows(tracks, self.task.tokenizer.eos_id))

    def abort_unfinished(self) -> int:
        """Must hold :attr:`lock`. Abort every unfinished request (an ``abort``-mode pause);
        returns the calls in flight."""
        with self.state.lock:
            in_flight = self.state.in_flight
            unfinished = [t for t in self.tracks.values() if t.finish_reason is None]
        if unfinished:
            self.llm.abort_request([t.request_id for t in unfinished])
        with self.state.lock:
            for track in unfinished:
                track.finish_reason = "abort"
            self.state.lock.notify_all()
        return in_flight

    def close(self) -> None:
        """Stop the stepping thread."""
        with self.state.lock:
            self._closed = True
            self.state.lock.notify_all()
        self._stepper.join(timeout=5.0)
