"""Provides GpuTable: one row per GPU (8 fit), values that look wrong highlighted; rows keyed "gpu-<index>".

When NVML gives nothing, a single row says why (no driver, no library, a VM without GPUs) instead of an empty grid.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, replace
from typing import ClassVar

from rich.text import Text
from textual import events
from textual.widgets import DataTable

from decodetop.tui.model import GpuView, TelemetryFrame
from decodetop.tui.widgets.cells import CellCache
from decodetop.tui.widgets.telemetry_history import TelemetryHistory

# docs/reference/healthchecks.md N3: HwSlowdown 0x8, HwThermal 0x40, HwPowerBrake 0x80 -> fail; SwThermal 0x20,
# SwPowerCap 0x4 -> warn;
# GpuIdle, ApplicationsClocksSetting, SyncBoost, DisplayClockSetting -> info.
# Names as `decodetop.collectors.telemetry.CLOCK_EVENT_REASONS` decodes them.
BAD_REASONS = frozenset({"HwSlowdown", "HwThermalSlowdown", "HwPowerBrakeSlowdown"})
WARN_REASONS = frozenset({"SwThermalSlowdown", "SwPowerCap"})
HOT_WARN_C = 80.0
"""Above this a datacenter GPU is close to its slowdown threshold (H100/H200 slow down in the high 80s °C)."""
HOT_BAD_C = 87.0
POWER_NEAR_LIMIT = 0.95
"""Power at or above this share of the enforced limit means the power cap is about to act."""
CLOCK_LOW_SHARE = 0.9
"""SM clock below this share of max while busy (util ≥ BUSY_UTIL_PCT) is worth a look."""
BUSY_UTIL_PCT = 50.0
MEM_FULL_SHARE = 0.95

GIB = 1024**3


@dataclass(frozen=True)
class GpuColumn:
    """One column the table can show."""

    key: str
    label: str
    width: int
    priority: int
    """Lower shows first: narrow terminals keep the columns that say most about a decode host."""


BAR_CELLS = 5
"""Width of the utilisation and memory bars (eighth-block steps: 40 levels)."""
BAR_GLYPHS = " ▏▎▍▌▋▊▉█"

COLUMNS: tuple[GpuColumn, ...] = (
    GpuColumn("gpu", "GPU", 3, 0),
    GpuColumn("name", "name", 10, 11),
    GpuColumn("bus", "bus", 7, 10),
    GpuColumn("util", "util", 4, 1),
    GpuColumn("util_bar", "", BAR_CELLS, 9),
    GpuColumn("util_hist", "util 10m", 9, 8),
    GpuColumn("mem", "mem GiB", 7, 2),
    GpuColumn("mem_bar", "", BAR_CELLS, 9),
    GpuColumn("memutil", "mem%", 4, 14),
    GpuColumn("mem_hist", "mem 10m", 9, 16),
    GpuColumn("sm", "SM MHz", 9, 3),
    GpuColumn("memclk", "memclk", 6, 18),
    GpuColumn("power", "power W", 7, 6),
    GpuColumn("power_hist", "power 10m", 10, 15),
    GpuColumn("temp", "°C", 3, 4),
    GpuColumn("temp_hist", "°C 10m", 9, 17),
    GpuColumn("pcie", "PCIe g×w", 9, 7),
    GpuColumn("txrx", "TX/RX GB/s", 10, 9),
    GpuColumn("nvlink", "NVLink", 6, 13),
    GpuColumn("ecc", "ECC", 4, 12),
    GpuColumn("reasons", "clock events", 14, 5),
)
"""Every column in display order. Widths fit their widest usual value ("1980/1980", "5x16/5x16", "700/700", a
9-point sparkline); the clock-event column takes what room is left, so a tick never re-measures a column."""
COLUMN_WIDTHS = {c.key: c.width for c in COLUMNS}
FLEX_COLUMN = "reasons"
CELL_PADDING = 1
"""DataTable's default padding each side of a cell."""
SCROLLBAR_CELLS = 2
"""Room kept for the vertical scrollbar, so a scrollbar never pushes a column out of view."""
SPARK_POINTS = 9
"""Recent views kept per GPU (the details screen's throttle history)."""
SPARK_WINDOW_S = 600.0
"""A sparkline spans the last ten minutes, each cell the mean of its slice (`TelemetryHistory`, downsampled)."""
SPARK_GLYPHS = "▁▂▃▄▅▆▇█"
SORTS: tuple[str, ...] = ("gpu", "util", "mem", "power", "temp")
"""Sort orders `o` cycles through (also chosen by clicking those column headers); all but "gpu" largest first."""
TEMP_SCALE_C = 100.0
"""Top of the temperature sparkline (datacenter GPUs slow down in the high 80s °C)."""


