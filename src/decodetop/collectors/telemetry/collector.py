"""Provides `TelemetryCollector`: the sampler on its own thread, one snapshot per tick handed to a callback.

The TUI and the exporter both use it. Process lists are costly (MangoHud PR #2104: ~4.5 ms per call holding the
driver's lock, docs/reference/peers.md §3.8), so they are skipped while `collector.costly_paused` is set, which a
latency probe sets for its duration (`with collector.latency_probe(): ...`)."""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from decodetop.collectors.nvml import Nvml
from decodetop.collectors.telemetry.sampler import DEFAULT_SLOW_EVERY_TICKS, TelemetrySampler
from decodetop.collectors.telemetry.snapshot import TelemetrySnapshot

log = logging.getLogger(__name__)


class TelemetryCollector:
    """Takes a snapshot every `interval_s` on its own thread and hands it to `on_snapshot`.

    Thread-based (no textual): `start()`, then `stop()` sets the stop event and joins. `costly_paused` is a
    `threading.Event`: while set (a latency probe runs), process lists are not read. `latest` is the last snapshot.
    """

    def __init__(
        self,
        nvml: Nvml,
        *,
        interval_s: float = 1.0,
        on_snapshot: Callable[[TelemetrySnapshot], None] | None = None,
        read_processes: bool = True,
        slow_every_ticks: int = DEFAULT_SLOW_EVERY_TICKS,
        costly_paused: threading.Event | None = None,
        thread_name: str = "decodetop-telemetry",
    ) -> None:
        if not (interval_s > 0 and math.isfinite(interval_s)):
            raise ValueError(f"telemetry interval must be a positive number of seconds, got {interval_s!r}")
        self.nvml = nvml
        self.interval_s = interval_s
        self.on_snapshot = on_snapshot
        self.read_processes = read_processes
        self.costly_paused = costly_paused if costly_paused is not None else threading.Event()
        self.sampler = TelemetrySampler(nvml, slow_every_ticks=slow_every_ticks)
        self._thread_name = thread_name
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._latest: TelemetrySnapshot | None = None
        self._latest_lock = threading.Lock()
        self._sample_lock = threading.Lock()
        self._pause_depth = 0
        self._pause_lock = threading.Lock()
        self.errors = 0
        """Ticks that raised (logged; the thread goes on)."""

    @property
    def latest(self) -> TelemetrySnapshot | None:
        """The last snapshot taken (None before the first tick)."""
        with self._latest_lock:
            return self._latest

    @property
    def running(self) -> bool:
        """Whether the thread is alive."""
        return self._thread is not None and self._thread.is_alive()

    def sample_once(self) -> TelemetrySnapshot:
        """Take one snapshot now (on the caller's thread), store it as `latest` and call `on_snapshot`."""
        with self._sample_lock:
            if not self.read_processes:
                snap = self.sampler.sample(processes=False, processes_note="process lists turned off")
            elif self.costly_paused.is_set():
                snap = self.sampler.sample(processes=False, processes_note="skipped: a latency probe is running")
            else:
                snap = self.sampler.sample(processes=True)
        with self._latest_lock:
            self._latest = snap
        if self.on_snapshot is not None:
            self.on_snapshot(snap)
        return snap

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                self.sample_once()
            except Exception:  # a tick must not kill the thread; the next one retries
                self.errors += 1
                log.exception("telemetry tick failed")
            elapsed = time.monotonic() - started
            self._stop.wait(max(0.0, self.interval_s - elapsed))

    def start(self) -> None:
        """Start the thread (a daemon, so a forgotten collector never blocks exit)."""
        if self.running:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name=self._thread_name, daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Set the stop event and join the thread (a tick in flight finishes first)."""
        self._stop.set()
        thread = self._thread
        if thread is not None:
            thread.join(timeout_s)
            if thread.is_alive():
                log.warning("telemetry thread did not stop within %.1f s", timeout_s)
        self._thread = None

    @contextmanager
    def latency_probe(self) -> Iterator[None]:
        """Mark a latency probe as running: no costly NVML calls until the block ends (nests safely)."""
        with self._pause_lock:
            self._pause_depth += 1
            self.costly_paused.set()
        try:
            yield
        finally:
            with self._pause_lock:
                self._pause_depth -= 1
                if self._pause_depth == 0:
                    self.costly_paused.clear()

    def __enter__(self) -> TelemetryCollector:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
