"""EagerAdamW: torch's AdamW bit for bit, and a train cell that never imports the compiler."""

from __future__ import annotations

import copy
import subprocess
import sys
import textwrap

import torch

from actors.optimizer import EagerAdamW

STEPS = 5


def _model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3))


def _train(model: torch.nn.Module, optimizer: torch.optim.Optimizer, steps: int,
           seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        optimizer.zero_grad(set_to_none=True)
        model(torch.randn(4, 6, generator=generator)).pow(2).sum().backward()
        optimizer.step()


def _same_parameters(left: torch.nn.Module, right: torch.nn.Module) -> bool:
    return all(torch.equal(a, b) for a, b in zip(left.parameters(), right.parameters(),
                                                  strict=True))


def _same_state(left: dict, right: dict) -> bool:
    if left["param_groups"] != right["param_groups"]:
        return False
    if left["state"].keys() != right["state"].keys():
        return False
    return all(torch.equal(left["state"][k][name], right["state"][k][name])
               for k in left["state"] for name in left["state"][k])


def test_eager_adamw_updates_and_saves_exactly_like_torch_adamw() -> None:
    options = {"lr": 3e-2, "weight_decay": 0.01, "betas": (0.9, 0.95)}
    eager_model, torch_model = _model(0), _model(0)
    eager = EagerAdamW(eager_model.parameters(), **options)
    reference = torch.optim.AdamW(torch_model.parameters(), **options)

    _train(eager_model, eager, STEPS, seed=1)
    _train(torch_model, reference, STEPS, seed=1)

    assert not _same_parameters(eager_model, _model(0))  # the steps did move the weights
    assert _same_parameters(eager_model, torch_model)
    assert _same_state(eager.state_dict(), reference.state_dict())


def test_a_checkpoint_of_either_optimizer_resumes_in_the_other() -> None:
    options = {"lr": 3e-2, "weight_decay": 0.01}
    eager_model, torch_model = _model(0), _model(0)
    eager = EagerAdamW(eager_model.parameters(), **options)
    reference = torch.optim.AdamW(torch_model.parameters(), **options)
    _train(eager_model, eager, 2, seed=1)
    _train(torch_model, reference, 2, seed=1)

    eager_resumed, torch_resumed = _model(0), _model(0)
    eager_resumed.load_state_dict(torch_model.state_dict())
    torch_resumed.load_state_dict(eager_model.state_dict())
    from_torch = EagerAdamW(eager_resumed.parameters(), **options)
    # Copies: a loaded state dict shares its tensors, and both sides go on training.
    from_torch.load_state_dict(copy.deepcopy(reference.state_dict()))
    from_eager = torch.optim.AdamW(torch_resumed.parameters(), **options)
    from_eager.load_state_dict(copy.deepcopy(eager.state_dict()))
    _train(eager_resumed, from_torch, 3, seed=2)
    _train(torch_resumed, from_eager, 3, seed=2)
    _train(eager_model, eager, 3, seed=2)

    assert _same_parameters(eager_resumed, eager_model)
    assert _same_parameters(torch_resumed, eager_model)
    assert _same_state(from_torch.state_dict(), from_eager.state_dict())


def test_a_train_cell_trains_heals_and_checkpoints_without_importing_the_compiler(
        tmp_path) -> None:
    """``torch.optim``'s wrappers import ``torch._dynamo`` (1.0-1.8 CPU-s) on first use; a
    cell's whole life (optimizer steps, healing state, checkpoint and restore) must not."""
    script = textwrap.dedent(f"""
        import sys
        from actors.engines.rollout_engine import RolloutEngine
        from actors.policies.policy import PolicyConfig
        from actors.task import TOKENIZER, AdditionTask
        from actors.train_cell import TrainCell

        task, config = AdditionTask(seed=0), PolicyConfig(vocab_size=TOKENIZER.vocab_size)
        engine = RolloutEngine("engine-0", "torch", config, 0, task)
        cell = TrainCell("cell-0", "torch", config, 0)
        for start in (0, 8):
            cell.train_step([engine.generate(task.make_prompt(i), 8, i)
                             for i in range(start, start + 8)])
        TrainCell("cell-1", "torch", config, 1).set_state(cell.get_state())
        cell.save_checkpoint({str(tmp_path / "ckpt.pt")!r})
        cell.load_checkpoint({str(tmp_path / "ckpt.pt")!r})
        stepped = bool(cell.optimizer.state)  # AdamW keeps moments once it has stepped
        print("torch._dynamo" in sys.modules, stepped, cell.progress())
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=300, check=False)

    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["False", "True", "2"]