def fit_columns(table_width: int) -> tuple[GpuColumn, ...]:
    """The columns a table `table_width` cells wide shows, in display order: by priority while they fit, then the
    clock-event column widened by what is left."""
    room = table_width - SCROLLBAR_CELLS
    chosen: set[str] = set()
    for column in sorted(COLUMNS, key=lambda c: c.priority):
        need = column.width + 2 * CELL_PADDING
        if need <= room:
            chosen.add(column.key)
            room -= need
    out = []
    for column in COLUMNS:
        if column.key in chosen:
            out.append(replace(column, width=column.width + room) if column.key == FLEX_COLUMN else column)
    return tuple(out)


def sparkline(values: list[float | None], top: float) -> str:
    """Values as block glyphs from ▁ (0) to █ (`top` or more), newest last; a slice without a value is a space."""
    if top <= 0:
        return ""
    steps = len(SPARK_GLYPHS) - 1
    return "".join(" " if v is None else SPARK_GLYPHS[max(0, min(steps, round(steps * v / top)))] for v in values)


def bar(share: float | None, cells: int = BAR_CELLS) -> str:
    """A horizontal bar of `share` (0..1) in `cells` cells, in eighths ("███▌ " for 0.7); "" when unknown."""
    if share is None:
        return ""
    eighths = round(max(0.0, min(1.0, share)) * cells * 8)
    full, part = divmod(eighths, 8)
    return ("█" * full + (BAR_GLYPHS[part] if part else "")).ljust(cells)


def _num(value: float | None, fmt: str = "{:.0f}") -> str:
    return "–" if value is None else fmt.format(value)


def classify(gpu: GpuView) -> dict[str, str]:
    """Which cells look wrong: column key → "bad" or "warn" (pure, for tests)."""
    out: dict[str, str] = {}
    if gpu.pcie_width is not None and gpu.pcie_width_max is not None and gpu.pcie_width < gpu.pcie_width_max:
        out["pcie"] = "bad"
    elif gpu.pcie_gen is not None and gpu.pcie_gen_max is not None and gpu.pcie_gen < gpu.pcie_gen_max:
        out["pcie"] = "warn"  # gen drops at idle to save power on some boards; a warn, not a fail
    reasons = set(gpu.clock_reasons)
    if reasons & BAD_REASONS:
        out["reasons"] = "bad"
    elif reasons & WARN_REASONS:
        out["reasons"] = "warn"
    if gpu.temp_c is not None:
        if gpu.temp_c >= HOT_BAD_C:
            out["temp"] = "bad"
        elif gpu.temp_c >= HOT_WARN_C:
            out["temp"] = "warn"
    if gpu.power_w is not None and gpu.power_limit_w and gpu.power_w >= POWER_NEAR_LIMIT * gpu.power_limit_w:
        out["power"] = "warn"
    if (
        gpu.sm_clock_mhz is not None
        and gpu.sm_clock_max_mhz
        and gpu.util_pct is not None
        and gpu.util_pct >= BUSY_UTIL_PCT
        and gpu.sm_clock_mhz < CLOCK_LOW_SHARE * gpu.sm_clock_max_mhz
    ):
        out["sm"] = "warn"
    if (
        gpu.mem_used_bytes is not None
        and gpu.mem_total_bytes
        and gpu.mem_used_bytes >= MEM_FULL_SHARE * gpu.mem_total_bytes
    ):
        out["mem"] = "warn"
    return out


