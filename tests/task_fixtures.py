"""Local fixtures of data-set tasks: a tiny character tokenizer (with a chat template) and
JSONL / Parquet prompt files. Nothing is fetched from a hub."""

from __future__ import annotations

import json
from pathlib import Path

from orchestrator.rollout.data.tokenizer import build_char_tokenizer

CHAT_TEMPLATE = (
    "{% for message in messages %}[{{ message['role'] }}]{{ message['content'] }}\n"
    "{% endfor %}{% if add_generation_prompt %}[assistant]{% endif %}"
)
ALPHABET = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 +-*/=?.,:[]{}\\"


def make_tokenizer(directory: Path) -> Path:
    """A one-token-per-character tokenizer with :data:`CHAT_TEMPLATE` (ids 0-2: pad, eos, bos)."""
    return build_char_tokenizer(directory, ALPHABET, CHAT_TEMPLATE)


def addition_rows(count: int, offset: int = 0) -> list[dict]:
    """``count`` rows ``{"prompt": "a+b=", "label": "a+b", "metadata": {"n": i}}``."""
    rows = []
    for index in range(offset, offset + count):
        left, right = index % 5, (index // 5) % 5
        rows.append({"prompt": f"{left}+{right}=", "label": str(left + right),
                     "metadata": {"n": index}})
    return rows


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def write_parquet(path: Path, rows: list[dict]) -> Path:
    import pyarrow as pa
    from pyarrow import parquet

    parquet.write_table(pa.Table.from_pylist(rows), path)
    return path
