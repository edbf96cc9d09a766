"""Two copies of the built-in engine's policy, so an in-flight update never waits for a step.

One copy serves; the other (the standby, made on the first stage) receives the next weights
while generation goes on. A swap makes the standby serve, under the version it is stamped with, at
once: it does not wait for the decode steps in progress. Each of those finishes on the copy it
started on, so its token carries the old version and the old weights' log-prob; a call takes
the new copy at its next step (:meth:`WeightBuffers.step`, which hands out the serving copy and
its version together) and rebuilds its key/value cache there. Before new weights are written into the
standby, :meth:`WeightBuffers.wait_standby_idle` waits until no step still runs on it (at most one step
after the previous swap).

Memory: a second copy of the policy, from the first in-flight update on. A paused load
(``load_weights``) writes the serving copy in place and drops the standby, so a later
adapters-only stage never lands on a stale base.

It is also where the engine's tensors are handled (received, checked, loaded, checksummed),
so the engine's own module imports no torch (:mod:`actors.engines.rollout_engine`).

Not thread-safe by itself: every method but :meth:`WeightBuffers.step` and the stateless
:meth:`WeightBuffers.receive` and :meth:`WeightBuffers.check` expects the caller to hold the
engine's state lock (a ``threading.Condition``), which :meth:`stage` waits on.
"""

from __future__ import annotations

import copy
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, NamedTuple

import torch
from torch import nn

from actors.policies.policy import check_tensors, load_tensors, tensor_state_dict
from actors.publishing.weight_sync import tensors_checksum
from actors.transport import is_lora_tensor
from actors.weight_paths import open_weights

__all__ = ["Serving", "WeightBuffers"]


class Serving(NamedTuple):
    """The copy that serves and the version it is labelled with (always read together)."""

    model: nn.Module
    version: int


class WeightBuffers:
    """The serving policy copy (with its version label) and its standby."""

    def __init__(self, model: nn.Module, lock: threading.Condition, version: int = 0) -> None:
        self.serving = Serving(model, version)
        self._standby: nn.Module | None = None
        self._lock = lock
        self._steps_on: Counter[int] = Counter()  # id(model) -> decode steps running on it

    @contextmanager
    def step(self) -> Iterator[Serving]:
        """One decode step: the serving copy and its version, taken together under the lock;
        the step counts as running on that copy until the block ends."""
        with self._lock:
            serving = self.serving
            self._steps_on[id(serving.model)] += 1
        try:
            yield serving
        finally:
            with self._lock:
                self._steps_on[id(serving.model)] -= 1
                self._lock.notify_all()

    @staticmethod
    def receive(transferred: Any) -> tuple[dict[str, torch.Tensor], str]:
        """A transfer's tensors, opened (a packed buffer, or CUDA IPC handles on our GPU), and
        their checksum as received."""
        tensors = open_weights(transferred)
        return tensors, tensors_checksum(tensors)

    def check(self, tensors: dict[str, torch.Tensor], adapters_only: bool) -> None:
        """Raise ``PolicyError`` if ``tensors`` do not match the serving copy."""
        check_tensors(self.serving.model, tensors, adapters_only)

    def load_serving(self, tensors: dict[str, torch.Tensor], adapters_only: bool) -> None:
        """A paused load: write ``tensors`` into the serving copy in place (``PolicyError``
        if they do not match) and drop the standby."""
        load_tensors(self.serving.model, tensors, adapters_only=adapters_only)
        self.drop_standby()

    def checksum(self, adapters_only: bool = False) -> str:
        """sha256 of the serving copy's tensors (all, or adapters only) in name order."""
        tensors = tensor_state_dict(self.serving.model)
        if adapters_only:
            tensors = {k: v for k, v in tensors.items() if is_lora_tensor(k)}
        return tensors_checksum(tensors)

    def relabel(self, version: int) -> None:
        """Label the serving copy ``version`` (a paused update's stamp: loaded in place)."""
        self.serving = Serving(self.serving.model, version)

    def wait_standby_idle(self) -> None:
        """Wait (releasing the lock) until no decode step runs on the standby copy."""
        if self._standby is not None:
            while self._steps_on[id(self._standby)]:
                self._lock.wait()

    def load_standby(self, tensors: dict[str, torch.Tensor], adapters_only: bool) -> None:
        """Write ``tensors`` (checked by the caller) into the standby copy, made from the
        serving one if there is none. Precondition: :meth:`wait_standby_idle` returned, and the
        lock was held since."""
        if self._standby is None:
            self._standby = copy.deepcopy(self.serving.model)
        load_tensors(self._standby, tensors, adapters_only)

    def swap(self, version: int) -> None:
        """Make the standby (staged by :meth:`stage`) serve as ``version``; the serving copy
        becomes the standby. Returns at once: steps in progress finish on their copy."""
        assert self._standby is not None, "swap without a stage"
        self.serving, self._standby = Serving(self._standby, version), self.serving.model

    def drop_standby(self) -> None:
        """Forget the standby: the serving copy was changed in place (a paused load)."""
        self._standby = None
