"""Start a job's own local Ray cluster without the helpers the job never uses.

A local head started by ``ray.init`` spawns, besides the GCS and the raylet:

- the autoscaler monitor: a job's own cluster is one machine with nothing to scale;
- the log monitor: the driver forwards no worker logs (``log_to_driver=False``; the workers'
  logs stay in Ray's session directory);
- with ``include_dashboard=False``, an API server that loads only Ray's usage-stats module
  (Ray's own comment there says the job and state APIs are not loaded either), which the job
  disables (``RAY_DISABLE_USAGE_STATS``), and whose address ``ray.init`` waits for.

On a 2-core machine they cost CPU while every actor imports torch, ``ray.init`` waits on
them, and the autoscaler monitor does not exit within the second Ray's shutdown gives it:
docs/benchmarks.md (start-up) has the measurements.

``ray.init`` has no parameter for any of them. Ray's own ``RayParams`` has ``no_monitor`` and
``include_log_monitor`` (what ``ray start --no-monitor --include-log-monitor=false`` sets), and
a head ``Node`` whose API server does not start carries on without one, as after a failed
dashboard start.

Then ``ray.init`` waits for the new raylet to register with the GCS through Ray's
``services.get_node``, which asks the GCS and, while the node is not there, sleeps a whole
second before asking again. The raylet registered 0.7-1.6 s after Ray's first ask here, so
the wait ended at 1.1 s or 2.1 s. Within the block, ``get_node`` first asks the GCS's node table
every 20 ms until the node is there (at most Ray's own 30 s), then calls Ray's, which then
answers at its first ask; any error on the way leaves the wait to Ray's.

:func:`lean_head` substitutes all three, for one ``ray.init`` call, and each only where this
Ray has it with the expected signature; any other Ray, and every run with
``RL_LEDGER_FULL_RAY=1`` (or ``true``, ``yes``; for Ray's own tools against a job's cluster),
starts with Ray's defaults.

The cluster's workers also start with the garbage collector held until their actor is built
(:mod:`actors.startup_gc`, measured in docs/benchmarks.md). Ray runs a worker setup hook named
in an environment variable of its own (what a job-level ``runtime_env`` hook sets per job, and
what Ray's own code expects a job supervisor's workers to inherit); set for the ``ray.init``
call that starts the cluster's processes, every worker inherits it. A job-level
``runtime_env`` would do the same through Ray's runtime-env agent, which made the default
job's actors start 0.4-0.5 s later than without one (docs/benchmarks.md).
:func:`workers_hold_collection` sets it where this Ray has it and nothing else set it, and not
with ``RL_LEDGER_FULL_RAY``.
"""

from __future__ import annotations

import inspect
import logging
import os
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

from actors.startup_gc import SETUP_HOOK

__all__ = ["FULL_RAY_ENV", "LEAN_PARAMS", "full_ray_asked", "lean_head", "start_local_ray",
           "workers_hold_collection"]

logger = logging.getLogger(__name__)

FULL_RAY_ENV = "RL_LEDGER_FULL_RAY"
# RayParams' own names: the autoscaler monitor off, the log monitor off.
LEAN_PARAMS: dict[str, bool] = {"no_monitor": True, "include_log_monitor": False}
MONITORS = ("autoscaler monitor", "log monitor")
API_SERVER = "API server"
SLOW_POLL = "1 s registration poll"
REGISTRATION_POLL_S = 0.02
REGISTRATION_WAIT_S = 30.0  # Ray's own bound on the wait (raylet_start_wait_time_s)


def _takes(function: Any, names: Iterable[str]) -> bool:
    try:
        parameters = inspect.signature(function).parameters
    except (TypeError, ValueError):
        return False
    return all(name in parameters for name in names)


@contextmanager
def _substituted(owner: Any, name: str, replacement: Any) -> Iterator[None]:
    original = getattr(owner, name)
    setattr(owner, name, replacement)
    try:
        yield
    finally:
        setattr(owner, name, original)


def _lean_params_class(params_class: type) -> type:
    class LeanRayParams(params_class):  # type: ignore[misc,valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **{**kwargs, **LEAN_PARAMS})

    return LeanRayParams


def _without_dashboard_api_server(start_api_server: Callable[..., None]) -> Callable[..., None]:
    def start_api_server_if_dashboard(self: Any, *, include_dashboard: bool | None,
                                      **options: Any) -> None:
        if include_dashboard is False:
            return  # the head's web UI address stays None, as Ray leaves it without one
        start_api_server(self, include_dashboard=include_dashboard, **options)

    return start_api_server_if_dashboard


