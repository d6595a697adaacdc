"""Provides ProbeTable: one row per probe with its state (and progress), last value and age; rows keyed by probe id."""

from __future__ import annotations

from typing import ClassVar

from rich.text import Text
from textual import events
from textual.coordinate import Coordinate
from textual.widgets import DataTable

from decodetop.history import format_age_coarse
from decodetop.tui.model import ProbeState, ProbeView
from decodetop.tui.widgets.cells import CellCache

_STATE_CLASS = {
    ProbeState.QUEUED: "probe-table--muted",
    ProbeState.RUNNING: "probe-table--running",
    ProbeState.DONE: "probe-table--ok",
    ProbeState.FAILED: "probe-table--bad",
    ProbeState.TIMED_OUT: "probe-table--bad",
    ProbeState.UNSUPPORTED: "probe-table--warn",
    ProbeState.CANCELLED: "probe-table--warn",
    ProbeState.IDLE: "probe-table--muted",
}
_COLUMNS = (("probe", "probe"), ("state", "state"), ("value", "last value"), ("age", "age"))
COLUMN_WIDTHS = {"probe": 22, "state": 17, "value": 26, "age": 6}
"""Widths at 80 columns (a title, the gauge, a headline, "59m ↺"); set, never measured, so a tick never re-measures
or re-lays out the table. The value column takes the room a table has (less beside the side panels)."""
CELL_PADDING = 1
SCROLLBAR_CELLS = 2
VALUE_MIN = 12
"""The value column never gets narrower than this (beside the side panels the tab is ~68 columns wide), so the age
column stays in view."""
NARROW_MIN = {"probe": 12, "state": 10}
"""Where even that leaves no room (60 columns), the probe and state columns give way down to these (cut with "…")."""


def probe_matches(view: ProbeView, text: str) -> bool:
    """True when `text` (any case) is in the probe's title, id, state or value."""
    needle = text.strip().lower()
    hay = (view.title, view.probe_id, view.state.value, view.value_text, view.error)
    return not needle or any(needle in h.lower() for h in hay)


def column_widths(table_width: int, probe_width: int = COLUMN_WIDTHS["probe"]) -> dict[str, int]:
    """The widths for a table `table_width` cells wide whose longest title is `probe_width` (at most the probe
    column's width): the value column takes what the others leave."""
    widths = dict(COLUMN_WIDTHS)
    widths["probe"] = min(COLUMN_WIDTHS["probe"], max(len("probe"), probe_width))
    others = sum(w for k, w in widths.items() if k != "value")
    room = table_width - others - 2 * CELL_PADDING * len(COLUMN_WIDTHS) - SCROLLBAR_CELLS
    for key, least in NARROW_MIN.items():  # a narrow pane: the title and state give way before the value
        give = max(0, min(VALUE_MIN - room, widths[key] - least))
        widths[key] -= give
        room += give
    widths["value"] = max(VALUE_MIN, room)
    return widths


PROGRESS_CELLS = 4
"""Width of the progress gauge drawn in the state column while a probe runs."""


def state_text(view: ProbeView) -> str:
    """The state column's plain text: "running ▰▰▱▱  38%" while running, the state's name otherwise."""
    if view.state is ProbeState.RUNNING:
        if view.progress is None:
            return "running…"
        done = max(0, min(PROGRESS_CELLS, round(view.progress * PROGRESS_CELLS)))
        return f"running {'▰' * done}{'▱' * (PROGRESS_CELLS - done)} {view.progress * 100:3.0f}%"
    return str(view.state.value)


