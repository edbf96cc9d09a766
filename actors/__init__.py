"""Ray actors that hold tensors: the policy, rollout engines, train cells, weight sync.

Modules (import them directly; this package imports nothing heavy):

- ``actors.task``: the verifiable toy task (two-digit addition) and its exact reward.
- ``actors.policies.policy``: the policy, megatron-core ``GPTModel`` on CPU or its plain-torch twin;
  ``build_policy(backend, config, seed)``; LoRA adapters.
- ``actors.grpo``: the GRPO objective (group-normalised advantages, clipped ratio).
- ``actors.engines.rollout_engine``: ``RolloutEngine`` (sampling, pause/continue, epoch fence).
- ``actors.weight_sync``: ``full`` and ``lora`` transports and the one
  ``finalize_and_resume_engines``.
- ``actors.train_cell``: ``TrainCell`` (GRPO step, cross-cell gradient averaging,
  ``update_weights`` following DESIGN section 5, checkpoints, state for healing).
- ``actors.errors``: the exception tree.

Classes are plain; callers make them remote where they allocate them, e.g.
``ray.remote(**ROLLOUT_ENGINE_ACTOR_OPTIONS)(RolloutEngine)``. Actors import ``ledger`` and
``orchestrator.rollout.types`` only.
"""
