"""Provides the split of a trace's units into decode steps: step markers, else graph launches, else the
repetition of the kernel sequence, else gaps; and the choice of the typical steps (prefills and mixed batches out)."""

from __future__ import annotations

import bisect
import itertools
import statistics
from collections import Counter, defaultdict

from decodetop.traces.classify import RuleSet
from decodetop.traces.reader import HOST_ANNOTATION, NO_ID, Trace
from decodetop.traces.units import Units

GAP_FACTOR = 10.0
"""A gap between kernels this many times the median gap (and at least GAP_MIN_US) splits steps when nothing else
does: decode steps are separated by the scheduler's host work, kernels inside a step by launch latency."""
GAP_MIN_US = 20.0
"""Floor of that threshold: a couple of eager launches (docs/reference/probes.md §3: 4-6 µs per launch + sync)."""
REPEAT_MATCH = 0.9
"""Fraction of kernels that must equal the kernel one period later for a period to count as the step length."""


def segment_steps(trace: Trace, units: Units, rules: RuleSet) -> tuple[list[list[int]], str, list[float | None]]:
    """Group unit indices into decode steps; returns the steps, how they were found, and marker durations.

    A step holding graph-replayed kernels is timed on the GPU timeline (its kernels' window), not by its host
    marker: the marker ends when the launch call returns, long before the replay's kernels finish."""
    steps, how, durs = _segment_host(trace, units, rules)
    graph_steps = [k for k, members in enumerate(steps) if any(units.graph[u] for u in members)]
    if graph_steps and not how.startswith("graph launches"):
        for k in graph_steps:
            durs[k] = None
        how += "; graph replays timed on the GPU timeline (kernels linked to their graph launch by correlation id)"
    return steps, how, durs


def _by_graph_launch(units: Units) -> list[list[int]]:
    """One step per graph launch: the kernels carrying that launch's correlation id, in time order."""
    groups: dict[int, list[int]] = defaultdict(list)
    for u in range(len(units.name)):
        if units.graph[u]:
            groups[units.corr[u]].append(u)
    return sorted(groups.values(), key=lambda members: units.ts[members[0]])


def _segment_host(trace: Trace, units: Units, rules: RuleSet) -> tuple[list[list[int]], str, list[float | None]]:
    """Steps from markers, else graph launches, else the repetition of the kernel sequence, else gaps."""
    n = len(units.name)
    for marker in rules.step_markers:
        matches = {i for i, name in enumerate(trace.names) if marker.pattern.search(name)}
        if not matches:
            continue
        host = [
            (trace.host_ts_us[i], trace.host_dur_us[i], trace.host_name[i])
            for i in range(trace.n_host)
            if trace.host_name[i] in matches and trace.host_kind[i] == HOST_ANNOTATION
        ]
        gpu = [
            (trace.ga_ts_us[i], trace.ga_dur_us[i], trace.ga_name[i])
            for i in range(len(trace.ga_name))
            if trace.ga_name[i] in matches
        ]
        linked = any(t != NO_ID for t in units.launch_thread)
        for ranges, by_launch, where in ((host, True, "host ranges"), (gpu, False, "GPU annotations")):
            if not ranges or (by_launch and not linked):
                continue
            steps, durs = _assign(units, _outermost(ranges), by_launch)
            if steps:
                sample = trace.names[ranges[0][2]]
                return steps, f"markers: {marker.id} ({where}, e.g. {sample!r})", durs
    graphs = _by_graph_launch(units)
    if len(graphs) >= 2:
        return graphs, "graph launches: one step per replay (kernels by correlation id)", [None] * len(graphs)
    period = _period(units)
    if period is not None:
        steps = _by_period(units, period)
        if len(steps) >= 2:
            return steps, f"repetition of the kernel sequence (period {period} kernels)", [None] * len(steps)
    steps = _by_gaps(units)
    if len(steps) >= 2:
        return steps, "gaps between kernels", [None] * len(steps)
    return [list(range(n))], "none found: the whole trace is one step", [None]


