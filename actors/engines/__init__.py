"""Rollout engines: the engine protocol, the built-in engine and the vLLM engine."""
