"""The vLLM rollout engine, for real: one engine (a Ray actor) shared by the whole module.

After full (HF and megatron) and LoRA updates through the trainer's real update sequence
(ledger commit, the one finalize), the engine's per-token log-probs equal the trainer's forward
pass; a sample paused mid-sequence across an update carries both versions and continues under
the new weights, and so does one an in-flight swap lands on (weights staged while vLLM
generates, swapped in after the commit); the abort pause mode returns what was generated; the epoch fence refuses a
stale publisher and changes nothing. Nothing is downloaded: the model is made locally.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

pytest.importorskip("vllm")

import ray  # noqa: E402
import torch  # noqa: E402

from actors.errors import EngineStateError, StaleEpochError  # noqa: E402
from actors.policies.hf_policy import (  # noqa: E402
    HFPolicyConfig,
    build_hf_policy,
    ensure_task_model,
    read_checkpoint,
)
from actors.llama_cell import LlamaTrainCell  # noqa: E402
from actors.policies.policy import PolicyError, adapter_state_dict  # noqa: E402
from actors.task import TOKENIZER, AdditionTask  # noqa: E402
from actors.engines.vllm.engine import VLLM_ENGINE_ACTOR_OPTIONS, VLLMEngine  # noqa: E402
from actors.publishing.weight_sync import tensors_checksum  # noqa: E402
from ledger import Ledger  # noqa: E402
from orchestrator.rollout.types import SampleStatus  # noqa: E402
from tests.waiting import wait_until  # noqa: E402

pytestmark = pytest.mark.ray

MAX_NEW_TOKENS = 8
LOG_PROB_TOLERANCE = 1e-4  # float32 on both sides; measured ~5e-7
TASK = AdditionTask(seed=0)


class SteeredVLLMEngine(VLLMEngine):
    """Test double: can pause itself right after the next tokens are delivered (a weight
    update landing exactly at a token boundary mid-sequence), and switch pause modes."""

    _pause_armed = False

    def pause_after_next_tokens(self) -> None:
        with self.state.lock:
            self._pause_armed = True

    def set_pause_mode(self, mode: str) -> None:
        self.pause_mode = mode

    def _deliver(self, outputs: list[Any], version: int) -> None:
        super()._deliver(outputs, version)
        if self._pause_armed and any(t.tokens for t in self._tracks.values()):
            self._pause_armed = False
            self.state.pause()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    return str(ensure_task_model(tmp_path_factory.mktemp("model") / "model",
                                 TOKENIZER.symbols, seed=3))


@pytest.fixture(scope="module")
def engine(ray_cluster, model_dir: str):
    """One vLLM engine for the module (start-up is seconds): tests move its epoch up."""
    started = time.monotonic()
    handle = ray.remote(**VLLM_ENGINE_ACTOR_OPTIONS)(SteeredVLLMEngine).remote(
        "vllm-0", HFPolicyConfig(model_dir, lora_alpha=16.0), seed=0, task=TASK,
        sampling={"max_new_tokens": MAX_NEW_TOKENS}, partial_rollout=True,
        paused_wait_timeout_s=120.0,
    )
    health = ray.get(handle.health.remote())
    print(f"vLLM engine up in {time.monotonic() - started:.1f}s "
          f"(LLMEngine start-up {health['startup_s']:.1f}s)")
    yield handle
    ray.kill(handle, no_restart=True)


def test_the_vllm_engine_offers_the_engine_interface() -> None:
    from actors.engines.engine_protocol import RolloutEngineProtocol

    wanted = {name for name in dir(RolloutEngineProtocol) if not name.startswith("_")}
    assert wanted <= set(dir(VLLMEngine)) | {"engine_id"}


def _publisher(engine, sqlite_url: str, backend: str, policy: HFPolicyConfig,
               run_id: str) -> tuple[LlamaTrainCell, Ledger, int]:
    """A cell promoted to an epoch above every epoch the shared engine has seen."""
    cell = LlamaTrainCell("cell-0", backend, policy, seed=0, ledger_url=sqlite_url,
                          run_id=run_id, transport="lora" if policy.lora_rank else "full")
    ledger = Ledger.open(sqlite_url)
    ledger.start_run(run_id)
    epoch, engine_epoch = 0, ray.get(engine.health.remote())["epoch"]
    while epoch <= engine_epoch:
        epoch = ledger.promote(run_id, "cell-0", reason="start")
    return cell, ledger, epoch


def _perturb(model: torch.nn.Module, scale: float = 0.05) -> None:
    """Stand-in for training: move every trainable tensor (a LoRA B leaves zero)."""
    generator = torch.Generator().manual_seed(11)
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.requires_grad:
                parameter.add_(torch.randn(parameter.shape, generator=generator) * scale)


def _log_prob_error(samples, models: dict[int, torch.nn.Module]) -> float:
    """Max |engine log-prob - trainer log-prob| over every response token, each token scored
    by the model of the version that produced it."""
    worst = 0.0
    for sample in samples:
        tokens = torch.tensor([sample.prompt_tokens + sample.response_tokens])
        start = len(sample.prompt_tokens) - 1
        for index, (token, logged) in enumerate(zip(sample.response_tokens,
                                                    sample.rollout_log_probs)):
            model = models[sample.token_versions[index]]
            with torch.no_grad():
                log_probs = torch.log_softmax(model(tokens)[0].float(), dim=-1)
            worst = max(worst, abs(float(log_probs[start + index, token]) - logged))
    return worst


def _generate(engine, n_samples: int = 8, index: int = 0):
    return ray.get(engine.generate.remote(TASK.make_prompt(index), n_samples, index))


def test_full_update_from_the_hf_trainer_gives_its_log_probs(engine, model_dir, sqlite_url):
    cell, ledger, epoch = _publisher(engine, sqlite_url, "hf", HFPolicyConfig(model_dir),
                                     "full-hf")
    _perturb(cell.model)

    report = cell.update_weights([engine], epoch)
    samples = _generate(engine)

    assert report.stamped_engine_ids == ["vllm-0"] and not report.failed
    health = ray.get(engine.health.remote())
    assert (health["version"], health["epoch"], health["paused"]) == (report.version, epoch,
                                                                     False)
    assert all(s.token_versions == [report.version] * len(s.response_tokens) for s in samples)
    error = _log_prob_error(samples, {report.version: cell.model.eval()})
    print(f"full update (hf): max log-prob error {error:.2e}")
    assert error < LOG_PROB_TOLERANCE
    assert ray.get(engine.weights_checksum.remote()) == cell.weights_checksum()
    assert ledger.verify("full-hf").ok
    ledger.close()


def test_megatron_update_is_converted_to_hf_names_on_the_publisher(engine, model_dir,
                                                                   sqlite_url):
    cell, ledger, epoch = _publisher(engine, sqlite_url, "megatron", HFPolicyConfig(model_dir),
                                     "full-megatron")
    _perturb(cell.model)

    report = cell.update_weights([engine], epoch)
    samples = _generate(engine)

    error = _log_prob_error(samples, {report.version: cell.model.eval()})
    print(f"full update (megatron -> HF bridge): max log-prob error {error:.2e}")
    assert error < LOG_PROB_TOLERANCE
    committed = [e.payload for e in ledger.events("full-megatron") if e.kind == "weight_committed"]
    # The commit names what the engines received: the HF-named tensors, not megatron's.
    assert committed[-1]["checksum"] == ray.get(engine.weights_checksum.remote())
    ledger.close()


def test_lora_update_is_merged_and_gives_the_adapted_log_probs(engine, model_dir, sqlite_url):
    policy = HFPolicyConfig(model_dir, lora_rank=4, lora_alpha=16.0)
    cell, ledger, epoch = _publisher(engine, sqlite_url, "hf", policy, "lora-hf")
    _perturb(cell.model)

    report = cell.update_weights([engine], epoch)
    samples = _generate(engine)

    error = _log_prob_error(samples, {report.version: cell.model.eval()})
    print(f"LoRA update (merged): max log-prob error {error:.2e}")
    assert error < LOG_PROB_TOLERANCE
    assert (ray.get(engine.weights_checksum.remote(adapters_only=True))
            == tensors_checksum(adapter_state_dict(cell.model)))
    ledger.close()


def test_a_sample_paused_mid_sequence_continues_under_the_new_weights(engine, model_dir,
                                                                       sqlite_url):
    cell, ledger, epoch = _publisher(engine, sqlite_url, "hf", HFPolicyConfig(model_dir),
                                     "partial")
    old_version = cell.update_weights([engine], epoch).version  # the directory's weights
    old_model = build_hf_policy(HFPolicyConfig(model_dir)).eval()
    ray.get(engine.set_pause_mode.remote("in_place"))
    ray.get(engine.pause_after_next_tokens.remote())

    pending = engine.generate.remote(TASK.make_prompt(1), 8, 1)
    wait_until(lambda: ray.get(engine.health.remote(), timeout=30)["paused"],
               what="the engine pausing after its next tokens", timeout_s=120)
    _perturb(cell.model)
    new_version = cell.update_weights([engine], epoch).version
    samples = ray.get(pending)

    assert new_version == old_version + 1
    spanning = [s for s in samples if len(set(s.token_versions)) == 2]
    assert spanning, [s.token_versions for s in samples]
    for sample in samples:
        assert sample.status is not SampleStatus.ABORTED
        assert sample.token_versions == sorted(sample.token_versions)
        assert sample.token_versions[0] == old_version  # the first token came before the pause
        assert sample.weight_versions == sorted(set(sample.token_versions))
    unfinished_at_pause = [s for s in samples if s.response_tokens[0] != TOKENIZER.eos_id]
    assert all(s.token_versions[-1] == new_version for s in unfinished_at_pause)
    error = _log_prob_error(samples, {old_version: old_model, new_version: cell.model.eval()})
    print(f"partial rollout across v{old_version}->v{new_version}: "
          f"{len(spanning)}/{len(samples)} samples span both; max log-prob error {error:.2e}")
    assert error < LOG_PROB_TOLERANCE
    ledger.close()


def test_in_flight_weights_wait_staged_while_vllm_serves_then_swap_in_at_the_stamp(
        engine, model_dir, sqlite_url):
    from actors.transport import WeightSwap

    cell, ledger, epoch = _publisher(engine, sqlite_url, "hf", HFPolicyConfig(model_dir),
                                     "in-flight")
    old_version = cell.update_weights([engine], epoch, swap=WeightSwap.IN_FLIGHT).version
    old_model = build_hf_policy(HFPolicyConfig(model_dir)).eval()
    serving = ray.get(engine.weights_checksum.remote())
    _perturb(cell.model)

    staged = ray.get(engine.stage_weights.remote(
        {name: t.detach().clone() for name, t in cell.model.state_dict().items()}, epoch))
    while_staged = _generate(engine, 4, 5)
    health = ray.get(engine.health.remote())
    assert staged == cell.weights_checksum() != serving
    assert (health["paused"], health["version"]) == (False, old_version)
    assert ray.get(engine.weights_checksum.remote()) == serving
    assert all(set(s.token_versions) == {old_version} for s in while_staged)
    assert _log_prob_error(while_staged, {old_version: old_model}) < LOG_PROB_TOLERANCE

    ray.get(engine.set_pause_mode.remote("in_place"))
    ray.get(engine.pause_after_next_tokens.remote())  # the swap lands between two tokens
    pending = engine.generate.remote(TASK.make_prompt(6), 8, 6)
    wait_until(lambda: ray.get(engine.health.remote(), timeout=30)["paused"],
               what="the engine stopping after its next tokens", timeout_s=120)
    report = cell.update_weights([engine], epoch, swap=WeightSwap.IN_FLIGHT)
    samples = ray.get(pending)

    new_version = report.version
    assert new_version == old_version + 1 and not report.failed
    assert ray.get(engine.weights_checksum.remote()) == cell.weights_checksum()
    spanning = [s for s in samples if len(set(s.token_versions)) == 2]
    assert spanning, [s.token_versions for s in samples]
    assert all(s.token_versions == sorted(s.token_versions) for s in samples)
    error = _log_prob_error(samples, {old_version: old_model, new_version: cell.model.eval()})
    print(f"in-flight swap v{old_version}->v{new_version}: {len(spanning)}/{len(samples)} "
          f"samples span both; max log-prob error {error:.2e}")
    assert error < LOG_PROB_TOLERANCE
    assert ledger.verify("in-flight").ok
    ledger.close()


def test_abort_mode_returns_the_tokens_so_far_as_aborted(engine):
    ray.get(engine.set_pause_mode.remote("abort"))
    epoch = ray.get(engine.health.remote())["epoch"]
    ray.get(engine.pause_after_next_tokens.remote())

    pending = engine.generate.remote(TASK.make_prompt(2), 4, 2)
    wait_until(lambda: ray.get(engine.health.remote(), timeout=30)["paused"],
               what="the engine pausing after its next tokens", timeout_s=120)
    ray.get(engine.begin_update.remote(epoch))
    samples = ray.get(pending)
    ray.get(engine.continue_generation.remote(epoch))
    ray.get(engine.set_pause_mode.remote("in_place"))

    unfinished = [s for s in samples if s.response_tokens[-1:] != [TOKENIZER.eos_id]]
    assert unfinished and all(s.status is SampleStatus.ABORTED for s in unfinished)
    assert all(len(s.response_tokens) == 1 and s.reward == 0.0 for s in unfinished)
    assert all(len(s.rollout_log_probs) == len(s.token_versions) == 1 for s in unfinished)


def test_a_stale_epoch_is_refused_and_changes_nothing(engine, model_dir):
    before = ray.get(engine.health.remote())
    checksum = ray.get(engine.weights_checksum.remote())
    epoch = before["epoch"]
    tensors = read_checkpoint(model_dir)

    for call in (engine.begin_update.remote(epoch - 1),
                 engine.load_weights.remote(tensors, epoch - 1),
                 engine.update_weight_version.remote(before["version"] + 1, epoch - 1),
                 engine.continue_generation.remote(epoch - 1),
                 engine.stamp_and_resume.remote(before["version"] + 1, epoch - 1),
                 engine.stage_weights.remote(tensors, epoch - 1),
                 engine.swap_and_stamp.remote(before["version"] + 1, epoch - 1)):
        with pytest.raises(StaleEpochError):
            ray.get(call)
    with pytest.raises(EngineStateError):  # weights only into a paused engine
        ray.get(engine.load_weights.remote(tensors, epoch))
    ray.get(engine.begin_update.remote(epoch))
    with pytest.raises(PolicyError):  # a foreign model's names: nothing loaded
        ray.get(engine.load_weights.remote({"transformer.wte.weight": torch.zeros(2, 2)}, epoch))
    ray.get(engine.continue_generation.remote(epoch))

    after = ray.get(engine.health.remote())
    assert (after["version"], after["epoch"], after["weight_loads"]) == (
        before["version"], before["epoch"], before["weight_loads"])
    assert ray.get(engine.weights_checksum.remote()) == checksum
    assert all(s.token_versions == [before["version"]] * len(s.response_tokens)
               for s in _generate(engine, 2, 3))


def test_a_sampled_eos_completes_the_sample(engine, model_dir):
    # Weights that say EOS at every position: a constant residual stream v, and only the EOS
    # row of the output layer points along it.
    tensors = read_checkpoint(model_dir)
    direction = torch.randn(tensors["model.norm.weight"].shape[0])
    tensors["model.embed_tokens.weight"][:] = direction
    for name in tensors:
        if name.endswith(("o_proj.weight", "down_proj.weight")):
            tensors[name].zero_()
    tensors["lm_head.weight"].zero_()
    tensors["lm_head.weight"][TOKENIZER.eos_id] = 10 * direction
    epoch = ray.get(engine.health.remote())["epoch"]
    ray.get(engine.begin_update.remote(epoch))
    ray.get(engine.load_weights.remote(tensors, epoch))
    ray.get(engine.continue_generation.remote(epoch))

    samples = _generate(engine, 4, 4)

    assert all(s.response_tokens == [TOKENIZER.eos_id] for s in samples)
    assert all(s.status is SampleStatus.COMPLETED and s.reward == 0.0 for s in samples)
