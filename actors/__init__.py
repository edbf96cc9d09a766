"""Ray actors that hold tensors: the policy, rollout engines, train cells, weight sync.

Modules (import them directly; this package imports nothing heavy):

- ``actors.task``: the verifiable toy task (two-digit addition) and its exact reward.
- ``actors.policies.policy``: the policy, megatron-core ``GPTModel`` on CPU or its plain-torch twin;
  ``build_policy(backend, config, seed)``; LoRA adapters.
- ``actors.grpo``: the GRPO objective (group-normalised advantages, clipped ratio).
- ``actors.engines.rollout_engine``: ``RolloutEngine`` (sampling, pause/continue, epoch fence).
- ``actors.publishing.sequence``: THE weight-update sequence (DESIGN section 5) and its named fault
  points; ``actors.publishing.records``: the publisher's ledger writes.
- ``actors.publishing.weight_sync``: the engine side of an update (pause, stage, load, the one
  ``finalize_and_resume_engines``); ``actors.transport``: ``Transport`` (``full`` | ``lora``)
  and the one LoRA-tensor rule.
- ``actors.train_cell``: ``TrainCell`` (GRPO step, cross-cell gradient averaging,
  ``update_weights`` running the sequence, checkpoints, state for healing).
- ``actors.errors``: the exception tree (one root, ``ActorError``).

Classes are plain; callers make them remote where they allocate them, e.g.
``ray.remote(**ROLLOUT_ENGINE_ACTOR_OPTIONS)(RolloutEngine)``. Actors import ``ledger`` and
``orchestrator.rollout.types`` only.
"""
