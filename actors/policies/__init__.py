"""Policies: the built-in causal LM (torch and megatron-core), the Hugging Face Llama, and
the megatron <-> HF bridge."""
