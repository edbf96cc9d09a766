"""Devices on CPU (issue 21): what ``--device auto`` and unset GPU counts become from Ray's
resource view, the GPUs each actor asks for, the gradient backend and where it is recorded,
dtype handling, and a checkpoint written on CUDA that resumes on CPU.

Nothing here needs a GPU: a Ray cluster can declare logical GPUs (``ray.init(num_gpus=2)``),
which is all resolution and placement read; what needs a real CUDA device is in
``tests/actors/test_gpu.py`` (skipped without one).
"""

from __future__ import annotations

import io
import subprocess
import sys
import textwrap
from datetime import timedelta
from pathlib import Path

import pytest
import torch

from actors.device import DeviceError, autocast, cpu_copy, select_device, torch_dtype
from actors.engines.rollout_engine import RolloutEngine
from actors.errors import CollectiveError
from actors.gradient_group import GradientGroup, create_rendezvous_store, gradient_backend
from actors.policies.megatron_gpt import default_group_backend
from actors.policies.policy import PolicyConfig
from actors.task import AdditionTask
from actors.train_cell import TrainCell
from orchestrator.config import ConfigError, RunConfig
from orchestrator.control import launch
from orchestrator.control.placement import devices
from orchestrator.errors import StartupError

ROOT = Path(__file__).resolve().parents[2]


def _config(**fields) -> RunConfig:
    return RunConfig(rollout_batch_size=4, **fields)


# ------------------------------------------------------------------ resolution


def test_auto_without_gpus_is_cpu_in_float32_asking_no_gpu() -> None:
    resolved = devices.resolve_devices(_config(), gpus=0.0)

    assert (resolved.device, resolved.dtype) == ("cpu", "float32")
    assert (resolved.gpus_per_cell, resolved.gpus_per_engine) == (0.0, 0.0)
    assert devices.gpu_options(resolved, "cell") == {} == devices.gpu_options(resolved, "engine")
    assert launch.role_resources(resolved, "cell") == {"CPU": launch.CELL_CPUS}


def test_auto_on_one_gpu_shares_it_between_two_cells_and_one_engine() -> None:
    resolved = devices.resolve_devices(_config(num_cells=2, num_engines=1), gpus=1.0)

    assert (resolved.device, resolved.dtype) == ("cuda", "bfloat16")
    assert resolved.gpus_per_cell == resolved.gpus_per_engine == 0.3333
    assert resolved.gpu_memory_utilization == pytest.approx(0.3)
    assert devices.gpu_options(resolved, "engine") == {"num_gpus": 0.3333}
    assert launch.role_resources(resolved, "cell") == {"CPU": launch.CELL_CPUS, "GPU": 0.3333}
    assert devices.cell_device_options(resolved) == {
        "device": "cuda", "dtype": "bfloat16", "gradient_backend": "gloo"}


def test_auto_with_a_gpu_for_every_actor_gives_each_a_whole_one_and_nccl() -> None:
    resolved = devices.resolve_devices(_config(num_cells=2, num_engines=2), gpus=4.0)

    assert resolved.gpus_per_cell == resolved.gpus_per_engine == 1.0
    assert resolved.gpu_memory_utilization == pytest.approx(0.9)
    assert devices.cell_device_options(resolved)["gradient_backend"] == "nccl"


@pytest.mark.parametrize(("gpus", "actors", "share"), [
    (1.0, 3, 0.3333), (2.0, 3, 0.5), (2.0, 4, 0.5), (3.0, 4, 0.5), (8.0, 4, 1.0), (0.0, 3, 0.0),
])
def test_a_default_share_always_fits_on_one_gpu(gpus: float, actors: int, share: float) -> None:
    assert devices.default_gpu_share(gpus, actors) == share
    if share:  # k actors per GPU at 1/k each: every request fits on one GPU
        per_gpu = int(1 / share + 1e-6)
        assert per_gpu * int(gpus) >= actors


def test_explicit_values_win_and_cpu_engines_are_allowed_on_a_cuda_run() -> None:
    config = _config(num_cells=2, num_engines=2, dtype="float32", gpus_per_cell=0.5,
                     gpus_per_engine=0.0)
    resolved = devices.resolve_devices(config, gpus=1.0)

    assert (resolved.device, resolved.dtype) == ("cuda", "float32")
    assert devices.actor_device(resolved, "cell") == "cuda"
    assert devices.actor_device(resolved, "engine") == "cpu"
    assert resolved.gpu_memory_utilization is None  # no engine on a GPU


