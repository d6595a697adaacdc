"""Provides the results of a trace analysis: per-step timing, per-component time, top kernels (frozen, JSON-able)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from decodetop.traces.layers import LayerPattern

_NOT_ATTRIBUTED = ("unattributed (family known, component not)", "no rule (unclassified)")
"""`AttributionCount.rule` values that mean no component (the analysis's HOW_NONE and HOW_UNCLASSIFIED)."""

LAUNCH_KEY = "launch"
"""The traced bar's launch segment: GPU idle inside the decode steps (host-bound gaps), beside the probes' launch."""


@dataclass(frozen=True)
class StepSummary:
    """One decode step as the trace shows it."""

    index: int
    label: str
    start_us: float
    wall_us: float
    """The step's duration: its marker's length where a marker delimits it, else first kernel start to last end."""
    gpu_window_us: float
    """First kernel start to last kernel end of the step."""
    gpu_busy_us: float
    """Union of the step's kernel intervals (overlapping streams counted once)."""
    gpu_idle_us: float
    """Window minus busy: the GPU waited for the host inside the step."""
    kernel_count: int


@dataclass(frozen=True)
class KernelStat:
    """One kernel name in one attribution (bucket and where it was launched from), summed over the steps."""

    name: str
    bucket: str
    """Budget component value, 'unattributed:<family>' or 'unclassified'."""
    family: str | None
    rule_id: str | None
    via: str | None
    """The enclosing operator and the frame that decided the context, e.g. 'aten::_to_copy in attention'."""
    count_per_step: float
    time_us_per_step: float
    mean_us: float
    share: float
    """Fraction of all kernel time in the steps."""


@dataclass(frozen=True)
class BucketTime:
    """Time per decode step attributed to one bucket (a budget component or an unattributed family)."""

    key: str
    label: str
    time_us_per_step: float
    kernels_per_step: float
    share: float
    top: tuple[KernelStat, ...]


@dataclass(frozen=True)
class AttributionCount:
    """Kernels (and their time) per step that one way of attribution decided (host context, name, order...)."""

    rule: str
    kernels_per_step: float
    time_us_per_step: float
    share: float
    """Fraction of all kernel time in the steps."""


@dataclass(frozen=True)
class TraceReport:
    """What `analyze_trace` found in one trace file."""

    path: str
    source: str
    """'gpu' (kernels of one device) or 'cpu' (a CPU-only trace: CPU operators stand in for kernels)."""
    device: str
    segmentation: str
    """How the steps were found, e.g. 'markers: ProfilerStep#N (host ranges)', 'gaps', 'repetition'."""
    steps: tuple[StepSummary, ...]
    buckets: tuple[BucketTime, ...]
    top_kernels: tuple[KernelStat, ...]
    step_wall_us_mean: float
    gpu_busy_us_mean: float
    gpu_idle_us_mean: float
    kernels_per_step_mean: float
    kernel_time_us_per_step: float
    """Sum of kernel durations per step (exceeds busy time where streams overlap)."""
    outside_steps_kernels: int
    outside_steps_us: float
    unclassified_names: tuple[str, ...]
    notes: tuple[str, ...]
    events_total: int
    gpu_name: str | None = None
    """The traced GPU's name from the trace's deviceProperties, when it says."""
    attribution: tuple[AttributionCount, ...] = ()
    """How the kernels got their component, largest time first."""
    graph_kernels_per_step: float = 0.0
    """Kernels per step replayed by a CUDA graph launch (no host operators around them)."""
    events_skipped: int = 0
    """Events left out for a NaN, infinite or negative timestamp or duration."""
    layer_pattern: LayerPattern | None = None
    """The per-layer kernel pattern of the first decode step and how often it repeats (None: none found)."""
    world_size: int | None = None
    """The trace's own `distributedInfo.world_size` (the engine's ranks), when it says."""

    @property
    def attributed_share(self) -> float:
        """Fraction of kernel time attributed to a budget component (not unattributed, not unclassified)."""
        return sum(a.share for a in self.attribution if a.rule not in _NOT_ATTRIBUTED)

    def traced_ms(self) -> dict[str, float]:
        """Per-step milliseconds by bucket key, plus 'launch' = GPU idle inside the step: the traced bar."""
        out = {b.key: b.time_us_per_step / 1000.0 for b in self.buckets}
        out[LAUNCH_KEY] = out.get(LAUNCH_KEY, 0.0) + self.gpu_idle_us_mean / 1000.0
        return out

    def bucket(self, key: str) -> BucketTime | None:
        """The bucket with this key, if any kernel landed in it."""
        return next((b for b in self.buckets if b.key == key), None)

    def to_json(self) -> dict[str, Any]:
        """Plain JSON-able form (what `decodetop trace --json` prints)."""
        data = asdict(self)
        data["traced_ms"] = self.traced_ms()
        return data


@dataclass(frozen=True)
class ComparisonRow:
    """One component: the probes' figure beside the trace's, and what explains the difference."""

    key: str
    label: str
    probed_ms: float | None
    """The budget's figure (whatever its source: `source`)."""
    traced_ms: float
    delta_ms: float | None
    finding: str
    source: str = ""
    """Where the budget's figure came from: 'probed' (measured in this run), 'stored' (measured earlier: the history
    or a file), 'roofline' (an estimate), '' where it has none (`compare.budget_sources`)."""


@dataclass(frozen=True)
class Comparison:
    """The probe-composed bar against the traced bar, per component."""

    rows: tuple[ComparisonRow, ...]
    probed_total_ms: float | None
    traced_total_ms: float
    traced_step_ms: float
    notes: tuple[str, ...]
    source: str = "budget"
    """The budget's figures' source in one word: 'probed', 'stored' or 'roofline' where all agree, else 'budget'."""

    def to_json(self) -> dict[str, Any]:
        """Plain JSON-able form."""
        return asdict(self)
