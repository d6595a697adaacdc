"""Provides the curve engine's self-check: leave-one-out errors per curve family on this host's own curves
(`ErrorStat`, `FamilyCheck`, `SelfCheck`), the σ each kind of prediction takes from them, and the published
defaults where this host has too few points to check itself (docs/reference/whatif.md §2). Stdlib only."""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

Z80 = 1.2815515655446004
"""statistics.NormalDist().inv_cdf(0.9): an 80 % range is ±1.2816 σ."""
Z_ABS90 = 1.6448536269514722
"""The p90 of |e| for e ~ N(0, σ²) is 1.645 σ (NormalDist().inv_cdf(0.95)): σ from a p90 of absolute errors."""
MIN_CHECK_SAMPLES = 5
"""Fewer leave-one-out samples than this and a family's error is the published default, said so."""

DEFAULT_INTERIOR_SIGMA = {"gemm": math.log(1.156) / Z_ABS90, "attention": math.log(1.097) / Z_ABS90}
"""Interpolation error where this host has too few points to check itself: AIConfigurator's published
leave-one-out p90, GEMM 15.6 % and generation attention (grid frontier) 9.7 % (docs/reference/whatif.md §2)."""
DEFAULT_OCTAVE_SIGMA = math.log(2.12) / Z_ABS90 / 3
"""Per extrapolated octave where this host cannot fit it: AIConfigurator's 3-octave GEMM extrapolation p90 of
51–112 % (docs/reference/whatif.md §2), the upper end spread over 3 octaves."""
DEFAULT_TRANSFER_SIGMA = math.log(1.35) / Z80
"""A shape carried from other shapes where no shape can be left out to check it: the ±35 % transfer band."""


@dataclass(frozen=True)
class ErrorStat:
    """Absolute relative errors of one kind of self-check: count, median and p90 (%), and σ in log space."""

    n: int
    median_pct: float
    p90_pct: float
    sigma_log: float

    @classmethod
    def of(cls, log_errors: Sequence[float]) -> ErrorStat | None:
        """The stat of |log(predicted / measured)| values (None when there are none)."""
        if not log_errors:
            return None
        errs = sorted(abs(e) for e in log_errors)
        p90 = _quantile(errs, 0.9)
        return cls(len(errs), 100 * math.expm1(statistics.median(errs)), 100 * math.expm1(p90), p90 / Z_ABS90)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class FamilyCheck:
    """One curve family's self-check on this host's data, and the σ each kind of prediction gets from it."""

    probe: str
    points: int
    curves: int
    interior: ErrorStat | None
    """Leave-one-out of points inside the grid."""
    per_octave: ErrorStat | None
    """Leave-one-out of grid-edge points, error per octave extrapolated."""
    transfer: ErrorStat | None
    """Leave-one-shape-out: a whole curve left out and predicted from the other shapes."""
    interior_sigma: float
    """σ of a figure interpolated within one launch regime (where the family's regimes are told apart), else of
    any interpolated figure."""
    octave_sigma: float
    transfer_sigma: float
    defaults: tuple[str, ...] = ()
    """Which σ are published defaults (too few samples here): interior, per_octave, transfer."""
    within_launch: ErrorStat | None = None
    """The interior points whose brackets stand in their own launch regime (GQA curves whose launch is known)."""
    across_launch: ErrorStat | None = None
    """The interior points interpolated across a launch change of their kernel (`decodetop.budget.gqa_launch`)."""
    across_sigma: float = 0.0
    """σ of a figure interpolated across a launch change (the interior σ of all points where too few cross)."""
    launch_unknown: int = 0
    """GQA curves whose results do not say their launch (written before it was recorded): regimes not told apart."""

    STATS = ("interior", "per_octave", "transfer", "within_launch", "across_launch")

    def to_dict(self) -> dict[str, Any]:
        out = {k: v for k, v in dataclasses.asdict(self).items() if k not in self.STATS}
        for name in self.STATS:
            stat = getattr(self, name)
            out[name] = stat.to_dict() if stat is not None else None
        out["defaults"] = list(self.defaults)
        return out


