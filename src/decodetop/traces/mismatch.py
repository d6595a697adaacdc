"""Provides `trace_mismatches`: what in a trace does not match the model and deployment it is compared with, in one
line, so a trace of another model, another layer count or another TP degree is never compared in silence.

What the trace shows (`TraceShape`) against what the step inventory says one decode step of the model holds on one
GPU (`ModelShape`):

- layers: the per-layer kernel pattern's repeats (`traces.layers`) against the model's decoder layers (all of
  them, the longest stretch of one kind, or the repeats of alternating kinds: `repeat_counts`), one layer of slack
  (an engine that fuses the first layer's norm into the embedding changes that layer by a kernel); where no pattern
  is found, kernels per step against the inventory's kernel count, beyond `KERNEL_RATIO` either way (engines fuse
  and unfused forwards split: within that factor the count says nothing);
- experts: a MoE model whose trace has no routed-expert, shared-expert or routing kernel (only judged while
  unclassified kernels take under `UNCLASSIFIED_LIMIT` of the time: an engine kernel no rule knows may be an
  expert), or expert kernels in a dense model's trace;
- collectives: TP > 1 without any all-reduce or other collective kernel, or collectives with TP 1 given;
- ranks: the trace's world size (`distributedInfo`), or the number of per-rank files read, against the TP degree.

A check that cannot be made (no pattern, a CPU-only trace, no world size) says nothing: only a found mismatch is a
line, and no line is not a claim that everything matched.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

from decodetop.budget.components import Component
from decodetop.budget.inventory import StepInventory
from decodetop.traces.classify import UNCLASSIFIED
from decodetop.traces.layers import layer_pattern
from decodetop.traces.ranks import TraceSet
from decodetop.traces.trace_report import TraceReport

LAYER_SLACK = 1
"""Layers the pattern's repeats may fall short of or exceed the model's (the first layer fused into the embedding)."""
KERNEL_RATIO = 8.0
"""Kernels per step against the inventory, judged only where no layer pattern is found: the recorded 4-layer Llama
steps launch 187 (eager) and 231 (graph) kernels where the inventory counts 45 (an unfused forward: ×5.1), so a
smaller factor would call a model's own trace another model."""
UNCLASSIFIED_LIMIT = 0.10
"""Share of kernel time no rule classified above which a missing kind of kernel is not evidence."""
_EXPERT_KEYS = (Component.ROUTED_EXPERTS.value, Component.SHARED_EXPERTS.value, Component.ROUTING.value)


@dataclass(frozen=True)
class ModelShape:
    """What one decode step of the model on this deployment holds, as far as a trace can show it."""

    name: str
    tp: int | None
    """None where the deployment's TP is not known (then TP is not judged)."""
    layers: int
    moe_layers: int
    kernels: int
    """The inventory's kernels per step (one GPU)."""
    layer_counts: tuple[int, ...]
    """The repeat counts a trace of this model may show (`repeat_counts`)."""

    @classmethod
    def of(cls, inventory: StepInventory, *, tp_known: bool = True) -> ModelShape:
        """The shape of `inventory`'s step; `tp_known` False leaves the TP unjudged."""
        spec = inventory.spec
        kinds = [(i in spec.moe_layers, i in spec.sliding_layers) for i in range(spec.n_layers)]
        return cls(
            name=spec.name,
            tp=inventory.deployment.tp if tp_known else None,
            layers=spec.n_layers,
            moe_layers=len(spec.moe_layers),
            kernels=inventory.kernels,
            layer_counts=repeat_counts(kinds),
        )

    def describe(self) -> str:
        """'GLM-5 at TP 8' (or the name alone)."""
        return f"{self.name} at TP {self.tp}" if self.tp is not None else self.name


def repeat_counts(kinds: Sequence[Hashable]) -> tuple[int, ...]:
    """How often a trace of layers of these kinds (dense or MoE, full or sliding attention, in layer order) repeats
    its per-layer kernel pattern: every layer where all are alike; else the longest stretch of one kind (GLM-5: 3
    dense, then 75 MoE layers) or, where kinds alternate (sliding and full attention every other layer), the
    repeats of the alternation, whose pattern spans several layers."""
    counts = {len(kinds)}
    run = longest = 0
    for i, kind in enumerate(kinds):
        run = run + 1 if i and kind == kinds[i - 1] else 1
        longest = max(longest, run)
    if longest < len(kinds):
        if longest > 1:
            counts.add(longest)
        ids = {kind: n for n, kind in enumerate(dict.fromkeys(kinds))}
        alternation = layer_pattern([ids[k] for k in kinds])
        if alternation is not None:
            counts.add(alternation.layers)
    return tuple(sorted(counts))


