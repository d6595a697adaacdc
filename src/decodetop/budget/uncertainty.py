"""Provides how the 80 % ranges of a budget's components combine into the range of their total.

Each component's figure is taken as log-normal: median = its figure, σ = ln(p90 / p10) / (2 × 1.2816) from its
80 % range. The components' errors are taken as independent (the ops inside one component share a curve family
and are summed as fully correlated: their p10s and p90s add). The total's range is the Fenton–Wilkinson
approximation of a sum of independent log-normals: the log-normal with the sum's mean and variance (Fenton, IRE
Trans. Commun. Syst. 8(1), 1960), whose p10 and p90 are exp(μ ∓ 1.2816 σ), widened where needed to hold the sum
of the medians (the figure a budget shows: with a very wide part the log-normal's p90 can fall below it). The
component with the largest share of the sum's variance is the one that dominates the uncertainty. Stdlib only.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

Z80 = 1.2815515655446004
"""statistics.NormalDist().inv_cdf(0.9)."""
RANGE_METHOD = (
    "80 % ranges: per op the repeat spread (p10–p90), the curve family's leave-one-out error on this host, a "
    "penalty per extrapolated octave and the transfer error, combined in log space; ops within a component add "
    "(fully correlated); components combine as independent log-normals (Fenton–Wilkinson: the log-normal with "
    "the sum's mean and variance)"
)


@dataclass(frozen=True)
class Part:
    """One component's figure and its 80 % range, in ms."""

    name: str
    ms: float
    p10_ms: float
    p90_ms: float

    @property
    def sigma_log(self) -> float:
        """σ of its log-normal (0 for a point figure)."""
        if self.ms <= 0 or self.p10_ms <= 0 or self.p90_ms <= self.p10_ms:
            return 0.0
        return math.log(self.p90_ms / self.p10_ms) / (2 * Z80)

    @property
    def mean_ms(self) -> float:
        return self.ms * math.exp(self.sigma_log**2 / 2)

    @property
    def variance(self) -> float:
        s2 = self.sigma_log**2
        return math.expm1(s2) * self.ms**2 * math.exp(s2)


@dataclass(frozen=True)
class Combined:
    """The total's 80 % range and the part that dominates its uncertainty ('' when every part is a point)."""

    p10_ms: float
    median_ms: float
    p90_ms: float
    dominant: str
    dominant_share: float
    """The dominant part's share of the total's variance (0..1)."""


def combine(parts: Sequence[Part]) -> Combined:
    """The Fenton–Wilkinson range of the sum of `parts` (see the module docstring)."""
    known = [p for p in parts if p.ms > 0]
    mean = math.fsum(p.mean_ms for p in known)
    var = math.fsum(p.variance for p in known)
    if mean <= 0:
        return Combined(0.0, 0.0, 0.0, "", 0.0)
    if var <= 0:
        return Combined(mean, mean, mean, "", 0.0)
    s2 = math.log1p(var / mean**2)
    mu = math.log(mean) - s2 / 2
    sigma = math.sqrt(s2)
    top = max(known, key=lambda p: p.variance)
    shown = math.fsum(p.ms for p in known)  # the figure the range qualifies: Σ medians, as the budget shows it
    low, high = min(math.exp(mu - Z80 * sigma), shown), max(math.exp(mu + Z80 * sigma), shown)
    return Combined(low, math.exp(mu), high, top.name, top.variance / var)
