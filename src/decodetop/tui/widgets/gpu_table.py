"""Provides GpuTable: one row per GPU (8 fit), values that look wrong highlighted; rows keyed "gpu-<index>".

When NVML gives nothing, a single row says why (no driver, no library, a VM without GPUs) instead of an empty grid.
"""

from __future__ import annotations

from typing import ClassVar

from rich.text import Text
from textual.widgets import DataTable

from decodetop.tui.model import GpuView, TelemetryFrame
from decodetop.tui.widgets.cells import CellCache

# healthchecks.md N3: HwSlowdown 0x8, HwThermal 0x40, HwPowerBrake 0x80 -> fail; SwThermal 0x20, SwPowerCap 0x4 -> warn;
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

_COLUMNS = (
    ("gpu", "GPU"),
    ("util", "util"),
    ("sm", "SM MHz"),
    ("memclk", "memclk"),
    ("pcie", "PCIe g×w"),
    ("txrx", "TX/RX GB/s"),
    ("power", "power W"),
    ("temp", "°C"),
    ("reasons", "clock events"),
    ("mem", "mem GiB"),
)
GIB = 1024**3
COLUMN_WIDTHS = {
    "gpu": 3,
    "util": 4,
    "sm": 9,
    "memclk": 6,
    "pcie": 9,
    "txrx": 10,
    "power": 7,
    "temp": 3,
    "reasons": 14,
    "mem": 7,
}
"""Fixed widths ("1980/1980", "5x16/5x16", "700/700"; long clock-event names are cut, the health panel has them
whole), so a telemetry tick never re-measures columns or re-lays out the screen."""


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


def gpu_cells(gpu: GpuView) -> dict[str, str]:
    """The plain text of each column for one GPU."""
    pcie_now = "–" if gpu.pcie_gen is None else f"{gpu.pcie_gen}x{_num(gpu.pcie_width)}"
    pcie_max = "–" if gpu.pcie_gen_max is None else f"{gpu.pcie_gen_max}x{_num(gpu.pcie_width_max)}"
    reasons = [r for r in gpu.clock_reasons if r != "none"]
    mem = "–"
    if gpu.mem_used_bytes is not None and gpu.mem_total_bytes is not None:
        mem = f"{gpu.mem_used_bytes / GIB:.0f}/{gpu.mem_total_bytes / GIB:.0f}"
    return {
        "gpu": str(gpu.index),
        "util": _num(gpu.util_pct, "{:.0f}%"),
        "sm": f"{_num(gpu.sm_clock_mhz)}/{_num(gpu.sm_clock_max_mhz)}",
        "memclk": _num(gpu.mem_clock_mhz),
        "pcie": f"{pcie_now}/{pcie_max}",
        "txrx": f"{_num(gpu.pcie_tx_gbps, '{:.1f}')}/{_num(gpu.pcie_rx_gbps, '{:.1f}')}",
        "power": f"{_num(gpu.power_w)}/{_num(gpu.power_limit_w)}",
        "temp": _num(gpu.temp_c),
        "reasons": ",".join(reasons) if reasons else "none",
        "mem": mem,
    }


class GpuTable(DataTable[Text]):
    """All GPUs, updated in place each tick.

    | Class | Description |
    | :- | :- |
    | `gpu-table--bad` | a value that costs performance now (PCIe width down, HW slowdown, too hot) |
    | `gpu-table--warn` | a value worth a look |
    | `gpu-table--muted` | the "why empty" row |
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
        self._keys: set[str] = set()
        self._empty_reason: str | None = None
        self._cache = CellCache()

    def on_mount(self) -> None:
        """Set up the columns."""
        for key, label in _COLUMNS:
            self.add_column(label, key=key, width=COLUMN_WIDTHS[key])

    def show(self, frame: TelemetryFrame) -> None:
        """Show one telemetry frame: update rows in place, or one row saying why there is no GPU."""
        if not frame.gpus:
            reason = frame.unavailable_reason or "no GPU found"
            if reason != self._empty_reason:
                self.clear()
                self._keys.clear()
                self._cache.clear()
                muted = self.get_component_rich_style("gpu-table--muted", partial=True)
                cells = [Text("–", style=muted) for _ in _COLUMNS]
                cells[-2] = Text(reason, style=muted)
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
        }
        wanted = {f"gpu-{gpu.index}" for gpu in frame.gpus}
        for key in sorted(self._keys - wanted):
            self.remove_row(key)
            self._keys.discard(key)
            self._cache.forget_row(key)
        for gpu in frame.gpus:
            key = f"gpu-{gpu.index}"
            flags = classify(gpu)
            row_cells = {
                col: Text(value, style=styles[flags[col]] if col in flags else "")
                for col, value in gpu_cells(gpu).items()
            }
            if key in self._keys:
                for col, text in row_cells.items():
                    self._cache.set(self, key, col, text, fixed_width=True)
            else:
                self.add_row(*(row_cells[col] for col, _ in _COLUMNS), key=key)
                self._keys.add(key)
                for col, text in row_cells.items():
                    self._cache.remember(key, col, text)
