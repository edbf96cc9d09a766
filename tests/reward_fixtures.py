"""Custom reward functions the tests load by name (``--custom-rm-path tests.reward_fixtures.X``)."""

from __future__ import annotations

import asyncio

CALLS: list[tuple] = []


def exact(prompt, response, label, metadata):
    CALLS.append((prompt, response, label, dict(metadata)))
    return 1.0 if response.strip() == label else 0.0


async def exact_async(prompt, response, label, metadata):
    await asyncio.sleep(0)
    return 1.0 if response.strip() == label else 0.0


def exact_batched(prompts, responses, labels, metadatas):
    return [1.0 if r.strip() == l else 0.0 for r, l in zip(responses, labels)]


exact_batched.batched = True


def raises(prompt, response, label, metadata):
    raise ZeroDivisionError("the reward function's own bug")


def not_a_number(prompt, response, label, metadata):
    return "1.0"


def raises_on_three(prompt, response, label, metadata):
    """Raises for every prompt whose answer is 3 (some groups of each step), else exact."""
    if label == "3":
        raise ValueError("cannot score a 3")
    return 1.0 if response.strip() == label else 0.0
