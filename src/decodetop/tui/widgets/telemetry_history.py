"""Provides TelemetryHistory: per-GPU history of recent values for the charts and the GPU table's sparklines, every
tick for the last two minutes and downsampled to 10 s means for half an hour before that (no textual)."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field

from decodetop.tui.model import TelemetryFrame

FINE_POINTS = 120
"""Ticks kept as they came (two minutes at the default 1 s tick)."""
COARSE_S = 10.0
"""Older ticks are kept as means over this many seconds."""
COARSE_POINTS = 180
"""Downsampled points kept (30 minutes of 10 s means): more than the ten minutes the sparklines and charts show."""
HISTORY_POINTS = FINE_POINTS + COARSE_POINTS
"""At most this many points per GPU and value."""
SERIES = ("util", "mem", "sm", "pcie", "power", "temp")
"""What is kept per GPU: utilisation %, memory used GiB, SM clock MHz, PCIe TX+RX GB/s, power W, temperature °C."""
GIB = 1024**3


@dataclass
class Ring:
    """(time, value) points, oldest first: the newest as they came, older ones as `COARSE_S` means."""

    fine: deque[tuple[float, float]] = field(default_factory=lambda: deque(maxlen=FINE_POINTS))
    coarse: deque[tuple[float, float]] = field(default_factory=lambda: deque(maxlen=COARSE_POINTS))
    _bucket: list[tuple[float, float]] = field(default_factory=list)

    def append(self, point: tuple[float, float]) -> None:
        """Add the newest point; the one it pushes out of the fine part joins the current 10 s mean."""
        if len(self.fine) == FINE_POINTS:
            old = self.fine[0]
            if self._bucket and old[0] - self._bucket[0][0] >= COARSE_S:
                self._flush()
            self._bucket.append(old)
        self.fine.append(point)

    def _flush(self) -> None:
        times = [t for t, _ in self._bucket]
        values = [v for _, v in self._bucket]
        self.coarse.append((sum(times) / len(times), sum(values) / len(values)))
        self._bucket = []

    def points(self) -> list[tuple[float, float]]:
        """Every point held, oldest first."""
        pending = []
        if self._bucket:
            n = len(self._bucket)
            pending = [(sum(t for t, _ in self._bucket) / n, sum(v for _, v in self._bucket) / n)]
        return [*self.coarse, *pending, *self.fine]

    def means(self, now_s: float, window_s: float, cells: int) -> list[float | None]:
        """The mean of each of `cells` equal slices of the last `window_s` seconds, oldest first (None: no point)."""
        width = window_s / cells
        sums = [0.0] * cells
        counts = [0] * cells
        for t, v in self.points():
            cell = int((t - (now_s - window_s)) // width)
            if 0 <= cell < cells:
                sums[cell] += v
                counts[cell] += 1
            elif cell == cells:  # the newest point, at `now_s` exactly
                sums[-1] += v
                counts[-1] += 1
        return [s / c if c else None for s, c in zip(sums, counts, strict=True)]

    def __len__(self) -> int:
        return len(self.points())

    def __iter__(self) -> Iterator[tuple[float, float]]:
        return iter(self.points())

    def __getitem__(self, index: int) -> tuple[float, float]:
        return self.points()[index]


class TelemetryHistory:
    """Per-GPU history of (time, value) for the charts and the sparklines."""

    def __init__(self) -> None:
        self.series: dict[str, dict[int, Ring]] = {name: {} for name in SERIES}

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
                    self.series[name].setdefault(gpu.index, Ring()).append((frame.taken_at_s, value))

    def means(self, name: str, gpu: int, now_s: float, window_s: float, cells: int) -> list[float | None]:
        """`Ring.means` of one GPU's series (all None when it has none)."""
        ring = self.series[name].get(gpu)
        return ring.means(now_s, window_s, cells) if ring is not None else [None] * cells
