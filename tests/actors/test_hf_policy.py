"""The Hugging Face policy and the megatron <-> HF bridge, without an engine.

The task model is made locally and cached; a model that does not speak the task's vocabulary is
refused; megatron-core built as a Llama from an HF directory gives the HF model's logits, and
its tensors (weights and LoRA adapters, grouped-query attention included) convert to exactly
the HF ones; a Llama train cell trains and heals like any cell.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("transformers")

import torch  # noqa: E402

from actors.policies.hf_policy import (  # noqa: E402
    HFPolicyConfig,
    build_hf_policy,
    check_task_vocabulary,
    ensure_task_model,
    hf_config,
    read_checkpoint,
)
from actors.llama_cell import LlamaTrainCell  # noqa: E402
from actors.policies.megatron_llama import (  # noqa: E402
    LlamaShape,
    build_megatron_llama,
    hf_to_megatron,
    megatron_to_hf,
)
from actors.policies.policy import PolicyError, adapter_state_dict, tensor_state_dict  # noqa: E402
from actors.task import TOKENIZER, AdditionTask  # noqa: E402

TOKENS = torch.tensor([[5, 13, 6, 16, 7, 1, 0, 0], [3, 13, 4, 16, 7, 7, 1, 2]])


@pytest.fixture(scope="module")
def task_model(tmp_path_factory) -> str:
    return str(ensure_task_model(tmp_path_factory.mktemp("hf") / "model", TOKENIZER.symbols,
                                 seed=3))


@pytest.fixture(scope="module")
def gqa_model(tmp_path_factory, task_model: str) -> str:
    """A Llama with grouped-query attention (4 query heads, 2 key/value groups) and the task's
    tokenizer."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    directory = tmp_path_factory.mktemp("gqa")
    config = LlamaConfig(vocab_size=TOKENIZER.vocab_size, hidden_size=128, intermediate_size=96,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=32, rms_norm_eps=1e-5)
    torch.manual_seed(5)
    LlamaForCausalLM(config).save_pretrained(str(directory))
    AutoTokenizer.from_pretrained(task_model).save_pretrained(str(directory))
    return str(directory)


def test_task_model_is_made_locally_cached_and_speaks_the_task(tmp_path: Path,
                                                               task_model: str) -> None:
    again = ensure_task_model(task_model, TOKENIZER.symbols, seed=3)

    assert str(again) == task_model
    check_task_vocabulary(task_model, TOKENIZER.symbols)
    config = hf_config(task_model)
    assert (config.vocab_size, config.model_type) == (TOKENIZER.vocab_size, "llama")
    with pytest.raises(PolicyError, match="other parameters"):
        ensure_task_model(task_model, TOKENIZER.symbols, seed=4)
    with pytest.raises(PolicyError, match="does not speak the task's vocabulary"):
        check_task_vocabulary(task_model, list(reversed(TOKENIZER.symbols)))
    with pytest.raises(PolicyError, match="no Hugging Face model"):
        hf_config(tmp_path)


def test_hf_policy_has_vllm_names_and_lora_trains_only_adapters(task_model: str) -> None:
    model = build_hf_policy(HFPolicyConfig(task_model))
    adapted = build_hf_policy(HFPolicyConfig(task_model, lora_rank=4), seed=1)

    assert set(tensor_state_dict(model)) == set(read_checkpoint(task_model))
    assert model(TOKENS).shape == (2, 8, TOKENIZER.vocab_size)
    assert torch.allclose(model(TOKENS), adapted(TOKENS))  # B starts at zero
    trainable = [n for n, p in adapted.named_parameters() if p.requires_grad]
    assert trainable and all(n.endswith((".lora_a", ".lora_b")) for n in trainable)
    assert "model.layers.0.self_attn.q_proj.lora_a" in adapter_state_dict(adapted)


