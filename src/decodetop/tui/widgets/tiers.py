"""Provides the priority tiers of what the main screen shows, and `keep_lines`, which keeps a widget's lines by tier
within the rows it is given: on a small screen the one-line verdict stays first, then the bar, the focused table's
first rows, the legend, and the rest (`tui.layout.fit_budget_box` hands out the rows in this order)."""

from __future__ import annotations

from rich.style import Style
from rich.text import Text

VERDICT = 0
"""The one-line verdict (explained / observed / target), what must not be missed (weights that do not fit, CPU
ranks, an unreachable server)."""
BAR = 10
"""The probed bar and its markers."""
TRACE_BAR = 20
"""The traced bar (one line)."""
TABLE_FIRST = 30
"""The focused table's header and its first rows (`TABLE_FIRST_ROWS`)."""
LEGEND = 40
"""The budget's legend: every component's figure with its unit and share."""
TRACE_GAP = 50
"""The traced bar's title and its largest gap in words."""
TABLE_MORE = 60
"""More of the focused table's rows (up to `TABLE_MORE_ROWS`)."""
ZOOM = 70
"""The zoomed bar and its markers."""
DETAIL = 80
"""The rest of the budget box: where the observed step came from, ranks, the roofline verdict, notes, the key."""
TRACE_DETAIL = 90
"""The rest of the traced bar: its legend, ranks and how kernels were attributed."""

TABLE_FIRST_ROWS = 3
"""Rows of the focused table that come before the legend (the acceptance: three rows at every size)."""
TABLE_MORE_ROWS = 10
"""Rows of the focused table that come before the zoomed bar and the details (a whole probe plan)."""

TieredLines = list[tuple[int, Text]]
"""A widget's lines in display order, each with its tier."""


def tier_counts(lines: TieredLines) -> dict[int, int]:
    """How many lines each tier has."""
    counts: dict[int, int] = {}
    for tier, _ in lines:
        counts[tier] = counts.get(tier, 0) + 1
    return counts


def keep_lines(lines: TieredLines, rows: int | None, more_style: Style | str = "") -> list[Text]:
    """The lines of the lowest tiers that fit in `rows` (all of them when None), in display order. A tier that fits
    only in part keeps its first lines and, given two rows or more, says how many it left out ("… 3 more lines")."""
    if rows is None or rows >= len(lines):
        return [text for _, text in lines]
    keep = [False] * len(lines)
    more_at, more_count = -1, 0
    left = max(0, rows)
    for tier in sorted({t for t, _ in lines}):
        members = [i for i, (t, _) in enumerate(lines) if t == tier]
        if len(members) <= left:
            for i in members:
                keep[i] = True
            left -= len(members)
            continue
        if left == 1:  # one row: the tier's first line says more than "… N more lines"
            keep[members[0]] = True
        elif left > 1:
            for i in members[: left - 1]:
                keep[i] = True
            more_at, more_count = members[left - 1], len(members) - (left - 1)
        break
    out: list[Text] = []
    for i, (_, text) in enumerate(lines):
        if keep[i]:
            out.append(text)
        elif i == more_at:
            out.append(Text(f"… {more_count} more line{'s' if more_count != 1 else ''}", style=more_style))
    return out
