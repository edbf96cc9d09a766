"""What supervision has seen and done, for metrics, tests and drills."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["SupervisionCounters"]


@dataclass
class SupervisionCounters:
    """Counts of what the supervision modules did in this process (each module adds its own)."""

    promotions: int = 0
    retried_steps: int = 0
    heals: int = 0
    engine_restarts: int = 0
    manager_replacements: int = 0
    checkpoint_restores: int = 0  # every cell lost at once: all restarted from a checkpoint
