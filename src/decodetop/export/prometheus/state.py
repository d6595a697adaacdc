"""Provides what one Prometheus scrape renders: `ExportState` (the latest of everything, as the TUI or the exporter
command holds it) and `StateBox`, its thread-safe holder, which is a state provider (`() -> ExportState`)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

from decodetop.budget.compose import Budget
from decodetop.collectors.checks.result import CheckResult
from decodetop.collectors.serving import ServerStatus, ServerStep
from decodetop.collectors.telemetry import TelemetrySnapshot
from decodetop.probes.results import ProbeResult

Observation = ServerStep | ServerStatus
"""The live server's last answer: its step, or why there is none (carrying the last step seen)."""


@dataclass(frozen=True)
class ExportState:
    """What one scrape renders: the latest of everything, as the TUI or the exporter command holds it. A part that
    is None or empty is simply absent from the exposition."""

    telemetry: TelemetrySnapshot | None = None
    probe_results: tuple[ProbeResult, ...] = ()
    budget: Budget | None = None
    checks: tuple[CheckResult, ...] = ()
    checks_unix_s: float | None = None
    """When the checks ran (wall clock)."""
    observed: Observation | None = None
    """The live server's step or why there is none."""
    probe_interval_s: float | None = None
    """The exporter's probe schedule, when it has one."""
    notes: Mapping[str, str] = field(default_factory=dict)
    """Part → one line about its last failure (e.g. "probes": "probe group failed to start: ...")."""


class StateBox:
    """A thread-safe holder of the current `ExportState`; calling it returns the state (a state provider)."""

    def __init__(self, state: ExportState | None = None) -> None:
        self._lock = threading.Lock()
        self._state = state or ExportState()

    def __call__(self) -> ExportState:
        with self._lock:
            return self._state

    def update(self, **changes: object) -> ExportState:
        """Replace some fields (dataclasses.replace) atomically; returns the new state."""
        with self._lock:
            self._state = replace(self._state, **changes)  # type: ignore[arg-type]
            return self._state

    def add_probe_result(self, result: ProbeResult) -> ExportState:
        """Keep the latest result per probe name."""
        with self._lock:
            kept = tuple(r for r in self._state.probe_results if r.probe != result.probe)
            self._state = replace(self._state, probe_results=(*kept, result))
            return self._state


StateProvider = Callable[[], ExportState]
