"""Chaos campaigns: a seeded nemesis schedule of overlapping faults, and the history checker
that judges the whole recorded run afterwards (DESIGN section 4)."""

from orchestrator.chaos.history import (
    Breach,
    CampaignFacts,
    HistoryVerdict,
    InjectedFault,
    check_history,
)
from orchestrator.chaos.nemesis import FaultKind, PlannedFault, draw_schedule

__all__ = [
    "Breach",
    "CampaignFacts",
    "FaultKind",
    "HistoryVerdict",
    "InjectedFault",
    "PlannedFault",
    "check_history",
    "draw_schedule",
]
