"""A short seeded GRPO run really learns: mean reward rises far above its first steps.

In-process (no Ray): one RolloutEngine and one TrainCell as plain objects, with the real weight
update path and a real SQLite ledger. Weights are published every second step, so half the
batches are one version behind the trainer and the clipped importance ratio is exercised.

With the defaults of issue 11: the engine runs with partial rollout (pause mode in_place), and
every publish lands while two groups of the next batch are being generated, so those groups
continue under the new weights and are trained with tokens of two versions (per-token
versions and log-probs). Without partial rollout (pause mode abort) those groups come back
aborted and are generated again, as the rollout path recycles them; partial rollout is the
default because it learns as well (second half within 10%, mean of seeds 0-2). With
``--transport lora``, only the adapters train, at the run's LoRA defaults (rank, alpha,
learning rate from ``RunConfig``).
"""

from __future__ import annotations

import statistics
import threading
import time
from dataclasses import dataclass, field

import pytest

from actors.policies.policy import PolicyConfig
from actors.engines.rollout_engine import RolloutEngine
from actors.task import TOKENIZER, AdditionTask
from actors.train_cell import TrainCell
from ledger import Ledger
from orchestrator.config import RunConfig
from orchestrator.control.launch import policy_config
from orchestrator.rollout.types import SampleStatus

STEPS = 40
PROMPTS_PER_STEP = 16
SAMPLES_PER_PROMPT = 8
PUBLISH_EVERY = 2
STRADDLING_GROUPS = 2  # groups of the next batch in flight when a publish lands
WINDOW = 5
# A randomly initialised policy earns ~0.04 (format credit is rare). 40 steps reach ~0.42 on
# both backends and seeds 0-2; the margin below is what chance does not reach.
MIN_GAIN = 0.2
MIN_FINAL = 0.25
LEARNING_SEEDS = (0, 1, 2)  # partial rollout against abort: the mean over these


class PacedEngine(RolloutEngine):
    """The built-in engine, slowed per decode step while ``pace_s`` is set, so that a publish
    can land in the middle of a generation."""

    pace_s = 0.0

    def _before_token(self) -> None:
        if self.pace_s:
            time.sleep(self.pace_s)


@dataclass
class LearningRun:
    rewards: list[float] = field(default_factory=list)
    clip_fractions: list[float] = field(default_factory=list)
    published: list[int] = field(default_factory=list)
    spanning_samples: int = 0
    aborted_samples: int = 0

    @property
    def first(self) -> float:
        return statistics.mean(self.rewards[:WINDOW])

    @property
    def last(self) -> float:
        return statistics.mean(self.rewards[-WINDOW:])


def _publish_while_generating(engine: PacedEngine, cell: TrainCell, epoch: int,
                              prompts: list) -> tuple[int, list]:
    """Start generating ``prompts`` (one call each), publish once every call has decoded a
    token, then return the version and the finished groups."""
    groups: dict[int, list] = {}
    engine.pace_s = 0.01
    decoded_before = engine.health()["decode_steps"]
    threads = [
        threading.Thread(target=lambda p=p: groups.__setitem__(
            p.index, engine.generate(p, SAMPLES_PER_PROMPT, p.index)))
        for p in prompts
    ]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 30
    while engine.health()["decode_steps"] < decoded_before + len(prompts):
        assert time.monotonic() < deadline, "the straddling generations never started"
        time.sleep(0.001)
    version = cell.update_weights([engine], epoch).version
    engine.pace_s = 0.0
    for thread in threads:
        thread.join(timeout=30)
    return version, [groups[p.index] for p in prompts]


def _learn(backend: str, sqlite_url: str, config: PolicyConfig, *, transport: str = "full",
           learning_rate: float = 3e-3, partial_rollout: bool = True,
           straddling_groups: int = STRADDLING_GROUPS, seed: int = 0,
           ) -> tuple[LearningRun, PacedEngine, Ledger]:
    task = AdditionTask(seed=seed)
    engine = PacedEngine("engine-0", backend, config, seed=seed, task=task,
                         partial_rollout=partial_rollout)
    cell = TrainCell("cell-0", backend, config, seed=seed, transport=transport,
                     learning_rate=learning_rate, ledger_url=sqlite_url, run_id="learn")
    ledger = Ledger.open(sqlite_url)
    ledger.start_run("learn")
    epoch = ledger.promote("learn", "cell-0", reason="start")

    run = LearningRun()
    prompt_index = 0
    carried: list = []  # groups generated across the last publish
    for step in range(STEPS):
        groups = list(carried)
        while len(groups) < PROMPTS_PER_STEP:
            prompt = task.make_prompt(prompt_index)
            groups.append(engine.generate(prompt, SAMPLES_PER_PROMPT, prompt_index))
            prompt_index += 1
        run.spanning_samples += sum(1 for group in groups for s in group if s.version_span > 0)
        metrics = cell.train_step(groups)
        run.rewards.append(metrics["reward_mean"])
        run.clip_fractions.append(metrics["clip_fraction"])
        carried = []
        if step % PUBLISH_EVERY == PUBLISH_EVERY - 1:
            next_prompts = [task.make_prompt(prompt_index + i) for i in range(straddling_groups)]
            prompt_index += straddling_groups
            version, carried = _publish_while_generating(engine, cell, epoch, next_prompts)
            run.published.append(version)
            run.aborted_samples += sum(
                1 for group in carried for s in group if s.status is SampleStatus.ABORTED)
            # Aborted groups are generated again (the rollout path recycles them).
            carried = [
                engine.generate(prompt, SAMPLES_PER_PROMPT, prompt.index)
                if any(s.status is SampleStatus.ABORTED for s in group) else group
                for prompt, group in zip(next_prompts, carried)
            ]
    cell.close()
    return run, engine, ledger


