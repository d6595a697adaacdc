"""Provides `analyze_trace`: a profiler trace split into decode steps, with each kernel attributed to a component.

Pipeline: read the trace (streaming) → pick the units to attribute (the kernels, memcpys and memsets of the busiest
GPU; or, in a CPU-only trace, the CPU operators by self time) → find each unit's host context (the annotation,
module and operator ranges open on the launching thread when its launch call ran, linked by correlation id; GPU-side
annotations where no launch is linked) → split the units into decode steps (step markers, else the repetition of
the kernel sequence, else gaps) → classify every unit through the rules table → sum per step.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import json
import statistics
from array import array
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from decodetop.budget.components import Component
from decodetop.budget.inventory import Op
from decodetop.budget.keys import GemmKey, SamplingKey
from decodetop.errors import UserInputError
from decodetop.traces.classify import (
    UNCLASSIFIED,
    RuleSet,
    bucket_key,
    bucket_label,
    load_rules,
)
from decodetop.traces.model import LAUNCH_KEY, AttributionCount, BucketTime, KernelStat, StepSummary, TraceReport
from decodetop.traces.reader import GPU_KERNEL, HOST_ANNOTATION, HOST_OP, NO_ID, Trace, read_trace

GAP_FACTOR = 10.0
"""A gap between kernels this many times the median gap (and at least GAP_MIN_US) splits steps when nothing else
does: decode steps are separated by the scheduler's host work, kernels inside a step by launch latency."""
GAP_MIN_US = 20.0
"""Floor of that threshold: a couple of eager launches (docs/reference/probes.md §3: 4-6 µs per launch + sync)."""
REPEAT_MATCH = 0.9
"""Fraction of kernels that must equal the kernel one period later for a period to count as the step length."""
TOP_PER_BUCKET = 10
"""Kernels kept per bucket: what the traced bar's kernel list shows when a segment is opened."""
GRAPH_LAUNCH = "GraphLaunch"
"""Runtime calls whose name holds this launch a CUDA (or HIP) graph: cudaGraphLaunch, cudaGraphLaunch_v10000,
hipGraphLaunch. Every kernel of the replay carries the launch's correlation id (CUPTI/roctracer)."""
HOW_CONTEXT = "host context (module, annotation or operator)"
HOW_NAME = "kernel name"
HOW_SHAPE = "GEMM shape (model weights or vocabulary)"
HOW_ORDER = "order in the step (the block between norms)"
HOW_NONE = "unattributed (family known, component not)"
HOW_UNCLASSIFIED = "no rule (unclassified)"
"""How a kernel got its component: the traced report counts kernels and time per way."""
OVERLAP_NOTE = 1.05
"""Kernel time above busy time by more than 5% means streams overlap: component sums then exceed the step."""


@dataclass
class _Units:
    """The things attributed, in time order: one row per kernel (or CPU operator)."""

    name: array[int]
    ts: array[float]
    dur: array[float]
    """Time attributed to the unit: a kernel's duration; a CPU operator's self time (children excluded)."""
    launch_ts: array[float]
    launch_thread: array[int]
    stack: array[int]
    end: array[float]
    """Where the unit's span ends (ts + full duration), for step windows."""
    exclusive: bool = False
    """True when `dur` are self times that partition the covered time (CPU ops): busy = their sum."""
    graph: array[int] = field(default_factory=lambda: array("b"))
    """1 where the unit was replayed by a graph launch (no host operators around it), else 0."""
    corr: array[int] = field(default_factory=lambda: array("q"))
    """The unit's correlation id (graph-replayed kernels share their launch's)."""


def analyze_trace(
    path: str | Path,
    *,
    rules_path: str | None = None,
    device: int | None = None,
    vocab_size: int | None = None,
    top_n: int = 15,
    all_steps: bool = False,
    gemm_shapes: Mapping[tuple[int, int], Component] | None = None,
) -> TraceReport:
    """Read `path` and attribute its decode steps; raises UserInputError with one line on any bad input.

    GEMMs without a telling context are attributed, in order, by `gemm_shapes` ((k, n) of a weight → component, as
    `gemm_shapes_from_inventory` makes from the budget), by a dimension equal to `vocab_size` (lm_head), and by the
    norm-delimited block they sit in.

    Unless `all_steps`, steps whose kernel count differs from the most common one (prefills, mixed batches) are
    left out when the most common count covers at least half the steps; a note says how many.
    """
    trace = read_trace(path)
    return analyze(
        trace,
        rules=load_rules(rules_path),
        device=device,
        vocab_size=vocab_size,
        top_n=top_n,
        all_steps=all_steps,
        gemm_shapes=gemm_shapes,
    )


