"""Built-in engine tokens/s at response lengths 8, 64 and 512 (issue 20, item 4).

    python bench/response_length.py [--lengths 8 64 512] [--repeat 3] [--samples 8]

One ``RolloutEngine`` per length (built in this process, no Ray: the engine class is plain), the
GPT policy at its run sizes (hidden 64, 2 layers) with a context of prompt + length, one
generate call of ``--samples`` samples per repeat, lengths alternated within each repeat so
load drifts hit them alike. The engine's task is a benchmark double whose EOS is never
sampled, so every sample runs to the full length. Reports response tokens/s, median and spread.

Two decode paths side by side, alternated within each repeat: ``kv-cache`` (the engine as it
runs: each step extends a key/value cache) and ``full-prefix`` (the engine before it had one:
each step re-runs the whole sequence, so a token at position t costs O(t)). Prints a table
(tokens/s, the ratio to the first length, and cache/full-prefix); asserts nothing.
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


class _FullPrefixEngine(RolloutEngine):
    """The engine without its cache: every decode step runs every position."""

    def _forward_step(self, tokens: torch.Tensor, decoder: object) -> torch.Tensor:
        return self.model(tokens)[:, -1, :].float()


MODES = {"kv-cache": RolloutEngine, "full-prefix": _FullPrefixEngine}


def engine(length: int, mode: str) -> RolloutEngine:
    config = PolicyConfig(vocab_size=VOCAB, max_sequence_length=len(PROMPT.tokens) + length)
    return MODES[mode](f"bench-{length}", "torch", config, seed=0, task=_LengthTask(),
                       sampling={"temperature": 1.0, "top_p": 1.0, "max_new_tokens": length})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[8, 64, 512])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--samples", type=int, default=8)
    args = parser.parse_args()
    torch.set_num_threads(1)
    cases = [(length, mode) for length in args.lengths for mode in MODES]
    engines = {case: engine(*case) for case in cases}
    for built in engines.values():
        built.generate(PROMPT, 2, 0)  # warm
    rates: dict[tuple[int, str], list[float]] = {case: [] for case in cases}
    for repeat in range(args.repeat):
        order = cases if repeat % 2 == 0 else cases[::-1]
        for case in order:
            started = time.perf_counter()
            samples = engines[case].generate(PROMPT, args.samples, 0)
            seconds = time.perf_counter() - started
            tokens = sum(len(sample.response_tokens) for sample in samples)
            assert tokens == case[0] * args.samples, "a sample stopped early"
            rates[case].append(tokens / seconds)
    median = {case: statistics.median(values) for case, values in rates.items()}
    print(f"built-in engine, {args.samples} samples per call, {args.repeat} repeats "
          "(alternating)")
    print(f"{'length':>7}  {'mode':>11}  {'tokens/s median':>15}  {'min-max':>15}  "
          f"{'vs first':>8}  {'cache/full':>10}")
    for length, mode in cases:
        values = rates[(length, mode)]
        speedup = median[(length, "kv-cache")] / median[(length, "full-prefix")]
        print(f"{length:>7}  {mode:>11}  {median[(length, mode)]:>15.0f}  "
              f"{min(values):>7.0f}-{max(values):<7.0f}  "
              f"{median[(length, mode)] / median[(args.lengths[0], mode)]:>8.2f}  "
              f"{speedup if mode == 'kv-cache' else 1.0:>10.2f}")

if __name__ == "__main__":
    main()