@dataclass(frozen=True)
class TraceShape:
    """What a trace shows of the step's structure."""

    layers: int | None
    """The per-layer pattern's repeats (None: no pattern found)."""
    kernels_per_layer: int | None
    kernels_per_step: float
    expert_kernels: float
    """Routed-expert, shared-expert and routing kernels per step."""
    collective_kernels: float
    unclassified_share: float
    """Share of kernel time no rule classified."""
    gpu: bool
    """False for a CPU-only trace (CPU operators stand in for kernels: collectives and layers are not judged)."""
    world_size: int | None
    """The trace's own `distributedInfo.world_size`, when it says."""
    rank_files: int

    @classmethod
    def of(cls, traces: TraceSet | TraceReport) -> TraceShape:
        """The shape of a trace set (its shown rank's report, and how many rank files were read) or one report."""
        report = traces.report if isinstance(traces, TraceSet) else traces
        ranks = len(traces.ranks) if isinstance(traces, TraceSet) else 1
        by_key = {b.key: b for b in report.buckets}
        total = sum(b.time_us_per_step for b in report.buckets)
        odd = by_key.get(UNCLASSIFIED)
        pattern = report.layer_pattern
        return cls(
            layers=pattern.layers if pattern is not None else None,
            kernels_per_layer=pattern.kernels_per_layer if pattern is not None else None,
            kernels_per_step=report.kernels_per_step_mean,
            expert_kernels=sum(by_key[k].kernels_per_step for k in _EXPERT_KEYS if k in by_key),
            collective_kernels=(
                by_key[Component.COMMUNICATION.value].kernels_per_step
                if Component.COMMUNICATION.value in by_key
                else 0.0
            ),
            unclassified_share=odd.time_us_per_step / total if odd is not None and total > 0 else 0.0,
            gpu=report.source == "gpu",
            world_size=report.world_size,
            rank_files=ranks,
        )


@dataclass(frozen=True)
class TraceMismatch:
    """One thing the trace shows that the model or deployment does not have."""

    what: str
    """'layers', 'kernels', 'experts', 'collectives' or 'ranks'."""
    text: str


def _layers(trace: TraceShape, model: ModelShape) -> list[TraceMismatch]:
    kernels = f"{trace.kernels_per_step:,.0f} kernels per step vs {model.kernels:,} expected"
    if trace.layers is not None and trace.gpu:
        if min(abs(trace.layers - n) for n in model.layer_counts) <= LAYER_SLACK:
            return []
        return [TraceMismatch("layers", f"{trace.layers} layers traced vs {model.layers} ({kernels})")]
    ratio = trace.kernels_per_step / model.kernels if model.kernels else 1.0
    if trace.gpu and trace.kernels_per_step > 0 and not 1 / KERNEL_RATIO <= ratio <= KERNEL_RATIO:
        return [TraceMismatch("kernels", kernels)]
    return []


def _experts(trace: TraceShape, model: ModelShape) -> list[TraceMismatch]:
    if model.moe_layers and trace.expert_kernels == 0 and trace.unclassified_share < UNCLASSIFIED_LIMIT:
        return [
            TraceMismatch("experts", f"no expert or routing kernels for a MoE model ({model.moe_layers} MoE layers)")
        ]
    if not model.moe_layers and trace.expert_kernels > 0:
        return [TraceMismatch("experts", f"{trace.expert_kernels:.0f} expert kernels per step, {model.name} has none")]
    return []


def _parallel(trace: TraceShape, model: ModelShape) -> list[TraceMismatch]:
    """Ranks, then collectives, against the TP degree: the first that does not match (they say the same thing)."""
    tp = model.tp
    if tp is None:
        return []
    found: list[TraceMismatch] = []
    if trace.world_size is not None and trace.world_size != tp:
        found.append(TraceMismatch("ranks", f"TP {tp} given, the trace's world size is {trace.world_size}"))
    elif trace.rank_files > 1 and trace.rank_files != tp:
        found.append(TraceMismatch("ranks", f"TP {tp} given, {trace.rank_files} rank traces read"))
    elif trace.gpu and tp > 1 and trace.collective_kernels == 0:
        ranks = "1 rank" if trace.rank_files == 1 else f"{trace.rank_files} ranks"
        found.append(TraceMismatch("collectives", f"TP {tp} given, the trace shows {ranks} and no all-reduce kernels"))
    elif trace.gpu and tp == 1 and trace.collective_kernels > 0:
        per_step = f"{trace.collective_kernels:.0f} all-reduce kernels per step"
        found.append(TraceMismatch("collectives", f"{per_step} with TP 1 given (pass --tp)"))
    return found


def trace_mismatches(traces: TraceSet | TraceReport, model: ModelShape) -> tuple[TraceMismatch, ...]:
    """Everything in `traces` that does not match `model` (the module docstring's checks), in that order."""
    trace = TraceShape.of(traces)
    return (*_layers(trace, model), *_experts(trace, model), *_parallel(trace, model))


def mismatch_line(model: ModelShape, found: Sequence[TraceMismatch]) -> str:
    """ "the trace does not match GLM-5 at TP 8: 4 layers traced vs 78 (…); no expert or routing kernels …", or ''
    when nothing was found."""
    if not found:
        return ""
    return f"the trace does not match {model.describe()}: " + "; ".join(m.text for m in found)