def analyze(
    trace: Trace,
    *,
    rules: RuleSet | None = None,
    device: int | None = None,
    vocab_size: int | None = None,
    top_n: int = 15,
    all_steps: bool = False,
    gemm_shapes: Mapping[tuple[int, int], Component] | None = None,
) -> TraceReport:
    """Attribute an already-read trace (see `analyze_trace`)."""
    rules = rules or load_rules()
    notes: list[str] = []
    if any(k == GPU_KERNEL for k in trace.gpu_kind):
        units, device_label = _gpu_units(trace, device)
        source = "gpu"
    elif trace.n_host:
        units, device_label = _cpu_units(trace), "cpu"
        source = "cpu"
        notes.append(
            "CPU-only trace: CPU operators (by self time) stand in for kernels, and 'GPU idle' is host time "
            "outside any operator"
        )
    else:
        raise UserInputError(f"{trace.path}: no GPU kernels and no CPU operators in the trace: nothing to attribute")
    if not len(units.name):
        raise UserInputError(f"{trace.path}: no kernels on {device_label}: nothing to attribute")
    markers = {i for i, name in enumerate(trace.names) if any(m.pattern.search(name) for m in rules.step_markers)}
    stacks = _attach_context(trace, units, source, skip=markers)
    steps, segmentation, marker_durs = _segment(trace, units, rules)
    if not all_steps:
        steps, marker_durs = _typical_steps(steps, marker_durs, notes)
    return _attribute(
        trace,
        rules,
        units=units,
        stacks=stacks,
        steps=steps,
        segmentation=segmentation,
        marker_durs=marker_durs,
        source=source,
        device_label=device_label,
        vocab_size=vocab_size,
        gemm_shapes=gemm_shapes,
        top_n=top_n,
        notes=notes,
    )


# --------------------------------------------------------------------------------------------------- units


def _gpu_units(trace: Trace, device: int | None) -> tuple[_Units, str]:
    per_device: dict[int, float] = defaultdict(float)
    for kind, dev, dur in zip(trace.gpu_kind, trace.gpu_device, trace.gpu_dur_us, strict=False):
        if kind == GPU_KERNEL:
            per_device[dev] += dur
    if device is None:
        device = max(per_device, key=per_device.__getitem__)
    elif device not in per_device:
        raise UserInputError(
            f"{trace.path}: no kernels on device {device} (devices with kernels: {sorted(per_device)})"
        )
    order = sorted((i for i in range(trace.n_gpu) if trace.gpu_device[i] == device), key=trace.gpu_ts_us.__getitem__)
    # Launch lookup by correlation id over sorted columns (a dict of tuples would cost ~200 B per launch).
    by_corr = sorted((i for i, c in enumerate(trace.rt_corr) if c != NO_ID), key=trace.rt_corr.__getitem__)
    corr_sorted = array("q", (trace.rt_corr[i] for i in by_corr))
    launch_ts = array("d", (trace.rt_ts_us[i] for i in by_corr))
    launch_thread = array("i", (trace.rt_thread[i] for i in by_corr))
    graph_ids = {i for i, name in enumerate(trace.names) if GRAPH_LAUNCH in name}
    graph_corr = {trace.rt_corr[i] for i in by_corr if trace.rt_name[i] in graph_ids} if graph_ids else set()
    del by_corr
    units = _empty_units()
    for i in order:
        units.name.append(trace.gpu_name[i])
        units.ts.append(trace.gpu_ts_us[i])
        units.dur.append(trace.gpu_dur_us[i])
        corr = trace.gpu_corr[i]
        k = bisect.bisect_left(corr_sorted, corr) if corr != NO_ID else len(corr_sorted)
        found = k < len(corr_sorted) and corr_sorted[k] == corr
        units.launch_ts.append(launch_ts[k] if found else -1.0)
        units.launch_thread.append(launch_thread[k] if found else NO_ID)
        units.stack.append(NO_ID)
        units.end.append(trace.gpu_ts_us[i] + trace.gpu_dur_us[i])
        units.graph.append(1 if corr != NO_ID and corr in graph_corr else 0)
        units.corr.append(corr)
    return units, f"cuda:{device}" if device >= 0 else "gpu"