@pytest.mark.parametrize("fixture", ["task_model", "gqa_model"])
def test_megatron_llama_matches_hf_and_converts_exactly(fixture: str, request) -> None:
    directory = request.getfixturevalue(fixture)
    hf = build_hf_policy(HFPolicyConfig(directory)).eval()
    megatron = build_megatron_llama(HFPolicyConfig(directory)).eval()
    shape = LlamaShape(hf_config(directory))

    with torch.no_grad():
        difference = (hf(TOKENS) - megatron(TOKENS)).abs().max().item()
    converted = megatron_to_hf(tensor_state_dict(megatron), shape)
    reference = tensor_state_dict(hf)

    assert difference < 1e-5
    assert set(converted) == set(reference)
    assert all(torch.equal(converted[name], reference[name]) for name in reference)
    back = hf_to_megatron(converted, shape)
    assert all(torch.equal(back[n], t) for n, t in tensor_state_dict(megatron).items())


def test_megatron_lora_adapters_convert_to_the_same_merged_update(gqa_model: str) -> None:
    shape = LlamaShape(hf_config(gqa_model))
    megatron = build_megatron_llama(HFPolicyConfig(gqa_model, lora_rank=4, lora_alpha=8.0))
    with torch.no_grad():
        for name, parameter in megatron.named_parameters():
            if name.endswith(".lora_b"):
                parameter.normal_(0.0, 0.1)
    adapters = megatron_to_hf(adapter_state_dict(megatron), shape)
    merged = read_checkpoint(gqa_model)
    for name, down in adapters.items():
        if name.endswith(".lora_a"):
            module = name.removesuffix(".lora_a")
            merged[f"{module}.weight"] = (merged[f"{module}.weight"]
                                          + 2.0 * adapters[f"{module}.lora_b"] @ down)
    hf = build_hf_policy(HFPolicyConfig(gqa_model)).eval()
    hf.load_state_dict(merged)

    with torch.no_grad():
        assert (hf(TOKENS) - megatron.eval()(TOKENS)).abs().max().item() < 1e-5
    assert {n.rsplit(".", 2)[-2] for n in adapters} == {
        "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}


def test_unknown_tensor_names_are_refused(task_model: str) -> None:
    shape = LlamaShape(hf_config(task_model))
    with pytest.raises(PolicyError, match="no Hugging Face name"):
        megatron_to_hf({"decoder.layers.0.self_attention.linear_qkv.bias": torch.zeros(3)},
                       shape)
    with pytest.raises(PolicyError, match="no megatron name"):
        hf_to_megatron({"transformer.wte.weight": torch.zeros(2, 2)}, shape)


@pytest.mark.parametrize("backend", ["hf", "megatron"])
def test_llama_cell_trains_and_heals(backend: str, task_model: str) -> None:
    task = AdditionTask(seed=0)
    cells = [LlamaTrainCell(f"cell-{i}", backend, HFPolicyConfig(task_model), seed=0)
             for i in range(2)]
    groups = []
    for index in range(4):
        prompt = task.make_prompt(index)
        groups.append([_sample(prompt, index, row, reward=float(row % 2)) for row in range(4)])

    metrics = cells[0].train_step(groups)
    cells[1].set_state(cells[0].get_state())

    assert metrics["num_samples"] == 16 and metrics["grad_norm"] > 0
    assert cells[1].weights_checksum() == cells[0].weights_checksum()
    assert cells[0].get_state()["backend"] == backend
    assert cells[0].policy_config.vocab_size == TOKENIZER.vocab_size


def _sample(prompt, group: int, row: int, reward: float):
    from orchestrator.rollout.types import Sample

    response = [5 + row, TOKENIZER.eos_id]
    return Sample(index=group * 4 + row, group_index=group, prompt_tokens=list(prompt.tokens),
                  response_tokens=response, rollout_log_probs=[-2.0, -2.0], reward=reward,
                  weight_versions=[0], token_versions=[0, 0])


def test_the_vocabulary_read_without_transformers_is_the_tokenizers_own(tmp_path: Path,
                                                                        task_model: str) -> None:
    from transformers import AutoTokenizer

    from actors.policies.task_vocabulary import tokenizer_vocabulary

    assert dict(tokenizer_vocabulary(task_model)) == AutoTokenizer.from_pretrained(
        task_model, local_files_only=True).get_vocab()
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "tokenizer.json").write_text("{not json", encoding="utf-8")
    with pytest.raises(PolicyError, match="unreadable"):
        tokenizer_vocabulary(broken)
    with pytest.raises(PolicyError, match="no tokenizer"):
        tokenizer_vocabulary(tmp_path / "empty")
