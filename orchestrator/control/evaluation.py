"""Evaluation between train steps: each eval set scored on the engines, recorded in the ledger.

Every ``eval_interval`` steps (and after the last), after the step's publish, the driver asks
:class:`Evaluator` to score every eval set (``--eval-prompt-data NAME PATH``, read and rendered
like the training data: same tokenizer, template and reward) on the current weights:
``n_samples_per_eval_prompt`` samples per prompt, generated on the rollout engines (round robin)
beside the running producer. Eval prompts never enter the rollout's buffer or prompt tracker,
so the staleness accounting and the prompt account are untouched.

Per set: ``mean_reward`` over samples and ``pass@k`` (k = samples per prompt: the fraction of
prompts with a sample whose reward is at least 1.0); samples whose reward function raised are
counted in ``reward_errors`` and left out of both. Each set's result is one ``eval_finished``
event (name, the version evaluated, the set's digest, metrics): ``ledger evals`` lists them,
``ledger lineage V`` shows how V scored. The trackers get ``eval/<name>/<metric>``.
"""

from __future__ import annotations

import logging
from typing import Any

from ledger import EventKind, Ledger
from orchestrator.config import RunConfig
from orchestrator.control.task_setup import eval_sets

__all__ = ["Evaluator", "score_samples"]

logger = logging.getLogger(__name__)


def score_samples(groups: list[list[Any]]) -> dict[str, float]:
    """``mean_reward``, ``pass@k`` and ``reward_errors`` of one eval set's sample groups."""
    rewards, passed, errors, prompts = [], 0, 0, 0
    for samples in groups:
        scored = [sample for sample in samples if not sample.reward_error]
        errors += len(samples) - len(scored)
        if not scored:
            continue
        prompts += 1
        rewards += [sample.reward for sample in scored]
        passed += any(sample.reward >= 1.0 for sample in scored)
    k = max((len(samples) for samples in groups), default=1)
    return {"mean_reward": sum(rewards) / len(rewards) if rewards else 0.0,
            f"pass@{k}": passed / prompts if prompts else 0.0,
            "reward_errors": float(errors)}


class Evaluator:
    """Scores the run's eval sets when due; does nothing without ``eval_prompt_data``."""

    def __init__(self, config: RunConfig, ledger: Ledger, run_id: str, tracker: Any) -> None:
        self.config = config
        self.ledger = ledger
        self.run_id = run_id
        self.tracker = tracker

    def due(self, step: int) -> bool:
        """True after step ``step`` (0-based) when an evaluation is due."""
        interval = self.config.eval_interval
        if interval is None or not self.config.eval_prompt_data:
            return False
        return (step + 1) % interval == 0 or step + 1 == self.config.num_rollout

    def after_step(self, step: int, engines: dict[str, Any]) -> dict[str, float]:
        """Evaluate every set if due (see the module docstring); returns the tracker metrics.

        Raises:
            RayActorError: an engine died during the evaluation (the supervisor's business).
            LedgerError: ``eval_finished`` could not be appended.
        """
        if not self.due(step):
            return {}
        import ray

        version = self.ledger.head(self.run_id).version
        handles = list(engines.values())
        metrics: dict[str, float] = {}
        n = self.config.n_samples_per_eval_prompt
        for name, evaluation in eval_sets(self.config).items():
            length = self.config.eval_max_response_len
            calls = [handles[index % len(handles)].generate.remote(prompt, n, index, length)
                     for index, prompt in enumerate(evaluation.prompts)]
            scores = score_samples(ray.get(calls))
            self.ledger.append(self.run_id, EventKind.EVAL_FINISHED, {
                "name": name, "version": version, "train_step": step + 1,
                "digest": evaluation.digest, "prompts": len(evaluation.prompts),
                "samples_per_prompt": n, "metrics": scores,
            }, idempotency_key=f"{self.run_id}:eval_finished:{name}:{step + 1}")
            metrics.update({f"eval/{name}/{key}": value for key, value in scores.items()})
            logger.info("eval %s at v%d (step %d): %s", name, version, step + 1, scores)
        self.tracker.log_step(step + 1, metrics)
        return metrics
