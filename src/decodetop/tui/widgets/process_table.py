"""Provides ProcessTable: every process with a context on a GPU, as nvitop lists them — GPU, pid, user, GPU memory,
SM share, CPU %, resident memory, elapsed time and command line; rows keyed "pid-<gpu>-<pid>", sorted by any of
them (largest GPU memory first at start; `o` cycles, `O` reverses, a header click sorts, ▼/▲ says how) and filtered
by GPU or by process (`/`)."""

from __future__ import annotations

from rich.text import Text
from textual import events
from textual.widgets import DataTable

from decodetop.history import format_age_coarse
from decodetop.textfmt import format_bytes
from decodetop.tui.model import GpuProcessView, GpuView, TelemetryFrame
from decodetop.tui.widgets.cells import cut_with_ellipsis
from decodetop.tui.widgets.gpu_table import gpu_cells

COLUMNS = (
    ("gpu", "GPU", 3, 0),
    ("pid", "pid", 8, 1),
    ("user", "user", 9, 2),
    ("mem", "GPU mem", 8, 3),
    ("sm", "SM%", 4, 5),
    ("cpu", "CPU%", 5, 4),
    ("rss", "RSS", 8, 6),
    ("elapsed", "time", 5, 7),
)
"""The fixed columns (key, label, width, priority: lower shows first on a narrow pane; each a sort order); the
command takes the rest of the width."""
SORTS = ("mem", "gpu", "pid", "user", "sm", "cpu", "rss", "elapsed")
"""Sort orders `o` cycles through; numbers largest first, the GPU, pid and user in their own order."""
ASCENDING = frozenset({"gpu", "pid", "user"})
COMMAND_MIN = 16
CELL_PADDING = 1
SCROLLBAR_CELLS = 2


def process_matches(gpu: GpuView, proc: GpuProcessView, text: str) -> bool:
    """True when `text` (any case) is in the GPU's own cells (its index, name, bus id…: all its processes) or in this
    process's pid, user or command line (this one alone, as nvitop filters)."""
    needle = text.strip().lower()
    if not needle:
        return True
    own = [*gpu_cells(gpu).values(), gpu.name, gpu.bus_id]
    return any(needle in h.lower() for h in (*own, str(proc.pid), proc.user, proc.command))


def _sort_value(gpu: GpuView, proc: GpuProcessView, key: str) -> float | None:
    """What a numeric sort order compares (None: not known, sorted last)."""
    values = {
        "gpu": float(gpu.index),
        "pid": float(proc.pid),
        "mem": None if proc.used_mem_bytes is None else float(proc.used_mem_bytes),
        "sm": proc.sm_util_pct,
        "cpu": proc.cpu_pct,
        "rss": None if proc.rss_bytes is None else float(proc.rss_bytes),
        "elapsed": None if proc.started_at_s is None else -proc.started_at_s,
    }
    return values.get(key)


def process_rows(
    frame: TelemetryFrame, filter_text: str = "", sort_key: str = "mem", reverse: bool = False
) -> list[tuple[GpuView, GpuProcessView]]:
    """(GPU, process) pairs to list, matching the filter, in the sort order (ties by GPU, then pid)."""
    rows = [(g, p) for g in frame.gpus for p in g.processes or () if process_matches(g, p, filter_text)]
    rows.sort(key=lambda gp: (gp[0].index, gp[1].pid))
    descending = (sort_key not in ASCENDING) != reverse
    if sort_key == "user":
        return sorted(rows, key=lambda gp: gp[1].user, reverse=descending)
    known = [(v, r) for r in rows if (v := _sort_value(*r, sort_key)) is not None]
    known.sort(key=lambda vr: vr[0], reverse=descending)
    return [r for _, r in known] + [r for r in rows if _sort_value(*r, sort_key) is None]


def process_cells(gpu: GpuView, proc: GpuProcessView, now_s: float | None = None) -> dict[str, str]:
    """The plain text of each column for one process (its elapsed time against `now_s`)."""
    elapsed = "–"
    if proc.started_at_s is not None and now_s is not None:
        elapsed = format_age_coarse(max(0.0, now_s - proc.started_at_s))
    return {
        "gpu": str(gpu.index),
        "pid": str(proc.pid),
        "user": proc.user or "?",
        "mem": "–" if proc.used_mem_bytes is None else format_bytes(proc.used_mem_bytes),
        "sm": "–" if proc.sm_util_pct is None else f"{proc.sm_util_pct:.0f}%",
        "cpu": "–" if proc.cpu_pct is None else f"{proc.cpu_pct:.0f}%",
        "rss": "–" if proc.rss_bytes is None else format_bytes(proc.rss_bytes),
        "elapsed": elapsed,
        "command": proc.command or "?",
    }