def _node_registered(gcs_address: str, node_id: str, services: Any, state: Any) -> None:
    """Return once the GCS's node table lists ``node_id`` alive, or after
    :data:`REGISTRATION_WAIT_S` (Ray's own wait says what went wrong then)."""
    global_state = state.GlobalState()
    global_state._initialize_global_state(services._get_gcs_client_options(gcs_address))
    try:
        deadline = time.monotonic() + REGISTRATION_WAIT_S
        while time.monotonic() < deadline:
            if any(node.get("NodeID") == node_id and node.get("Alive")
                   for node in global_state.node_table()):
                return
            time.sleep(REGISTRATION_POLL_S)
    finally:
        global_state.disconnect()


def _promptly_registered(get_node: Callable[[str, str], Any], services: Any,
                         state: Any) -> Callable[[str, str], Any]:
    def get_node_once_registered(gcs_address: str, node_id: str) -> Any:
        try:
            _node_registered(gcs_address, node_id, services, state)
        except Exception:  # noqa: BLE001 - Ray's own wait below raises what matters
            logger.debug("the fine registration poll failed; Ray's own waits", exc_info=True)
        return get_node(gcs_address, node_id)

    return get_node_once_registered


def _has_node_table(services: Any, state: Any) -> bool:
    global_state = getattr(state, "GlobalState", None)
    return (callable(getattr(services, "_get_gcs_client_options", None))
            and all(callable(getattr(global_state, name, None))
                    for name in ("_initialize_global_state", "node_table", "disconnect")))


def full_ray_asked() -> bool:
    """Whether ``RL_LEDGER_FULL_RAY`` asks for Ray's defaults (``1``, ``true`` or ``yes``)."""
    return os.environ.get(FULL_RAY_ENV, "").strip().lower() in {"1", "true", "yes"}


@contextmanager
def lean_head() -> Iterator[tuple[str, ...]]:
    """Within the block, a local head that ``ray.init`` starts leaves out the autoscaler
    monitor, the log monitor, (with ``include_dashboard=False``) the API server and the 1 s
    poll for the raylet's registration; yields the names of those it leaves out: none where
    this Ray lacks the parameters, or where ``RL_LEDGER_FULL_RAY`` asks for Ray's defaults
    (:func:`full_ray_asked`). Ray's classes and functions are restored on leaving, also on an
    error."""
    if full_ray_asked():
        yield ()
        return
    try:
        from ray._private import node, parameter, services, state
    except ImportError:
        yield ()
        return
    left_out: list[str] = []
    with ExitStack() as stack:
        params_class = getattr(parameter, "RayParams", None)
        if params_class is not None and _takes(params_class.__init__, LEAN_PARAMS):
            stack.enter_context(_substituted(parameter, "RayParams",
                                             _lean_params_class(params_class)))
            left_out += MONITORS
        start_api_server = getattr(getattr(node, "Node", None), "start_api_server", None)
        if start_api_server is not None and _takes(start_api_server, ["include_dashboard"]):
            stack.enter_context(_substituted(node.Node, "start_api_server",
                                             _without_dashboard_api_server(start_api_server)))
            left_out.append(API_SERVER)
        get_node = getattr(services, "get_node", None)
        if (get_node is not None and _takes(get_node, ["gcs_address", "node_id"])
                and _has_node_table(services, state)):
            stack.enter_context(_substituted(services, "get_node",
                                             _promptly_registered(get_node, services, state)))
            left_out.append(SLOW_POLL)
        yield tuple(left_out)


def _setup_hook_variable() -> str | None:
    try:
        from ray._private import ray_constants
    except ImportError:
        return None
    name = getattr(ray_constants, "WORKER_PROCESS_SETUP_HOOK_ENV_VAR", None)
    return name if isinstance(name, str) else None


@contextmanager
def workers_hold_collection() -> Iterator[bool]:
    """Within the block, the processes of a cluster that ``ray.init`` starts inherit Ray's
    worker setup hook variable naming :data:`actors.startup_gc.SETUP_HOOK`; yields whether it
    was set. Not where this Ray has no such variable, where the environment names a hook
    already, or where ``RL_LEDGER_FULL_RAY`` asks for Ray's defaults. The driver's environment
    is restored on leaving, also on an error."""
    name = None if full_ray_asked() else _setup_hook_variable()
    if name is None or name in os.environ:
        yield False
        return
    os.environ[name] = SETUP_HOOK
    try:
        yield True
    finally:
        os.environ.pop(name, None)


def start_local_ray(num_cpus: int) -> None:
    """Start a private local cluster of ``num_cpus`` CPUs, whatever ``ray start`` cluster runs
    or ran on the machine, as a job's own: no dashboard, no worker logs forwarded to the
    driver, Ray's logging left alone, inside :func:`lean_head`, its workers' collection held
    while their actors start (:func:`workers_hold_collection`)."""
    import ray

    with lean_head() as left_out, workers_hold_collection() as held:
        ray.init(address="local", num_cpus=num_cpus, include_dashboard=False,
                 log_to_driver=False, configure_logging=False)
    logger.debug("local Ray cluster started without: %s; workers hold collection: %s",
                 ", ".join(left_out) or "nothing", held)
