"""Does a model's tokenizer speak the task's vocabulary? Checked without torch.

The toy task's prompts are token ids and its reward decodes response ids with the task's own
symbol list (:mod:`actors.task`), so a model trained on it must map each symbol to the task's
id. The driver checks that before anything starts; importing torch and ``transformers`` for it
would put seconds of imports on the start-up's critical path, so a ``tokenizer.json`` (every
fast tokenizer has one) is read with ``tokenizers`` alone. A directory without one (a slow,
sentencepiece-only tokenizer) falls back to ``transformers.AutoTokenizer``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from actors.errors import PolicyError

__all__ = ["check_task_vocabulary", "offline", "tokenizer_vocabulary"]

TOKENIZER_FILE = "tokenizer.json"


def offline() -> None:
    """Never reach a hub: every load in this project is local."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def tokenizer_vocabulary(model_dir: str | Path) -> Mapping[str, int]:
    """Every token of the tokenizer in ``model_dir`` (added tokens included), with its id.

    Raises:
        PolicyError: no readable tokenizer in the directory.
    """
    tokenizer_file = Path(model_dir) / TOKENIZER_FILE
    if tokenizer_file.is_file():
        from tokenizers import Tokenizer

        try:
            return Tokenizer.from_file(str(tokenizer_file)).get_vocab(with_added_tokens=True)
        except Exception as exc:  # noqa: BLE001 - tokenizers raises a bare Exception on bad JSON
            raise PolicyError(f"no tokenizer in {model_dir}: {tokenizer_file} is unreadable: "
                              f"{exc}") from None
    offline()
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    except (OSError, ValueError) as exc:
        raise PolicyError(f"no tokenizer in {model_dir}: {exc}") from None
    return tokenizer.get_vocab()


def check_task_vocabulary(model_dir: str | Path, symbols: Sequence[str]) -> None:
    """Check that the tokenizer in ``model_dir`` maps ``symbols[i]`` to id ``i``.

    Raises:
        PolicyError: no tokenizer, or a symbol with another id (the model would be trained on
            ids that mean something else to it).
    """
    vocabulary = tokenizer_vocabulary(model_dir)
    wrong = [(s, i, vocabulary.get(s)) for i, s in enumerate(symbols) if vocabulary.get(s) != i]
    if wrong:
        raise PolicyError(
            f"{model_dir}: the tokenizer does not speak the task's vocabulary "
            f"(symbol, task id, model id): {wrong[:4]}; the addition task needs a model whose "
            "tokenizer maps its symbols to its ids (omit --model to get one)"
        )
