"""Provides the per-rank view of a decode-step budget (stdlib only): each rank's own total, the spread between the
ranks, the step bound a tensor-parallel step pays (it waits for its slowest rank at every all-reduce) and the
straggler rule.

Why: the budget's figures take the slowest rank's median per measurement, one key at a time; that hides which rank
is slow and by how much. A TP step runs the same ops on every rank and meets at each all-reduce, so a noisy
neighbour, a throttled or degraded GPU, or a rank on the wrong NUMA node makes every rank wait for it.

    per-rank total_r   = Σ components of the budget composed from rank r's own times (its median per key)
    step bound         = Σ over sync intervals of max over ranks of the interval's time
                       ≈ max_r (non-collective_r) + max_r (collective_r)

The approximation (and why): the all-reduces cut the step into `intervals` pieces (a dense layer has two: after
attention and after the MLP); the layers repeat, so each rank's share of every interval is taken as its
non-collective time / intervals, the same mix of ops everywhere. Then Σ_intervals max_r (non-collective_r /
intervals) = max_r non-collective_r; the all-reduces themselves take the slowest rank's time (a fast rank's
all-reduce includes its wait). The bound is ≥ every rank's total and ≤ the per-key-max composition; it is a lower
bound when different ranks are slow in different intervals (their maxima would add).

Straggler rule: the slowest rank r is named when its total exceeds the median of the other ranks' totals by more
than all of

    - the widest p10–p90 band of the other ranks' totals (each band is its ops' p10/p90 summed: compose.py), so a
      difference inside one rank's own run-to-run spread is not a straggler;
    - `STRAGGLER_FLOOR_MS` and `STRAGGLER_RELATIVE_FLOOR` × the others' median (the budget diff's floors:
      decodetop.budget.noise), so point figures (no band) do not name a rank for a µs.

A straggler carries its likely causes in words (another process on that GPU, clocks below the others or clock-event
reasons, a PCIe link below its maximum, a NUMA node other than the others'), found by the probes-level reader from
what the results recorded (`decodetop.probes.rankbudget`).
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from decodetop.budget.components import Component
from decodetop.budget.noise import NOISE_FLOOR_MS, RELATIVE_FLOOR
from decodetop.errors import UserInputError
from decodetop.textfmt import format_ms

STRAGGLER_FLOOR_MS = NOISE_FLOOR_MS
"""Absolute floor of the straggler rule, ms per step: the budget diff's noise floor (same source)."""
STRAGGLER_RELATIVE_FLOOR = RELATIVE_FLOOR
"""Relative floor of the straggler rule, a fraction of the other ranks' median total: the diff's relative floor."""

BOUND_METHOD = (
    "Σ over all-reduce intervals of the slowest rank ≈ max over ranks of the non-collective time + max over ranks of "
    "the all-reduce time (layers repeat: every interval is the same mix of ops)"
)
STRAGGLER_RULE = (
    "its total exceeds the other ranks' median by more than their widest p10–p90 band, "
    f"{STRAGGLER_FLOOR_MS:g} ms and {STRAGGLER_RELATIVE_FLOOR:.0%} of that median"
)


@dataclass(frozen=True)
class RankTotal:
    """One rank's composed step: the budget composed from that rank's own times."""

    rank: int
    label: str
    """'GPU 1' on GPUs, 'CPU rank 1' on CPU ranks."""
    total_ms: float
    """Σ components, each from this rank's medians (the budget's statistic)."""
    mean_ms: float
    """Σ components, each from this rank's means (what throughput pays)."""
    p10_ms: float
    p90_ms: float
    """Σ of the ops' p10 / p90: this rank's noise band."""
    collective_ms: float = 0.0
    """The all-reduce / all-gather part of `total_ms` (0 when none was measured)."""
    components: Mapping[str, float] = field(default_factory=dict)
    """This rank's ms per component (`Component` value → ms; components without a figure left out)."""

    def __post_init__(self) -> None:
        for name in ("total_ms", "mean_ms", "p10_ms", "p90_ms", "collective_ms"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise UserInputError(f"rank {self.rank} {name}={value!r} must be a finite number ≥ 0")

    @property
    def band_ms(self) -> float:
        """p90 − p10 of this rank's total."""
        return max(0.0, self.p90_ms - self.p10_ms)

    @property
    def non_collective_ms(self) -> float:
        """The time this rank spends between its all-reduces."""
        return max(0.0, self.total_ms - self.collective_ms)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "rank": self.rank,
            "label": self.label,
            "total_ms": self.total_ms,
            "mean_ms": self.mean_ms,
            "p10_ms": self.p10_ms,
            "p90_ms": self.p90_ms,
            "collective_ms": self.collective_ms,
            "components": dict(self.components),
        }


