"""The default job's start-up path (issue 25 item 2): what the driver imports before it needs
it, the order cells and their store are made in, the background preload's lifetime, and a
vLLM run's model: checked before Ray without torch, made while Ray starts.
Timings are ``bench/startup.py``'s; these check the mechanisms, without Ray."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import threading
import time
from pathlib import Path
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


def test_the_engines_modules_import_no_torch() -> None:
    """Every holder of an engine's handle imports its module (the rollout manager too)."""
    probe = ("import sys; import actors.engines.rollout_engine, actors.engines.vllm.engine;"
             " print(sorted({'torch', 'numpy', 'vllm', 'transformers'} & set(sys.modules)))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          check=True, timeout=120)

    assert done.stdout.strip() == "[]"


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


def _recording_preload(started: list[threading.Thread]):
    """A stand-in for :func:`launch.preload_in_background` that sleeps 0.5 s instead of
    importing, and records its thread in ``started``."""

    def preload(*modules: str) -> threading.Thread:
        thread = threading.Thread(target=time.sleep, args=(0.5,), daemon=True)
        thread.start()
        started.append(thread)
        return thread

    return preload


def test_run_job_waits_for_its_preload_when_the_start_fails(monkeypatch, tmp_path) -> None:
    from orchestrator.errors import StartupError

    started: list[threading.Thread] = []

    def no_cluster(config: RunConfig, address: str | None = None) -> None:
        raise StartupError("cannot join the Ray cluster")

    monkeypatch.setattr(launch, "preload_in_background", _recording_preload(started))
    monkeypatch.setattr(launch, "init_ray", no_cluster)
    monkeypatch.setattr(launch, "check_cluster_ledger", lambda *arguments: None)

    with pytest.raises(StartupError, match="cannot join"):
        run_job(RunConfig(), JobOptions(runs_dir=tmp_path, progress=False, plot=False))

    assert len(started) == 1 and not started[0].is_alive()


def test_the_ledger_opens_before_the_preload_and_ray_start(monkeypatch, tmp_path) -> None:
    """The preload's import would hold the interpreter lock the ledger's migrations need
    (their start measured 0.60 s against 0.15 s after it, bench/startup.py); and a ledger that
    cannot be opened leaves nothing started."""
    started: list[threading.Thread] = []
    ray_started: list[str] = []

    def unreachable(url: str, **kwargs: Any) -> Ledger:
        raise LedgerError("database unavailable")

    monkeypatch.setattr(launch, "preload_in_background", _recording_preload(started))
    monkeypatch.setattr(launch, "init_ray", lambda *arguments: ray_started.append("ray"))
    monkeypatch.setattr(launch, "check_cluster_ledger", lambda *arguments: None)
    monkeypatch.setattr(driver.Ledger, "open", unreachable)

    with pytest.raises(LedgerError, match="unavailable"):
        run_job(RunConfig(), JobOptions(runs_dir=tmp_path, progress=False, plot=False))

    assert started == [] and ray_started == []


# ----------------------------------------------------------------- --engine vllm: the model

def _task_tokenizer(directory: Path, symbols: list[str]) -> Path:
    """A directory holding only a ``tokenizer.json`` over ``symbols`` (``tokenizers``
    alone: no torch, no transformers)."""
    from tokenizers import Tokenizer, models

    directory.mkdir(parents=True)
    vocabulary = {symbol: index for index, symbol in enumerate(symbols)}
    Tokenizer(models.WordLevel(vocab=vocabulary, unk_token="<pad>")).save(
        str(directory / "tokenizer.json"))
    return directory


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs the vllm extra")
def test_a_named_models_vocabulary_is_checked_before_ray_without_torch(tmp_path: Path) -> None:
    from actors.task import TOKENIZER

    good = _task_tokenizer(tmp_path / "good", list(TOKENIZER.symbols))
    probe = ("import sys; from pathlib import Path;"
             " from orchestrator.config import RunConfig;"
             " from orchestrator.control.engine_pool.vllm_launch import plan_model;"
             f" plan = plan_model(RunConfig(engine='vllm', backend='hf', model={str(good)!r}),"
             " Path('unused'));"
             " print(plan.to_make, plan.config.model, 'torch' in sys.modules,"
             " 'transformers' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          check=True, timeout=120)

    assert done.stdout.split() == ["None", str(good.resolve()), "False", "False"]


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs the vllm extra")
def test_a_named_model_that_does_not_speak_the_task_is_refused_before_anything_starts(
        tmp_path: Path) -> None:
    from actors.task import TOKENIZER
    from orchestrator.control.engine_pool.vllm_launch import plan_model
    from orchestrator.errors import StartupError

    wrong = _task_tokenizer(tmp_path / "wrong", list(reversed(TOKENIZER.symbols)))

    with pytest.raises(StartupError, match="does not speak the task's vocabulary"):
        plan_model(RunConfig(engine="vllm", backend="hf", model=str(wrong)), tmp_path / "run")
    with pytest.raises(StartupError, match="no tokenizer"):
        plan_model(RunConfig(engine="vllm", backend="hf", model=str(tmp_path / "absent")),
                   tmp_path / "run")
    assert not (tmp_path / "run").exists()


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs the vllm extra")
def test_the_task_model_is_planned_first_and_made_later(tmp_path: Path) -> None:
    from actors.policies.task_vocabulary import check_task_vocabulary
    from actors.task import TOKENIZER
    from orchestrator.control.engine_pool.vllm_launch import plan_model

    plan = plan_model(RunConfig(engine="vllm", backend="hf", seed=7), tmp_path / "run")

    model_dir = (tmp_path / "run" / "model").resolve()
    assert plan.to_make == (model_dir, 7) and plan.config.model == str(model_dir)
    assert not model_dir.exists()  # planning writes nothing
    plan.make()
    check_task_vocabulary(model_dir, TOKENIZER.symbols)
    assert plan_model(RunConfig(), tmp_path / "run").to_make is None  # the built-in engine


def test_run_job_makes_the_model_while_ray_starts_and_raises_its_failure(monkeypatch,
                                                                       tmp_path) -> None:
    from orchestrator.control.engine_pool.vllm_launch import ModelPlan
    from orchestrator.errors import StartupError

    ray_starting, model_done = threading.Event(), threading.Event()

    def make(plan: ModelPlan) -> None:
        assert ray_starting.wait(timeout=30), "the model was made before Ray started"
        model_done.set()
        raise StartupError("the task model cannot be made")

    def init_ray(config: RunConfig, address: str | None = None) -> None:
        ray_starting.set()
        assert model_done.wait(timeout=30), "the model waited for Ray to start"

    monkeypatch.setattr(driver, "plan_model",
                        lambda config, run_dir: ModelPlan(config, to_make=(run_dir, 0)))
    monkeypatch.setattr(ModelPlan, "make", make)
    monkeypatch.setattr(launch, "init_ray", init_ray)
    # A job that starts its own cluster: with the test session's Ray up, the cluster-ledger
    # check would join it (through init_ray) before the model is even planned.
    monkeypatch.setattr(launch, "check_cluster_ledger", lambda *arguments: None)

    with pytest.raises(StartupError, match="cannot be made"):
        run_job(RunConfig(), JobOptions(runs_dir=tmp_path, progress=False, plot=False))

    assert ray_starting.is_set() and model_done.is_set()
