"""The gradient quorum forms across network namespaces (issue 14, item 1).

A cell in its own network namespace (its own loopback, reaching the host through a veth pair,
as a cell on another machine reaches the driver's) and a cell on the host join one quorum
through the store the control plane hosts. With the store advertised at its routable address
the quorum forms and both cells apply the same averaged step; advertised at ``127.0.0.1`` (the
old default) the namespaced cell cannot reach it.

Needs root and ``ip netns`` (iproute2); skipped with a one-line reason otherwise. No Ray: the
cells are plain ``TrainCell`` objects in two processes (tests/netns_cell.py).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from actors.gradient_group import create_rendezvous_store, routable_address

ROOT = Path(__file__).resolve().parents[2]
SUBNET = "10.231.{}.{}"


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True, timeout=30)


@pytest.fixture
def netns() -> Iterator[str]:
    """A network namespace linked to the host by a veth pair (host .1, namespace .2), whose
    default route is the host; removed afterwards."""
    if shutil.which("ip") is None:
        pytest.skip("iproute2 'ip' is not installed")
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root")
    tag = os.getpid() % 250 + 1
    name, host_if, ns_if = f"rl14-{tag}", f"rl14h{tag}", f"rl14n{tag}"
    try:
        _ip("netns", "add", name)
    except subprocess.CalledProcessError as exc:
        pytest.skip(f"ip netns unavailable here: {exc.stderr.strip()[:120]}")
    try:
        _ip("link", "add", host_if, "type", "veth", "peer", "name", ns_if)
        _ip("link", "set", ns_if, "netns", name)
        _ip("addr", "add", SUBNET.format(tag, 1) + "/24", "dev", host_if)
        _ip("link", "set", host_if, "up")
        for command in (["addr", "add", SUBNET.format(tag, 2) + "/24", "dev", ns_if],
                        ["link", "set", ns_if, "up"], ["link", "set", "lo", "up"],
                        ["route", "add", "default", "via", SUBNET.format(tag, 1)]):
            _ip("netns", "exec", name, "ip", *command)
        yield name
    finally:
        subprocess.run(["ip", "link", "del", host_if], capture_output=True, timeout=30)
        subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=30)


def _start_cell(store_addr: str, rank: int, netns: str | None, timeout_s: float
                ) -> subprocess.Popen[str]:
    command = [sys.executable, "-m", "tests.netns_cell", store_addr, str(rank), "2",
               "--timeout", str(timeout_s)]
    if netns is not None:
        command = ["ip", "netns", "exec", netns, *command]
    environment = {**os.environ, "PYTHONPATH": str(ROOT), "GLOO_SOCKET_IFNAME": ""}
    return subprocess.Popen(command, cwd=ROOT, env=environment, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _answer(process: subprocess.Popen[str]) -> dict:
    out, err = process.communicate(timeout=180)
    lines = [line for line in out.splitlines() if line.startswith("{")]
    assert lines, f"no answer from the cell (exit {process.returncode}): {err[-800:]}"
    return json.loads(lines[-1])


def test_a_cell_in_another_network_namespace_joins_the_quorum(netns: str) -> None:
    store, store_addr = create_rendezvous_store()  # the default: the routable address
    cells = [_start_cell(store_addr, 0, None, 60.0), _start_cell(store_addr, 1, netns, 60.0)]
    host_cell, namespaced_cell = (_answer(cell) for cell in cells)

    assert not store_addr.startswith("127."), store_addr
    assert store_addr.startswith(routable_address() + ":")
    assert host_cell["ok"], host_cell
    assert namespaced_cell["ok"], namespaced_cell
    assert host_cell["world_size"] == namespaced_cell["world_size"] == 2.0
    assert host_cell["batch"] != namespaced_cell["batch"]  # each trained its own batch ...
    assert host_cell["checksum"] == namespaced_cell["checksum"]  # ... on averaged gradients
    del store


def test_a_loopback_store_address_is_unreachable_from_another_namespace(netns: str) -> None:
    # The bug this replaces: the store advertised at 127.0.0.1 is the namespace's own loopback.
    store, store_addr = create_rendezvous_store(host="127.0.0.1")
    namespaced_cell = _answer(_start_cell(store_addr, 1, netns, 5.0))

    assert not namespaced_cell["ok"]
    assert "CollectiveError" in namespaced_cell["error"]
    del store
