"""Garbage collection while an actor starts: held off until it is built, then its heap frozen.

Starting an actor is mostly imports (torch, transformers, vLLM) and building objects that live
as long as the process. CPython's collector, left on, scans the growing heap again and again
meanwhile: on this 2-core machine, 0.27 s of the 1.43 s a train cell's and an engine's modules
take to import, and vLLM's own start calls ``gc.collect()`` five times over about a million
objects (0.97 s). So:

- the workers of a job's own Ray cluster start with automatic collection off:
  :func:`hold_collection` (:data:`SETUP_HOOK`) is the worker setup hook the cluster's
  processes inherit (:mod:`orchestrator.control.lean_ray` says how);
- every actor's ``__init__`` is decorated with :func:`settles_heap`: when the outermost
  ``__init__`` returns (a subclass's, which calls its base's), what is alive is frozen (moved
  to the permanent generation, which later collections do not scan, as vLLM does after its
  own start) and automatic collection is on again (:func:`settle_heap`). The rollout manager,
  whose package may not import this one, is settled by the control plane that creates it
  (:func:`settle_after_start`);
- a vLLM engine calls :func:`freeze_heap` just before vLLM starts, so vLLM's explicit
  collections scan only what vLLM builds.

Freezing without a full collection first keeps the start-up's own garbage cycles for the
process's life: about 17,500 of a vLLM engine's million objects (measured), against a 0.5 s
collection. A worker that never builds one of this project's actors (a Ray task, a test's own
actor) gets automatic collection back :data:`HOLD_LIMIT_S` after it started. A process that
was never held (the driver; a test building an actor in its own process) is left alone.
"""

from __future__ import annotations

import functools
import gc
import threading
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["HOLD_LIMIT_S", "SETUP_HOOK", "freeze_heap", "hold_collection", "is_held",
           "settle_after_start", "settle_heap", "settles_heap"]

Init = TypeVar("Init", bound=Callable[..., None])

HOLD_LIMIT_S = 120.0
"""The longest a worker runs without automatic collection when nothing settles its heap."""

SETUP_HOOK = f"{__name__}.hold_collection"
""":func:`hold_collection` as a Ray worker setup hook: a module path, which each worker imports
and calls when it starts."""

_lock = threading.Lock()
_release_timer: threading.Timer | None = None  # set while collection is held
_init_depth = 0  # decorated __init__ calls in progress (a subclass's calls its base's)


def hold_collection(limit_s: float = HOLD_LIMIT_S) -> None:
    """Turn automatic collection off until :func:`settle_heap`, or for at most ``limit_s``."""
    global _release_timer
    with _lock:
        if _release_timer is not None:
            _release_timer.cancel()
        gc.disable()
        _release_timer = threading.Timer(limit_s, _release)
        _release_timer.daemon = True
        _release_timer.name = "rl-ledger-gc-hold"
        _release_timer.start()


def is_held() -> bool:
    """Whether :func:`hold_collection` holds this process's collection now."""
    return _release_timer is not None


def freeze_heap() -> None:
    """While collection is held: move every object alive now to the permanent generation, so
    collections, explicit or automatic, no longer scan them. Nothing otherwise."""
    with _lock:
        if _release_timer is not None:
            gc.freeze()


def settle_heap() -> None:
    """The start-up is over: freeze the heap and turn automatic collection on again. Only in a
    process :func:`hold_collection` held: the driver, or a test that builds an actor in its own
    process, is left as it is (freezing a long test session's heap would keep its garbage)."""
    global _release_timer
    with _lock:
        if _release_timer is None:
            return
        _release_timer.cancel()
        _release_timer = None
        gc.freeze()
        gc.enable()


def settles_heap(init: Init) -> Init:
    """Decorate an actor's ``__init__``: :func:`settle_heap` once the outermost decorated
    ``__init__`` has returned (not when a subclass's call of its base's returns)."""

    @functools.wraps(init)
    def settling_init(self: Any, *args: Any, **kwargs: Any) -> None:
        global _init_depth
        _init_depth += 1
        try:
            init(self, *args, **kwargs)
        finally:
            _init_depth -= 1
        if _init_depth == 0:
            settle_heap()

    return settling_init  # type: ignore[return-value]


def settle_after_start(actor: Any) -> None:
    """Settle the heap of ``actor``'s worker once its ``__init__`` has returned: a call queued
    behind the constructor (Ray's ``__ray_call__``), not awaited. For an actor whose class
    cannot be decorated with :func:`settles_heap`."""
    actor.__ray_call__.remote(_settle_actor)


def _settle_actor(_actor: Any) -> None:
    settle_heap()


def _release() -> None:
    """The hold's limit passed with nothing settled: collection on again, nothing frozen."""
    global _release_timer
    with _lock:
        if _release_timer is threading.current_thread():  # not a hold cancelled meanwhile
            _release_timer = None
            gc.enable()
