"""Provides BudgetHistory: the two histories a performance engineer watches besides the GPUs — the observed step (and
so tok/s per stream) over time, and each component's figure since the baseline — kept from every composition the
screen showed, downsampled as the telemetry is (no textual)."""

from __future__ import annotations

from collections.abc import Mapping

from decodetop.history import HistoryEntry
from decodetop.tui.model import BudgetView
from decodetop.tui.widgets.telemetry_history import Ring


class BudgetHistory:
    """(time, ms) of the observed step and of each component, oldest first."""

    def __init__(self) -> None:
        self.observed = Ring()
        self.components: dict[str, Ring] = {}
        self.labels: dict[str, str] = {}
        """Component key → its label (for the chart's legend)."""
        self.baseline_at_s: float | None = None
        """When the baseline the components start from was saved (None: no baseline)."""

    def add(self, view: BudgetView, at_s: float) -> None:
        """One composition shown at `at_s`: its observed step and every component with a figure."""
        if view.observed_ms > 0:
            self.observed.append((at_s, view.observed_ms))
        for seg in view.components:
            if seg.status != "missing":
                self.labels.setdefault(seg.key, seg.label)
                self.components.setdefault(seg.key, Ring()).append((at_s, seg.ms))

    def start_from(self, baseline: HistoryEntry | None) -> None:
        """Start each component's line at its figure in the baseline's stored budget (a baseline without a budget,
        or none, leaves the lines as they are)."""
        stored = None if baseline is None else baseline.payload.get("budget")
        if baseline is None or not isinstance(stored, Mapping):
            return
        self.baseline_at_s = baseline.recorded_at_s
        for seg in stored.get("segments", ()):
            if not isinstance(seg, Mapping):
                continue
            key, ms = seg.get("component"), seg.get("ms")
            if isinstance(key, str) and isinstance(ms, (int, float)) and not isinstance(ms, bool):
                ring = self.components.setdefault(key, Ring())
                if not ring.fine or ring.fine[0][0] > baseline.recorded_at_s:
                    points = [(baseline.recorded_at_s, float(ms)), *ring.points()]
                    fresh = Ring()
                    for point in points:
                        fresh.append(point)
                    self.components[key] = fresh
                if isinstance(seg.get("label"), str):
                    self.labels.setdefault(key, str(seg["label"]))
