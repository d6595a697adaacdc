"""Provides the main screen's layout: the panels shown in tabs (`PANELS`, one line each), the widget tree the app
composes around them (budget box on top, tabs and the side column, filter box, status line, footer), and the size
rules (breakpoint classes that app.tcss lays out from, the compact legend and footer, "too small").

Adding a panel: its widget (one module under `widgets/`, with its CSS), the source it reads (in a worker, never on
the event loop) and one `Panel(...)` line in `PANELS`; its number key, its `?` line and its tab follow from there
(`tests/tui/test_panel_recipe.py` adds one from a temporary module).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from textual.app import App, ComposeResult
from textual.containers import Container, Horizontal, Vertical
from textual.geometry import Size
from textual.widget import Widget
from textual.widgets import DataTable, Footer, Input, Static, TabbedContent, TabPane

from decodetop.tui.launch import HEADLESS_HINT, MIN_COLUMNS, MIN_ROWS
from decodetop.tui.sources import Sources
from decodetop.tui.widgets import tiers
from decodetop.tui.widgets.budget_bar import BudgetBar
from decodetop.tui.widgets.gpu_table import GpuTable
from decodetop.tui.widgets.health_panel import HealthPanel
from decodetop.tui.widgets.probe_table import ProbeTable
from decodetop.tui.widgets.process_table import ProcessTable
from decodetop.tui.widgets.status_line import StatusLine
from decodetop.tui.widgets.traced_bar import TracedBar


@dataclass(frozen=True)
class Panel:
    """One tab of the main screen. Its number key is its place in `PANELS` (1 for the first)."""

    id: str
    """The tab pane's id (also what `show_panel` switches to)."""
    title: str
    """The tab's label, before its number key."""
    widgets: Callable[[Sources], Iterable[Widget]]
    """The pane's widgets, given the app's sources."""
    focus: str = ""
    """Selector (inside the pane) of the widget that takes focus when the tab is shown; "" leaves focus alone."""
    what: str = ""
    """What `?` says of its number key ("" says "<title> tab")."""
    chrome_rows: int = 1
    """Rows the pane shows besides its table's rows (a header, a summary line)."""

    @property
    def help(self) -> str:
        """The `?` line of its number key."""
        return self.what or f"{self.title} tab"


def _probe_widgets(sources: Sources) -> Iterable[Widget]:
    yield ProbeTable(id="probe-table")


def _gpu_widgets(sources: Sources) -> Iterable[Widget]:
    yield Static("", id="gpu-note", classes="gpu-note")
    yield GpuTable(id="gpu-table")
    yield ProcessTable(id="process-table")


def _health_widgets(sources: Sources) -> Iterable[Widget]:
    yield HealthPanel(id="health-panel")


def _chart_widgets(sources: Sources) -> Iterable[Widget]:
    # mounted on first view: plotext costs ~0.1 s to import and each re-plot is pure Python
    yield Static("charts load when this tab opens", id="charts-placeholder")


PANELS: tuple[Panel, ...] = (
    Panel("probes", "Probes", _probe_widgets, "#probe-table", "probes tab"),
    Panel("gpus", "GPUs", _gpu_widgets, "#gpu-table", "GPUs tab"),
    Panel("health", "Health", _health_widgets, "#health-table", "health tab", chrome_rows=2),
    Panel("charts", "Charts", _chart_widgets, what="charts tab", chrome_rows=0),
)
"""The tabs, in order. Read at call time (a test may add one)."""

MAX_PANELS = 9
"""Number keys 1-9 switch tabs."""


def panels() -> tuple[Panel, ...]:
    """The panels in their tab order (at most `MAX_PANELS`)."""
    return PANELS[:MAX_PANELS]


def compose_screen(sources: Sources) -> ComposeResult:
    """Budget on top, the panels in tabs below with the side column beside them (wide terminals), the filter box, the
    "too small" note, the status line and the footer."""
    shown = panels()
    with Container(id="budget-box"):
        yield Static("", id="held-note", markup=False)
        yield BudgetBar(id="budget")
        yield TracedBar(sources.trace, id="traced")
    with Horizontal(id="main"):
        with TabbedContent(initial=shown[0].id, id="tabs"):
            for number, panel in enumerate(shown, 1):
                with TabPane(f"{panel.title} {number}", id=panel.id):
                    yield from panel.widgets(sources)
        with Vertical(id="side"):
            yield Static("", id="side-gpu-note", classes="gpu-note")
            yield GpuTable(id="side-gpu-table")
            yield HealthPanel(id="side-health-panel")
    yield Input(placeholder="filter: GPU, bus id, process, check… (enter keeps, escape clears)", id="filter")
    yield Static("", id="too-small")
    yield StatusLine(id="status")
    yield Footer()


COMPACT_BELOW_ROWS = 40
"""Terminals shorter than this get the compact budget legend (so 80×24 keeps room for the tables)."""

WIDE_FROM = (150, 40)
"""From this size (columns, rows) the GPU table and health panel also show beside the tabs."""

WIDE_FOOTER_FROM = 120
"""Narrower terminals get Textual's compact footer (one space between keys), so every key fits at 80."""

MIN_SIZE = (MIN_COLUMNS, MIN_ROWS)
"""Below this (columns, rows) the screen says "too small" instead of drawing a cut layout: the compact budget
(border, title, bar, two legend rows, note: 6 rows), the tab strip (2), three table rows with the header (4),
the status line and the footer (2) need 14 rows; 60 columns hold the six headline GPU columns."""