def test_cuda_without_a_gpu_and_too_many_gpus_are_refused_in_one_line() -> None:
    with pytest.raises(StartupError, match="^device: --device cuda but the Ray cluster"):
        devices.resolve_devices(_config(device="cuda"), gpus=0.0)
    with pytest.raises(StartupError, match="need 4 GPUs; the Ray cluster has 2"):
        devices.resolve_devices(_config(gpus_per_cell=1, gpus_per_engine=1), gpus=2.0)


@pytest.mark.parametrize(("fields", "message"), [
    ({"device": "cpu", "gpus_per_cell": 0.5}, "gpus_per_cell: --device cpu asks Ray for no GPU"),
    ({"gpus_per_engine": 1.5}, "gpus_per_engine: Value error, must be a fraction below 1"),
    ({"device": "tpu"}, "device: Input should be"),
    ({"dtype": "float16"}, "dtype: Input should be"),
])
def test_bad_device_options_fail_at_load(fields: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        RunConfig.from_yaml(None, fields)


def test_an_unresolved_config_builds_cpu_actors_as_before() -> None:
    config = RunConfig()

    assert devices.gpu_options(config, "cell") == {}
    assert devices.cell_device_options(config) == {
        "device": "cpu", "dtype": "float32", "gradient_backend": "gloo"}


_LOGICAL_GPU_CLUSTER = textwrap.dedent("""
    import json, ray
    from ray.util.placement_group import placement_group_table
    from orchestrator.config import RunConfig
    from orchestrator.control import launch
    from orchestrator.control.placement.placer import Placement
    from orchestrator.control.supervision.failure_policy import FailurePolicy

    ray.init(address="local", num_cpus=2, num_gpus=1, include_dashboard=False,
             log_to_driver=False, configure_logging=False)
    config = launch.resolve_devices(RunConfig(run_id="gpus", rollout_batch_size=4,
                                              num_cells=2, num_engines=1))
    placement = Placement(config, FailurePolicy(actor_start_timeout_s=60))
    role = placement._role("cell", config)
    bundles = placement_group_table(role.group)["bundles"]

    @ray.remote
    def visible():
        return ray.get_gpu_ids()

    gpu_ids = [ray.get(visible.options(num_gpus=config.gpus_per_cell).remote())
               for _ in range(2)]
    placement.release()
    print(json.dumps({"device": config.device, "dtype": config.dtype,
                      "gpus_per_cell": config.gpus_per_cell,
                      "bundles": [bundles[i] for i in sorted(bundles)], "gpu_ids": gpu_ids}))
""")


def test_auto_reads_gpus_from_ray_and_bundles_reserve_them() -> None:
    # A Ray cluster of its own (the session's has no GPU), declaring one logical GPU.
    result = subprocess.run([sys.executable, "-c", _LOGICAL_GPU_CLUSTER], cwd=ROOT,
                            capture_output=True, text=True, timeout=240, check=False)
    assert result.returncode == 0, result.stderr[-2000:]
    import json

    seen = json.loads(result.stdout.strip().splitlines()[-1])
    assert (seen["device"], seen["dtype"], seen["gpus_per_cell"]) == ("cuda", "bfloat16", 0.3333)
    assert seen["bundles"] == [{"CPU": launch.CELL_CPUS, "GPU": 0.3333}] * 2
    assert seen["gpu_ids"] == [[0], [0]]  # fractional: both share the one GPU


def test_the_session_cluster_reports_no_gpu_so_auto_is_cpu(ray_cluster) -> None:
    assert devices.cluster_gpus() == 0.0
    assert launch.resolve_devices(_config()).device == "cpu"


# ------------------------------------------------------------------ gradient backend


@pytest.mark.parametrize(("device", "gpus", "backend"), [
    ("cuda", 1.0, "nccl"), ("cuda", 2.0, "nccl"), ("cuda", 0.5, "gloo"), ("cpu", 0.0, "gloo"),
])
def test_nccl_only_when_each_cell_has_a_gpu_of_its_own(device: str, gpus: float,
                                                       backend: str) -> None:
    assert gradient_backend(device, gpus) == backend


def test_an_nccl_group_without_cuda_fails_to_form_with_a_collective_error() -> None:
    store, address = create_rendezvous_store("127.0.0.1")
    group = GradientGroup("cell-0", timedelta(seconds=5), "nccl")

    with pytest.raises(CollectiveError, match="not formed over nccl"):
        group.join(1, 0, 2, address)
    assert group.world_size == 1 and group.quorum_id is None
    with pytest.raises(ValueError, match="unknown gradient backend"):
        GradientGroup("cell-0", timedelta(seconds=5), "mpi")
    del store


def test_cell_state_records_the_gradient_backend(ray_cluster, sqlite_url: str) -> None:
    from ledger import EventKind, Ledger
    from orchestrator.control.supervision.cell_group import CellGroup
    from orchestrator.control.supervision.failure_policy import FailurePolicy

    config = RunConfig(run_id="backend", num_cells=1, rollout_batch_size=1, db=sqlite_url)
    with Ledger.open(sqlite_url) as ledger:
        ledger.start_run("backend")
        cells = CellGroup(config, ledger, "backend", launch.create_cell, FailurePolicy())
        cells.start()
        cells.stop()
        states = [e.payload for e in ledger.events("backend") if e.kind == EventKind.CELL_STATE]

    assert [(s["state"], s["gradient_backend"]) for s in states] == [
        ("alive", "gloo"), ("stopped", "gloo")]


def test_megatron_world_of_one_uses_nccl_only_with_cuda() -> None:
    assert default_group_backend(cuda=False) == "gloo"
    assert default_group_backend(cuda=True) == "cpu:gloo,cuda:nccl"
    assert default_group_backend() == "gloo"  # this machine has no CUDA


# ------------------------------------------------------------------ dtype and devices


def test_device_and_dtype_names() -> None:
    assert select_device("cpu") == torch.device("cpu")
    assert torch_dtype("bfloat16") is torch.bfloat16 and torch_dtype("float32") is torch.float32
    with pytest.raises(DeviceError, match="torch sees no CUDA device"):
        select_device("cuda")
    with pytest.raises(ValueError, match="unknown dtype"):
        torch_dtype("float16")
    with autocast(torch.device("cpu"), torch.float32):
        assert not torch.is_autocast_enabled("cpu")
    with autocast(torch.device("cpu"), torch.bfloat16):
        assert torch.is_autocast_enabled("cpu")


def _groups(engine: RolloutEngine, count: int = 8) -> list:
    task = AdditionTask(seed=3)
    return [engine.generate(task.make_prompt(i), 4, i) for i in range(count)]


def test_bfloat16_cell_keeps_float32_master_weights_and_engine_holds_bfloat16() -> None:
    config = PolicyConfig(vocab_size=AdditionTask().tokenizer.vocab_size)
    engine = RolloutEngine("engine-0", "torch", config, seed=5, dtype="bfloat16")
    cell = TrainCell("cell-0", "torch", config, seed=5, dtype="bfloat16")
    before = cell.weights_checksum()

    metrics = cell.train_step(_groups(engine))

    assert {p.dtype for p in engine.model.parameters()} == {torch.bfloat16}
    assert {p.dtype for p in cell.model.parameters()} == {torch.float32}
    state = cell.optimizer.state_dict()["state"]
    assert {t.dtype for s in state.values() for k, t in s.items() if k != "step"} == {
        torch.float32}
    assert cell.weights_checksum() != before and metrics["train_step"] == 1.0
    samples = _groups(engine, 1)[0]
    assert all(isinstance(lp, float) for s in samples for lp in s.rollout_log_probs)


def test_float32_cell_trains_exactly_as_without_device_options() -> None:
    config = PolicyConfig(vocab_size=AdditionTask().tokenizer.vocab_size)
    engine = RolloutEngine("engine-0", "torch", config, seed=5)
    groups = _groups(engine)
    plain = TrainCell("a", "torch", config, seed=5)
    explicit = TrainCell("b", "torch", config, seed=5, device="cpu", dtype="float32",
                         gradient_backend="gloo")

    assert plain.train_step(groups)["loss"] == explicit.train_step(groups)["loss"]
    assert plain.weights_checksum() == explicit.weights_checksum()


# ------------------------------------------------------------------ state across devices


def test_state_leaves_the_cell_as_cpu_copies() -> None:
    cell = TrainCell("cell-0", "torch", PolicyConfig(vocab_size=AdditionTask().tokenizer.vocab_size))
    state = cell.get_state()
    tensors = [*state["model"].values(),
               *(t for s in state["optimizer"]["state"].values() for t in s.values())]

    assert tensors and all(t.device.type == "cpu" for t in tensors)
    live = dict(cell.model.named_parameters())
    name = next(iter(state["model"]))
    assert state["model"][name].data_ptr() != live[name].data_ptr()  # a copy, not a view
    assert cpu_copy({"a": (1, [torch.ones(1)])})["a"][1][0].device.type == "cpu"


def test_a_checkpoint_written_on_cuda_resumes_on_cpu(tmp_path: Path, monkeypatch) -> None:
    vocab = AdditionTask().tokenizer.vocab_size
    engine = RolloutEngine("engine-0", "torch", PolicyConfig(vocab_size=vocab), seed=5)
    writer = TrainCell("writer", "torch", PolicyConfig(vocab_size=vocab), seed=5)
    writer.train_step(_groups(engine))
    # Tag every storage as CUDA while saving: the file is what a CUDA cell writes (each
    # storage recorded at "cuda:0"), though this machine has no GPU.
    registry = list(torch.serialization._package_registry)
    cuda_tag = (0, lambda storage: "cuda:0", lambda obj, location: None)
    monkeypatch.setattr(torch.serialization, "_package_registry", [cuda_tag, *registry])
    path = tmp_path / "ckpt.pt"
    writer.save_checkpoint(str(path))
    monkeypatch.setattr(torch.serialization, "_package_registry", registry)

    with pytest.raises(RuntimeError, match="CUDA"):  # without map_location it needs a GPU
        torch.load(io.BytesIO(path.read_bytes()), weights_only=True)
    reader = TrainCell("reader", "torch", PolicyConfig(vocab_size=vocab), seed=6)
    summary = reader.load_checkpoint(str(path))

    assert summary["train_step"] == 1
    assert reader.weights_checksum() == writer.weights_checksum()
    groups = _groups(engine)
    assert reader.train_step(groups)["loss"] == writer.train_step(groups)["loss"]
    assert reader.weights_checksum() == writer.weights_checksum()  # optimizer state came too


# ------------------------------------------------------------------ the command


@pytest.mark.usefixtures("ray_cluster")
@pytest.mark.parametrize(("argv", "fragment"), [
    (["--device", "cuda"], "device: --device cuda but the Ray cluster reports no GPU"),
    (["--gpus-per-cell", "1"], "gpus_per_cell: GPUs per cell or engine were asked for"),
])
def test_asking_for_gpus_on_a_cluster_without_them_is_exit_2_and_writes_nothing(
        argv: list[str], fragment: str, capsys, tmp_path: Path) -> None:
    from orchestrator.cli import main

    with pytest.raises(SystemExit) as exited:
        main(["run", "--runs-dir", str(tmp_path), *argv])
    err = capsys.readouterr().err.strip().splitlines()

    assert exited.value.code == 2 and len(err) == 1, err
    assert err[0].startswith("orchestrator: error: ") and fragment in err[0]
    assert list(tmp_path.iterdir()) == []


def test_a_gpu_role_fits_only_nodes_with_gpus_to_spare() -> None:
    from orchestrator.control.placement.nodes import NodeInfo
    from orchestrator.control.placement.placer import _Role

    role = _Role("cell", 0.25, None, gpus=0.5)

    assert not role.fits(NodeInfo("a", "10.0.0.1", 4.0, 0.0))
    assert role.fits(NodeInfo("b", "10.0.0.2", 4.0, 1.0))
    assert not role.fits(NodeInfo("c", "10.0.0.3", 0.1, 8.0))
    assert _Role("cell", 0.25, None).fits(NodeInfo("a", "10.0.0.1", 4.0))  # CPU roles as before
