"""Provides how the 80 % ranges of a budget's components combine into the range of their total.

Each component's figure is taken as log-normal: median = its figure, σ = ln(p90 / p10) / (2 × 1.2816) from its
80 % range. The components' errors are taken as independent (the ops inside one component share a curve family
and are summed as fully correlated: their p10s and p90s add). The total's range is the Fenton–Wilkinson
approximation of a sum of independent log-normals: the log-normal with the sum's mean and variance (Fenton, IRE
Trans. Commun. Syst. 8(1), 1960), whose p10 and p90 are exp(μ ∓ 1.2816 σ); a factor every part shares (figures
carried to another GPU model: one ratio for all) multiplies the whole sum, its σ (the parts' ms-weighted mean)
added to the total's in quadrature, the parts' own σ less it, widened where needed to hold the sum
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
    "the sum's mean and variance); a factor shared by every part (another GPU model) widens the total whole"
)


@dataclass(frozen=True)
class Part:
    """One component's figure and its 80 % range, in ms."""

    name: str
    ms: float
    p10_ms: float
    p90_ms: float
    shared_sigma: float = 0.0
    """The share of its σ common to every part that has one (fully correlated: one GPU-to-GPU ratio), at most σ."""

    @property
    def full_sigma(self) -> float:
        """σ of its log-normal from its 80 % range (0 for a point figure)."""
        if self.ms <= 0 or self.p10_ms <= 0 or self.p90_ms <= self.p10_ms:
            return 0.0
        return math.log(self.p90_ms / self.p10_ms) / (2 * Z80)

    @property
    def sigma_log(self) -> float:
        """σ of its own, independent error: the full σ less the shared one (in quadrature)."""
        full, shared = self.full_sigma, min(self.shared_sigma, self.full_sigma)
        return math.sqrt(max(0.0, full**2 - shared**2))

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
    if var <= 0 and not any(p.shared_sigma for p in known):
        return Combined(mean, mean, mean, "", 0.0)
    s2 = math.log1p(var / mean**2)
    mu = math.log(mean) - s2 / 2
    shared = math.fsum(p.ms * min(p.shared_sigma, p.full_sigma) for p in known) / math.fsum(p.ms for p in known)
    sigma = math.sqrt(s2 + shared**2)  # the common factor multiplies the whole sum: its σ adds, not averaged
    top = max(known, key=lambda p: p.variance + (p.ms * p.shared_sigma) ** 2)
    shown = math.fsum(p.ms for p in known)  # the figure the range qualifies: Σ medians, as the budget shows it
    low, high = min(math.exp(mu - Z80 * sigma), shown), max(math.exp(mu + Z80 * sigma), shown)
    share = top.variance / var if var > 0 else 1.0
    return Combined(low, math.exp(mu), high, top.name, share)
