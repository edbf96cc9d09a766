"""The rollout path: data contracts (types), prompts (data_source), the staleness-aware data
buffer (data_buffer), producer and drain (producer), and the RolloutManager (manager)."""