def _empty_units() -> _Units:
    return _Units(array("l"), array("d"), array("d"), array("d"), array("l"), array("l"), array("d"))


def _cpu_units(trace: Trace) -> _Units:
    """Every CPU operator, with its self time (its duration minus its direct children's), so that an op that
    does its work itself (aten::mm) and one that only calls others (aten::linear) are both counted once."""
    by_thread: dict[int, list[int]] = defaultdict(list)
    for i in range(trace.n_host):
        if trace.host_kind[i] == HOST_OP:
            by_thread[trace.host_thread[i]].append(i)
    ts, dur = trace.host_ts_us, trace.host_dur_us
    self_us: dict[int, float] = {}
    for idx in by_thread.values():
        _sort_ranges(idx, ts, dur)
        open_: list[int] = []
        for i in idx:
            while open_ and ts[open_[-1]] + dur[open_[-1]] <= ts[i]:
                open_.pop()
            self_us[i] = dur[i]
            if open_:
                parent = open_[-1]
                self_us[parent] = self_us[parent] - dur[i]
            open_.append(i)
    ops = sorted(self_us, key=ts.__getitem__)
    units = _empty_units()
    units.exclusive = True
    for i in ops:
        units.name.append(trace.host_name[i])
        units.ts.append(ts[i])
        units.dur.append(max(0.0, self_us[i]))
        units.launch_ts.append(ts[i])
        units.launch_thread.append(trace.host_thread[i])
        units.stack.append(NO_ID)
        units.end.append(ts[i] + dur[i])
        units.graph.append(0)
        units.corr.append(NO_ID)
    return units


# --------------------------------------------------------------------------------------------------- context


def _sort_ranges(idx: list[int], ts: Sequence[float], dur: Sequence[float]) -> None:
    """Sort range indices by start, the longer (enclosing) range first on equal starts, in place. Two stable sorts
    with float keys: tuple keys would cost ~100 B per range at once."""
    idx.sort(key=dur.__getitem__, reverse=True)
    idx.sort(key=ts.__getitem__)


@dataclass(frozen=True)
class _Stack:
    frames_inner_first: tuple[int, ...]
    kinds_inner_first: tuple[int, ...]
    shape: int


class _StackTable:
    """Distinct enclosing-frame stacks, each stored once; units hold an index into it."""

    def __init__(self) -> None:
        self.stacks: list[_Stack] = []
        self._ids: dict[_Stack, int] = {}

    def intern(self, stack: _Stack) -> int:
        """The index of `stack`, adding it once."""
        got = self._ids.get(stack)
        if got is None:
            got = self._ids[stack] = len(self.stacks)
            self.stacks.append(stack)
        return got


def _attach_context(trace: Trace, units: _Units, source: str, skip: set[int]) -> list[_Stack]:
    """Fill `units.stack` with an index into the returned list of distinct enclosing-frame stacks. Frames named in
    `skip` (step markers: a new name every step, and no context) are left out, so stacks repeat across steps."""
    table = _StackTable()
    ranges: dict[int, list[int]] = defaultdict(list)
    for i in range(trace.n_host):
        ranges[trace.host_thread[i]].append(i)
    queries: dict[int, list[int]] = defaultdict(list)
    for u in range(len(units.name)):
        if units.launch_thread[u] != NO_ID:
            queries[units.launch_thread[u]].append(u)
    for thread, us in queries.items():
        order = ranges.get(thread, [])
        _sort_ranges(order, trace.host_ts_us, trace.host_dur_us)
        us.sort(key=units.launch_ts.__getitem__)
        _thread_stacks(trace, units, us, order, cpu=source == "cpu", skip=skip, table=table)
    # Units with no linked launch (no runtime events, or graph kernels without correlation): GPU-side annotations.
    orphans = [u for u in range(len(units.name)) if units.stack[u] == NO_ID]
    if orphans:
        _annotation_stacks(trace, units, orphans, skip=skip, table=table)
    return table.stacks


