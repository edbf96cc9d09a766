"""A publish's tensors packed into one buffer for the object store: every dtype and shape
comes back with the same bytes (so the engine's checksum equals the sender's), through a
real ``ray.put``/``ray.get``, and into a real engine actor's ``load_weights``."""

from __future__ import annotations

import pytest
import torch

from actors.publishing.packed import PackedTensors, pack_tensors, unpack_tensors
from actors.publishing.weight_sync import stage_weights, tensors_checksum
from actors.weight_paths import open_weights


def _mixed_tensors() -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return {
        "layer.weight": torch.randn(5, 3, generator=generator),
        "layer.bias": torch.randn(3, generator=generator).to(torch.bfloat16),
        "embed": torch.randn(7, 2, generator=generator).to(torch.float16),
        "positions": torch.arange(9, dtype=torch.int64).reshape(3, 3),
        "mask": torch.tensor([True, False, True]),
        "scale": torch.tensor(2.5),  # a 0-d tensor
        "empty": torch.zeros(0, 4),
        "odd": torch.arange(3, dtype=torch.uint8),  # 3 bytes: the next one must still align
        "after_odd": torch.randn(2, 2, generator=generator, dtype=torch.float64),
    }


def test_packed_tensors_come_back_with_the_same_names_dtypes_shapes_and_bytes() -> None:
    tensors = _mixed_tensors()

    unpacked = unpack_tensors(pack_tensors(tensors))

    assert set(unpacked) == set(tensors)
    for name, tensor in tensors.items():
        assert unpacked[name].dtype == tensor.dtype, name
        assert unpacked[name].shape == tensor.shape, name
        assert torch.equal(unpacked[name], tensor), name
    assert tensors_checksum(unpacked) == tensors_checksum(tensors)


def test_a_non_contiguous_tensor_is_packed_as_its_values() -> None:
    transposed = torch.arange(6.0).reshape(2, 3).t()

    unpacked = unpack_tensors(pack_tensors({"t": transposed}))

    assert torch.equal(unpacked["t"], transposed)


def test_unpacked_tensors_do_not_alias_the_packed_buffer() -> None:
    packed = pack_tensors({"w": torch.zeros(4)})

    unpacked = unpack_tensors(packed)
    unpacked["w"].add_(1.0)

    assert not packed.buffer.any()


def test_packing_refuses_tensors_off_the_cpu() -> None:
    tensor = torch.zeros(2, device="meta")

    with pytest.raises(ValueError, match="not on the CPU: \\['w'\\]"):
        pack_tensors({"w": tensor})


def test_stage_for_actor_engines_puts_one_packed_buffer_that_every_engine_reads(
        ray_cluster) -> None:
    import ray

    from actors.engines.rollout_engine import ROLLOUT_ENGINE_ACTOR_OPTIONS, RolloutEngine
    from actors.policies.policy import PolicyConfig, build_policy, tensor_state_dict

    config = PolicyConfig(vocab_size=16)
    options = {**ROLLOUT_ENGINE_ACTOR_OPTIONS, "num_cpus": 0.1}
    engine = ray.remote(**options)(RolloutEngine).remote("engine-0", "torch", config)
    try:
        tensors = {name: t.clone() for name, t in
                   tensor_state_dict(build_policy("torch", config, seed=7)).items()}
        staged = stage_weights([engine], tensors)

        assert isinstance(ray.get(staged.payload), PackedTensors)
        assert tensors_checksum(open_weights(ray.get(staged.payload))) == staged.checksum
        ray.get(engine.begin_update.remote(1))
        received = ray.get(engine.load_weights.remote(staged.payload, 1))
        assert received == staged.checksum
        assert ray.get(engine.weights_checksum.remote()) == staged.checksum
    finally:
        ray.kill(engine)
