"""The peer side of ``bench/vs_peer.py``: Hugging Face TRL's ``GRPOTrainer`` on the task model.

    python bench/_trl_peer.py --model DIR --seed S --steps N --out FILE [--threshold 0.4]

Not a benchmark itself: ``vs_peer.py`` runs it as a subprocess of ``--peer-python`` (which
needs ``trl``; this checkout is put on its ``PYTHONPATH`` for ``actors.task``). One process,
HF ``generate`` on the CPU, the same :class:`actors.task.AdditionTask` prompts (in index order,
16 per step) and reward (scored on the completion's token ids, EOS included), and the same
hyper-parameters as rl-ledger's defaults: 16 prompts x 8 samples, AdamW lr 3e-3 constant,
no weight decay, grad-norm clip 1.0, no KL (``beta=0``), clip 0.2/0.28, token-mean loss
(``dapo``), one optimizer step per batch, temperature 1, 3 new tokens.

Writes one JSON line per step to ``--out``: ``{"step", "reward", "time"}`` (``time`` is
``time.time()`` at the end of the step).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from actors.task import TOKENIZER, AdditionTask


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--prompts-per-step", type=int, default=16)
    parser.add_argument("--samples-per-prompt", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=3)
    args = parser.parse_args()

    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    task = AdditionTask(seed=args.seed)
    prompts = [task.make_prompt(i) for i in range(args.steps * args.prompts_per_step)]
    dataset = Dataset.from_dict({
        "prompt": [TOKENIZER.decode(p.tokens) for p in prompts],
        "label": [p.label for p in prompts],
        "index": [p.index for p in prompts],
    })
    by_index = {p.index: p for p in prompts}

    def addition_reward(prompts, completions, completion_ids, index, **_) -> list[float]:
        return [task.reward(by_index[i], ids) for i, ids in zip(index, completion_ids)]

    out = Path(args.out)

    class StepTimes(TrainerCallback):
        def on_log(self, _args, state, _control, logs=None, **_) -> None:
            if logs and "reward" in logs:
                with out.open("a", encoding="utf-8") as sink:
                    sink.write(json.dumps({"step": state.global_step,
                                           "reward": float(logs["reward"]),
                                           "time": time.time()}) + "\n")

    config = GRPOConfig(
        output_dir=str(out.parent / f"trl-out-{args.seed}"),
        per_device_train_batch_size=args.prompts_per_step * args.samples_per_prompt,
        gradient_accumulation_steps=1,
        num_generations=args.samples_per_prompt,
        max_completion_length=args.max_new_tokens,
        learning_rate=3e-3,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.0,
        max_grad_norm=1.0,
        beta=0.0,
        epsilon=0.2,
        epsilon_high=0.28,
        loss_type="dapo",
        num_iterations=1,
        temperature=1.0,
        top_p=1.0,
        max_steps=args.steps,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        seed=args.seed,
        shuffle_dataset=False,
        remove_unused_columns=False,
        dataloader_num_workers=0,
        disable_tqdm=True,
    )
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32,
                                                 local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(args.model, local_files_only=True)
    trainer = GRPOTrainer(model=model, reward_funcs=addition_reward, args=config,
                          train_dataset=dataset, processing_class=tokenizer,
                          callbacks=[StepTimes()])
    trainer.train()


if __name__ == "__main__":
    main()
