"""Provides the curve engine's arithmetic along one axis (`decodetop.budget.curves`): a figure and what it rests on
(`Eval`), the time between two measured points (`between`, linear in roofline terms; `blend_ms`, efficiencies
blended across shapes), beyond them (`beyond`, the marginal cost held within the edge's efficiency and the latency
floor, `Limits`), and a figure's label. Stdlib only."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Eval:
    """A figure at full coordinates on one curve, and what it rests on."""

    ms: float
    coords: tuple[int, ...]
    sigma_rep: float
    octaves: float
    rank: int
    """0 exact, 1 interpolated, 2 extrapolated."""
    anchors: tuple[str, ...]
    floor_held: bool = False
    across: bool = False
    """Interpolated between points of another launch regime than its own (`decodetop.budget.gqa_launch`)."""


@dataclass(frozen=True)
class Limits:
    """What bounds a figure beyond the measured points: the latency floor of its kind (the fastest latency-bound
    point of that kind on this host; 0 where none is) and the best efficiency this host reached (the rate extra
    work costs at least)."""

    floor_ms: float
    best_efficiency: float


def between(a: tuple[float, float], b: tuple[float, float], rx: float) -> float:
    """Time at roofline `rx` between a = (roofline, time) and b = (roofline, time) along one axis of one curve:
    linear in roofline terms (exact for the latency + work / rate a decode kernel is), held between the two times
    so a curve monotone in its points stays monotone between them."""
    (ra, ta), (rb, tb) = a, b
    ms = ta + (rx - ra) * (tb - ta) / (rb - ra) if rb != ra else (ta + tb) / 2
    return min(max(ms, min(ta, tb)), max(ta, tb))


def blend_ms(a: tuple[float, float], b: tuple[float, float], rx: float, u: float) -> float:
    """Time at roofline `rx` between two shapes a and b = (roofline, time): their efficiencies blended at weight
    `u` (log space on the roofline), held between the two times."""
    (ra, ta), (rb, tb) = a, b
    eff = (1 - u) * ra / ta + u * rb / tb
    ms = rx / eff if eff > 0 else max(ta, tb)
    return min(max(ms, min(ta, tb)), max(ta, tb))


def beyond(
    edge: tuple[float, float], rx: float, second: tuple[float, float] | None, limits: Limits
) -> tuple[float, bool]:
    """Time at roofline `rx` outside the measured range, from the nearest point edge = (roofline, time) and the
    next one in (`second`): the edge's time plus the change of work at the marginal cost (the line through the two
    points in roofline terms, never cheaper than the roofline itself; with one point, the work at the best
    efficiency this host reached), bounded by the edge's efficiency held (above the range no slower per unit of
    work than at the edge, below it no faster) and by the edge's time (time grows with work), and never below the
    latency floor. Returns (ms, whether the floor set it)."""
    ra, ta = edge
    hold = ta * rx / ra
    slope = 1.0 / limits.best_efficiency
    if second is not None:
        rb, tb = second
        if (rb - ra) * (tb - ta) > 0:
            slope = max(1.0, (tb - ta) / (rb - ra))  # extra work never runs faster than the roofline
    line = ta + (rx - ra) * slope
    if rx >= ra:
        return min(max(line, ta), hold), False
    ms = max(line, hold)
    return min(max(ms, limits.floor_ms), ta), limits.floor_ms > ms


def label_of(status: str, octaves: float) -> str:
    """'interpolated', 'extrapolated 2 octaves', 'extrapolated 0.6 octave'."""
    if status != "extrapolated":
        return status
    text = f"{octaves:.1f}".rstrip("0").rstrip(".")
    return f"extrapolated {text} octave{'' if octaves < 1.05 else 's'}"
