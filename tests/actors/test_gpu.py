"""On a CUDA device (issue 21): placement on the GPU, a 2-cell quorum (NCCL with a GPU per
cell, gloo when they share one), a CUDA weight transfer whose log-probs match the trainer's,
and a checkpoint round trip between CUDA and CPU.

Every test is marked ``gpu`` and skipped where torch sees no CUDA device (``tests/conftest.py``);
``make gpu-check`` runs them first. Not run on the machine this was written on (no GPU).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from actors.engines.rollout_engine import ROLLOUT_ENGINE_ACTOR_OPTIONS, RolloutEngine
from actors.grpo import build_train_batch, token_log_probs
from actors.policies.policy import PolicyConfig
from actors.task import TOKENIZER, AdditionTask
from actors.train_cell import TRAIN_CELL_ACTOR_OPTIONS, TrainCell
from actors.publishing.weight_sync import (
    begin_engine_update,
    finalize_and_resume_engines,
    load_staged_weights,
)

pytestmark = pytest.mark.gpu

POLICY = PolicyConfig(vocab_size=TOKENIZER.vocab_size)
LOG_PROB_TOLERANCE = 1e-3  # float32 on both sides; CUDA kernels differ from the CPU's a little


def _groups(engine, count: int = 8) -> list:
    task = AdditionTask(seed=3)
    if hasattr(engine, "generate") and not hasattr(engine.generate, "remote"):
        return [engine.generate(task.make_prompt(i), 4, i) for i in range(count)]
    import ray

    return ray.get([engine.generate.remote(task.make_prompt(i), 4, i) for i in range(count)])


def test_cell_and_engine_compute_on_the_gpu() -> None:
    engine = RolloutEngine("engine-0", "torch", POLICY, seed=5, device="cuda", dtype="bfloat16")
    cell = TrainCell("cell-0", "torch", POLICY, seed=5, device="cuda", dtype="bfloat16")

    metrics = cell.train_step(_groups(engine))

    assert {p.device.type for p in cell.model.parameters()} == {"cuda"}
    assert {(p.device.type, p.dtype) for p in engine.model.parameters()} == {
        ("cuda", torch.bfloat16)}
    assert metrics["train_step"] == 1.0 and torch.isfinite(torch.tensor(metrics["loss"]))


@pytest.mark.parametrize(("gpus_per_cell", "backend"), [(0.5, "gloo"), (1.0, "nccl")])
def test_two_cells_average_gradients_and_reform_their_quorum(ray_cluster, gpus_per_cell: float,
                                                             backend: str) -> None:
    import ray

    from actors.gradient_group import create_rendezvous_store

    if gpus_per_cell >= 1 and torch.cuda.device_count() < 2:
        pytest.skip("NCCL between two cells needs two GPUs")
    store, address = create_rendezvous_store("127.0.0.1")
    options = {**TRAIN_CELL_ACTOR_OPTIONS, "num_cpus": 0.25, "num_gpus": gpus_per_cell}
    cells = [ray.remote(**options)(TrainCell).remote(
        f"cell-{i}", "torch", POLICY, seed=5 + i, device="cuda", dtype="float32",
        gradient_backend=backend) for i in range(2)]
    engine = RolloutEngine("engine-0", "torch", POLICY, seed=5)
    try:
        ray.get(cells[1].set_state.remote(cells[0].get_state.remote()))
        for quorum in (1, 2):  # the second: a fresh store prefix, as after a failover
            ray.get([cell.configure_group.remote(quorum, rank, 2, address)
                     for rank, cell in enumerate(cells)])
            groups = _groups(engine)
            ray.get([cells[0].train_step.remote(groups[:4]),
                     cells[1].train_step.remote(groups[4:])])
            checksums = ray.get([cell.weights_checksum.remote() for cell in cells])
            assert checksums[0] == checksums[1], f"cells diverged in quorum {quorum}"
    finally:
        for cell in cells:
            ray.kill(cell)
        del store


def _path_and_log_probs(cell: TrainCell, engines: list, groups: list) -> tuple[str, list]:
    """Inside the cell actor: the weight path it selects, and its log-probs of ``groups``."""
    from actors.weight_paths import local_device_info, select_weight_path

    path = select_weight_path(local_device_info(cell.device), cell._engine_devices.of(engines))
    batch = build_train_batch(groups, TOKENIZER.pad_id).to(cell.device)
    with torch.no_grad():
        log_probs = token_log_probs(cell.model(batch.tokens), batch.tokens)
    mask = batch.loss_mask.bool()
    return path, log_probs[mask].float().cpu().tolist()


def _transfer(cell, engines, epoch: int) -> str:
    """Inside the cell: step 3 of the update sequence (stage on the cell's chosen path,
    load); a cell without a ledger cannot run the whole sequence."""
    return load_staged_weights(engines, cell.stage(engines), epoch, cell.transport)


def test_cuda_ipc_transfer_gives_engine_log_probs_that_match_the_trainer(ray_cluster) -> None:
    import ray

    cell_options = {**TRAIN_CELL_ACTOR_OPTIONS, "num_cpus": 0.25, "num_gpus": 0.5}
    engine_options = {**ROLLOUT_ENGINE_ACTOR_OPTIONS, "num_cpus": 0.25, "num_gpus": 0.5}
    cell = ray.remote(**cell_options)(TrainCell).remote("cell-0", "torch", POLICY, seed=5,
                                                        device="cuda", dtype="float32")
    engine = ray.remote(**engine_options)(RolloutEngine).remote(
        "engine-0", "torch", POLICY, seed=9, device="cuda", dtype="float32")
    try:
        ray.get(cell.train_step.remote(_groups(engine)))  # the cell's weights move off v0
        begin_engine_update([engine], 1)
        checksum = ray.get(cell.__ray_call__.remote(_transfer, [engine], 1))
        finalize_and_resume_engines([engine], 1, 1)
        assert ray.get(engine.weights_checksum.remote()) == checksum
        groups = _groups(engine, 4)
        path, trainer = ray.get(cell.__ray_call__.remote(_path_and_log_probs, [engine],
                                                         [list(g) for g in groups]))
        rollout = [lp for g in groups for s in g for lp in s.rollout_log_probs]
        assert path == "cuda_ipc"
        assert len(trainer) == len(rollout)
        assert max(abs(a - b) for a, b in zip(trainer, rollout)) < LOG_PROB_TOLERANCE
    finally:
        ray.kill(cell)
        ray.kill(engine)


def test_checkpoints_round_trip_between_cuda_and_cpu(tmp_path: Path) -> None:
    engine = RolloutEngine("engine-0", "torch", POLICY, seed=5)
    on_cuda = TrainCell("cuda", "torch", POLICY, seed=5, device="cuda", dtype="float32")
    on_cuda.train_step(_groups(engine))
    on_cuda.save_checkpoint(str(tmp_path / "from-cuda.pt"))

    on_cpu = TrainCell("cpu", "torch", POLICY, seed=6)
    on_cpu.load_checkpoint(str(tmp_path / "from-cuda.pt"))
    assert on_cpu.weights_checksum() == on_cuda.weights_checksum()

    on_cpu.train_step(_groups(engine))
    on_cpu.save_checkpoint(str(tmp_path / "from-cpu.pt"))
    back = TrainCell("back", "torch", POLICY, seed=7, device="cuda", dtype="float32")
    back.load_checkpoint(str(tmp_path / "from-cpu.pt"))
    assert back.weights_checksum() == on_cpu.weights_checksum()
    assert {p.device.type for p in back.model.parameters()} == {"cuda"}
    assert {t.device.type for s in back.optimizer.state.values() for k, t in s.items()
            if k != "step"} == {"cuda"}
