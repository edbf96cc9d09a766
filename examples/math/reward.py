"""The example's custom reward (``--custom-rm-path examples.math.reward.score``).

Called per sample with the prompt text, the decoded response (up to EOS), the label and the
row's metadata. 1.0 for exactly the answer; partial credit for a well-formed wrong number
(a small format credit plus a closeness credit), so a tiny model from scratch gets a signal
before it is ever right (the built-in addition task's reward, for text).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def score(prompt: str, response: str, label: str, metadata: Mapping[str, Any]) -> float:
    """1.0 if ``response`` is ``label``; 0.1 + 0.4 * closeness for another number; else 0."""
    answer = response.strip()
    if answer == label:
        return 1.0
    if not answer.isdigit():
        return 0.0
    closeness = max(0.0, 1.0 - abs(int(answer) - int(label)) / 4)
    return 0.1 + 0.4 * closeness