@dataclass(frozen=True)
class Straggler:
    """A rank that stands out beyond the noise, and why it is likely slow."""

    rank: int
    label: str
    total_ms: float
    others_median_ms: float
    threshold_ms: float
    """What the excess had to exceed (the rule in the module docstring)."""
    causes: tuple[str, ...] = ()
    """Likely causes from what the results recorded ('another process on GPU 1: pid 4242 (python)')."""
    slowest_component: str = ""
    """The component this rank is slowest in against the other ranks' median ('' when not known)."""
    slowest_component_excess_ms: float = 0.0

    @property
    def excess_ms(self) -> float:
        """How much slower than the other ranks' median."""
        return self.total_ms - self.others_median_ms

    @property
    def text(self) -> str:
        """'straggler: GPU 1 (+2.4 ms, +35 % over the other ranks' median; likely: another process on GPU 1 …)'."""
        pct = f", {self.excess_ms / self.others_median_ms:+.0%}" if self.others_median_ms > 0 else ""
        why = "; likely: " + "; ".join(self.causes) if self.causes else "; no likely cause in the recorded telemetry"
        most = (
            f"; most in {self.slowest_component} (+{self.slowest_component_excess_ms:.3g} ms)"
            if self.slowest_component
            else ""
        )
        return f"straggler: {self.label} (+{self.excess_ms:.3g} ms{pct} over the other ranks' median{most}{why})"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "rank": self.rank,
            "label": self.label,
            "total_ms": self.total_ms,
            "others_median_ms": self.others_median_ms,
            "excess_ms": self.excess_ms,
            "threshold_ms": self.threshold_ms,
            "causes": list(self.causes),
            "slowest_component": self.slowest_component or None,
            "slowest_component_excess_ms": self.slowest_component_excess_ms,
            "text": self.text,
        }


