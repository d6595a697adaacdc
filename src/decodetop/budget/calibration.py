"""Provides the calibration of predictions by an observed step: observed / composed for the scenario the engine
actually runs, bounded to 0.5–2, offered beside the uncalibrated figures, never in place of them.

A what-if predicts another deployment from this host's curves; where the engine's own step was observed for the
current deployment (a flag, the server's /metrics, a trace: never the assumed default), the ratio of that step to
the composed one says how far the composition sits from the engine, and the same ratio scales each variant's
prediction. The bound follows AIConfigurator's online correction (docs/reference/whatif.md §2: the median of
observed / native per workload bucket, bounded to [0.5, 2.0]): a ratio outside it says the composition misses
something the engine does, which no scale factor should paper over. Stdlib only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from decodetop.budget.compose import Budget

CALIBRATION_BOUNDS = (0.5, 2.0)
"""docs/reference/whatif.md §2 (AIConfigurator's FPM correction, bounded to [0.5, 2.0])."""


@dataclass(frozen=True)
class Calibration:
    """observed / composed for the current scenario, and the factor the predictions are scaled by."""

    observed_ms: float
    composed_ms: float
    raw_ratio: float
    factor: float
    """`raw_ratio` held inside `CALIBRATION_BOUNDS`."""
    observed_text: str
    """Where the observed step came from ('12.3 ms observed by the server …')."""

    @property
    def bounded(self) -> bool:
        """Whether the bound changed the ratio (the composition is more than 2× off the engine)."""
        return self.factor != self.raw_ratio

    @property
    def text(self) -> str:
        """'calibrated ×1.22: observed 12.3 ms / composed 10.1 ms (…)', with the bound where it applied."""
        held = f" (held at ×{self.factor:.2f}: outside 0.5–2, the composition misses something)" if self.bounded else ""
        return (
            f"calibrated ×{self.factor:.2f}: observed {self.observed_ms:.3g} ms / composed {self.composed_ms:.3g} ms"
            f"{held}; {self.observed_text}"
        )

    def scale(self, ms: float) -> float:
        """A predicted figure calibrated."""
        return ms * self.factor

    def to_dict(self) -> dict[str, Any]:
        return {
            "observed_ms": self.observed_ms,
            "composed_ms": self.composed_ms,
            "raw_ratio": self.raw_ratio,
            "factor": self.factor,
            "bounded": self.bounded,
            "text": self.text,
        }


def calibration_of(budget: Budget) -> tuple[Calibration | None, str]:
    """The calibration a budget of the current scenario offers, or None and why not (nothing observed, a budget
    with missing figures, nothing composed)."""
    observed = budget.observed_step
    if observed.assumed:
        return None, "no calibration: the observed step is assumed, not observed (--observed-ms, --server, --trace)"
    if not budget.complete:
        return None, "no calibration: the current budget misses figures (" + ", ".join(budget.missing) + ")"
    if budget.total_ms <= 0:
        return None, "no calibration: nothing was composed"
    raw = observed.ms / budget.total_ms
    lo, hi = CALIBRATION_BOUNDS
    factor = min(max(raw, lo), hi)
    return Calibration(observed.ms, budget.total_ms, raw, factor, observed.text), ""
