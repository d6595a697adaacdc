"""Provides HealthPanel: pass/warn/fail counts, then every check with failing ones first and baseline changes marked.

A check that reads one row per subject (P7 per GPU pair: 56 rows on 8 GPUs) shows as one row per status with a count
("P7 ×56"); enter on it lists every subject in the details screen."""

from __future__ import annotations

from collections import Counter
from typing import ClassVar

from rich.text import Text
from textual import events, on
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import DataTable, Static

from decodetop.collectors.checks.result import CheckResult, Status, sort_for_display
from decodetop.tui.model import HealthView
from decodetop.tui.screens.details import CheckGroupDetailScreen
from decodetop.tui.widgets.cells import CellCache, ago

_STATUS_CLASS = {
    Status.PASS: "health-panel--ok",
    Status.INFO: "health-panel--muted",
    Status.UNKNOWN: "health-panel--muted",
    Status.WARN: "health-panel--warn",
    Status.FAIL: "health-panel--bad",
}
_COLUMNS = (("status", "status"), ("id", "id"), ("title", "check"), ("observed", "observed"), ("changed", "Δ"))
COLUMN_WIDTHS = {"status": 7, "id": 10, "title": 22, "observed": 26, "changed": 1}
"""Widths at 80 columns (enter shows a check whole). Widths are set, never measured from the cells: a host has
dozens of checks, and measuring them all at start stalled the event loop for ~0.3 s on a busy 2-core box."""
FLEX_COLUMNS = ("title", "observed")
"""The text columns that take the room a wider table has, in the proportion of their widths at 80 columns."""
CELL_PADDING = 1
"""DataTable's default padding each side of a cell."""


def column_widths(table_width: int) -> dict[str, int]:
    """Column widths for a table `table_width` cells wide: the fixed columns as they are, the text columns share the
    rest (never narrower than at 80 columns; one cell kept for the vertical scrollbar's edge)."""
    fixed = sum(w for k, w in COLUMN_WIDTHS.items() if k not in FLEX_COLUMNS)
    room = table_width - 2 * CELL_PADDING * len(COLUMN_WIDTHS) - fixed - 2  # the scrollbar (2 cells wide)
    base = sum(COLUMN_WIDTHS[k] for k in FLEX_COLUMNS)
    widths = dict(COLUMN_WIDTHS)
    if room <= base:
        return widths
    title = room * COLUMN_WIDTHS["title"] // base
    widths["title"], widths["observed"] = title, room - title
    return widths


def display_id(check_id: str) -> str:
    """The id as the narrow column shows it: the PCI domain dropped ("N3:0000:3b:00.0" → "N3:3b:00.0")."""
    head, sep, subject = check_id.partition(":")
    if sep and subject.startswith("0000:"):
        return f"{head}:{subject[5:]}"
    return check_id


def sorted_checks(checks: tuple[CheckResult, ...]) -> list[CheckResult]:
    """The rows in `decodetop check`'s order (`sort_for_display`: fail, warn, unknown, pass, info; ids in natural
    order, C2 before C13)."""
    return sort_for_display(checks)


def check_matches(check: CheckResult, text: str) -> bool:
    """True when `text` (any case) is in the check's status, id, title or observed value."""
    needle = text.strip().lower()
    hay = (check.status.value, check.check_id, check.title, check.observed)
    return not needle or any(needle in h.lower() for h in hay)


def base_id(check_id: str) -> str:
    """The check's id without its subject ("P7:GPU0-GPU1" → "P7")."""
    return check_id.partition(":")[0]


def group_checks(checks: list[CheckResult]) -> list[tuple[CheckResult, ...]]:
    """`checks` (in row order) with the rows of one check id and status collapsed into one group, placed where its
    first row was: the order of statuses stays fail, warn, unknown, pass, info."""
    groups: dict[tuple[str, Status], list[CheckResult]] = {}
    for check in checks:
        groups.setdefault((base_id(check.check_id), check.status), []).append(check)
    return [tuple(group) for group in groups.values()]


