"""What ``ledger lineage`` and ``ledger prompts`` ask of a ledger: a replay of the run (one
snapshot, :func:`ledger.cli.query.replay`) answered by the builders of :mod:`ledger.cli.lineage`.
"""

from __future__ import annotations

from typing import Any

from ledger.cli import lineage as answers
from ledger.cli.args import QueryError
from ledger.cli.query import replay

__all__ = ["evals", "lineage", "prompts"]


def lineage(url: str, run_id: str | None, version: int | None = None,
            step: int | None = None) -> dict[str, Any]:
    """``lineage V``: who produced V, the steps that trained on it, the engines that served it;
    ``lineage --step N``: what fed step N.

    Raises:
        QueryError: neither or both of ``version`` and ``step``; an unknown version; a step no
            ``batch_trained`` records; an unknown run.
    """
    if (version is None) == (step is None):
        raise QueryError("lineage takes a VERSION or --step N (one of them)")
    header, state = replay(url, run_id)
    if version is not None:
        return {"header": header, **answers.version_lineage(state, version)}
    assert step is not None
    return {"header": header, **answers.step_lineage(state, step)}


def prompts(url: str, run_id: str | None) -> dict[str, Any]:
    """The run's prompt account at its last event: issued, trained, dropped by reason,
    recycled, in flight (from ``batch_trained`` and ``run_resumed`` events alone).

    Raises:
        QueryError: an unknown run.
    """
    header, state = replay(url, run_id)
    return {"header": header, **answers.prompt_account(state)}


def evals(url: str, run_id: str | None) -> dict[str, Any]:
    """Every ``eval_finished`` of the run: each eval set's scores over versions.

    Raises:
        QueryError: an unknown run.
    """
    header, state = replay(url, run_id)
    return {"header": header, "evals": answers.eval_rows(state)}
