"""Start a job's own local Ray cluster without the helpers the job never uses.

A local head started by ``ray.init`` spawns, besides the GCS and the raylet, Ray's autoscaler
monitor and its log monitor. A job's own cluster needs neither: it is one machine with nothing
to scale, and the driver forwards no worker logs (``log_to_driver=False``; the workers' logs
stay in Ray's session directory). On a 2-core machine the two cost about 0.8 CPU-s while every
actor imports torch, they are spawned before the raylet, and the autoscaler monitor does not
exit within the second Ray's shutdown gives it: measured in the README's start-up section.

``ray.init`` has no parameter for either; Ray's own ``RayParams`` (``no_monitor``,
``include_log_monitor``, what ``ray start --no-monitor --include-log-monitor=false`` sets)
does. :func:`lean_params` substitutes a subclass of it with those two set, for one
``ray.init`` call, and only where this Ray's ``RayParams`` takes both; any other Ray starts
with its defaults, as does every run with ``RL_LEDGER_FULL_RAY=1`` set (for Ray's own
tools, ``ray status`` say, against a job's cluster).
"""

from __future__ import annotations

import inspect
import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType
from typing import Any

__all__ = ["FULL_RAY_ENV", "LEAN_PARAMS", "lean_params", "start_local_ray"]

logger = logging.getLogger(__name__)

FULL_RAY_ENV = "RL_LEDGER_FULL_RAY"
# RayParams' own names: the autoscaler monitor off, the log monitor off.
LEAN_PARAMS: dict[str, bool] = {"no_monitor": True, "include_log_monitor": False}


def _params_module() -> ModuleType | None:
    try:
        from ray._private import parameter
    except ImportError:
        return None
    return parameter


def _takes_lean_params(params_class: Any) -> bool:
    try:
        names = inspect.signature(params_class.__init__).parameters
    except (TypeError, ValueError):
        return False
    return all(name in names for name in LEAN_PARAMS)


@contextmanager
def lean_params() -> Iterator[bool]:
    """Within the block, a local head that ``ray.init`` starts has no autoscaler monitor and
    no log monitor; yields whether that applies (False: this Ray's ``RayParams`` lacks the
    parameters, or ``RL_LEDGER_FULL_RAY`` is set, and Ray starts as it would anyway).
    ``RayParams`` is restored on leaving, also on an error."""
    module = _params_module()
    original = getattr(module, "RayParams", None)
    if os.environ.get(FULL_RAY_ENV) or original is None or not _takes_lean_params(original):
        yield False
        return

    class LeanRayParams(original):  # type: ignore[misc,valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **{**kwargs, **LEAN_PARAMS})

    module.RayParams = LeanRayParams  # type: ignore[union-attr]
    try:
        yield True
    finally:
        module.RayParams = original  # type: ignore[union-attr]


def start_local_ray(**init_options: Any) -> None:
    """``ray.init(address="local", **init_options)``, inside :func:`lean_params`."""
    import ray

    with lean_params() as lean:
        ray.init(address="local", **init_options)
    logger.debug("local Ray cluster started %s", "lean" if lean else "with Ray's defaults")
