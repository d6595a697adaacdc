"""Provides `traced_view`: the traced bar (what each budget component does cost in the engine's own step) beside
the probed one (what it should cost), with the largest gap named in words. The live UI and `decodetop trace` both
draw from it, so they show the same figures for the same file.

Segments follow the budget's components in the budget's order; the GPU idle inside the step (host-bound gaps)
stands where the probes' launch overhead stands; two segments the probes cannot have follow: copies & casts that no
context claims, and the other unattributed or unclassified kernels. The segments sum to the traced step: where
kernels overlap on several streams their times are scaled to the GPU's busy time (said in a note).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from decodetop.budget.components import Component
from decodetop.traces.analysis import OVERLAP_NOTE
from decodetop.traces.classify import UNATTRIBUTED_PREFIX
from decodetop.traces.compare import short_name, source_word
from decodetop.traces.ranks import TraceSet
from decodetop.traces.trace_report import LAUNCH_KEY, BucketTime, KernelStat, TraceReport

COPIES_KEY = "copies"
OTHER_KEY = "unattributed"
COPY_FAMILIES = ("copy", "memcpy", "memset")
"""Families (kernel_rules.json) whose unattributed time forms the 'copies & casts' segment."""
IDLE_LABEL = "GPU idle (host-bound)"
_CAST_OPS = re.compile(r"aten::(to|_to_copy|type_as|float|half|bfloat16)\b|direct_copy")
"""A copy is called a cast when its chain holds a dtype conversion (`aten::to` …) or its kernel is the plain
elementwise direct copy that `.to(dtype)` launches."""


@dataclass(frozen=True)
class TracedSegment:
    """One segment of the traced bar, with the probed figure of the same component where the budget has one."""

    key: str
    """A budget component value, or COPIES_KEY / OTHER_KEY."""
    label: str
    traced_ms: float
    probed_ms: float | None
    kernels_per_step: float
    kernels: tuple[KernelStat, ...]
    """The segment's kernels, largest time first (what Enter on the segment lists)."""
    source: str = ""
    """Where `probed_ms` came from: 'probed', 'stored', 'roofline' ('' without a figure; `compare.figure_source`)."""

    @property
    def gap_ms(self) -> float:
        """Traced minus probed (the probed figure taken as 0 where the probes cannot have the segment)."""
        return self.traced_ms - (self.probed_ms or 0.0)


@dataclass(frozen=True)
class TracedView:
    """The traced bar and its header, ready to draw or print."""

    path: str
    segments: tuple[TracedSegment, ...]
    step_ms: float
    observed_ms: float | None
    explained_ms: float | None
    """The probed bar's explained total, when a budget was given."""
    gap_text: str
    """The largest gap in words ('' without a budget and nothing to name)."""
    gap_key: str | None
    ranks_text: str
    attribution_text: str
    notes: tuple[str, ...]
    observed_is_trace: bool = False
    """The observed step is this trace's (nothing above it in the rule: no flag, setting or live server)."""
    budget_source: str = "budget"
    """The budget figures' source in one word ('probed', 'stored', 'roofline'; 'budget' for a mix)."""
    mismatch: str = ""
    """What the trace shows that the model or deployment does not have, in one line ('' when nothing was found:
    `decodetop.traces.mismatch`)."""

    @property
    def unexplained_ms(self) -> float | None:
        """The probed bar's unexplained remainder (observed − explained), when both are known."""
        if self.observed_ms is None or self.explained_ms is None:
            return None
        return max(0.0, self.observed_ms - self.explained_ms)

    @property
    def accounted_ms(self) -> float | None:
        """How much of the unexplained remainder the trace accounts for: its step (up to the observed one) beyond
        what the probes explain."""
        if self.observed_ms is None or self.explained_ms is None:
            return None
        return max(0.0, min(self.step_ms, self.observed_ms) - self.explained_ms)

    def header(self) -> str:
        """'traced step 93.1 ms · accounts for 84.1 ms of the 86.0 ms unexplained (98%)'; where the trace is the
        observed step: 'traced step 2.84 ms, the observed step · unexplained 0.468 ms of 2.84 ms (16%)'."""
        text = f"traced step {_ms(self.step_ms)}"
        unexplained, accounted = self.unexplained_ms, self.accounted_ms
        if self.observed_is_trace and unexplained is not None:
            share = unexplained / self.step_ms if self.step_ms > 0 else 0.0
            return f"{text}, the observed step · unexplained {_ms(unexplained)} of {_ms(self.step_ms)} ({share:.0%})"
        if unexplained is not None and accounted is not None and unexplained > 0:
            text += (
                f" · accounts for {_ms(accounted)} of the {_ms(unexplained)} unexplained "
                f"({accounted / unexplained:.0%})"
            )
        elif self.observed_ms is not None:
            text += f" · observed {_ms(self.observed_ms)}"
        return text

    def segment(self, key: str) -> TracedSegment | None:
        """The segment with this key."""
        return next((s for s in self.segments if s.key == key), None)


def _ms(value: float) -> str:
    if value >= 100:
        return f"{value:.0f} ms"
    if value >= 0.01:
        return f"{value:.3g} ms"
    return f"{value * 1000:.3g} µs"


def _merge(buckets: list[BucketTime], scale: float) -> tuple[float, float, tuple[KernelStat, ...]]:
    ms = sum(b.time_us_per_step for b in buckets) * scale / 1000
    kernels = sum(b.kernels_per_step for b in buckets)
    top = tuple(sorted((k for b in buckets for k in b.top), key=lambda k: -k.time_us_per_step))
    return ms, kernels, top