def fit_process_columns(table_width: int) -> tuple[tuple[tuple[str, str, int], ...], int]:
    """The columns a list `table_width` cells wide shows (by priority while the command keeps `COMMAND_MIN`), in
    display order, and the command column's width (the rest)."""
    room = table_width - SCROLLBAR_CELLS - COMMAND_MIN - 2 * CELL_PADDING
    chosen: set[str] = set()
    for key, _, width, _ in sorted(COLUMNS, key=lambda c: c[3]):
        if width + 2 * CELL_PADDING <= room:
            chosen.add(key)
            room -= width + 2 * CELL_PADDING
    return tuple((k, label, w) for k, label, w, _ in COLUMNS if k in chosen), COMMAND_MIN + room


def processes_note(frame: TelemetryFrame) -> str:
    """Why the list may be empty or old: no GPU, lists not read this tick (a latency probe runs), none running."""
    if not frame.gpus:
        return "no GPU telemetry"
    notes = {g.processes_note for g in frame.gpus if g.processes_note}
    if all(g.processes is None for g in frame.gpus):
        return "; ".join(sorted(notes)) or "process lists not read"
    if not any(g.processes for g in frame.gpus):
        return "no process has a context on these GPUs"
    return "; ".join(sorted(notes))


class ProcessTable(DataTable[Text]):
    """The processes of every GPU; kept as last read while the lists are paused (a latency probe is running)."""

    DEFAULT_CSS = """
    ProcessTable { height: 1fr; border-top: hkey $panel; }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id, cursor_type="row", zebra_stripes=True)
        self.frame: TelemetryFrame | None = None
        self.filter_text = ""
        self.sort_key = "mem"
        self.sort_reverse = False
        self._columns, self._command_width = fit_process_columns(80)
        self._shown: list[tuple[str, ...]] = []

    def on_mount(self) -> None:
        """Set up the columns."""
        self._add_columns()
        self.border_title = "processes"

    def _label(self, key: str, label: str) -> str:
        """The header, with ▼ (largest or last first) or ▲ on the sorted column."""
        if key != self.sort_key:
            return label
        descending = (key not in ASCENDING) != self.sort_reverse
        return label + ("▼" if descending else "▲")

    def _add_columns(self) -> None:
        for key, label, width in self._columns:
            self.add_column(self._label(key, label), key=key, width=width)
        self.add_column("command", key="command", width=self._command_width)

    def _rebuild(self) -> None:
        self.clear(columns=True)
        self._shown = []
        self._add_columns()
        if self.frame is not None:
            self.show(self.frame)

    def on_resize(self, event: events.Resize) -> None:
        """The command column takes the width there is."""
        columns, width = fit_process_columns(event.size.width)
        if (columns, width) != (self._columns, self._command_width):
            self._columns, self._command_width = columns, width
            self._rebuild()

    def set_sort(self, key: str, *, reverse: bool = False) -> None:
        """Sort by `key` (one of SORTS), the other way round with `reverse`."""
        if key in SORTS and (key, reverse) != (self.sort_key, self.sort_reverse):
            self.sort_key, self.sort_reverse = key, reverse
            self._rebuild()

    def cycle_sort(self) -> str:
        """The next sort order; returns it."""
        self.set_sort(SORTS[(SORTS.index(self.sort_key) + 1) % len(SORTS)])
        return self.sort_key

    def reverse_sort(self) -> str:
        """The same order the other way round; returns it in words."""
        self.set_sort(self.sort_key, reverse=not self.sort_reverse)
        return f"{self.sort_key} {'reversed' if self.sort_reverse else ''}".strip()

    def on_data_table_header_selected(self, event: DataTable.HeaderSelected) -> None:
        """A click on a header sorts by it; a second click reverses."""
        key = str(event.column_key.value)
        if key in SORTS:
            event.stop()
            self.set_sort(key, reverse=not self.sort_reverse if key == self.sort_key else False)

    def set_filter(self, text: str) -> None:
        """List only the processes matching `text` (their GPU, pid, user or command line)."""
        self.filter_text = text
        if self.frame is not None:
            self.show(self.frame)

    def show(self, frame: TelemetryFrame) -> None:
        """Show the frame's processes (a frame whose lists were not read keeps the rows shown)."""
        if frame.gpus and all(g.processes is None for g in frame.gpus) and self.frame is not None:
            self.border_subtitle = processes_note(frame) + " (as last read)"
            return
        self.frame = frame
        self.border_subtitle = processes_note(frame)
        pairs = process_rows(frame, self.filter_text, self.sort_key, self.sort_reverse)
        keys = [key for key, _, _ in self._columns] + ["command"]
        rows = [tuple(process_cells(g, p, frame.taken_at_s)[k] for k in keys) for g, p in pairs]
        if rows == self._shown:
            return
        self.clear()
        for (gpu, proc), cells in zip(pairs, rows, strict=True):
            self.add_row(*(cut_with_ellipsis(Text(c)) for c in cells), key=f"pid-{gpu.index}-{proc.pid}")
        self._shown = rows
