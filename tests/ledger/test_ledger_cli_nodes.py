"""``ledger cells`` and ``ledger lag`` show the node each cell and engine was last recorded on
(issue 14, item 2): the ``node_id``/``host`` the control plane puts in ``cell_state``,
``cell_promoted`` and ``engines_stamped``. Runs recorded before that show ``-``."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from ledger import EventKind, Ledger
from ledger.cli.app import app

RUN = "placed"
NODE_A = {"node_id": "a1" * 28, "host": "10.0.0.1"}
NODE_B = {"node_id": "b2" * 28, "host": "10.0.0.2"}


def _cli(url: str, *args: str) -> str:
    result = CliRunner().invoke(app, ["--db", url, *args, "--run", RUN])
    assert result.exit_code == 0, result.output
    return result.output


def _build(url: str) -> None:
    """cell-0 on A publishes v1 to engine-0 (A) and engine-1 (B); A is lost, cell-1 on B
    takes over, cell-0 is healed onto B and engine-0 restarted there; v2 stamps both."""
    with Ledger.open(url) as ledger:
        ledger.start_run(RUN)
        for cell, node in (("cell-0", NODE_A), ("cell-1", NODE_B)):
            ledger.append(RUN, EventKind.CELL_STATE, {"state": "alive", **node}, cell_id=cell)
        epoch = ledger.append(RUN, EventKind.CELL_PROMOTED, {"reason": "start", **NODE_A},
                              cell_id="cell-0").epoch
        version = ledger.commit_weights(RUN, cell_id="cell-0", epoch=epoch, train_step=1)
        ledger.append(RUN, EventKind.ENGINES_STAMPED, {
            "version": version, "engine_ids": ["engine-0", "engine-1"], **NODE_A,
            "engine_nodes": {"engine-0": NODE_A, "engine-1": NODE_B}},
            cell_id="cell-0", epoch=epoch)
        ledger.append(RUN, EventKind.CELL_STATE, {"state": "errored", **NODE_A},
                      cell_id="cell-0")
        epoch = ledger.append(RUN, EventKind.CELL_PROMOTED, {
            "reason": "failover", "previous_cell": "cell-0", **NODE_B}, cell_id="cell-1").epoch
        ledger.append(RUN, EventKind.CELL_STATE, {"state": "healed", **NODE_B},
                      cell_id="cell-0")
        version = ledger.commit_weights(RUN, cell_id="cell-1", epoch=epoch, train_step=2)
        ledger.append(RUN, EventKind.ENGINES_STAMPED, {
            "version": version, "engine_ids": ["engine-0", "engine-1"], **NODE_B,
            "engine_nodes": {"engine-0": NODE_B, "engine-1": NODE_B}},
            cell_id="cell-1", epoch=epoch)


def test_cells_and_lag_show_the_node_last_recorded(sqlite_url: str) -> None:
    _build(sqlite_url)

    cells = _cli(sqlite_url, "cells").splitlines()
    lag = _cli(sqlite_url, "lag").splitlines()
    cells_json = json.loads(_cli(sqlite_url, "cells", "-o", "json"))["cells"]
    lag_json = json.loads(_cli(sqlite_url, "lag", "-o", "json"))["engines"]

    assert cells[0].split()[-1] == lag[0].split()[-1] == "NODE"
    assert [line.split()[-1] for line in cells[1:]] == ["10.0.0.2/b2b2b2b2"] * 2
    assert [line.split()[-1] for line in lag[1:]] == ["10.0.0.2/b2b2b2b2"] * 2
    assert [(c["cell_id"], c["node_id"], c["host"]) for c in cells_json] == [
        ("cell-0", NODE_B["node_id"], "10.0.0.2"), ("cell-1", NODE_B["node_id"], "10.0.0.2")]
    assert {e["engine_id"]: e["host"] for e in lag_json} == {"engine-0": "10.0.0.2",
                                                             "engine-1": "10.0.0.2"}
