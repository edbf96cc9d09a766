"""Engines as the control plane sees them: the Ray engine pool and the vLLM engine launch."""
