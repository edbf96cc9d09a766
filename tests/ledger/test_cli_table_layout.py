"""The CLI lays out a table that fits its width itself, and rich lays out the rest; both must
print the same bytes, or the answers would change with the path a table takes."""

from __future__ import annotations

import io
import os
from unittest import mock

from hypothesis import given, settings, strategies as st

from ledger.cli import render
from ledger.cli.render import _print_rich_table, _print_table, _Table

_CELL = st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126), max_size=24)


def _render(printer, table: _Table, width: int) -> str:
    out = io.StringIO()
    with mock.patch.dict(os.environ, {"COLUMNS": str(width)}):
        if printer is _print_rich_table:
            printer(out, table, width)
        else:
            printer(out, table)
    return out.getvalue()


@settings(max_examples=150, deadline=None)
@given(columns=st.integers(min_value=1, max_value=6), data=st.data(),
       show_header=st.booleans(), width=st.integers(min_value=20, max_value=200))
def test_the_plain_layout_prints_what_rich_prints(columns, data, show_header, width):
    headers = data.draw(st.lists(_CELL.filter(bool), min_size=columns, max_size=columns))
    rows = data.draw(st.lists(st.lists(_CELL, min_size=columns, max_size=columns), max_size=5))
    table = _Table(*headers, show_header=show_header, no_wrap_first=not show_header)
    for row in rows:
        table.add_row(*row)

    plain = _render(_print_table, table, width)
    laid_out_by_rich = _render(_print_rich_table, table, width)

    assert plain == laid_out_by_rich


def test_a_table_that_fits_never_imports_rich(monkeypatch):
    calls = []
    monkeypatch.setattr(render, "_print_rich_table", lambda *args: calls.append(args))
    table = _Table("ENGINE", "STAMPED")
    table.add_row("engine-0", "[x] 12")
    out = io.StringIO()
    monkeypatch.setenv("COLUMNS", "80")

    _print_table(out, table)

    assert calls == [] and out.getvalue() == "ENGINE    STAMPED\nengine-0  [x] 12\n"


def test_a_cell_too_wide_for_the_width_is_folded_by_rich(monkeypatch):
    table = _Table("KEY", "VALUE")
    table.add_row("k", "x" * 50)
    out = io.StringIO()
    monkeypatch.setenv("COLUMNS", "30")

    _print_table(out, table)

    assert all(len(line) <= 30 for line in out.getvalue().splitlines())
    assert out.getvalue().replace("\n", "").replace(" ", "").count("x") == 50