def _thread_stacks(
    trace: Trace, units: _Units, us: list[int], order: list[int], *, cpu: bool, skip: set[int], table: _StackTable
) -> None:
    """One thread's sweep: the host ranges open when each unit was launched (units and ranges sorted by time)."""
    ts, dur = trace.host_ts_us, trace.host_dur_us
    open_: list[int] = []
    j = 0
    for u in us:
        q = units.launch_ts[u]
        while j < len(order) and ts[order[j]] <= q:
            r = order[j]
            while open_ and ts[open_[-1]] + dur[open_[-1]] < ts[r]:
                open_.pop()
            open_.append(r)
            j += 1
        while open_ and ts[open_[-1]] + dur[open_[-1]] < q:
            open_.pop()
        live = [r for r in open_ if ts[r] + dur[r] >= q and trace.host_name[r] not in skip]
        if cpu:  # the unit's own range is on the stack: drop it
            live = [r for r in live if not (ts[r] == units.ts[u] and trace.host_name[r] == units.name[u])]
        shape = next((trace.host_shape[r] for r in reversed(live) if trace.host_shape[r] != NO_ID), NO_ID)
        units.stack[u] = table.intern(
            _Stack(
                tuple(trace.host_name[r] for r in reversed(live)),
                tuple(trace.host_kind[r] for r in reversed(live)),
                shape,
            )
        )


def _annotation_stacks(trace: Trace, units: _Units, orphans: list[int], *, skip: set[int], table: _StackTable) -> None:
    """Stacks of the GPU-side annotations open when each unit ran (units in time order)."""
    ga = list(range(len(trace.ga_name)))
    _sort_ranges(ga, trace.ga_ts_us, trace.ga_dur_us)
    open_: list[int] = []
    j = 0
    for u in orphans:
        q = units.ts[u]
        while j < len(ga) and trace.ga_ts_us[ga[j]] <= q:
            open_.append(ga[j])
            j += 1
        open_ = [r for r in open_ if trace.ga_ts_us[r] + trace.ga_dur_us[r] >= q]
        frames = tuple(trace.ga_name[r] for r in reversed(open_) if trace.ga_name[r] not in skip)
        units.stack[u] = table.intern(_Stack(frames, tuple(HOST_ANNOTATION for _ in frames), NO_ID))


# --------------------------------------------------------------------------------------------------- steps


def _segment(trace: Trace, units: _Units, rules: RuleSet) -> tuple[list[list[int]], str, list[float | None]]:
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


def _by_graph_launch(units: _Units) -> list[list[int]]:
    """One step per graph launch: the kernels carrying that launch's correlation id, in time order."""
    groups: dict[int, list[int]] = defaultdict(list)
    for u in range(len(units.name)):
        if units.graph[u]:
            groups[units.corr[u]].append(u)
    return sorted(groups.values(), key=lambda members: units.ts[members[0]])


def _segment_host(trace: Trace, units: _Units, rules: RuleSet) -> tuple[list[list[int]], str, list[float | None]]:
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