def traced_view(
    traces: TraceSet | TraceReport,
    probed: Mapping[str, float | None] | None = None,
    *,
    observed_ms: float | None = None,
    layers: int | None = None,
    observed_is_trace: bool = False,
    sources: Mapping[str, str] | None = None,
    mismatch: str = "",
) -> TracedView:
    """The traced bar of `traces` beside `probed` ({component: ms}, e.g. `BudgetView` segments or
    `compare.budget_ms`); `observed_ms` is the budget's observed step (`observed_is_trace`: it is this trace's),
    `layers` the model's decoder layers (for 'per layer'), `sources` each figure's source word
    (`compare.budget_sources`; unsaid: 'budget'), `mismatch` the line of `traces.mismatch` to show with the bar."""
    report = traces.report if isinstance(traces, TraceSet) else traces
    ranks_text = traces.spread_line() if isinstance(traces, TraceSet) else ""
    probed = dict(probed or {})
    sources = {k: v for k, v in (sources or {}).items() if k in probed and probed[k] is not None}
    step = report.step_wall_us_mean / 1000
    busy = min(report.gpu_busy_us_mean / 1000, step) if step > 0 else report.gpu_busy_us_mean / 1000
    kernel_ms = sum(b.time_us_per_step for b in report.buckets) / 1000
    scale = busy / kernel_ms if kernel_ms > busy > 0 else 1.0
    notes: list[str] = []
    if scale < 1 / OVERLAP_NOTE:
        notes.append(f"kernels overlap on several streams: their times are scaled by {scale:.2f} to the busy time")
    groups: dict[str, list[BucketTime]] = {}
    for b in report.buckets:
        if b.key.startswith(UNATTRIBUTED_PREFIX) and b.key[len(UNATTRIBUTED_PREFIX) :] in COPY_FAMILIES:
            groups.setdefault(COPIES_KEY, []).append(b)
        elif b.key in {c.value for c in Component}:
            groups.setdefault(b.key, []).append(b)
        else:
            groups.setdefault(OTHER_KEY, []).append(b)
    segments: list[TracedSegment] = []
    for comp in Component:
        if comp.value == LAUNCH_KEY:
            idle = max(0.0, step - kernel_ms * scale)  # the rest of the step: the GPU waited for the host
            launch = probed.get(LAUNCH_KEY)
            segments.append(TracedSegment(LAUNCH_KEY, IDLE_LABEL, idle, launch, 0.0, (), sources.get(LAUNCH_KEY, "")))
            continue
        found = groups.get(comp.value)
        if found is None and probed.get(comp.value) is None:
            continue
        ms, kernels, top = _merge(found or [], scale)
        segments.append(
            TracedSegment(comp.value, comp.label, ms, probed.get(comp.value), kernels, top, sources.get(comp.value, ""))
        )
    for key, label in ((COPIES_KEY, "copies & casts"), (OTHER_KEY, "unattributed kernels")):
        if key in groups:
            ms, kernels, top = _merge(groups[key], scale)
            segments.append(TracedSegment(key, label, ms, None, kernels, top))
    explained = sum(v for k, v in probed.items() if v is not None and k in {c.value for c in Component}) or None
    word = source_word(sources) if sources else "budget"
    gap_key, gap_text = _largest_gap(segments, layers, has_budget=bool(probed), word=word)
    how = ", ".join(f"{a.rule} {a.share:.0%}" for a in report.attribution if a.share >= 0.005)
    attribution = f"kernel time attributed to a component: {report.attributed_share:.0%}" + (
        f" (by {how})" if how else ""
    )
    return TracedView(
        path=report.path,
        segments=tuple(segments),
        step_ms=step,
        observed_ms=observed_ms,
        explained_ms=explained if probed else None,
        gap_text=gap_text,
        gap_key=gap_key,
        ranks_text=ranks_text,
        attribution_text=attribution,
        notes=tuple(notes),
        observed_is_trace=observed_is_trace,
        budget_source=word,
        mismatch=mismatch,
    )


def _largest_gap(
    segments: list[TracedSegment], layers: int | None, *, has_budget: bool, word: str
) -> tuple[str | None, str]:
    """'attention: traced 1.90 ms vs probed 0.06 ms per step — top kernel `…` via aten::to>… (a cast), 1 per
    layer' for the segment whose traced time exceeds its budget figure the most (the largest segment without a
    budget); the figure is named by its source (probed, stored, roofline; `word` where the segment has none)."""
    candidates = [s for s in segments if s.traced_ms > 0]
    if not candidates:
        return None, ""
    seg = max(candidates, key=(lambda s: s.gap_ms) if has_budget else (lambda s: s.traced_ms))
    if has_budget and seg.gap_ms <= 0:
        return None, f"no component costs more in the trace than in the {word} budget"
    text = f"{seg.label}: traced {_ms(seg.traced_ms)}"
    if has_budget:
        text += f" vs {seg.source or word} {_ms(seg.probed_ms or 0.0)}"
    text += " per step"
    if seg.key == LAUNCH_KEY:
        return seg.key, text + " — the GPU waits for the host between kernels (launch and Python overhead)"
    if seg.kernels:
        k = seg.kernels[0]
        text += f" — top kernel `{short_name(k.name, 60)}`"
        if k.via:
            text += f" via {k.via}"
        if k.family in COPY_FAMILIES and _CAST_OPS.search(f"{k.via or ''} {k.name}"):
            text += " (a cast)"
        if (
            layers
            and k.count_per_step >= layers
            and abs(k.count_per_step / layers - round(k.count_per_step / layers)) < 0.01
        ):
            text += f", {k.count_per_step / layers:.0f} per layer"
        else:
            text += f", {k.count_per_step:.3g} per step"
    return seg.key, text