SHORT_REASONS = {
    "HwThermalSlowdown": "HwThermal",
    "HwPowerBrakeSlowdown": "HwPowerBrake",
    "SwThermalSlowdown": "SwThermal",
    "ApplicationsClocksSetting": "AppClocks",
    "DisplayClockSetting": "DisplayClock",
}
"""Clock-event names as the table shows them (the details screen and the health panel give NVML's names)."""


def display_bus_id(bus_id: str) -> str:
    """The bus id without the usual PCI domain ("0000:3b:00.0" → "3b:00.0")."""
    return bus_id.removeprefix("0000:")


def history_cells(gpu: GpuView, trend: TelemetryHistory, now_s: float) -> dict[str, str]:
    """The bars and the sparkline columns of one GPU: the last ten minutes, each cell the mean of its slice."""

    def means(name: str) -> list[float | None]:
        return trend.means(name, gpu.index, now_s, SPARK_WINDOW_S, SPARK_POINTS)

    util, mem, power, temp = means("util"), means("mem"), means("power"), means("temp")
    mem_top = (gpu.mem_total_bytes or 0) / GIB or max((m for m in mem if m is not None), default=0.0)
    power_top = gpu.power_limit_w or max((w for w in power if w is not None), default=0.0)
    hot = max((c for c in temp if c is not None), default=0.0)
    mem_share = None
    if gpu.mem_used_bytes is not None and gpu.mem_total_bytes:
        mem_share = gpu.mem_used_bytes / gpu.mem_total_bytes
    return {
        "util_bar": bar(None if gpu.util_pct is None else gpu.util_pct / 100.0),
        "mem_bar": bar(mem_share),
        "util_hist": sparkline(util, 100.0),
        "mem_hist": sparkline(mem, mem_top),
        "power_hist": sparkline(power, power_top),
        "temp_hist": sparkline(temp, max(TEMP_SCALE_C, hot)),
    }


def sort_value(gpu: GpuView, key: str) -> float:
    """What a sort order compares (missing values last)."""
    values = {
        "gpu": float(gpu.index),
        "util": gpu.util_pct,
        "mem": None if gpu.mem_used_bytes is None else float(gpu.mem_used_bytes),
        "power": gpu.power_w,
        "temp": gpu.temp_c,
    }
    value = values.get(key)
    return float("-inf") if value is None else value


def matches(gpu: GpuView, text: str) -> bool:
    """True when `text` (any case) is in one of the GPU's cells, its full name or bus id, or one of its processes'
    user or command."""
    needle = text.strip().lower()
    if not needle:
        return True
    hay = [*gpu_cells(gpu).values(), gpu.name, gpu.bus_id]
    hay += [f"{p.pid} {p.user} {p.command}" for p in gpu.processes or ()]
    return any(needle in h.lower() for h in hay)


def gpu_cells(gpu: GpuView) -> dict[str, str]:
    """The plain text of each column for one GPU."""
    pcie_now = "–" if gpu.pcie_gen is None else f"{gpu.pcie_gen}x{_num(gpu.pcie_width)}"
    pcie_max = "–" if gpu.pcie_gen_max is None else f"{gpu.pcie_gen_max}x{_num(gpu.pcie_width_max)}"
    reasons = [r for r in gpu.clock_reasons if r != "none"]
    mem = "–"
    if gpu.mem_used_bytes is not None and gpu.mem_total_bytes is not None:
        mem = f"{gpu.mem_used_bytes / GIB:.0f}/{gpu.mem_total_bytes / GIB:.0f}"
    ecc = "–"
    if gpu.ecc_enabled is False:
        ecc = "off"
    elif gpu.ecc_uncorrected is not None:
        ecc = str(gpu.ecc_uncorrected)
    nvlink = "–"
    if gpu.nvlink_links:
        nvlink = f"{_num(gpu.nvlink_active)}/{gpu.nvlink_links}"
    elif gpu.nvlink_links == 0:
        nvlink = "none"
    return {
        "gpu": str(gpu.index),
        "name": gpu.name.removeprefix("NVIDIA ") or "–",
        "bus": display_bus_id(gpu.bus_id) or "–",
        "util": _num(gpu.util_pct, "{:.0f}%"),
        "memutil": _num(gpu.mem_util_pct, "{:.0f}%"),
        "nvlink": nvlink,
        "ecc": ecc,
        "sm": f"{_num(gpu.sm_clock_mhz)}/{_num(gpu.sm_clock_max_mhz)}",
        "memclk": _num(gpu.mem_clock_mhz),
        "pcie": f"{pcie_now}/{pcie_max}",
        "txrx": f"{_num(gpu.pcie_tx_gbps, '{:.1f}')}/{_num(gpu.pcie_rx_gbps, '{:.1f}')}",
        "power": f"{_num(gpu.power_w)}/{_num(gpu.power_limit_w)}",
        "temp": _num(gpu.temp_c),
        "reasons": ",".join(SHORT_REASONS.get(r, r) for r in reasons) if reasons else "none",
        "mem": mem,
    }