HORIZONTAL_BREAKPOINTS = [
    (0, "-cols-tiny"),
    (MIN_SIZE[0], "-cols-ok"),
    (WIDE_FROM[0], "-cols-wide"),
]
"""Screen classes from the width Textual passes with each resize (the new size, never the old one)."""
VERTICAL_BREAKPOINTS = [
    (0, "-rows-tiny"),
    (MIN_SIZE[1], "-rows-ok"),
    (WIDE_FROM[1], "-rows-tall"),
]
"""Screen classes from the height; app.tcss lays the screen out from these classes alone."""


def fit_layout(app: App[int], size: Size) -> None:
    """What the breakpoint classes cannot say: the compact legend on short terminals, the compact footer (and no
    palette hint) on narrow ones, and the "too small" note with the size."""
    app.query_one(BudgetBar).compact = size.height < COMPACT_BELOW_ROWS
    footer = app.query_one(Footer)
    footer.compact = size.width < WIDE_FOOTER_FROM
    palette = size.width >= WIDE_FOOTER_FROM  # narrower: ctrl+p still works, `?` lists it
    if footer.show_command_palette != palette:
        footer.show_command_palette = palette
        footer.refresh(recompose=True)
    too_small = size.width < MIN_SIZE[0] or size.height < MIN_SIZE[1]
    app.query_one("#too-small", Static).update(
        f"terminal too small: {size.width}×{size.height}, decodetop needs {MIN_SIZE[0]}×{MIN_SIZE[1]}"
        f"; make it larger, or {HEADLESS_HINT}"
        if too_small
        else ""
    )


TALL_FROM_ROWS = WIDE_FROM[1]
"""From this height the tab strip has its underline (two rows; one below, app.tcss)."""
CHART_ROWS = 10
"""Rows a tab without a table (the charts) claims, as a table claims its rows."""
BOX_BORDER_ROWS = 2
"""The budget box's border (top with its title, bottom); none when folded."""


def _focused_table_rows(app: App[int]) -> tuple[int, int]:
    """(rows its pane shows besides the table's rows, the table's rows) of the tab on screen."""
    active = app.query_one(TabbedContent).active
    panel = next((p for p in panels() if p.id == active), None)
    if panel is None:
        return 0, tiers.TABLE_FIRST_ROWS
    pane = app.query_one(f"#{active}")
    chrome = panel.chrome_rows + sum(
        1 for note in pane.query(".gpu-note") if note.display and note.styles.display != "none"
    )
    if not panel.focus:
        return chrome, CHART_ROWS
    found = pane.query(panel.focus)
    table = found.first() if found else None
    return chrome, table.row_count if isinstance(table, DataTable) else tiers.TABLE_FIRST_ROWS


def _rows_outside_box(app: App[int], size: Size) -> int:
    """Status line and footer, the tab strip, the filter box when shown."""
    rows = 2 + (2 if size.height >= TALL_FROM_ROWS else 1)
    if app.query_one("#filter", Input).has_class("-shown"):
        rows += 1
    return rows


def fit_budget_box(app: App[int], size: Size | None = None, *, folded: bool = False, note_rows: int = 0) -> None:
    """Hand the screen's rows out by priority (`tui.widgets.tiers`): the verdict, the bar, the traced bar, the focused
    table's first rows, the legend, the trace's gap, more table rows, the zoomed bar, the details; the table takes
    what is left. Folded, the box is its one-line verdict. `note_rows`: the serving-time note's rows (first of all)."""
    size = size or app.size
    bar, traced = app.query_one(BudgetBar), app.query_one(TracedBar)
    box = app.query_one("#budget-box")
    box.set_class(folded, "-folded")
    bar.folded = folded
    if folded:
        traced.max_lines = 0
        _fit_processes(app, size.height - _rows_outside_box(app, size) - 1 - note_rows)
        return
    width = max(10, size.width - BOX_BORDER_ROWS - 2)  # the border, the bars' padding
    claims = [(tier, n, "budget") for tier, n in tiers.tier_counts(bar.tiered_lines(width)).items()]
    if traced.display:
        claims += [(tier, n, "traced") for tier, n in tiers.tier_counts(traced.tiered_lines(max(20, width))).items()]
    chrome, rows = _focused_table_rows(app)
    claims.append((tiers.TABLE_FIRST, chrome + min(rows, tiers.TABLE_FIRST_ROWS), "table"))
    claims.append((tiers.TABLE_MORE, max(0, min(rows, tiers.TABLE_MORE_ROWS) - tiers.TABLE_FIRST_ROWS), "table"))
    left = size.height - _rows_outside_box(app, size) - BOX_BORDER_ROWS - note_rows
    given = {"budget": 0, "traced": 0, "table": 0}
    for _tier, count, who in sorted(claims):
        take = max(0, min(count, left))
        given[who] += take
        left -= take
    bar.max_lines = max(1, given["budget"])
    traced.max_lines = given["traced"]
    _fit_processes(app, given["table"] + max(0, left))


PROCESS_ROWS = 4
"""The process list's least: its border, its header and two processes."""


def _fit_processes(app: App[int], tab_rows: int) -> None:
    """The process list shows under the GPUs wherever the GPU tab has the rows for both (the screen's
    `-processes-fit` class, app.tcss): from 40 rows, or folded, or maximised at 80×24."""
    gpus = app.query_one("#gpu-table", DataTable).row_count
    chrome = sum(1 for note in app.query_one("#gpus").query(".gpu-note") if note.display)
    app.screen.set_class(tab_rows >= chrome + 1 + gpus + PROCESS_ROWS, "-processes-fit")
