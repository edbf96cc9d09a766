"""One train cell as a bare process (no Ray), for the network-namespace rendezvous test.

``python -m tests.netns_cell STORE_ADDR RANK WORLD [--timeout S]`` builds a ``TrainCell``,
joins quorum 1 at ``STORE_ADDR`` as ``RANK`` of ``WORLD``, trains one step on its own batch and
prints one JSON line: ``{"ok", "world_size", "batch", "checksum"}`` or ``{"ok": false,
"error"}``. The test runs one copy inside a network namespace and one outside it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys

from actors.policies.policy import PolicyConfig
from actors.engines.rollout_engine import RolloutEngine
from actors.task import TOKENIZER, AdditionTask
from actors.train_cell import TrainCell

TASK = AdditionTask(seed=0)
CONFIG = PolicyConfig(vocab_size=TOKENIZER.vocab_size)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("store_addr")
    parser.add_argument("rank", type=int)
    parser.add_argument("world", type=int)
    parser.add_argument("--timeout", type=float, default=30.0)
    args = parser.parse_args()
    cell = TrainCell(f"cell-{args.rank}", "torch", CONFIG, 0,
                     collective_timeout_s=args.timeout)
    engine = RolloutEngine("engine-0", "torch", CONFIG, 0, TASK)
    start = 100 * args.rank  # each cell its own batch: only averaging makes them agree
    batch = [engine.generate(TASK.make_prompt(i), 4, i) for i in range(start, start + 4)]
    try:
        cell.configure_group(1, args.rank, args.world, args.store_addr)
        metrics = cell.train_step(batch)
    except Exception as exc:  # noqa: BLE001 - reported to the test as data
        print(json.dumps({"ok": False, "error": f"{type(exc).__name__}: {exc}"}), flush=True)
        return 1
    tokens = [sample.prompt_tokens + sample.response_tokens for group in batch for sample in group]
    print(json.dumps({"ok": True, "world_size": metrics["world_size"],
                      "batch": hashlib.sha256(repr(tokens).encode()).hexdigest()[:16],
                      "checksum": cell.weights_checksum()}), flush=True)
    cell.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
