"""Generate the example's data and tokenizer (nothing is downloaded).

    python examples/math/make_data.py            # writes examples/math/data/ and tokenizer/
    python examples/math/make_data.py --model    # also model/: a tiny HF Llama (run-hf.yaml)

* ``data/train.jsonl``: word problems ``{"prompt", "label", "metadata"}`` over small numbers
  (sums and differences 0..9), seeded, so the same command makes the same file;
* ``data/test.parquet``: held-out problems, in Parquet (both formats are read);
* ``tokenizer/``: a one-token-per-character Hugging Face tokenizer with a chat template, made
  locally with ``tokenizers`` (:func:`orchestrator.rollout.data.tokenizer.build_char_tokenizer`);
* ``model/`` (with ``--model``): a tiny random Hugging Face Llama over that tokenizer's ids,
  with the same tokenizer and template saved beside its weights, for ``run-hf.yaml`` (vLLM
  engines and the HF policy). Not committed: the command makes the same model again.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

HERE = Path(__file__).resolve().parent
NAMES = ("Ana", "Ben", "Kim", "Lou", "Max", "Sam")
THINGS = ("apples", "books", "coins", "pens")
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message['role'][0] }}:{{ message['content'] }}\n"
    "{% endfor %}{% if add_generation_prompt %}a:{% endif %}"
)


def problem(rng: random.Random) -> dict:
    """One word problem whose answer is a single digit."""
    name, thing = rng.choice(NAMES), rng.choice(THINGS)
    if rng.random() < 0.5:
        left, right = rng.randint(0, 4), rng.randint(0, 4)
        text = f"{name} has {left} {thing} and gets {right} more. How many?"
        answer, kind = left + right, "add"
    else:
        left = rng.randint(1, 9)
        right = rng.randint(0, left)
        text = f"{name} has {left} {thing} and gives away {right}. How many?"
        answer, kind = left - right, "sub"
    return {"prompt": text, "label": str(answer), "metadata": {"kind": kind}}


def alphabet(rows: list[dict]) -> str:
    """Every character the prompts, answers and chat template use."""
    text = "".join(row["prompt"] + row["label"] for row in rows) + "usera:0123456789"
    return "".join(sorted(set(text)))


def write_model(tokenizer_dir: Path, model_dir: Path, characters: str, seed: int) -> Path:
    """A tiny HF Llama whose token ids are the tokenizer's, saved with that tokenizer."""
    from actors.policies.hf_policy import TinyLlamaSizes, ensure_task_model
    from orchestrator.rollout.data.tokenizer import HFTokenizer, build_char_tokenizer

    tokenizer = HFTokenizer(tokenizer_dir)
    symbols = tokenizer.hf.convert_ids_to_tokens(list(range(tokenizer.vocab_size)))
    # A context for the longest templated prompt (run-hf.yaml's max-prompt-len) and its answer.
    ensure_task_model(model_dir, symbols, seed=seed,
                      sizes=TinyLlamaSizes(max_position_embeddings=80))
    return build_char_tokenizer(model_dir, characters, CHAT_TEMPLATE)  # same ids, templated


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=256)
    parser.add_argument("--test-rows", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=HERE)
    parser.add_argument("--model", action="store_true",
                        help="also write model/, a tiny HF Llama over the tokenizer's ids")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    train = [problem(rng) for _ in range(args.rows)]
    test = [problem(rng) for _ in range(args.test_rows)]
    data = args.out / "data"
    data.mkdir(parents=True, exist_ok=True)
    (data / "train.jsonl").write_text("".join(json.dumps(row) + "\n" for row in train))

    import pyarrow as pa
    from pyarrow import parquet

    parquet.write_table(pa.Table.from_pylist(test), data / "test.parquet")
    from orchestrator.rollout.data.tokenizer import build_char_tokenizer

    build_char_tokenizer(args.out / "tokenizer", alphabet(train + test), CHAT_TEMPLATE)
    if args.model:
        write_model(args.out / "tokenizer", args.out / "model", alphabet(train + test), args.seed)
    print(f"wrote {len(train)} train rows, {len(test)} test rows and a tokenizer under "
          f"{args.out}")


if __name__ == "__main__":
    main()
