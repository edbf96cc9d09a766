"""The rollout path: prompts in, training batches out, staleness measured against the ledger.

One job per module, listed from the contracts up to the manager (each imports only modules
above it, plus ``ledger``):

* ``errors``: the rollout path's exception tree (version refusals, a dead producer).
* ``types``: contracts: Prompt, Sample, Group, the rollout function's input and output, the
  EnginePool the control plane injects and the RolloutConfig protocol. Importable without
  Ray or the ledger (actors import it).
* ``data_source``: PromptSource, fresh prompts from a deterministic factory, in index order.
* ``data/``: a data-set task's prompts (``--prompt-data``): files and their identity, the HF
  tokenizer, the stream position -> (epoch, row) -> Prompt.
* ``prompt_tracker``: where every prompt is (in flight, buffered, claimed, pending, trained,
  dropped), recycling and starvation, the accounting of invariant 7.
* ``staleness``: the screen: train, recycle or drop one finished group.
* ``step_metrics``: per-step rollout metrics under ``rollout/fully_async/``.
* ``admission``: AdmissionControl, the staleness-aware bound on starting a group.
* ``data_buffer``: DataBuffer, the bounded queue between producer and drain.
* ``producer``: FullyAsyncRolloutFn, the producer loop over the engines (paced by admission)
  and the drain.
* ``manager_state``: a new manager's prompt state, rebuilt from the ledger's account.
* ``manager``: RolloutManager, the owner of one run's rollout, version from the ledger (the
  control plane runs it as a Ray actor).

Nothing here imports Ray, the control plane, the drills or the actors. This ``__init__``
imports nothing, so ``orchestrator.rollout.types`` stays light.
"""
