"""Which path a publish takes (issue 21): the object store, or CUDA IPC when the publisher and
every engine share one GPU; and how vLLM is started on each device. The CUDA IPC transfer
itself needs a GPU (``tests/actors/test_gpu.py``); here: the selection, and that the object-store
path, which every CPU run takes, is unchanged."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from actors.engines.vllm.args import engine_arguments
from actors.weight_paths import (
    CUDA_IPC,
    OBJECT_STORE,
    DeviceInfo,
    EngineDevices,
    local_device_info,
    open_weights,
    select_weight_path,
    share_cuda_tensors,
)
from actors.publishing.weight_sync import stage_weights, tensors_checksum

GPU_A = DeviceInfo("node-1", "cuda", "GPU-aaaa")
GPU_B = DeviceInfo("node-1", "cuda", "GPU-bbbb")
CPU = DeviceInfo("node-1", "cpu")


@pytest.mark.parametrize(("publisher", "engines", "path"), [
    (GPU_A, [GPU_A, GPU_A], CUDA_IPC),  # one GPU shared by the cell and its engines
    (GPU_A, [GPU_A, GPU_B], OBJECT_STORE),  # an engine on another GPU
    (GPU_A, [dataclasses.replace(GPU_A, node_id="node-2")], OBJECT_STORE),  # same id elsewhere
    (GPU_A, [GPU_A, None], OBJECT_STORE),  # an engine that did not say (or a plain object)
    (GPU_A, [CPU], OBJECT_STORE),
    (CPU, [CPU, CPU], OBJECT_STORE),
    (GPU_A, [], OBJECT_STORE),
])
def test_cuda_ipc_only_when_every_engine_shares_the_publishers_gpu(publisher, engines,
                                                                   path) -> None:
    assert select_weight_path(publisher, engines) == path


def test_a_cpu_process_describes_itself_as_cpu() -> None:
    info = local_device_info("cpu")

    assert (info.device, info.gpu_uuid) == ("cpu", None)


def test_plain_engines_have_no_device_to_report() -> None:
    assert EngineDevices().of([object(), object()]) == [None, None]


def test_engine_actors_report_their_device(ray_cluster) -> None:
    import ray

    from actors.engines.rollout_engine import ROLLOUT_ENGINE_ACTOR_OPTIONS, RolloutEngine
    from actors.policies.policy import PolicyConfig

    options = {**ROLLOUT_ENGINE_ACTOR_OPTIONS, "num_cpus": 0.1}
    engine = ray.remote(**options)(RolloutEngine).remote("engine-0", "torch",
                                                        PolicyConfig(vocab_size=16))
    try:
        (info,) = EngineDevices().of([engine])
        assert info.device == "cpu" and info.node_id == ray.get_runtime_context().get_node_id()
    finally:
        ray.kill(engine)


def test_the_object_store_path_passes_tensors_unchanged() -> None:
    tensors = {"w": torch.arange(4.0)}
    staged = stage_weights([object()], tensors)

    assert staged.path == OBJECT_STORE and staged.payload is tensors
    assert staged.checksum == tensors_checksum(tensors)
    assert open_weights(staged.payload) is tensors


def test_cuda_ipc_refuses_tensors_that_are_not_on_cuda() -> None:
    with pytest.raises(ValueError, match="CUDA IPC needs CUDA tensors"):
        share_cuda_tensors({"w": torch.zeros(2)})
    with pytest.raises(ValueError, match="CUDA IPC needs CUDA tensors"):
        stage_weights([object()], {"w": torch.zeros(2)}, CUDA_IPC)


def test_vllm_on_cpu_keeps_its_fixed_kv_cache_and_on_cuda_takes_its_gpu_share() -> None:
    cpu = engine_arguments("/m", 1, 16, 1 << 20)
    cuda = engine_arguments("/m", 1, 16, 1 << 20, "cuda", "bfloat16", 0.3)

    assert cpu["kv_cache_memory_bytes"] == 1 << 20 and cpu["dtype"] == "float32"
    assert "enable_sleep_mode" not in cpu and "gpu_memory_utilization" not in cpu
    assert cuda["dtype"] == "bfloat16" and cuda["gpu_memory_utilization"] == 0.3
    assert cuda["enable_sleep_mode"] is True and "kv_cache_memory_bytes" not in cuda
    assert engine_arguments("/m", 1, 16, 0, "cuda")["gpu_memory_utilization"] == 0.9
    with pytest.raises(ValueError, match="unknown device"):
        engine_arguments("/m", 1, 16, 0, "tpu")


def test_every_vllm_argument_is_an_engine_args_field() -> None:
    arg_utils = pytest.importorskip("vllm.engine.arg_utils")
    known = {field.name for field in dataclasses.fields(arg_utils.EngineArgs)}

    for device in ("cpu", "cuda"):
        assert set(engine_arguments("/m", 1, 16, 1, device)) <= known
