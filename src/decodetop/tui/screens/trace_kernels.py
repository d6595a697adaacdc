"""Provides TraceKernelsScreen: the kernels of one traced segment (count per step, mean µs, share of the step's
kernel time, and the host op chain or module that launched them), opened by Enter on the traced bar."""

from __future__ import annotations

from typing import ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import DataTable, Static

from decodetop.traces.compare import short_name
from decodetop.traces.traced import TracedSegment
from decodetop.tui.inert_text import inert_text

COLUMNS = ("kernel", "n/step", "mean µs", "µs/step", "share", "host op chain or module")


def kernel_rows(segment: TracedSegment, name_width: int = 60) -> list[tuple[Text, ...]]:
    """The table's rows (pure, for tests): largest time first. Every cell is a `Text` (a kernel or module name is
    the trace's, chosen by whoever wrote it: never markup, controls marked)."""
    return [
        tuple(
            inert_text(cell)
            for cell in (
                short_name(k.name, name_width),
                f"{k.count_per_step:.3g}",
                f"{k.mean_us:.3g}",
                f"{k.time_us_per_step:.4g}",
                f"{k.share:.1%}",
                k.via or "-",
            )
        )
        for k in segment.kernels
    ]


class TraceKernelsScreen(ModalScreen[None]):
    """One segment's kernels; escape or q closes it."""

    DEFAULT_CSS = """
    TraceKernelsScreen { align: center middle; }
    TraceKernelsScreen > Vertical { width: 95%; max-width: 160; height: auto; max-height: 90%;
        border: round $primary; background: $surface; padding: 0 1; }
    TraceKernelsScreen #trace-kernels-title { text-style: bold; }
    TraceKernelsScreen DataTable { height: auto; max-height: 20; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "dismiss", "close"),
        Binding("q", "dismiss", "close", show=False),
    ]

    def __init__(self, segment: TracedSegment, trace_path: str) -> None:
        super().__init__()
        self.segment = segment
        self.trace_path = trace_path

    def compose(self) -> ComposeResult:
        """Title line, then the kernel table."""
        seg = self.segment
        probed = "-" if seg.probed_ms is None else f"{seg.probed_ms:.3g} ms"
        title = (
            f"{seg.label}: does cost {seg.traced_ms:.3g} ms per step (should cost {probed}), "
            f"{seg.kernels_per_step:.3g} kernels per step"
        )
        with Vertical():
            yield Static(inert_text(title), id="trace-kernels-title")
            yield Static(inert_text(self.trace_path), classes="muted")
            if seg.kernels:
                yield DataTable(id="trace-kernels", cursor_type="row", zebra_stripes=True)
            else:
                yield Static("no kernels: the GPU waited for the host here (launch and Python overhead)")

    def on_mount(self) -> None:
        """Fill the table."""
        if self.segment.kernels:
            table = self.query_one("#trace-kernels", DataTable)
            table.add_columns(*COLUMNS)
            table.add_rows(kernel_rows(self.segment))
            table.focus()

    async def action_dismiss(self, result: None = None) -> None:
        """Close."""
        self.dismiss(result)
