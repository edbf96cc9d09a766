"""Borderless text tables for the ``ledger`` CLI, laid out as rich lays them out, mostly
without importing rich.

A table (kubectl style: aligned columns two spaces apart, no colour, no markup) is laid out here
when its cells are printable ASCII (lines split on newlines) and either every line fits the
width, or it is a ``key  value`` table whose value column is wrapped at word boundaries as rich
wraps a cell (a word longer than the column folded). Anything else (wide characters, a table
of several wrapped columns) goes to rich. Both paths print the same bytes (a hypothesis test
compares them): the common answers then never import rich, a third of ``ledger status``'s
start-up (issue 22: a read command answers in under 0.3 s, start-up included).
"""

from __future__ import annotations

import io
import re
from typing import TextIO

__all__ = ["Table", "print_table", "print_with_rich"]

_GAP = "  "  # one space of padding on each side of a column boundary, none at the edges
_WORD = re.compile(r"\s*\S+\s*")  # a word with the spaces after it (and before, at the start)


class Table:
    """A borderless table's columns and rows (cells as text), before it is laid out.

    ``no_wrap_first``: the first column keeps its width and only the others wrap (the
    ``key  value`` tables).
    """

    def __init__(self, *headers: str, show_header: bool = True,
                 no_wrap_first: bool = False) -> None:
        self.headers = headers
        self.show_header = show_header
        self.no_wrap_first = no_wrap_first
        self.rows: list[tuple[str, ...]] = []

    def add_row(self, *cells: str) -> None:
        self.rows.append(cells)


def print_table(out: TextIO, table: Table, width: int) -> None:
    """Lay ``table`` out within ``width`` columns, without the trailing spaces of padding."""
    rows = [table.headers, *table.rows] if table.show_header else list(table.rows)
    if not rows or not all(isinstance(cell, str) and _plain(cell) for row in rows for cell in row):
        print_with_rich(out, table, width)
        return
    split = [[cell.split("\n") for cell in row] for row in rows]
    widths = [max(len(line) for row in split for line in row[column])
              for column in range(len(table.headers))]
    if sum(widths) + len(_GAP) * (len(widths) - 1) > width:
        value_width = width - widths[0] - len(_GAP)
        if not (table.no_wrap_first and len(widths) == 2 and value_width > 0):
            print_with_rich(out, table, width)
            return
        widths[1] = value_width
        split = [[key, [piece for line in value for piece in _wrap(line, value_width)]]
                 for key, value in split]
    for row in split:
        for index in range(max(len(lines) for lines in row)):
            cells = (lines[index] if index < len(lines) else "" for lines in row)
            out.write(_GAP.join(cell.ljust(size) for cell, size in zip(cells, widths))
                      .rstrip() + "\n")


def _plain(cell: str) -> bool:
    # Rich splits a cell that opens with a newline in ways of its own: it goes to rich.
    return (cell.isascii() and not cell.startswith("\n")
            and all(line.isprintable() for line in cell.split("\n")))


def _wrap(line: str, width: int) -> list[str]:
    """``line`` broken before the first word that would pass ``width``; a word longer than
    the width is folded into pieces of ``width`` (rich's ``divide_line`` with ``fold``)."""
    breaks: list[int] = []
    offset = 0  # where the current piece has reached
    for word in _WORD.finditer(line):
        start, text = word.start(), word.group()
        length = len(text.rstrip())
        if width - offset >= length:
            offset += len(text)
        elif length > width:
            chunks = [text[index:index + width] for index in range(0, len(text), width)]
            for chunk in chunks:
                if start:
                    breaks.append(start)
                start += len(chunk)
            offset = len(chunks[-1])
        elif offset and start:
            breaks.append(start)
            offset = len(text)
    bounds = [0, *breaks, len(line)]
    return [line[begin:end] for begin, end in zip(bounds, bounds[1:])]


def print_with_rich(out: TextIO, table: Table, width: int) -> None:
    """Lay ``table`` out with rich: no colour, no markup, overflowing cells folded."""
    from rich.console import Console
    from rich.table import Table as RichTable

    laid_out = RichTable(box=None, pad_edge=False, show_edge=False, header_style=None,
                         show_header=table.show_header)
    for column, header in enumerate(table.headers):
        if column == 0 and table.no_wrap_first:
            laid_out.add_column(header, no_wrap=True)
        else:
            laid_out.add_column(header, overflow="fold")
    for row in table.rows:
        laid_out.add_row(*row)
    buffer = io.StringIO()
    console = Console(
        file=buffer, width=width, markup=False, highlight=False, emoji=False,
        color_system=None, soft_wrap=False,
    )
    console.print(laid_out)
    for line in buffer.getvalue().splitlines():
        out.write(line.rstrip() + "\n")
