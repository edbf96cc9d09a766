"""The vLLM rollout engine: :mod:`.engine` (the actor), :mod:`.args` (how vLLM starts),
:mod:`.serving` and :mod:`.requests` (generate on vLLM's scheduler), :mod:`.weights` (the
logical weights and LoRA merges). Importing this package does not import vLLM."""
