"""The default job's start-up path (issue 25 item 2): what the driver imports before it needs
it, the order cells and their store are made in, and the background preload's lifetime.
Timings are ``bench/startup.py``'s; these check the mechanisms, without Ray."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from typing import Any

import pytest

import actors.gradient_group
from ledger import Ledger, LedgerError
from orchestrator.config import RunConfig
from orchestrator.control import driver, launch
from orchestrator.control.driver import JobOptions, run_job
from orchestrator.control.supervision.cell_group import CellGroup
from orchestrator.control.supervision.failure_policy import FailurePolicy


def test_the_driver_decides_the_gradient_backend_without_importing_torch() -> None:
    probe = ("import sys; import orchestrator.control.driver;"
             " from orchestrator.config import RunConfig;"
             " from orchestrator.control.placement.devices import cell_device_options;"
             " print(cell_device_options(RunConfig())['gradient_backend'],"
             " 'torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          check=True, timeout=120)

    assert done.stdout.split() == ["gloo", "False"]


def test_cells_are_created_before_the_store_they_rendezvous_on(monkeypatch) -> None:
    events: list[str] = []

    def create_cell(config: RunConfig, cell_id: str) -> Any:
        events.append(cell_id)
        return object()

    def create_store(host: str | None = None) -> tuple[Any, str]:
        events.append("store")
        return object(), "127.0.0.1:1"

    monkeypatch.setattr(actors.gradient_group, "create_rendezvous_store", create_store)
    config = RunConfig(num_cells=2)
    group = CellGroup(config, ledger=None, run_id="run", create_cell=create_cell,  # type: ignore[arg-type]
                      policy=FailurePolicy.from_config(config))

    group.create()

    assert events == ["cell-0", "cell-1", "store"]


def test_a_preload_imports_its_modules_and_swallows_a_failed_import() -> None:
    sys.modules.pop("colorsys", None)

    thread = launch.preload_in_background("no_such_module_here", "colorsys")
    thread.join(timeout=30)

    assert not thread.is_alive() and thread.daemon
    assert "colorsys" not in sys.modules  # the failed import ended the preload; nothing raised
    thread = launch.preload_in_background("colorsys")
    thread.join(timeout=30)
    assert "colorsys" in sys.modules


def test_run_job_waits_for_its_preload_when_the_start_fails(monkeypatch, tmp_path) -> None:
    started: list[threading.Thread] = []

    def slow_preload(*modules: str) -> threading.Thread:
        thread = threading.Thread(target=time.sleep, args=(0.5,), daemon=True)
        thread.start()
        started.append(thread)
        return thread

    def unreachable(url: str, **kwargs: Any) -> Ledger:
        raise LedgerError("database unavailable")

    monkeypatch.setattr(launch, "preload_in_background", slow_preload)
    monkeypatch.setattr(driver.Ledger, "open", unreachable)

    with pytest.raises(LedgerError, match="unavailable"):
        run_job(RunConfig(), JobOptions(runs_dir=tmp_path, progress=False, plot=False))

    assert len(started) == 1 and not started[0].is_alive()
