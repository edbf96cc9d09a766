"""The CLI lays out most tables itself and gives the rest to rich; both must print the same
bytes, or an answer would change with the path its table takes."""

from __future__ import annotations

import io

from hypothesis import given, settings, strategies as st

from ledger.cli import table_layout
from ledger.cli.table_layout import Table, print_table, print_with_rich

_PRINTABLE = st.characters(min_codepoint=32, max_codepoint=126)
_CELL = st.text(alphabet=_PRINTABLE, max_size=24)
# Values of key-value tables: words, runs of spaces, long words, several lines.
_WORDS = st.lists(st.one_of(st.text(alphabet=st.characters(min_codepoint=33, max_codepoint=126),
                                    min_size=1, max_size=30),
                            st.sampled_from([" ", "  ", "   ", "\n"])), max_size=40)


def _both(table: Table, width: int) -> tuple[str, str]:
    plain, laid_out_by_rich = io.StringIO(), io.StringIO()
    print_table(plain, table, width)
    print_with_rich(laid_out_by_rich, table, width)
    return plain.getvalue(), laid_out_by_rich.getvalue()


@settings(max_examples=200, deadline=None)
@given(columns=st.integers(min_value=1, max_value=6), data=st.data(),
       show_header=st.booleans(), width=st.integers(min_value=20, max_value=200))
def test_a_table_prints_what_rich_prints(columns, data, show_header, width):
    headers = data.draw(st.lists(_CELL.filter(bool), min_size=columns, max_size=columns))
    rows = data.draw(st.lists(st.lists(_CELL, min_size=columns, max_size=columns), max_size=5))
    table = Table(*headers, show_header=show_header)
    for row in rows:
        table.add_row(*row)

    plain, laid_out_by_rich = _both(table, width)

    assert plain == laid_out_by_rich


@settings(max_examples=300, deadline=None)
@given(rows=st.lists(st.tuples(st.text(alphabet=_PRINTABLE, min_size=1, max_size=16),
                               _WORDS.map("".join)), min_size=1, max_size=4),
       width=st.integers(min_value=20, max_value=160))
def test_a_key_value_table_wraps_as_rich_wraps(rows, width):
    table = Table("key", "value", show_header=False, no_wrap_first=True)
    for key, value in rows:
        table.add_row(key, value)

    plain, laid_out_by_rich = _both(table, width)

    assert plain == laid_out_by_rich


def test_a_table_that_fits_or_wraps_never_imports_rich(monkeypatch):
    calls = []
    monkeypatch.setattr(table_layout, "print_with_rich", lambda *args: calls.append(args))
    table = Table("ENGINE", "STAMPED")
    table.add_row("engine-0", "[x] 12")
    pairs = Table("key", "value", show_header=False, no_wrap_first=True)
    pairs.add_row("served by", "engine-0, engine-1, engine-2")
    pairs.add_row("payload", '{\n  "version": 3\n}')
    out = io.StringIO()

    print_table(out, table, 80)
    print_table(out, pairs, 24)

    assert calls == []
    assert out.getvalue() == ("ENGINE    STAMPED\nengine-0  [x] 12\n"
                              "served by  engine-0,\n           engine-1,\n"
                              "           engine-2\n"
                              'payload    {\n             "version":\n           3\n'
                              "           }\n")
