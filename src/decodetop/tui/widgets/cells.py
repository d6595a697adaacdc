"""Provides `ago` (an age in words) and `CellCache`: update a DataTable cell only when its text changed, and re-measure
the column only when it grew, so a steady telemetry tick repaints nothing and never re-lays out the screen."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import DataTable

from decodetop.history import format_ago


def ago(age_s: float) -> str:
    """ "5m ago", or "just now" (never "now ago")."""
    return format_ago(age_s)


def cut_with_ellipsis(text: Text) -> Text:
    """`text` drawn on one line, ending in "…" where its column is narrower (DataTable cuts it silently otherwise)."""
    text.no_wrap = True
    text.overflow = "ellipsis"
    return text


class CellCache:
    """The last text written to each (row, column) of one table."""

    def __init__(self) -> None:
        self._cells: dict[tuple[str, str], Text] = {}

    def set(self, table: DataTable[Text], row: str, col: str, text: Text, *, fixed_width: bool = False) -> bool:
        """Write `text` if it differs from what the cell shows; returns True if it wrote. With `fixed_width` the
        column is never re-measured (no layout pass at all). A cell wider than its column ends in "…"."""
        cut_with_ellipsis(text)
        old = self._cells.get((row, col))
        if old is not None and old.plain == text.plain and old.spans == text.spans and old.style == text.style:
            return False
        grew = not fixed_width and (old is None or text.cell_len > old.cell_len)
        table.update_cell(row, col, text, update_width=grew)
        self._cells[(row, col)] = text
        return True

    def remember(self, row: str, col: str, text: Text) -> None:
        """Record a cell written by `add_row` (drawn with an ellipsis where it is cut, as `set` does)."""
        cut_with_ellipsis(text)
        self._cells[(row, col)] = text

    def forget_row(self, row: str) -> None:
        """Drop a removed row."""
        for key in [k for k in self._cells if k[0] == row]:
            del self._cells[key]

    def clear(self) -> None:
        """Drop everything (after `DataTable.clear`)."""
        self._cells.clear()