class GpuTable(DataTable[Text]):
    """All GPUs, updated in place each tick; the columns follow the table's width, rows can be sorted (`o`, or a
    click on a sortable header) and filtered (`/`).

    | Class | Description |
    | :- | :- |
    | `gpu-table--bad` | a value that costs performance now (PCIe width down, HW slowdown, too hot) |
    | `gpu-table--warn` | a value worth a look |
    | `gpu-table--muted` | the "why empty" row, and the sparklines |
    """

    COMPONENT_CLASSES: ClassVar[set[str]] = {"gpu-table--bad", "gpu-table--warn", "gpu-table--muted"}
    DEFAULT_CSS = """
    GpuTable { height: 1fr; }
    GpuTable > .gpu-table--bad { color: $state-bad; text-style: bold reverse; }
    GpuTable > .gpu-table--warn { color: $state-warn; text-style: bold; }
    GpuTable > .gpu-table--muted { color: $state-muted; }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id, cursor_type="row", zebra_stripes=True)
        self._row_keys: list[str] = []
        self._empty_reason: str | None = None
        self._cache = CellCache()
        self._columns: tuple[GpuColumn, ...] = fit_columns(80)
        self.history: dict[int, deque[GpuView]] = {}
        """Each GPU's recent views (the sparklines and the details screen's throttle history)."""
        self.frame: TelemetryFrame | None = None
        """The frame shown."""
        self.sort_key = "gpu"
        self.sort_reverse = False
        """True: the other way round (the GPU order descending, the rest smallest first)."""
        self.filter_text = ""
        self.trend = TelemetryHistory()
        """The per-GPU history the sparklines draw from (the app hands its own)."""

    def on_mount(self) -> None:
        """Set up the columns."""
        self._add_columns()

    def _add_columns(self) -> None:
        for column in self._columns:
            self.add_column(self._label(column), key=column.key, width=column.width)

    def _label(self, column: GpuColumn) -> str:
        """The header, with ▼ (largest first) or ▲ on the sorted column (the GPU order: only when reversed)."""
        if column.key != self.sort_key or (column.key == "gpu" and not self.sort_reverse):
            return column.label
        descending = (column.key != "gpu") != self.sort_reverse
        return column.label + ("▼" if descending else "▲")

    def on_resize(self, event: events.Resize) -> None:
        """Columns for the new width (from the event: never one resize behind)."""
        columns = fit_columns(event.size.width)
        if columns != self._columns:
            self._columns = columns
            self._rebuild()

    def _rebuild(self) -> None:
        row = self.cursor_row
        self.clear(columns=True)
        self._cache.clear()
        self._row_keys = []
        self._empty_reason = None
        self._add_columns()
        if self.frame is not None:
            self._draw(self.frame)
        if 0 <= row < self.row_count:
            self.move_cursor(row=row, scroll=False)

    def set_sort(self, key: str, *, reverse: bool = False) -> None:
        """Sort by `key` (one of SORTS), the other way round with `reverse`."""
        if key in SORTS and (key, reverse) != (self.sort_key, self.sort_reverse):
            self.sort_key, self.sort_reverse = key, reverse
            self._rebuild()

    def reverse_sort(self) -> str:
        """The same order the other way round; returns what the header now says ("util ▲")."""
        self.set_sort(self.sort_key, reverse=not self.sort_reverse)
        return f"{self.sort_key} {'reversed' if self.sort_reverse else ''}".strip()

    def cycle_sort(self) -> str:
        """The next sort order; returns it."""
        self.set_sort(SORTS[(SORTS.index(self.sort_key) + 1) % len(SORTS)])
        return self.sort_key

    def set_filter(self, text: str) -> None:
        """Show only GPUs matching `text` (empty: all)."""
        if text != self.filter_text:
            self.filter_text = text
            if self.frame is not None:
                self._draw(self.frame)

    def on_data_table_header_selected(self, event: DataTable.HeaderSelected) -> None:
        """A click on a sortable header sorts by it."""
        key = str(event.column_key.value)
        if key in SORTS:  # a second click on the sorted column reverses it
            event.stop()
            self.set_sort(key, reverse=not self.sort_reverse if key == self.sort_key else False)

    @property
    def selected_gpu(self) -> GpuView | None:
        """The GPU under the cursor."""
        if self.frame is None or not 0 <= self.cursor_row < len(self._row_keys):
            return None
        key = self._row_keys[self.cursor_row]
        return next((g for g in self.frame.gpus if f"gpu-{g.index}" == key), None)

    def show(self, frame: TelemetryFrame, trend: TelemetryHistory | None = None) -> None:
        """Show one telemetry frame: update rows in place, or one row saying why there is no GPU. `trend`: the
        history the sparklines draw (the app's, already holding this frame); without it the table keeps its own."""
        for gpu in frame.gpus:
            self.history.setdefault(gpu.index, deque(maxlen=SPARK_POINTS)).append(gpu)
        if trend is None:
            self.trend.add(frame)
        else:
            self.trend = trend
        self.frame = frame
        self._draw(frame)

    def _draw(self, frame: TelemetryFrame) -> None:
        keys = [c.key for c in self._columns]
        if not frame.gpus:
            reason = frame.unavailable_reason or "no GPU found"
            if reason != self._empty_reason:
                self.clear()
                self._row_keys = []
                self._cache.clear()
                muted = self.get_component_rich_style("gpu-table--muted", partial=True)
                cells = [Text("–", style=muted) for _ in keys]
                cells[-1] = Text(reason, style=muted)
                self.add_row(*cells, key="none")
                self._empty_reason = reason
            return
        if self._empty_reason is not None:
            self.clear()
            self._cache.clear()
            self._empty_reason = None
        styles = {
            "bad": self.get_component_rich_style("gpu-table--bad", partial=True),
            "warn": self.get_component_rich_style("gpu-table--warn", partial=True),
            "muted": self.get_component_rich_style("gpu-table--muted", partial=True),
        }
        shown = [g for g in frame.gpus if matches(g, self.filter_text)]
        reverse = (self.sort_key != "gpu") != self.sort_reverse
        shown.sort(key=lambda g: (sort_value(g, self.sort_key), -g.index if reverse else g.index), reverse=reverse)
        order = [f"gpu-{g.index}" for g in shown]
        rebuild = order != self._row_keys
        if rebuild:
            self.clear()
            self._cache.clear()
            self._row_keys = order
        for gpu in shown:
            key = f"gpu-{gpu.index}"
            flags = classify(gpu)
            plain = gpu_cells(gpu) | history_cells(gpu, self.trend, frame.taken_at_s)
            row_cells = {}
            for col in keys:
                quiet = col.endswith(("_hist", "_bar"))
                style = styles[flags[col]] if col in flags else (styles["muted"] if quiet else "")
                row_cells[col] = Text(plain[col], style=style)
            if not rebuild:
                for col, text in row_cells.items():
                    self._cache.set(self, key, col, text, fixed_width=True)
            else:
                self.add_row(*row_cells.values(), key=key)
                for col, text in row_cells.items():
                    self._cache.remember(key, col, text)
