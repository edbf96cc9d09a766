"""Built-in engine tokens/s at response lengths 8, 64 and 512 (issue 20, item 4).

    python bench/response_length.py [--lengths 8 64 512] [--repeat 3] [--samples 8]

One ``RolloutEngine`` per length (built in this process, no Ray: the engine class is plain), the
GPT policy at its run sizes (hidden 64, 2 layers) with a context of prompt + length, one
generate call of ``--samples`` samples per repeat, lengths alternated within each repeat so
load drifts hit them alike. The engine's task is a benchmark double whose EOS is never
sampled, so every sample runs to the full length. Reports response tokens/s, median and spread.

Read it knowing the engine: the built-in sampler re-runs the whole sequence per token (no KV
cache), so a token at position t costs O(t): tokens/s falls roughly with length. A vLLM engine
(``--engine vllm``) keeps a KV cache. Prints a table; asserts nothing.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from actors.engines.rollout_engine import RolloutEngine
from actors.policies.policy import PolicyConfig
from orchestrator.rollout.types import Prompt

PROMPT = Prompt(index=0, tokens=tuple(range(3, 19)), label="")  # 16 prompt tokens
VOCAB = 64


class _NoEosTokenizer:
    pad_id = 0
    eos_id = VOCAB  # outside the vocabulary: never sampled
    vocab_size = VOCAB


class _LengthTask:
    """Benchmark double: generation always runs to max_new_tokens; rewards are 0."""

    tokenizer = _NoEosTokenizer()

    def score_group(self, prompt, responses):
        return [0.0] * len(responses)


def engine(length: int) -> RolloutEngine:
    config = PolicyConfig(vocab_size=VOCAB, max_sequence_length=len(PROMPT.tokens) + length)
    return RolloutEngine(f"bench-{length}", "torch", config, seed=0, task=_LengthTask(),
                         sampling={"temperature": 1.0, "top_p": 1.0, "max_new_tokens": length})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[8, 64, 512])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--samples", type=int, default=8)
    args = parser.parse_args()
    torch.set_num_threads(1)
    engines = {length: engine(length) for length in args.lengths}
    for length, built in engines.items():
        built.generate(PROMPT, 2, 0)  # warm
    rates: dict[int, list[float]] = {length: [] for length in args.lengths}
    for _ in range(args.repeat):
        for length, built in engines.items():
            started = time.perf_counter()
            samples = built.generate(PROMPT, args.samples, 0)
            seconds = time.perf_counter() - started
            tokens = sum(len(sample.response_tokens) for sample in samples)
            assert tokens == length * args.samples, "a sample stopped early"
            rates[length].append(tokens / seconds)
    base = statistics.median(rates[args.lengths[0]])
    print(f"built-in engine, {args.samples} samples per call, {args.repeat} repeats")
    print(f"{'length':>7}  {'tokens/s median':>15}  {'min-max':>15}  {'vs first':>8}")
    for length in args.lengths:
        median = statistics.median(rates[length])
        print(f"{length:>7}  {median:>15.0f}  {min(rates[length]):>7.0f}-"
              f"{max(rates[length]):<7.0f}  {median / base:>8.2f}")


if __name__ == "__main__":
    main()