def group_key(group: tuple[CheckResult, ...]) -> str:
    """A collapsed group's row key (a single check keeps its own id as the key)."""
    return f"{base_id(group[0].check_id)} {group[0].status.value} ×"


def group_observed(group: tuple[CheckResult, ...]) -> str:
    """What a collapsed row shows as observed: the one value all its rows share, else each distinct value once."""
    seen = list(dict.fromkeys(c.observed for c in group))
    return seen[0] if len(seen) == 1 else f"{len(seen)} values: " + " · ".join(seen)


def row_keys(checks: list[CheckResult]) -> list[str]:
    """Unique, stable row keys (check_id, suffixed if two checks share one)."""
    seen: Counter[str] = Counter()
    keys = []
    for check in checks:
        seen[check.check_id] += 1
        keys.append(check.check_id if seen[check.check_id] == 1 else f"{check.check_id}#{seen[check.check_id]}")
    return keys


class HealthPanel(Vertical):
    """Counts on one line, the checks below.

    | Class | Description |
    | :- | :- |
    | `health-panel--ok` / `--warn` / `--bad` / `--muted` | status colours |
    | `health-panel--changed` | the Δ mark of a check that changed since the baseline |
    """

    COMPONENT_CLASSES: ClassVar[set[str]] = {
        "health-panel--ok",
        "health-panel--warn",
        "health-panel--bad",
        "health-panel--muted",
        "health-panel--changed",
    }
    DEFAULT_CSS = """
    HealthPanel { height: 1fr; }
    HealthPanel > #health-summary { height: 1; padding: 0 1; }
    HealthPanel > DataTable { height: 1fr; }
    HealthPanel > .health-panel--ok { color: $state-ok; }
    HealthPanel > .health-panel--warn { color: $state-warn; text-style: bold; }
    HealthPanel > .health-panel--bad { color: $state-bad; text-style: bold; }
    HealthPanel > .health-panel--muted { color: $state-muted; }
    HealthPanel > .health-panel--changed { color: $accent; text-style: bold; }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.view = HealthView()
        """What is shown."""
        self.now_s = 0.0
        self._groups: list[tuple[CheckResult, ...]] = []
        self._order: list[CheckResult] = []
        """The first check of each row."""
        self._keys: list[str] = []
        self._cache = CellCache()
        self._widths = dict(COLUMN_WIDTHS)
        self.filter_text = ""

    def compose(self) -> ComposeResult:
        """Summary line and table."""
        yield Static("health checks running…", id="health-summary")
        table: DataTable[Text] = DataTable(cursor_type="row", id="health-table")
        yield table

    def on_mount(self) -> None:
        """Set up the columns."""
        table = self.table
        for key, label in _COLUMNS:
            table.add_column(label, key=key, width=self._widths[key])

    @property
    def table(self) -> DataTable[Text]:
        """The checks table."""
        return self.query_one("#health-table", DataTable)

    def summary_text(self) -> Text:
        """ "3 fail · 2 warn · 14 pass · 1 unknown · baseline 2h ago, 2 changed"."""
        view = self.view
        text = Text()
        if view.problem:
            text.append(view.problem, style=self.get_component_rich_style("health-panel--bad", partial=True))
            return text
        counts = Counter(c.status for c in view.checks)
        parts = [
            (Status.FAIL, "fail"),
            (Status.WARN, "warn"),
            (Status.UNKNOWN, "unknown"),
            (Status.PASS, "pass"),
            (Status.INFO, "info"),
        ]
        first = True
        for status, word in parts:
            if not first:
                text.append(" · ")
            first = False
            style = self.get_component_rich_style(_STATUS_CLASS[status], partial=True) if counts[status] else ""
            text.append(f"{counts[status]} {word}", style=style)
        if view.baseline_at_s is None:
            text.append(" · no baseline (s saves one)")
        else:
            text.append(f" · baseline {ago(self.now_s - view.baseline_at_s)}, ")
            text.append(
                f"{len(view.changed_ids)} changed",
                style=self.get_component_rich_style("health-panel--changed", partial=True) if view.changed_ids else "",
            )
        return text

    def show(self, view: HealthView, now_s: float) -> None:
        """Show `view`: rebuild rows if the set of checks changed, else update cells in place."""
        self.view = view
        self.now_s = now_s
        self.query_one("#health-summary", Static).update(self.summary_text())
        groups = group_checks([c for c in sorted_checks(view.checks) if check_matches(c, self.filter_text)])
        singles = row_keys([g[0] for g in groups])
        keys = [single if len(g) == 1 else group_key(g) for single, g in zip(singles, groups, strict=True)]
        table = self.table
        if keys != self._keys:
            table.clear()
            self._cache.clear()
            for key, group in zip(keys, groups, strict=True):
                cells = self._cells(group)
                table.add_row(*cells.values(), key=key)
                for col, text in cells.items():
                    self._cache.remember(key, col, text)
        else:
            for key, group in zip(keys, groups, strict=True):
                for col, text in self._cells(group).items():
                    self._cache.set(table, key, col, text, fixed_width=True)
        self._groups, self._keys = groups, keys
        self._order = [g[0] for g in groups]

    def _cells(self, group: tuple[CheckResult, ...]) -> dict[str, Text]:
        """One row's cells: a single check as it reads; a group as its id with the count ("P7 ×56")."""
        check = group[0]
        style = self.get_component_rich_style(_STATUS_CLASS[check.status], partial=True)
        changed = any(c.check_id in self.view.changed_ids for c in group)
        single = len(group) == 1
        return {
            "status": Text(check.status.value, style=style),
            "id": Text(display_id(check.check_id) if single else f"{base_id(check.check_id)} ×{len(group)}"),
            "title": Text(check.title),
            "observed": Text(check.observed if single else group_observed(group)),
            "changed": Text(
                "Δ" if changed else "",
                style=self.get_component_rich_style("health-panel--changed", partial=True),
            ),
        }

    def on_resize(self, event: events.Resize) -> None:
        """The text columns take the width there is (from the new size: never one resize behind)."""
        widths = column_widths(event.size.width)
        if widths != self._widths:
            self._widths = widths
            self._rebuild()

    def _rebuild(self) -> None:
        """Columns at the current widths, then the rows shown (a resize only; ticks update cells in place)."""
        table = self.table
        row = table.cursor_row
        table.clear(columns=True)
        self._cache.clear()
        for key, label in _COLUMNS:
            table.add_column(label, key=key, width=self._widths[key])
        for key, group in zip(self._keys, self._groups, strict=True):
            cells = self._cells(group)
            table.add_row(*cells.values(), key=key)
            for col, text in cells.items():
                self._cache.remember(key, col, text)
        if 0 <= row < table.row_count:
            table.move_cursor(row=row, scroll=False)

    def set_filter(self, text: str) -> None:
        """Show only the checks matching `text` (the counts stay those of every check)."""
        if text != self.filter_text:
            self.filter_text = text
            self.show(self.view, self.now_s)

    @property
    def selected(self) -> CheckResult | None:
        """The check under the cursor (the first of a collapsed row)."""
        group = self.selected_group
        return group[0] if group else None

    @property
    def selected_group(self) -> tuple[CheckResult, ...]:
        """Every check of the row under the cursor (one, or a collapsed row's all)."""
        row = self.table.cursor_row
        if 0 <= row < len(self._groups):
            return self._groups[row]
        return ()

    @on(DataTable.RowSelected, "#health-table")
    def _open_group(self, event: DataTable.RowSelected) -> None:
        """`enter` on a collapsed row: every check of it in the details screen (a single check goes on to the app,
        which shows its details)."""
        group = self.selected_group
        if len(group) > 1:
            event.stop()
            self.app.push_screen(CheckGroupDetailScreen(group, self.view.changed_ids))
