"""The two waits a weight update takes on a generating engine: a stage never lands inside a
swap, and a call into vLLM gets the vLLM lock at the next step boundary, not steps later.

vLLM's own ``LLMEngine`` is replaced by a stepper that only counts its steps: what is tested
is the engine's locking around it (the real engine's swap is tested with vLLM in
``test_vllm_engine.py``).
"""

from __future__ import annotations

import statistics
import threading
import time

from actors.engines.engine_state import EngineState, StagedUpdate
from actors.engines.sampling import SamplingParams
from actors.engines.vllm.requests import Track
from actors.engines.vllm.serving import VLLMServing


class CountingStepper:
    """Stands in for vLLM's ``LLMEngine``: each ``step()`` is a device step of ``step_s``
    (the GIL released, as a real device step releases it), counted."""

    def __init__(self, step_s: float) -> None:
        self.step_s = step_s
        self.steps = 0

    def step(self) -> list:
        time.sleep(self.step_s)
        self.steps += 1
        return []


def test_a_stage_waits_while_a_swap_loads_and_lands_after_its_stamp() -> None:
    state = EngineState("engine-0", max_calls=16)
    with state.lock:
        state.stage(StagedUpdate("weights-e1", "full", epoch=1, checksum="c1"))
        swapping = state.begin_swap(version=5, epoch=1)
    newer = StagedUpdate("weights-e2", "full", epoch=2, checksum="c2")

    def stage_newer() -> None:
        with state.lock:
            state.stage(newer)

    stager = threading.Thread(target=stage_newer)
    stager.start()
    stager.join(timeout=0.3)
    assert stager.is_alive(), "a stage landed while the swap was loading"
    with state.lock:
        assert state.epoch == 1 and state.staged is swapping
        state.swapped(5, 1)  # the stamp of what the swap loaded: epoch 1 is still current
        state.end_swap()
    stager.join(timeout=5)

    assert not stager.is_alive()
    assert (state.version, state.epoch, state.staged) == (5, 2, newer)


def test_a_call_into_vllm_waits_for_one_step_at_most() -> None:
    state = EngineState("engine-0", max_calls=16)
    stepper = CountingStepper(step_s=0.005)
    serving = VLLMServing(stepper, state, "engine-0", task=None, sampling=SamplingParams(),
                          max_model_len=64, paused_wait_timeout_s=60.0,
                          on_outputs=lambda outputs, version: None)
    with state.lock:
        serving.tracks["endless"] = Track("endless", 0)  # never finishes: vLLM keeps stepping
        state.lock.notify_all()
    try:
        while stepper.steps < 3:
            time.sleep(0.005)
        waited = []
        for _ in range(20):
            before = stepper.steps
            with serving.exclusive():
                waited.append(stepper.steps - before)
            time.sleep(0.002)
    finally:
        serving.close()

    # The step in progress, never the ones after it (the median: a preemption between the
    # count and the call may let one more step in on a loaded machine).
    assert statistics.median(waited) <= 1 and max(waited) <= 2, waited
    assert stepper.steps > 20  # and vLLM went on stepping between the calls

