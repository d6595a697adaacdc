"""Provides GpuDetailScreen (enter on a GPU row): clocks against their maximum, the clock-event (throttle) history of
the last ticks, PCIe link and traffic, NVLink, ECC, memory and the GPU's processes."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from decodetop.tui.model import GpuView, TelemetryFrame
from decodetop.tui.widgets.gpu_table import GIB, SPARK_POINTS, SPARK_WINDOW_S, display_bus_id, history_cells
from decodetop.tui.widgets.process_table import process_cells
from decodetop.tui.widgets.telemetry_history import TelemetryHistory

PERCENT = 100.0


def _of(now: float | None, top: float | None, unit: str) -> str:
    if now is None:
        return "–"
    if not top:
        return f"{now:.0f} {unit}"
    return f"{now:.0f} / {top:.0f} {unit} ({PERCENT * now / top:.0f} %)"


def _recent(history: Sequence[GpuView], now_s: float) -> TelemetryHistory:
    """A history of the recent views alone, one a sparkline cell (where no longer history is at hand)."""
    trend = TelemetryHistory()
    step = SPARK_WINDOW_S / SPARK_POINTS
    recent = list(history[-SPARK_POINTS:])
    for age, view in enumerate(reversed(recent)):  # the newest at `now_s`
        trend.add(TelemetryFrame(taken_at_s=now_s - age * step, gpus=(view,)))
    return trend


def gpu_detail_text(
    gpu: GpuView, history: Sequence[GpuView], trend: TelemetryHistory | None = None, now_s: float = 0.0
) -> Text:
    """The body of the GPU detail screen (pure, for tests); `history` is the GPU's recent views, oldest first;
    `trend` the per-GPU history the sparklines show, the ten minutes up to `now_s` (without it: `history`)."""
    text = Text()
    text.append(f"GPU {gpu.index}  {gpu.name or '?'}  bus {display_bus_id(gpu.bus_id) or '?'}\n", style="bold")
    text.append("\nclocks\n", style="bold")
    text.append(f"  SM       {_of(gpu.sm_clock_mhz, gpu.sm_clock_max_mhz, 'MHz')}\n")
    text.append(f"  memory   {_of(gpu.mem_clock_mhz, gpu.mem_clock_max_mhz, 'MHz')}\n")
    text.append(f"  power    {_of(gpu.power_w, gpu.power_limit_w, 'W')}\n")
    text.append(f"  temp     {'–' if gpu.temp_c is None else f'{gpu.temp_c:.0f} °C'}\n")
    text.append("\nprocesses\n", style="bold")
    if gpu.processes is None:
        text.append(f"  not read this tick{': ' + gpu.processes_note if gpu.processes_note else ''}\n")
    elif not gpu.processes:
        text.append("  none\n")
    for proc in gpu.processes or ():
        cells = process_cells(gpu, proc, now_s or None)
        text.append(
            f"  {cells['pid']:>8}  {cells['user']:<10} {cells['mem']:>9}  SM {cells['sm']:>4}  CPU {cells['cpu']:>4}  "
            f"RSS {cells['rss']:>9}  {cells['elapsed']:>4}  {cells['command']}\n"
        )
    text.append(f"\nclock events over the last {len(history)} ticks\n", style="bold")
    for first, last, reasons in clock_event_runs(history):
        span = f"tick {first}" if first == last else f"ticks {first}…{last}"
        text.append(f"  {span:<14} {reasons}\n")
    if gpu.clock_event_share:
        shares = ", ".join(f"{name} {PERCENT * share:.0f} %" for name, share in gpu.clock_event_share if share > 0)
        text.append(f"  share of the last tick: {shares or 'none'}\n")
    spark = history_cells(gpu, trend if trend is not None else _recent(history, now_s), now_s)
    text.append("\nhistory, last ten minutes\n", style="bold")
    for label, key in (("util", "util_hist"), ("memory", "mem_hist"), ("power", "power_hist"), ("temp", "temp_hist")):
        text.append(f"  {label:<8} {spark[key] or '–'}\n")
    text.append("\nPCIe\n", style="bold")
    link = (
        "–" if gpu.pcie_gen is None else f"Gen{gpu.pcie_gen} x{gpu.pcie_width if gpu.pcie_width is not None else '?'}"
    )
    top = "–" if gpu.pcie_gen_max is None else f"Gen{gpu.pcie_gen_max} x{gpu.pcie_width_max or '?'}"
    text.append(f"  link     {link} (max {top}")
    if gpu.pcie_gen_gpu_max is not None and gpu.pcie_gen_max is not None and gpu.pcie_gen_gpu_max > gpu.pcie_gen_max:
        text.append(f"; the GPU could do Gen{gpu.pcie_gen_gpu_max}: the slot or riser limits it")
    text.append(")\n")
    tx = "–" if gpu.pcie_tx_gbps is None else f"{gpu.pcie_tx_gbps:.2f}"
    rx = "–" if gpu.pcie_rx_gbps is None else f"{gpu.pcie_rx_gbps:.2f}"
    text.append(f"  TX / RX  {tx} / {rx} GB/s\n")
    text.append(f"  replays  {'–' if gpu.pcie_replay_count is None else gpu.pcie_replay_count}\n")
    text.append("\nNVLink, ECC, memory\n", style="bold")
    if gpu.nvlink_links:
        text.append(
            f"  NVLink   {gpu.nvlink_active if gpu.nvlink_active is not None else '?'} of {gpu.nvlink_links} active\n"
        )
    else:
        text.append("  NVLink   none" if gpu.nvlink_links == 0 else "  NVLink   –")
        text.append("\n")
    _nvlink_traffic(text, gpu)
    ecc = "off" if gpu.ecc_enabled is False else ("on" if gpu.ecc_enabled else "–")
    text.append(f"  ECC      {ecc}; uncorrected {_count(gpu.ecc_uncorrected)}, corrected {_count(gpu.ecc_corrected)}\n")
    if gpu.mem_used_bytes is not None and gpu.mem_total_bytes:
        text.append(f"  memory   {gpu.mem_used_bytes / GIB:.1f} / {gpu.mem_total_bytes / GIB:.0f} GiB used")
        if gpu.mem_util_pct is not None:
            text.append(f", controller busy {gpu.mem_util_pct:.0f} %")
        text.append("\n")
    return text


NVLINK_LINKS_PER_ROW = 3
"""Links side by side in the per-link list: 18 links (an H200's) in six rows."""


def _nvlink_traffic(text: Text, gpu: GpuView) -> None:
    """NVLink TX / RX over all links and per link (GB/s), or n/a and why, where the source says anything."""
    if gpu.nvlink_tx_gbps is None and gpu.nvlink_rx_gbps is None:
        if gpu.nvlink_note:
            text.append("  traffic  n/a (")
            text.append(gpu.nvlink_note)  # NVML's reason, appended as plain text
            text.append(")\n")
        return
    text.append(f"  TX / RX  {_gbps(gpu.nvlink_tx_gbps)} / {_gbps(gpu.nvlink_rx_gbps)} GB/s over all links\n")
    cells = [f"L{link:<2} {_gbps(tx)} / {_gbps(rx)}" for link, tx, rx in gpu.nvlink_link_gbps]
    for start in range(0, len(cells), NVLINK_LINKS_PER_ROW):
        text.append("    " + "   ".join(f"{c:<18}" for c in cells[start : start + NVLINK_LINKS_PER_ROW]).rstrip())
        text.append("\n")
    if cells:
        text.append("    (per link: TX / RX GB/s)\n")


def _gbps(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}"


def clock_event_runs(history: Sequence[GpuView]) -> list[tuple[int, int, str]]:
    """(first tick, last tick, reasons) for each run of ticks with the same reasons; ticks count back from 0 (now)."""
    runs: list[tuple[int, int, str]] = []
    for tick, view in enumerate(history):
        reasons = ", ".join(r for r in view.clock_reasons if r != "none") or "none"
        age = tick - len(history) + 1
        if runs and runs[-1][2] == reasons:
            runs[-1] = (runs[-1][0], age, reasons)
        else:
            runs.append((age, age, reasons))
    return runs


def _count(value: int | None) -> str:
    return "–" if value is None else str(value)


class GpuDetailScreen(ModalScreen[None]):
    """One GPU in full; escape or q closes it."""

    DEFAULT_CSS = """
    GpuDetailScreen { align: center middle; }
    GpuDetailScreen > VerticalScroll { width: 90%; max-width: 120; height: auto; max-height: 90%;
        border: round $primary; background: $surface; padding: 0 1; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape,q,enter", "close", "close", show=False)]

    def __init__(
        self, gpu: GpuView, history: Sequence[GpuView], trend: TelemetryHistory | None = None, now_s: float = 0.0
    ) -> None:
        super().__init__()
        self.gpu = gpu
        self.history = list(history)
        self.trend = trend
        self.now_s = now_s

    def compose(self) -> ComposeResult:
        """The text in a scrollable box."""
        with VerticalScroll() as box:
            box.border_title = f"GPU {self.gpu.index} (escape closes)"
            yield Static(gpu_detail_text(self.gpu, self.history, self.trend, self.now_s), id="gpu-detail")

    def action_close(self) -> None:
        """Close."""
        self.dismiss(None)
