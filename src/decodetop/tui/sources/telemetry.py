"""Provides the telemetry sources: `CollectorTelemetry` over the live NVML collector (its own thread) and
`ReplayTelemetry` over recorded snapshots (``--replay``)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager

from decodetop.collectors.nvml import Nvml
from decodetop.collectors.telemetry import TelemetryCollector, TelemetrySnapshot
from decodetop.tui.model import TelemetryFrame
from decodetop.tui.sources.telemetry_views import LocalProcesses, telemetry_frame

log = logging.getLogger(__name__)


class CollectorTelemetry:
    """`TelemetrySource` over `decodetop.collectors.telemetry.TelemetryCollector` (its own daemon thread)."""

    def __init__(
        self, nvml: Nvml, interval_s: float, on_snapshot: Callable[[TelemetrySnapshot], None] | None = None
    ) -> None:
        self.nvml = nvml
        self.extra_listener = on_snapshot
        """Also called with every raw snapshot (the recorder, the Prometheus exporter)."""
        self._on_frame: Callable[[TelemetryFrame], None] | None = None
        self._processes = LocalProcesses()
        """Names the processes on the GPUs, with their CPU share since the previous tick."""
        self.collector: TelemetryCollector = TelemetryCollector(nvml, interval_s=interval_s, on_snapshot=self._snap)

    def _snap(self, snapshot: TelemetrySnapshot) -> None:
        if self.extra_listener is not None:
            try:
                self.extra_listener(snapshot)
            except Exception:  # a recorder or exporter error must not stop telemetry
                log.exception("telemetry listener failed")
        if self._on_frame is not None:
            self._processes.keep_only({p.pid for g in snapshot.gpus for p in g.processes or ()})
            self._on_frame(telemetry_frame(snapshot, self._processes))

    def start(self, on_frame: Callable[[TelemetryFrame], None]) -> None:
        """Start the collector's thread."""
        self._on_frame = on_frame
        self.collector.start()

    def latency_probe(self) -> AbstractContextManager[None]:
        """No costly NVML call (process lists) while the block runs: the plan runner's pause for a
        latency-sensitive probe (`TelemetryCollector.latency_probe`)."""
        return self.collector.latency_probe()

    def close(self) -> None:
        """Stop the thread, then release NVML."""
        self.collector.stop()
        self.nvml.close()


class ReplayTelemetry:
    """`TelemetrySource` replaying recorded snapshots (``--replay``) on a thread, one per tick."""

    def __init__(self, snapshots: Sequence[TelemetrySnapshot], interval_s: float, loop: bool = True) -> None:
        self.snapshots = list(snapshots)
        self.interval_s = interval_s
        self.loop = loop
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, on_frame: Callable[[TelemetryFrame], None]) -> None:
        """Start replaying."""

        def run() -> None:
            index = 0
            while not self._stop.is_set() and self.snapshots:
                frame = telemetry_frame(self.snapshots[index])
                on_frame(frame)
                index += 1
                if index >= len(self.snapshots):
                    if not self.loop:
                        return
                    index = 0
                self._stop.wait(self.interval_s)

        self._thread = threading.Thread(target=run, name="decodetop-replay", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop the thread."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5.0)
