"""Provides ProbeTable: one row per probe with its state (and progress), last value and age; rows keyed by probe id."""

from __future__ import annotations

from typing import ClassVar

from rich.text import Text
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
COLUMN_WIDTHS = {"state": 17, "value": 26, "age": 6}
"""Fixed widths (the gauge, a headline, "59m ↺"), so a tick never re-measures or re-lays out the table."""
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

    def on_mount(self) -> None:
        """Set up the columns."""
        for key, label in _COLUMNS:
            self.add_column(label, key=key, width=COLUMN_WIDTHS.get(key))

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
            "value": Text(value[:60], style=value_style),
            "age": Text(age, style=muted),
        }

    def show(self, view: ProbeView) -> None:
        """Add or update one probe's row in place (the cursor stays where it is)."""
        cells = self._cells(view)
        if view.probe_id in self.views:
            for key, text in cells.items():
                self._cache.set(self, view.probe_id, key, text, fixed_width=key in COLUMN_WIDTHS)
        else:
            self.add_row(*(cells[key] for key, _ in _COLUMNS), key=view.probe_id)
            for key, text in cells.items():
                self._cache.remember(view.probe_id, key, text)
        self.views[view.probe_id] = view

    def replace_all(self, views: list[ProbeView]) -> None:
        """Show exactly `views` (after a model change); keeps rows whose id survives."""
        wanted = {v.probe_id for v in views}
        for probe_id in [p for p in self.views if p not in wanted]:
            self.remove_row(probe_id)
            del self.views[probe_id]
            self._cache.forget_row(probe_id)
        for view in views:
            self.show(view)

    def refresh_ages(self, now_s: float) -> None:
        """Redraw the age column against `now_s`."""
        self.now_s = now_s
        for view in self.views.values():
            if view.measured_at_s is not None:
                self._cache.set(self, view.probe_id, "age", self._cells(view)["age"], fixed_width=True)

    @property
    def selected_id(self) -> str | None:
        """The probe id under the cursor, if any."""
        if not self.views or self.cursor_row < 0 or self.cursor_row >= self.row_count:
            return None
        row_key, _ = self.coordinate_to_cell_key(Coordinate(self.cursor_row, 0))
        return None if row_key.value is None else str(row_key.value)
