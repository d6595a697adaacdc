"""Provides HealthPanel: pass/warn/fail counts, then every check with failing ones first and baseline changes marked."""

from __future__ import annotations

from collections import Counter
from typing import ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import DataTable, Static

from decodetop.collectors.checks.model import CheckResult, Status
from decodetop.history import format_age
from decodetop.tui.model import HealthView
from decodetop.tui.widgets.cells import CellCache

_STATUS_CLASS = {
    Status.PASS: "health-panel--ok",
    Status.INFO: "health-panel--muted",
    Status.UNKNOWN: "health-panel--muted",
    Status.WARN: "health-panel--warn",
    Status.FAIL: "health-panel--bad",
}
_COLUMNS = (("status", "status"), ("id", "id"), ("title", "check"), ("observed", "observed"), ("changed", "Δ"))
COLUMN_WIDTHS = {"status": 7, "id": 10, "title": 22, "observed": 26, "changed": 1}
"""Fixed widths that fit 80 columns (enter shows a check whole). Filling the table then measures no cell: a host
has dozens of checks, and measuring them all at start stalled the event loop for ~0.3 s on a busy 2-core box."""


def display_id(check_id: str) -> str:
    """The id as the narrow column shows it: the PCI domain dropped ("N3:0000:3b:00.0" → "N3:3b:00.0")."""
    head, sep, subject = check_id.partition(":")
    if sep and subject.startswith("0000:"):
        return f"{head}:{subject[5:]}"
    return check_id


def sorted_checks(checks: tuple[CheckResult, ...]) -> list[CheckResult]:
    """Failing first, then warnings, unknown, info, pass; stable by id within a status."""
    return sorted(checks, key=lambda c: (-c.status.severity, c.check_id))


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
        self._order: list[CheckResult] = []
        self._keys: list[str] = []
        self._cache = CellCache()

    def compose(self) -> ComposeResult:
        """Summary line and table."""
        yield Static("health checks running…", id="health-summary")
        table: DataTable[Text] = DataTable(cursor_type="row", id="health-table")
        yield table

    def on_mount(self) -> None:
        """Set up the columns."""
        table = self.table
        for key, label in _COLUMNS:
            table.add_column(label, key=key, width=COLUMN_WIDTHS[key])

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
            (Status.PASS, "pass"),
            (Status.UNKNOWN, "unknown"),
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
            text.append(f" · baseline {format_age(self.now_s - view.baseline_at_s)} ago, ")
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
        order = sorted_checks(view.checks)
        keys = row_keys(order)
        table = self.table
        if keys != self._keys:
            table.clear()
            self._cache.clear()
            for key, check in zip(keys, order, strict=True):
                cells = self._cells(check)
                table.add_row(*cells.values(), key=key)
                for col, text in cells.items():
                    self._cache.remember(key, col, text)
        else:
            for key, check in zip(keys, order, strict=True):
                for col, text in self._cells(check).items():
                    self._cache.set(table, key, col, text, fixed_width=True)
        self._order, self._keys = order, keys

    def _cells(self, check: CheckResult) -> dict[str, Text]:
        style = self.get_component_rich_style(_STATUS_CLASS[check.status], partial=True)
        changed = check.check_id in self.view.changed_ids
        return {
            "status": Text(check.status.value, style=style),
            "id": Text(display_id(check.check_id)),
            "title": Text(check.title[:48]),
            "observed": Text(check.observed[:40]),
            "changed": Text(
                "Δ" if changed else "",
                style=self.get_component_rich_style("health-panel--changed", partial=True),
            ),
        }

    @property
    def selected(self) -> CheckResult | None:
        """The check under the cursor."""
        row = self.table.cursor_row
        if 0 <= row < len(self._order):
            return self._order[row]
        return None