@dataclass(frozen=True)
class SelfCheck:
    """Leave-one-out error per curve family, computed on the host's own curves."""

    families: tuple[FamilyCheck, ...]

    def family(self, probe: str) -> FamilyCheck | None:
        return next((f for f in self.families if f.probe == probe), None)

    def to_dict(self) -> dict[str, Any]:
        return {"method": SELF_CHECK_METHOD, "families": [f.to_dict() for f in self.families]}

    def lines(self) -> list[str]:
        """'gemm: 0.9 % median / 6.8 % p90 inside the grid (690 points), …' — one line per family with data."""
        out = []
        for f in self.families:
            parts = []
            if f.interior is not None:
                parts.append(f"{_pct(f.interior)} inside the grid ({f.interior.n}{_launch_split(f)})")
            if f.per_octave is not None:
                parts.append(f"{_pct(f.per_octave)} per extrapolated octave ({f.per_octave.n})")
            if f.transfer is not None:
                parts.append(f"{_pct(f.transfer)} for a shape left out ({f.transfer.n})")
            if parts:
                out.append(f"{f.probe}: " + "; ".join(parts))
        return out


SELF_CHECK_METHOD = (
    "leave-one-out on this host's curves: each point removed and predicted from the rest (inside the grid, or "
    "per octave at its edges); each measured shape removed and predicted from the other shapes (transfer); "
    "errors |predicted/measured − 1|, σ in log space from their p90"
)


def _launch_split(f: FamilyCheck) -> str:
    """'; within one launch regime 2.1 % / 8.7 % (14), across a launch change 5.6 % / 14.1 % (26)', and the
    curves whose launch their results do not say."""
    parts = [
        f"{what} {stat.median_pct:.1f} % / {stat.p90_pct:.1f} % ({stat.n})"
        for what, stat in (("within one launch regime", f.within_launch), ("across a launch change", f.across_launch))
        if stat is not None
    ]
    if f.launch_unknown:
        parts.append(f"the launch of {f.launch_unknown} GQA curve{'s' if f.launch_unknown > 1 else ''} not recorded")
    return "; " + ", ".join(parts) if parts else ""


def _pct(stat: ErrorStat) -> str:
    return f"{stat.median_pct:.1f} % median / {stat.p90_pct:.1f} % p90"


def _quantile(sorted_values: Sequence[float], q: float) -> float:
    """Linear-interpolated quantile of sorted values."""
    if len(sorted_values) == 1:
        return sorted_values[0]
    pos = q * (len(sorted_values) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (pos - lo) * (sorted_values[hi] - sorted_values[lo])


def default_check(probe: str) -> FamilyCheck:
    return family_check(probe, 0, 0, [], [], [])


@dataclass(frozen=True)
class LaunchSplit:
    """A family's interior leave-one-out errors told apart by the kernel's launch regimes (log errors)."""

    within: Sequence[float]
    across: Sequence[float]
    unknown_curves: int = 0
    """GQA curves whose launch is not known, their points in neither list."""


def family_check(  # noqa: PLR0917 - the parts of one family's check
    probe: str,
    points: int,
    curves: int,
    interior: list[float],
    per_octave: list[float],
    transfer: list[float],
    launch: LaunchSplit | None = None,
) -> FamilyCheck:
    """A family's check with the σ it gives each kind of prediction (a published default where too few samples);
    `launch`: its interior errors told apart by launch regime, where any of its curves' launch is known."""
    stats = (ErrorStat.of(interior), ErrorStat.of(per_octave), ErrorStat.of(transfer))
    defaults = (DEFAULT_INTERIOR_SIGMA.get(probe, DEFAULT_INTERIOR_SIGMA["gemm"]), DEFAULT_OCTAVE_SIGMA,
                DEFAULT_TRANSFER_SIGMA)  # fmt: skip
    names = ("interior", "per_octave", "transfer")
    sigmas = []
    used_default = []
    for name, stat, default in zip(names, stats, defaults, strict=True):
        if stat is not None and stat.n >= MIN_CHECK_SAMPLES:
            sigmas.append(stat.sigma_log)
        else:
            sigmas.append(default)
            used_default.append(name)
    within = ErrorStat.of(launch.within) if launch is not None else None
    across = ErrorStat.of(launch.across) if launch is not None else None
    interior_sigma, across_sigma = sigmas[0], sigmas[0]
    if within is not None and within.n >= MIN_CHECK_SAMPLES:
        interior_sigma = within.sigma_log
    if across is not None and across.n >= MIN_CHECK_SAMPLES:
        across_sigma = across.sigma_log
    return FamilyCheck(
        probe, points, curves, stats[0], stats[1], stats[2], interior_sigma, sigmas[1], sigmas[2],
        tuple(used_default), within, across, across_sigma, launch.unknown_curves if launch is not None else 0,
    )  # fmt: skip