@pytest.mark.parametrize("backend", ["torch", "megatron"])
def test_short_grpo_run_raises_mean_reward(backend: str, sqlite_url: str) -> None:
    config = PolicyConfig(vocab_size=TOKENIZER.vocab_size)
    run, engine, ledger = _learn(backend, sqlite_url, config)

    print(f"{backend}: mean reward first {WINDOW} steps {run.first:.3f}, last {WINDOW} "
          f"{run.last:.3f}, max clip fraction {max(run.clip_fractions):.3f}, "
          f"{run.spanning_samples} samples trained across an update")
    assert run.last >= run.first + MIN_GAIN, (run.first, run.last)
    assert run.last >= MIN_FINAL, run.last
    assert run.published == list(range(1, STEPS // PUBLISH_EVERY + 1))
    assert engine.health()["version"] == run.published[-1]
    assert max(run.clip_fractions) > 0  # stale batches were corrected by the clipped ratio
    # Partial rollout: generations a publish paused went on under the new weights.
    assert run.spanning_samples > 0
    assert run.aborted_samples == 0
    report = ledger.verify("learn")
    assert report.ok, report.problems
    assert report.unstamped_versions == []
    ledger.close()


def test_partial_rollout_learns_as_well_as_aborting(tmp_path) -> None:
    """The default's justification: same seeds and steps, the mean reward of the second half
    of the runs with partial rollout is within 10% of the runs whose updates abort generation
    in flight, over seeds 0-2.

    One seed per side was not enough. The straddling groups draw from the engine's one
    sampling generator in whatever order their threads reach it, and the publish lands at
    whichever decode step the pacing allows. So every run diverges from its twin after the
    first publish, and one 40-step trajectory against another is a single draw of a noisy
    ratio: 0.897x and 0.893x in two CI runs (2026-12-04), 0.96-1.14x elsewhere. The mean over
    three seeds is what the default rests on."""
    config = PolicyConfig(vocab_size=TOKENIZER.vocab_size)
    late: dict[bool, list[float]] = {True: [], False: []}
    for seed in LEARNING_SEEDS:
        for partial in (True, False):
            url = f"sqlite:///{tmp_path / f'partial-{partial}-seed{seed}.db'}"
            run, _, ledger = _learn("torch", url, config, partial_rollout=partial, seed=seed)
            ledger.close()
            late[partial].append(statistics.mean(run.rewards[STEPS // 2:]))
            if partial:  # paused groups went on under the new weights
                assert run.aborted_samples == 0 and run.spanning_samples > 0
            else:  # paused groups were aborted and generated again
                assert run.aborted_samples > 0 and run.spanning_samples == 0

    mean = {partial: statistics.mean(rewards) for partial, rewards in late.items()}
    print(f"steps {STEPS // 2 + 1}-{STEPS}, seeds {LEARNING_SEEDS}: partial rollout "
          f"{late[True]} (mean {mean[True]:.3f}), abort {late[False]} (mean {mean[False]:.3f})")
    assert mean[True] >= 0.9 * mean[False]


def test_lora_run_with_its_defaults_raises_mean_reward(sqlite_url: str) -> None:
    """Publishes land between generations here (no group straddles one): which tokens a
    straddling group decodes before the pause depends on thread timing, and this test is about
    what LoRA learns, so it runs the same on a loaded machine as on an idle one."""
    defaults = RunConfig(transport="lora")
    run, engine, ledger = _learn("torch", sqlite_url, policy_config(defaults), transport="lora",
                                 learning_rate=defaults.lora_lr, straddling_groups=0)

    print(f"lora (rank {defaults.lora_rank}, alpha {defaults.lora_alpha:g}, lr "
          f"{defaults.lora_lr:g}): mean reward first {WINDOW} steps {run.first:.3f}, last "
          f"{WINDOW} {run.last:.3f}")
    assert run.last >= run.first + MIN_GAIN, (run.first, run.last)
    assert run.last >= MIN_FINAL, run.last
    assert engine.health()["version"] == run.published[-1]
    assert ledger.verify("learn").ok
    ledger.close()
