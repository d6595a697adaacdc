"""Provides the attribution of a trace's units to the budget's components (by host context, kernel name, GEMM shape
or the norm-delimited block a kernel sits in), summed per step into a `TraceReport` with the top kernels per bucket
and a count of kernels per way of attribution."""

from __future__ import annotations

import heapq
import itertools
import json
from array import array
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from decodetop.budget.components import Component
from decodetop.traces.classify import UNCLASSIFIED, RuleSet, bucket_key, bucket_label
from decodetop.traces.hostcontext import Stack
from decodetop.traces.layers import layer_pattern
from decodetop.traces.reader import HOST_OP, NO_ID, Trace
from decodetop.traces.trace_report import AttributionCount, BucketTime, KernelStat, StepSummary, TraceReport
from decodetop.traces.units import Units

TOP_PER_BUCKET = 10
"""Kernels kept per bucket: what the traced bar's kernel list shows when a segment is opened."""
HOW_CONTEXT = "host context (module, annotation or operator)"
HOW_NAME = "kernel name"
HOW_SHAPE = "GEMM shape (model weights or vocabulary)"
HOW_ORDER = "order in the step (the block between norms)"
HOW_NONE = "unattributed (family known, component not)"
HOW_UNCLASSIFIED = "no rule (unclassified)"
"""How a kernel got its component: the traced report counts kernels and time per way."""
OVERLAP_NOTE = 1.05
"""Kernel time above busy time by more than 5% means streams overlap: component sums then exceed the step."""


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


def _stack_contexts(stacks: list[Stack], names: list[str], rules: RuleSet) -> list[tuple[str | None, str | None]]:
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
    trace: Trace, rules: RuleSet, units: Units, stacks: list[Stack], steps: list[list[int]], *, hints: _Hints
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


def attribute(
    trace: Trace,
    rules: RuleSet,
    *,
    units: Units,
    stacks: list[Stack],
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
        layer_pattern=layer_pattern([units.name[u] for u in steps[0]]) if steps else None,
        world_size=_world_size(trace),
    )


def _world_size(trace: Trace) -> int | None:
    """`distributedInfo.world_size` of the trace (PyTorch's profiler writes it for a distributed run), if valid."""
    info = trace.meta.get("distributedInfo")
    size = info.get("world_size") if isinstance(info, dict) else None
    return size if isinstance(size, int) and not isinstance(size, bool) and size > 0 else None


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


def _step_summary(k: int, units: Units, members: list[int], marker_dur: float | None) -> StepSummary:
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
