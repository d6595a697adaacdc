"""Provides TelemetryHistory: per-GPU rings of recent values for the time-series charts (no textual)."""

from __future__ import annotations

from collections import deque

from decodetop.tui.model import TelemetryFrame

HISTORY_POINTS = 300
"""Telemetry points kept per GPU (5 minutes at a 1 s tick)."""
SERIES = ("util", "mem", "sm", "pcie", "power", "temp")
"""What is kept per GPU: utilisation %, memory used GiB, SM clock MHz, PCIe TX+RX GB/s, power W, temperature °C."""
GIB = 1024**3


class TelemetryHistory:
    """Per-GPU rings of (time, value) for the time-series charts."""

    def __init__(self, points: int = HISTORY_POINTS) -> None:
        self.points = points
        self.series: dict[str, dict[int, deque[tuple[float, float]]]] = {name: {} for name in SERIES}

    def add(self, frame: TelemetryFrame) -> None:
        """Append one frame's values."""
        for gpu in frame.gpus:
            values = {
                "util": gpu.util_pct,
                "mem": None if gpu.mem_used_bytes is None else gpu.mem_used_bytes / GIB,
                "temp": gpu.temp_c,
                "sm": gpu.sm_clock_mhz,
                "pcie": None
                if gpu.pcie_tx_gbps is None or gpu.pcie_rx_gbps is None
                else gpu.pcie_tx_gbps + gpu.pcie_rx_gbps,
                "power": gpu.power_w,
            }
            for name, value in values.items():
                if value is not None:
                    self.series[name].setdefault(gpu.index, deque(maxlen=self.points)).append((frame.taken_at_s, value))
