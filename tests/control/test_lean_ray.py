"""A job's own Ray cluster starts without the autoscaler monitor, the log monitor and the API
server, with its workers' collection held (:mod:`orchestrator.control.lean_ray`), Ray's classes
and the driver's environment are put back afterwards, and a Ray without the parameters, or
``RL_LEDGER_FULL_RAY=1``, starts with Ray's defaults."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from ray._private import node, parameter, services

from orchestrator.config import RunConfig
from orchestrator.control import launch, lean_ray
from orchestrator.errors import StartupError

ROOT = Path(__file__).resolve().parents[2]

# Starts a local cluster as ``init_ray`` does, then names the Ray processes the driver spawned
# (a local head's processes are the driver's children) and checks that actors still run.
_START_AND_LIST = """
import gc, json, os, psutil, ray
from orchestrator.control.lean_ray import start_local_ray

start_local_ray(num_cpus=1)

@ray.remote(num_cpus=0.1)
class Echo:
    def echo(self, value):
        return value, gc.isenabled()

answer, worker_collects = ray.get(Echo.remote().echo.remote(7), timeout=120)
commands = [" ".join(child.cmdline()) for child in psutil.Process().children()]
ray.shutdown()
print(json.dumps({
    "answer": answer,
    "gcs": any("gcs_server" in command for command in commands),
    "raylet": any("raylet" in command for command in commands),
    "log_monitor": any("log_monitor.py" in command for command in commands),
    "monitor": any("autoscaler/_private/monitor.py" in command for command in commands),
    "api_server": any("dashboard/dashboard.py" in command for command in commands),
    "worker_collects": worker_collects,  # an actor of no project class: never settled
    "driver_hook_env": any("SETUP_HOOK" in name for name in os.environ),
}))
"""


def _started_cluster(extra_env: dict[str, str]) -> dict[str, object]:
    env = {key: value for key, value in os.environ.items() if key != lean_ray.FULL_RAY_ENV}
    env.update({"RAY_DISABLE_USAGE_STATS": "1", **extra_env})
    done = subprocess.run([sys.executable, "-c", _START_AND_LIST], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_jobs_cluster_runs_actors_without_the_monitors_and_the_api_server() -> None:
    lean = _started_cluster({})

    assert lean == {"answer": 7, "gcs": True, "raylet": True, "log_monitor": False,
                    "monitor": False, "api_server": False, "worker_collects": False,
                    "driver_hook_env": False}


def test_full_ray_env_starts_all_of_rays_helpers() -> None:
    """Also shows that the lean test above would see the helpers were they running."""
    full = _started_cluster({lean_ray.FULL_RAY_ENV: "1"})

    assert full == {"answer": 7, "gcs": True, "raylet": True, "log_monitor": True,
                    "monitor": True, "api_server": True, "worker_collects": True,
                    "driver_hook_env": False}


def test_lean_head_sets_both_parameters_and_restores_rays_classes() -> None:
    params_class, start_api_server = parameter.RayParams, node.Node.start_api_server
    get_node = services.get_node

    with lean_ray.lean_head() as left_out:
        params = parameter.RayParams(num_cpus=1)
        assert node.Node.start_api_server is not start_api_server
        assert services.get_node is not get_node
    assert left_out == ("autoscaler monitor", "log monitor", "API server",
                        "1 s registration poll")
    assert (params.no_monitor, params.include_log_monitor) == (True, False)
    assert isinstance(params, params_class)
    assert (parameter.RayParams, node.Node.start_api_server) == (params_class, start_api_server)
    assert services.get_node is get_node


class _NodeTable:
    """Stands in for Ray's GCS node table (Ray's internals, not this project's): the node
    appears alive at the ``appears_at``-th read; ``fails`` raises at the first."""

    def __init__(self, appears_at: int, fails: bool = False) -> None:
        self.appears_at, self.fails = appears_at, fails
        self.reads, self.disconnected = 0, False

    def GlobalState(self) -> "_NodeTable":  # noqa: N802 - Ray's name
        return self

    def _initialize_global_state(self, options: object) -> None:
        assert options == "options for gcs:1"

    def node_table(self) -> list[dict[str, object]]:
        self.reads += 1
        if self.fails:
            raise RuntimeError("the GCS is not answering yet")
        alive = self.reads >= self.appears_at
        return [{"NodeID": "other", "Alive": True}, {"NodeID": "abc", "Alive": alive}]

    def disconnect(self) -> None:
        self.disconnected = True

    @staticmethod
    def _get_gcs_client_options(address: str) -> str:
        return f"options for {address}"


@pytest.mark.parametrize("fails", [False, True])
def test_the_registration_is_polled_finely_then_left_to_rays_own_ask(fails: bool) -> None:
    table = _NodeTable(appears_at=3, fails=fails)
    asked: list[tuple[str, str, int]] = []

    def rays_get_node(gcs_address: str, node_id: str) -> dict[str, str]:
        asked.append((gcs_address, node_id, table.reads))
        return {"node_id": node_id}

    get_node = lean_ray._promptly_registered(rays_get_node, table, table)

    assert get_node("gcs:1", "abc") == {"node_id": "abc"}
    # Registered at the 3rd read, then Ray's own ask; a failing table leaves it to Ray's.
    assert asked == [("gcs:1", "abc", 1 if fails else 3)]
    assert table.disconnected


def test_the_api_server_starts_where_the_dashboard_is_asked_for(
        monkeypatch: pytest.MonkeyPatch) -> None:
    started: list[bool | None] = []

    def start_api_server(self: object, *, include_dashboard: bool | None,
                         raise_on_failure: bool) -> None:
        started.append(include_dashboard)

    monkeypatch.setattr(node.Node, "start_api_server", start_api_server)

    with lean_ray.lean_head():
        for include_dashboard in (False, None, True):
            node.Node.start_api_server(object(), include_dashboard=include_dashboard,
                                       raise_on_failure=False)
    assert started == [None, True]


def test_lean_head_restores_rays_classes_after_an_error() -> None:
    params_class, start_api_server = parameter.RayParams, node.Node.start_api_server

    get_node = services.get_node

    with pytest.raises(RuntimeError, match="ray.init failed"):
        with lean_ray.lean_head():
            raise RuntimeError("ray.init failed")
    assert (parameter.RayParams, node.Node.start_api_server) == (params_class, start_api_server)
    assert services.get_node is get_node


def test_a_ray_without_the_parameters_is_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    class OlderRayParams:
        def __init__(self, num_cpus: int | None = None) -> None:
            self.num_cpus = num_cpus

    def start_api_server(self: object, include: bool) -> None:
        """A signature without ``include_dashboard``."""

    def get_node(address: str, node: str) -> None:
        """Parameters under other names."""

    monkeypatch.setattr(parameter, "RayParams", OlderRayParams)
    monkeypatch.setattr(node.Node, "start_api_server", start_api_server)
    monkeypatch.setattr(services, "get_node", get_node)

    with lean_ray.lean_head() as left_out:
        assert parameter.RayParams is OlderRayParams
        assert node.Node.start_api_server is start_api_server
        assert services.get_node is get_node
    assert left_out == ()


def test_a_ray_without_a_node_table_keeps_its_registration_poll(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from ray._private import state

    get_node = services.get_node
    monkeypatch.delattr(state.GlobalState, "node_table")

    with lean_ray.lean_head() as left_out:
        assert services.get_node is get_node
    assert left_out == ("autoscaler monitor", "log monitor", "API server")


def test_full_ray_env_leaves_rays_classes_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(lean_ray.FULL_RAY_ENV, "1")
    params_class, start_api_server = parameter.RayParams, node.Node.start_api_server

    with lean_ray.lean_head() as left_out:
        assert (parameter.RayParams, node.Node.start_api_server) == (params_class,
                                                                      start_api_server)
    assert left_out == ()


def test_workers_hold_collection_names_the_hook_only_within_the_block() -> None:
    name = lean_ray._setup_hook_variable()
    assert name is not None and name not in os.environ

    with pytest.raises(RuntimeError, match="ray.init failed"):
        with lean_ray.workers_hold_collection() as held:
            assert held and os.environ[name] == "actors.startup_gc.hold_collection"
            raise RuntimeError("ray.init failed")
    assert name not in os.environ


def test_a_hook_already_named_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    name = lean_ray._setup_hook_variable()
    assert name is not None
    monkeypatch.setenv(name, "their.own_hook")

    with lean_ray.workers_hold_collection() as held:
        assert os.environ[name] == "their.own_hook"
    assert not held and os.environ[name] == "their.own_hook"


@pytest.mark.parametrize("cause", ["full Ray asked", "a Ray without the variable"])
def test_no_hook_with_full_ray_or_a_ray_without_the_variable(
        monkeypatch: pytest.MonkeyPatch, cause: str) -> None:
    from ray._private import ray_constants

    name = lean_ray._setup_hook_variable()
    if cause == "full Ray asked":
        monkeypatch.setenv(lean_ray.FULL_RAY_ENV, "1")
    else:
        monkeypatch.delattr(ray_constants, "WORKER_PROCESS_SETUP_HOOK_ENV_VAR")

    with lean_ray.workers_hold_collection() as held:
        assert name not in os.environ
    assert not held


@pytest.mark.parametrize(("value", "asked"), [("1", True), ("true", True), ("Yes", True),
                                               ("0", False), ("false", False), ("", False)])
def test_full_ray_is_asked_for_only_by_a_yes(monkeypatch: pytest.MonkeyPatch, value: str,
                                             asked: bool) -> None:
    monkeypatch.setenv(lean_ray.FULL_RAY_ENV, value)

    assert lean_ray.full_ray_asked() is asked


def test_a_local_cluster_that_cannot_start_is_one_startup_error(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import ray

    def cannot_start(num_cpus: int) -> None:
        raise RuntimeError("the raylet did not register")

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(launch, "start_local_ray", cannot_start)

    with pytest.raises(StartupError) as raised:
        launch.init_ray(RunConfig())
    assert str(raised.value) == ("cannot start a local Ray cluster: the raylet did not register "
                                 "(RL_LEDGER_FULL_RAY=1 starts it with all of Ray's helpers)")
