"""Provides `analyze_trace`: a profiler trace split into decode steps, with each kernel attributed to a component.

Pipeline: read the trace (streaming) → pick the units to attribute (the kernels, memcpys and memsets of the busiest
GPU; or, in a CPU-only trace, the CPU operators by self time) → find each unit's host context (the annotation,
module and operator ranges open on the launching thread when its launch call ran, linked by correlation id; GPU-side
annotations where no launch is linked) → split the units into decode steps (step markers, else the repetition of
the kernel sequence, else gaps) → classify every unit through the rules table → sum per step.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from pathlib import Path

from decodetop.budget.components import Component
from decodetop.budget.inventory import Op
from decodetop.budget.keys import GemmKey, SamplingKey
from decodetop.errors import UserInputError
from decodetop.traces.attribution import OVERLAP_NOTE, attribute
from decodetop.traces.classify import RuleSet, load_rules
from decodetop.traces.hostcontext import attach_context
from decodetop.traces.reader import GPU_KERNEL, Trace, read_trace
from decodetop.traces.steps import segment_steps, typical_steps
from decodetop.traces.trace_report import LAUNCH_KEY, TraceReport
from decodetop.traces.units import cpu_units, gpu_units


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
        units, device_label = gpu_units(trace, device)
        source = "gpu"
    elif trace.n_host:
        units, device_label = cpu_units(trace), "cpu"
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
    stacks = attach_context(trace, units, source, skip=markers)
    steps, segmentation, marker_durs = segment_steps(trace, units, rules)
    if not all_steps:
        steps, marker_durs = typical_steps(steps, marker_durs, notes)
    return attribute(
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


__all__ = ["LAUNCH_KEY", "OVERLAP_NOTE", "analyze", "analyze_trace", "gemm_shapes_from_inventory"]