@dataclass(frozen=True)
class RankSpread:
    """Every rank's composed step, their spread, the step bound and the straggler (None when none stands out)."""

    ranks: tuple[RankTotal, ...]
    step_bound_ms: float
    step_bound_mean_ms: float
    intervals: int
    """All-reduces per step (the sync points; 0 when the step has none)."""
    straggler: Straggler | None = None
    notes: tuple[str, ...] = field(default=())

    @property
    def slowest(self) -> RankTotal:
        """The rank with the largest total."""
        return max(self.ranks, key=lambda r: r.total_ms)

    @property
    def fastest(self) -> RankTotal:
        """The rank with the smallest total."""
        return min(self.ranks, key=lambda r: r.total_ms)

    @property
    def spread_ms(self) -> float:
        """Slowest − fastest rank total."""
        return self.slowest.total_ms - self.fastest.total_ms

    @property
    def spread_pct(self) -> float:
        """`spread_ms` as a percentage of the fastest rank's total (0 when that is 0)."""
        low = self.fastest.total_ms
        return self.spread_ms / low * 100.0 if low > 0 else 0.0

    def line(self) -> str:
        """'per rank (ms, medians): GPU 0 1.23 · GPU 1 1.45; spread 0.22 ms (18 %); step bound 1.45 ms (slowest
        rank at each of 8 all-reduces)'."""
        parts = " · ".join(f"{r.label} {r.total_ms:.3g}" for r in self.ranks)
        sync = (
            f"slowest rank at each of {self.intervals} all-reduces"
            if self.intervals
            else "no all-reduce: the slowest rank"
        )
        return (
            f"per rank (ms, medians): {parts}; spread {self.spread_ms:.3g} ms ({self.spread_pct:.0f} %); "
            f"step bound {self.step_bound_ms:.3g} ms ({sync})"
        )

    def short_line(self) -> str:
        """The line for narrow surfaces (the live budget bar), every figure with its unit: 'ranks GPU 0 1.23ms · GPU 1
        1.45ms · spread 0.22ms (18 %) · step bound 1.45ms'; '' while no rank has a figure."""
        if not any(r.total_ms > 0 for r in self.ranks):
            return ""
        parts = " · ".join(f"{r.label} {format_ms(r.total_ms, space=False)}" for r in self.ranks)
        return (
            f"ranks {parts} · spread {format_ms(self.spread_ms, space=False)} ({self.spread_pct:.0f} %) · step bound "
            f"{format_ms(self.step_bound_ms, space=False)}"
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (the `ranks` section of a budget)."""
        return {
            "ranks": [r.to_dict() for r in self.ranks],
            "spread_ms": self.spread_ms,
            "spread_pct": self.spread_pct,
            "slowest_rank": self.slowest.rank,
            "step_bound_ms": self.step_bound_ms,
            "step_bound_mean_ms": self.step_bound_mean_ms,
            "intervals": self.intervals,
            "bound_method": BOUND_METHOD,
            "straggler": self.straggler.to_dict() if self.straggler is not None else None,
            "straggler_rule": STRAGGLER_RULE,
            "line": self.line(),
            "notes": list(self.notes),
        }


def step_bound_ms(ranks: Sequence[RankTotal], *, mean: bool = False) -> float:
    """The step a TP group pays: max over ranks of the non-collective time + max over ranks of the collective time
    (the module docstring's approximation). `mean`: the same from the means (collective part scaled alike)."""
    if not ranks:
        return 0.0

    def scale(r: RankTotal) -> float:
        return r.mean_ms / r.total_ms if mean and r.total_ms > 0 else 1.0

    non_collective = max(r.non_collective_ms * scale(r) for r in ranks)
    collective = max(r.collective_ms * scale(r) for r in ranks)
    return non_collective + collective


def find_straggler(ranks: Sequence[RankTotal]) -> Straggler | None:
    """The slowest rank when it stands out beyond the noise (module docstring), else None (fewer than two ranks:
    None)."""
    if len(ranks) < 2:
        return None
    worst = max(ranks, key=lambda r: r.total_ms)
    others = [r for r in ranks if r is not worst]
    median = statistics.median(r.total_ms for r in others)
    band = max(r.band_ms for r in others)
    threshold = max(band, STRAGGLER_FLOOR_MS, STRAGGLER_RELATIVE_FLOOR * median)
    if worst.total_ms - median <= threshold:
        return None
    excess = {c: ms - statistics.median(o.components.get(c, 0.0) for o in others) for c, ms in worst.components.items()}
    comp = max(excess, key=lambda c: excess[c], default="")
    return Straggler(
        worst.rank,
        worst.label,
        worst.total_ms,
        median,
        threshold,
        slowest_component=_component_label(comp) if comp and excess[comp] > 0 else "",
        slowest_component_excess_ms=excess[comp] if comp and excess[comp] > 0 else 0.0,
    )


def _component_label(key: str) -> str:
    try:
        return Component(key).label
    except ValueError:
        return key


def rank_spread(
    ranks: Sequence[RankTotal],
    *,
    intervals: int,
    causes: Mapping[int, Sequence[str]] | None = None,
    notes: Sequence[str] = (),
) -> RankSpread | None:
    """The spread of `ranks` (None for fewer than two), its step bound and straggler; `causes`: likely causes per
    rank, attached to the straggler when one is named."""
    if len(ranks) < 2:
        return None
    ordered = tuple(sorted(ranks, key=lambda r: r.rank))
    straggler = find_straggler(ordered)
    if straggler is not None and causes:
        straggler = dataclasses.replace(straggler, causes=tuple(causes.get(straggler.rank, ())))
    return RankSpread(
        ranks=ordered,
        step_bound_ms=step_bound_ms(ordered),
        step_bound_mean_ms=step_bound_ms(ordered, mean=True),
        intervals=max(0, intervals),
        straggler=straggler,
        notes=tuple(notes),
    )


def straggler_in(budget: Mapping[str, Any]) -> tuple[str, str] | None:
    """(label, text) of the straggler a budget's JSON `ranks` section names, or None (no section, none named, or an
    older file without it). Malformed sections read as none: the diff must still compare the segments."""
    section = budget.get("ranks")
    if not isinstance(section, Mapping):
        return None
    found = section.get("straggler")
    if not isinstance(found, Mapping):
        return None
    label, text = found.get("label"), found.get("text")
    if not isinstance(label, str) or not label:
        return None
    return label, text if isinstance(text, str) and text else f"straggler: {label}"