class ProbeTable(DataTable[Text]):
    """The probe table. The app owns the `ProbeView`s and calls `show` with each change.

    | Class | Description |
    | :- | :- |
    | `probe-table--ok` | done |
    | `probe-table--running` | running |
    | `probe-table--bad` | failed, timed out |
    | `probe-table--warn` | unsupported, cancelled |
    | `probe-table--muted` | queued, idle, values from an earlier session |
    """

    COMPONENT_CLASSES: ClassVar[set[str]] = {
        "probe-table--ok",
        "probe-table--running",
        "probe-table--bad",
        "probe-table--warn",
        "probe-table--muted",
    }
    DEFAULT_CSS = """
    ProbeTable { height: 1fr; }
    ProbeTable > .probe-table--ok { color: $state-ok; }
    ProbeTable > .probe-table--running { color: $state-running; text-style: bold; }
    ProbeTable > .probe-table--bad { color: $state-bad; text-style: bold; }
    ProbeTable > .probe-table--warn { color: $state-warn; }
    ProbeTable > .probe-table--muted { color: $state-muted; }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id, cursor_type="row", zebra_stripes=False)
        self.views: dict[str, ProbeView] = {}
        """The rows shown, by probe id."""
        self.now_s = 0.0
        """Ages are measured against this (set by the app)."""
        self._cache = CellCache()
        self._widths = dict(COLUMN_WIDTHS)
        self._rows: list[str] = []
        """Probe ids with a row, in order."""
        self._table_width = 80
        self.filter_text = ""

    def on_mount(self) -> None:
        """Set up the columns."""
        for key, label in _COLUMNS:
            self.add_column(label, key=key, width=self._widths[key])

    def on_resize(self, event: events.Resize) -> None:
        """The value column takes the width there is (from the new size: never one resize behind)."""
        self._table_width = event.size.width
        self._fit_columns()

    def _fit_columns(self) -> None:
        longest = max((len(v.title or v.probe_id) for v in self.views.values()), default=COLUMN_WIDTHS["probe"])
        widths = column_widths(self._table_width, longest)
        if widths == self._widths:
            return
        self._widths = widths
        self.clear(columns=True)
        for key, label in _COLUMNS:
            self.add_column(label, key=key, width=widths[key])
        self._rebuild_rows()

    def _cells(self, view: ProbeView) -> dict[str, Text]:
        state_style = self.get_component_rich_style(_STATE_CLASS[view.state], partial=True)
        muted = self.get_component_rich_style("probe-table--muted", partial=True)
        value = view.value_text or (view.error.splitlines()[0] if view.error else "")
        value_style = muted if view.from_history else ""
        if view.state in (ProbeState.FAILED, ProbeState.TIMED_OUT) and not view.value_text:
            value_style = state_style
        age = ""
        if view.measured_at_s is not None:
            age = format_age_coarse(self.now_s - view.measured_at_s)
            if view.from_history:
                age += " ↺"  # from an earlier session (the history file)
        return {
            "probe": Text(view.title or view.probe_id),
            "state": Text(state_text(view), style=state_style),
            "value": Text(value, style=value_style),
            "age": Text(age, style=muted),
        }

    def show(self, view: ProbeView) -> None:
        """Add or update one probe's row in place (the cursor stays where it is)."""
        self.views[view.probe_id] = view
        shown = view.probe_id in self._rows
        if probe_matches(view, self.filter_text) != shown:
            self._rebuild_rows()
        elif shown:
            for key, text in self._cells(view).items():
                self._cache.set(self, view.probe_id, key, text, fixed_width=True)

    def _rebuild_rows(self) -> None:
        """Rows for the views that match the filter, in plan order (a filter or a plan change only)."""
        row = self.cursor_row
        self.clear()
        self._cache.clear()
        self._rows = []
        for view in self.views.values():
            if probe_matches(view, self.filter_text):
                cells = self._cells(view)
                self.add_row(*(cells[key] for key, _ in _COLUMNS), key=view.probe_id)
                for key, text in cells.items():
                    self._cache.remember(view.probe_id, key, text)
                self._rows.append(view.probe_id)
        if 0 <= row < self.row_count:
            self.move_cursor(row=row, scroll=False)

    def set_filter(self, text: str) -> None:
        """Show only the probes matching `text` (any case, in the title, id, state or value)."""
        if text != self.filter_text:
            self.filter_text = text
            self._rebuild_rows()

    def replace_all(self, views: list[ProbeView]) -> None:
        """Show exactly `views` (after a model change)."""
        self.views = {v.probe_id: v for v in views}
        self._fit_columns()
        self._rebuild_rows()

    def refresh_ages(self, now_s: float) -> None:
        """Redraw the age column of the rows shown (a filter hides the others: they have no cell) against `now_s`."""
        self.now_s = now_s
        for probe_id in self._rows:
            view = self.views[probe_id]
            if view.measured_at_s is not None:
                self._cache.set(self, probe_id, "age", self._cells(view)["age"], fixed_width=True)

    @property
    def selected_id(self) -> str | None:
        """The probe id under the cursor, if any."""
        if not self.views or self.cursor_row < 0 or self.cursor_row >= self.row_count:
            return None
        row_key, _ = self.coordinate_to_cell_key(Coordinate(self.cursor_row, 0))
        return None if row_key.value is None else str(row_key.value)