def _typical_steps(
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
    units: _Units, ranges: list[tuple[float, float, int]], by_launch: bool
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


def _period(units: _Units) -> int | None:
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


def _gaps(units: _Units) -> list[float]:
    """gaps[i]: idle time before unit i (after every earlier unit ended); gaps[0] = 0."""
    out = [0.0]
    end = units.end[0] if len(units.ts) else 0.0
    for i in range(1, len(units.ts)):
        out.append(max(0.0, units.ts[i] - end))
        end = max(end, units.end[i])
    return out


def _by_period(units: _Units, period: int) -> list[list[int]]:
    """Whole periods, phased so that boundaries fall on the largest gaps."""
    gaps = _gaps(units)
    n = len(gaps)
    phase = max(range(period), key=lambda p: sum(gaps[i] for i in range(p, n, period)))
    return [list(range(s, s + period)) for s in range(phase, n - period + 1, period)]


def _by_gaps(units: _Units) -> list[list[int]]:
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


# --------------------------------------------------------------------------------------------------- attribution


def _strip(name: str) -> str:
    return name[len("nn.Module: ") :] if name.startswith("nn.Module: ") else name


def _shape_has(dims_json: str, value: int) -> bool:
    try:
        dims = json.loads(dims_json)
    except json.JSONDecodeError:
        return False
    stack = [dims]
    while stack:
        item = stack.pop()
        if isinstance(item, list):
            stack.extend(item)
        elif item == value:
            return True
    return False


def _shape_component(dims_json: str, gemm_shapes: Mapping[tuple[int, int], Component]) -> Component | None:
    """The component whose weight is (k, n) or (n, k) among the 2-D operands of a GEMM's Input Dims."""
    try:
        dims = json.loads(dims_json)
    except json.JSONDecodeError:
        return None
    if not isinstance(dims, list):
        return None
    for operand in dims:
        if isinstance(operand, list) and len(operand) == 2 and all(isinstance(d, int) for d in operand):
            a, b = operand
            found = gemm_shapes.get((a, b)) or gemm_shapes.get((b, a))
            if found is not None:
                return found
    return None


@dataclass
class _Tally:
    """Counts and time (µs) summed over the steps, per kernel row and per way of attribution."""

    stats: dict[tuple[int, str, str | None], list[float]] = field(default_factory=dict)
    family_rule: dict[tuple[int, str, str | None], tuple[str | None, str | None]] = field(default_factory=dict)
    how: dict[str, list[float]] = field(default_factory=dict)
    inferred: int = 0
    unattributed_gemm: int = 0

    def add(
        self, key: tuple[int, str, str | None], how: str, family_rule: tuple[str | None, str | None], us: float
    ) -> None:
        """Count one unit of `us` microseconds under its kernel row and its way of attribution."""
        for acc in (self.stats.setdefault(key, [0.0, 0.0]), self.how.setdefault(how, [0.0, 0.0])):
            acc[0] += 1
            acc[1] += us
        self.family_rule[key] = family_rule

    @property
    def total_us(self) -> float:
        """All attributed time."""
        return sum(v[1] for v in self.stats.values())


@dataclass(frozen=True)
class _Hints:
    """What decides a GEMM without a telling context: the model's weight shapes, then its vocabulary."""

    vocab_size: int | None
    gemm_shapes: Mapping[tuple[int, int], Component] | None


def _stack_contexts(stacks: list[_Stack], names: list[str], rules: RuleSet) -> list[tuple[str | None, str | None]]:
    """Per distinct stack: the context rule's id (None: no telling frame) and a 'via' text (op chain in frame)."""
    out: list[tuple[str | None, str | None]] = []
    for st in stacks:
        frames = [names[f] for f in st.frames_inner_first]
        rule, frame = rules.context_of(frames)
        ctx = None if rule is None or rule.id == "body" else rule.id
        ops: list[str] = []
        for f, kind in zip(frames, st.kinds_inner_first, strict=False):
            if f == frame:
                break
            if kind == HOST_OP:
                ops.append(f)
        chain = ">".join(reversed(ops[-3:])) if ops else ""
        where = _strip(frame) if frame and ctx else ""
        via = f"{chain} in {where}" if chain and where else (chain or (f"in {where}" if where else None))
        out.append((ctx, via))
    return out


def _tally(
    trace: Trace, rules: RuleSet, units: _Units, stacks: list[_Stack], steps: list[list[int]], *, hints: _Hints
) -> _Tally:
    """Classify every unit of every step and sum it under its kernel row and its way of attribution."""
    names = trace.names
    stack_ctx = _stack_contexts(stacks, names, rules)
    tally = _Tally()
    for members in steps:
        krules = [rules.classify(names[units.name[u]]) for u in members]
        families = [k.family if k else None for k in krules]
        kinds = _block_kinds(families)
        guess = _sequence_guess(families, kinds)
        for pos, u in enumerate(members):
            stack = units.stack[u]
            ctx, via = stack_ctx[stack] if stack != NO_ID else (None, None)
            shape = stacks[stack].shape if stack != NO_ID else NO_ID
            unit = _Unit(families[pos], ctx, via, guess[pos], kinds[pos], bool(units.graph[u]))
            component, via, how = _decide(rules, unit, names[shape] if shape != NO_ID else None, hints, tally)
            if via is None and units.graph[u]:  # no host operator inside a replay: say where in the step it ran
                via = f"graph replay, {kinds[pos]} block" if kinds[pos] else "graph replay"
            key = (units.name[u], bucket_key(component, families[pos]), via)
            krule = krules[pos]
            tally.add(key, how, (families[pos], krule.id if krule else None), units.dur[u])
    return tally


class _Unit(NamedTuple):
    """What is known of one kernel when its component is decided (a tuple: one is made per kernel)."""

    family: str | None
    ctx: str | None
    via: str | None
    guess: Component | None
    """The component its norm-delimited block suggests (GEMMs and activations only)."""
    kind: str
    """The kind of that block ('' when none)."""
    graph: bool


def _decide(
    rules: RuleSet, unit: _Unit, shape: str | None, hints: _Hints, tally: _Tally
) -> tuple[Component | None, str | None, str]:
    """(component or None, via, how): the context's component, else the rules' default for the family, else (for
    GEMMs) the model's shapes or the block, else (inside a graph replay) the block's context."""
    family, ctx, via = unit.family, unit.ctx, unit.via
    if family is None:
        return None, via, HOW_UNCLASSIFIED
    component = rules.component(family, ctx)
    how = HOW_CONTEXT if ctx is not None and ctx in rules.families[family].by_context else HOW_NAME
    if family == "activation" and ctx is None and unit.guess is Component.ROUTED_EXPERTS:
        return Component.ROUTED_EXPERTS, "inferred: in an MoE block", HOW_ORDER
    if component is None and family == "gemm":
        component, via, how = _decide_gemm(unit, shape, hints, tally)
    if component is None and ctx is None and unit.graph and unit.kind:
        # inside a replay the block a copy sits in is all there is: the rules' context of that block
        component = rules.component(family, _KIND_CONTEXT[unit.kind])
        if component is not None:
            how, via = HOW_ORDER, f"graph replay, {unit.kind} block"
    return component, via, how if component is not None else HOW_NONE


def _decide_gemm(
    unit: _Unit, shape: str | None, hints: _Hints, tally: _Tally
) -> tuple[Component | None, str | None, str]:
    """A GEMM without a telling context: its weight's shape, a vocabulary-sized dimension, or its block."""
    by_shape = _shape_component(shape, hints.gemm_shapes) if hints.gemm_shapes and shape else None
    if by_shape is not None:
        return by_shape, f"weight shape matches the model's {by_shape.value}", HOW_SHAPE
    if hints.vocab_size and shape and _shape_has(shape, hints.vocab_size):
        return Component.LM_HEAD, f"shape has the vocabulary ({hints.vocab_size})", HOW_SHAPE
    if unit.ctx is None and unit.guess is not None:
        tally.inferred += 1
        return unit.guess, f"inferred: {unit.guess.value} by its neighbours", HOW_ORDER
    tally.unattributed_gemm += 1
    return None, unit.via, HOW_NONE


def _buckets(
    tally: _Tally, names: list[str], rules: RuleSet, per_step: int, top_n: int
) -> tuple[list[BucketTime], list[KernelStat]]:
    """Per-bucket times with their largest kernels, largest first, and the top kernels overall."""
    stats, total_us = tally.stats, tally.total_us

    def kstat(key: tuple[int, str, str | None]) -> KernelStat:
        count, time_us = stats[key]
        family, rule_id = tally.family_rule[key]
        return KernelStat(
            name=names[key[0]],
            bucket=key[1],
            family=family,
            rule_id=rule_id,
            via=key[2],
            count_per_step=count / per_step,
            time_us_per_step=time_us / per_step,
            mean_us=time_us / count if count else 0.0,
            share=time_us / total_us if total_us else 0.0,
        )

    by_bucket: dict[str, list[tuple[int, str, str | None]]] = defaultdict(list)
    for key in stats:
        by_bucket[key[1]].append(key)
    buckets = []
    for bkey, keys in by_bucket.items():
        keys.sort(key=lambda k: -stats[k][1])
        time_us = sum(stats[k][1] for k in keys)
        buckets.append(
            BucketTime(
                key=bkey,
                label=bucket_label(bkey, rules),
                time_us_per_step=time_us / per_step,
                kernels_per_step=sum(stats[k][0] for k in keys) / per_step,
                share=time_us / total_us if total_us else 0.0,
                top=tuple(kstat(k) for k in keys[:TOP_PER_BUCKET]),
            )
        )
    buckets.sort(key=lambda b: -b.time_us_per_step)
    return buckets, [kstat(k) for k in heapq.nlargest(top_n, stats, key=lambda k: stats[k][1])]


def _attribution(tally: _Tally, per_step: int) -> tuple[AttributionCount, ...]:
    """Kernels and time per way of attribution, largest time first."""
    total_us = tally.total_us
    return tuple(
        AttributionCount(
            rule=how,
            kernels_per_step=count / per_step,
            time_us_per_step=time_us / per_step,
            share=time_us / total_us if total_us else 0.0,
        )
        for how, (count, time_us) in sorted(tally.how.items(), key=lambda kv: -kv[1][1])
    )


def _notes(tally: _Tally, *, source: str, busy: float, idle: float, per_step: int, outside: int, bad: int) -> list[str]:
    """What the reader of the report should know: host-bound steps, overlapping streams, guessed GEMMs, leftovers."""
    notes = []
    kernel_us = tally.total_us / per_step
    if source == "gpu" and busy and idle / (idle + busy) > 0.2:
        notes.append(
            f"GPU idle {idle / (idle + busy):.0%} of the time inside a step: host-bound (launch/Python overhead); "
            "shown as the traced 'launch' segment"
        )
    if busy and kernel_us > busy * OVERLAP_NOTE:
        notes.append("kernels overlap on several streams: component times add up to more than the busy time")
    if tally.unattributed_gemm:
        notes.append(
            f"{tally.unattributed_gemm / per_step:.0f} GEMMs per step have no telling context (no enclosing module "
            "or annotation names, no vocabulary-sized shape): 'GEMM (unattributed)'"
        )
    if tally.inferred:
        notes.append(
            f"{tally.inferred / per_step:.0f} GEMMs per step attributed by their neighbours (norm-delimited blocks)"
        )
    if outside:
        notes.append(f"{outside} kernels outside the decode steps were left out")
    if bad:
        notes.append(f"{bad} events with a NaN, infinite or negative timestamp or duration were skipped")
    return notes


def _attribute(
    trace: Trace,
    rules: RuleSet,
    *,
    units: _Units,
    stacks: list[_Stack],
    steps: list[list[int]],
    segmentation: str,
    marker_durs: Sequence[float | None],
    source: str,
    device_label: str,
    vocab_size: int | None,
    gemm_shapes: Mapping[tuple[int, int], Component] | None,
    top_n: int,
    notes: list[str],
) -> TraceReport:
    tally = _tally(trace, rules, units, stacks, steps, hints=_Hints(vocab_size, gemm_shapes))
    per_step = max(len(steps), 1)
    buckets, top = _buckets(tally, trace.names, rules, per_step, top_n)
    summaries = [_step_summary(k, units, members, marker_durs[k]) for k, members in enumerate(steps)]
    in_step = array("b", bytes(len(units.name)))
    for members in steps:
        for u in members:
            in_step[u] = 1
    outside = [u for u in range(len(units.name)) if not in_step[u]]

    def mean(xs: list[float]) -> float:
        return sum(xs) / len(xs) if xs else 0.0

    idle = mean([s.gpu_idle_us for s in summaries])
    busy = mean([s.gpu_busy_us for s in summaries])
    notes.extend(
        _notes(tally, source=source, busy=busy, idle=idle, per_step=per_step, outside=len(outside), bad=trace.bad_times)
    )
    odd_us: dict[str, float] = defaultdict(float)
    for key, (_count, time_us) in tally.stats.items():
        if key[1] == UNCLASSIFIED:
            odd_us[trace.names[key[0]]] += time_us
    return TraceReport(
        path=str(trace.path),
        source=source,
        device=device_label,
        segmentation=segmentation,
        steps=tuple(summaries),
        buckets=tuple(buckets),
        top_kernels=tuple(top),
        step_wall_us_mean=mean([s.wall_us for s in summaries]),
        gpu_busy_us_mean=busy,
        gpu_idle_us_mean=idle,
        kernels_per_step_mean=mean([float(s.kernel_count) for s in summaries]),
        kernel_time_us_per_step=tally.total_us / per_step,
        outside_steps_kernels=len(outside),
        outside_steps_us=sum(units.dur[u] for u in outside),
        unclassified_names=tuple(sorted(odd_us, key=lambda name: -odd_us[name])[:20]),
        notes=tuple(notes),
        events_total=trace.events_total,
        gpu_name=_gpu_name(trace, device_label) if source == "gpu" else None,
        attribution=_attribution(tally, per_step),
        graph_kernels_per_step=sum(units.graph[u] for members in steps for u in members) / per_step,
        events_skipped=trace.bad_times,
    )


def gemm_shapes_from_inventory(ops: Iterable[Op]) -> dict[tuple[int, int], Component]:
    """(k, n) → component for the budget inventory's GEMMs and its lm_head (`StepInventory.ops` of
    `decodetop.budget.inventory`). Shapes two components share are left out: they decide nothing."""
    seen: dict[tuple[int, int], set[Component]] = defaultdict(set)
    for op in ops:
        key = op.key
        if op.kind == "sampling":  # the lm_head GEMM lives in the sampling op: hidden × vocab shard
            if isinstance(key, SamplingKey):
                seen[(key.hidden, key.vocab_shard)].add(op.component)
        elif isinstance(key, GemmKey):
            seen[(key.k, key.n)].add(op.component)
    return {shape: next(iter(comps)) for shape, comps in seen.items() if len(comps) == 1}


def _gpu_name(trace: Trace, device_label: str) -> str | None:
    """deviceProperties[i].name of the analysed device, if the trace carries it."""
    props = trace.meta.get("deviceProperties")
    index = device_label.removeprefix("cuda:")
    if isinstance(props, list):
        for prop in props:
            if isinstance(prop, dict) and str(prop.get("id")) == index and isinstance(prop.get("name"), str):
                return str(prop["name"])
    return None


_KIND_CONTEXT = {"attention": "attn_module", "experts": "experts", "mlp": "mlp", "lm_head": "lm_head"}
"""The context rule (kernel_rules.json) a norm-delimited block of each kind stands for, for graph-replayed kernels."""

_SEQ_COMPONENT = {
    "attention": Component.ATTENTION_PROJ,
    "experts": Component.ROUTED_EXPERTS,
    "mlp": Component.DENSE_MLP,
    "lm_head": Component.LM_HEAD,
}


def _block_kinds(families: Sequence[str | None]) -> list[str]:
    """The kind of norm-delimited block each position sits in ('attention', 'experts', 'mlp', 'lm_head' or ''):
    blocks between norms that hold attention are attention blocks, blocks with routing or grouped GEMMs are experts,
    blocks with an activation are the MLP, and a block with sampling (or the last block after the final norm) is the
    lm_head."""
    out = [""] * len(families)
    norms = [i for i, f in enumerate(families) if f == "norm"]
    if not norms:
        return out
    bounds = [0, *norms, len(families)]
    last = len(bounds) - 2
    for b, (lo, hi) in enumerate(itertools.pairwise(bounds)):
        block = set(families[lo:hi])
        if "attention" in block:
            kind = "attention"
        elif block & {"routing", "grouped_gemm"}:
            kind = "experts"
        elif "activation" in block:
            kind = "mlp"
        elif "sampling" in block or (b == last and lo > 0):
            kind = "lm_head"
        else:
            continue
        for i in range(lo, hi):
            out[i] = kind
    return out


def _sequence_guess(families: Sequence[str | None], kinds: Sequence[str]) -> list[Component | None]:
    """For GEMMs (and activations) without context: the component of the block they sit in (`_block_kinds`)."""
    return [
        _SEQ_COMPONENT[kind] if kind and family in {"gemm", "activation"} else None
        for family, kind in zip(families, kinds, strict=True)
    ]


def _step_summary(k: int, units: _Units, members: list[int], marker_dur: float | None) -> StepSummary:
    members = sorted(members, key=units.ts.__getitem__)
    start = units.ts[members[0]]
    end_all = max(units.end[u] for u in members)
    if units.exclusive:  # self times partition the covered time
        busy = sum(units.dur[u] for u in members)
    else:  # union of kernel intervals: overlapping streams count once
        busy = 0.0
        cur_s = cur_e = start
        for u in members:
            s, e = units.ts[u], units.end[u]
            if s > cur_e:
                busy += cur_e - cur_s
                cur_s, cur_e = s, e
            else:
                cur_e = max(cur_e, e)
        busy += cur_e - cur_s
    window = end_all - start
    busy = min(busy, window)
    return StepSummary(
        index=k,
        label=f"step {k}",
        start_us=start,
        wall_us=max(marker_dur, window) if marker_dur is not None else window,  # a marker can end before its kernels
        gpu_window_us=window,
        gpu_busy_us=busy,
        gpu_idle_us=max(0.0, window - busy),
        kernel_count=len(members),
    )


__all__ = ["LAUNCH_KEY", "analyze", "analyze_trace", "gemm_shapes_from_inventory"]
