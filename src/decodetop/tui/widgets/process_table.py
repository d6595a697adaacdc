"""Provides ProcessTable: every process with a context on a GPU (GPU, pid, user, GPU memory, SM share, command), as
nvitop lists them; rows keyed "pid-<gpu>-<pid>", largest GPU memory first."""

from __future__ import annotations

from rich.text import Text
from textual import events
from textual.widgets import DataTable

from decodetop.textfmt import format_bytes
from decodetop.tui.model import GpuProcessView, GpuView, TelemetryFrame
from decodetop.tui.widgets.cells import cut_with_ellipsis
from decodetop.tui.widgets.gpu_table import matches

COLUMNS = (("gpu", "GPU", 3), ("pid", "pid", 8), ("user", "user", 10), ("mem", "GPU mem", 9), ("sm", "SM%", 4))
"""The fixed columns; the command takes the rest of the width."""
COMMAND_MIN = 20
CELL_PADDING = 1
SCROLLBAR_CELLS = 2


def process_rows(frame: TelemetryFrame, filter_text: str = "") -> list[tuple[GpuView, GpuProcessView]]:
    """(GPU, process) pairs to list: GPUs matching the filter, largest GPU memory first, then by GPU and pid."""
    rows = [(g, p) for g in frame.gpus if matches(g, filter_text) for p in g.processes or ()]
    rows.sort(key=lambda gp: (-(gp[1].used_mem_bytes or 0), gp[0].index, gp[1].pid))
    return rows


def process_cells(gpu: GpuView, proc: GpuProcessView) -> dict[str, str]:
    """The plain text of each column for one process."""
    return {
        "gpu": str(gpu.index),
        "pid": str(proc.pid),
        "user": proc.user or "?",
        "mem": "–" if proc.used_mem_bytes is None else format_bytes(proc.used_mem_bytes),
        "sm": "–" if proc.sm_util_pct is None else f"{proc.sm_util_pct:.0f}%",
        "command": proc.command or "?",
    }


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
        self._command_width = COMMAND_MIN
        self._shown: list[tuple[str, ...]] = []

    def on_mount(self) -> None:
        """Set up the columns."""
        self._add_columns()
        self.border_title = "processes"

    def _add_columns(self) -> None:
        for key, label, width in COLUMNS:
            self.add_column(label, key=key, width=width)
        self.add_column("command", key="command", width=self._command_width)

    def on_resize(self, event: events.Resize) -> None:
        """The command column takes the width there is."""
        fixed = sum(w + 2 * CELL_PADDING for _, _, w in COLUMNS)
        width = max(COMMAND_MIN, event.size.width - fixed - 2 * CELL_PADDING - SCROLLBAR_CELLS)
        if width != self._command_width:
            self._command_width = width
            self.clear(columns=True)
            self._shown = []
            self._add_columns()
            if self.frame is not None:
                self.show(self.frame)

    def set_filter(self, text: str) -> None:
        """List only the processes of GPUs matching `text`."""
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
        rows = [tuple(process_cells(g, p).values()) for g, p in process_rows(frame, self.filter_text)]
        if rows == self._shown:
            return
        self.clear()
        for gpu_pid, cells in zip(process_rows(frame, self.filter_text), rows, strict=True):
            self.add_row(*(cut_with_ellipsis(Text(c)) for c in cells), key=f"pid-{gpu_pid[0].index}-{gpu_pid[1].pid}")
        self._shown = rows