def typical_steps(
    steps: list[list[int]], durs: list[float | None], notes: list[str]
) -> tuple[list[list[int]], list[float | None]]:
    """Keep the steps with the most common kernel count when it covers at least half of them."""
    if len(steps) < 3:
        return steps, durs
    mode, count = Counter(len(s) for s in steps).most_common(1)[0]
    if count == len(steps) or count * 2 < len(steps):
        return steps, durs
    keep = [k for k, s in enumerate(steps) if len(s) == mode]
    notes.append(
        f"{len(steps) - len(keep)} of {len(steps)} steps have another kernel count than the usual {mode} "
        "(prefill or a mixed batch?) and were left out (--all-steps keeps them)"
    )
    return [steps[k] for k in keep], [durs[k] for k in keep]


def _outermost(ranges: list[tuple[float, float, int]]) -> list[tuple[float, float, int]]:
    """Drop marker ranges nested inside an earlier one (same step seen twice)."""
    out: list[tuple[float, float, int]] = []
    for start, dur, name in sorted(ranges, key=lambda r: (r[0], -r[1])):
        if out and start < out[-1][0] + out[-1][1]:
            continue
        out.append((start, dur, name))
    return out


def _assign(
    units: Units, ranges: list[tuple[float, float, int]], by_launch: bool
) -> tuple[list[list[int]], list[float | None]]:
    starts = [r[0] for r in ranges]
    members: list[list[int]] = [[] for _ in ranges]
    for u in range(len(units.name)):
        t = units.launch_ts[u] if by_launch else units.ts[u]
        if by_launch and units.launch_thread[u] == NO_ID:
            continue
        k = bisect.bisect_right(starts, t) - 1
        if k >= 0 and t <= ranges[k][0] + ranges[k][1]:
            members[k].append(u)
    keep = [k for k, m in enumerate(members) if m]
    return [members[k] for k in keep], [ranges[k][1] for k in keep]


def _period(units: Units) -> int | None:
    """The step length in kernels, from the least frequent kernel name that recurs at a regular spacing."""
    names = units.name
    positions: dict[int, list[int]] = defaultdict(list)
    for i, name in enumerate(names):
        positions[name].append(i)
    candidates = sorted((len(p), name) for name, p in positions.items() if len(p) >= 2)
    for _count, name in candidates:
        pos = positions[name]
        spacing = {b - a for a, b in itertools.pairwise(pos)}
        if len(spacing) != 1:
            continue
        period = spacing.pop()
        if period < 2:
            continue
        span = len(names) - period
        same = sum(1 for i in range(span) if names[i] == names[i + period])
        if span > 0 and same / span >= REPEAT_MATCH:
            return period
    return None


def _gaps(units: Units) -> list[float]:
    """gaps[i]: idle time before unit i (after every earlier unit ended); gaps[0] = 0."""
    out = [0.0]
    end = units.end[0] if len(units.ts) else 0.0
    for i in range(1, len(units.ts)):
        out.append(max(0.0, units.ts[i] - end))
        end = max(end, units.end[i])
    return out


def _by_period(units: Units, period: int) -> list[list[int]]:
    """Whole periods, phased so that boundaries fall on the largest gaps."""
    gaps = _gaps(units)
    n = len(gaps)
    phase = max(range(period), key=lambda p: sum(gaps[i] for i in range(p, n, period)))
    return [list(range(s, s + period)) for s in range(phase, n - period + 1, period)]


def _by_gaps(units: Units) -> list[list[int]]:
    gaps = _gaps(units)
    if len(gaps) < 3:
        return []
    median = statistics.median(gaps[1:])
    threshold = max(GAP_FACTOR * median, GAP_MIN_US)
    cuts = [i for i, g in enumerate(gaps) if i and g > threshold]
    if not cuts:
        return []
    bounds = [0, *cuts, len(gaps)]
    segments = [list(range(a, b)) for a, b in itertools.pairwise(bounds)]
    mode = Counter(len(s) for s in segments).most_common(1)[0][0]
    same = [s for s in segments if len(s) == mode]
    return same if len(same) >= 2 else segments
