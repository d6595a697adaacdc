"""Provides `BudgetContext`: everything one composition of a budget depends on, in one frozen object (the scenario,
the probe results, the observed step, the target, the GPU the budget is for, where stored results came from and
when, and how figures of points nobody measured are obtained), and `GpuHint`, the GPU a budget is for where the
results do not say, chosen by one rule (`gpu_hint`). Stdlib only.

    ctx = BudgetContext(scenario, results, observed=observed_step(...), gpu=gpu_hint(named=args.gpu))
    composition = compose(ctx)          # decodetop.pipeline.composition
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from decodetop.budget.compose import ObservedStep, default_observed
from decodetop.budget.gpus import GPUS, find_gpu
from decodetop.budget.plan import ProbePlan
from decodetop.budget.scenario import Scenario
from decodetop.defaults import DEFAULT_TARGET_TPS
from decodetop.errors import UserInputError
from decodetop.probes.results import ProbeResult

ASSUMED_GPU_KEY = "rtx-pro-6000"
"""The GPU assumed where none is seen and none is named: the seed host's (docs/architecture.md, the 95 ms step)."""
DETECTED = "detected by NVML"
"""How a GPU NVML names was chosen, in words."""
UNMEASURED_CURVES = "curves"
"""Figures of points not measured exactly from the curve engine over every point measured on this host
(`decodetop.budget.curves`: interpolated, extrapolated or transferred, each labelled with its 80 % range), else the
roofline estimate for the budget's hardware; none on CPU ranks."""
UNMEASURED_ROOFLINE = "roofline"
"""Exact points only (a key measured as such, a point of a sweep): every other figure is the roofline estimate for
the budget's hardware, labelled (the spec-sheet view, beside the curves' for comparison)."""
UNMEASURED_WAYS = (UNMEASURED_CURVES, UNMEASURED_ROOFLINE)
"""The ways `BudgetContext.unmeasured` can name; `decodetop.pipeline.composition.compose` is the one place that
reads it."""


@dataclass(frozen=True)
class GpuHint:
    """The GPU a budget is for when the results do not say: its name and how it was chosen, in words."""

    name: str
    """An NVML device name or a hardware-table key ("NVIDIA H200", "h200")."""
    how: str
    """"detected by NVML", "--gpu", "assumed: no --gpu and no GPU seen"."""
    bandwidth_gbps: float | None = None
    """A measured memory bandwidth to use instead of the datasheet's (`--bandwidth-tbps`)."""
    bandwidth_source: str = ""
    allreduce_latency_us: float | None = None
    """A measured small-message all-reduce latency (`--allreduce-us`)."""
    latency_source: str = ""


def assumed_gpu() -> GpuHint:
    """The GPU a budget assumes where none is seen and none is named."""
    return GpuHint(GPUS[ASSUMED_GPU_KEY].name, "assumed: no --gpu and no GPU seen")


def gpu_hint(
    *,
    named: str | None = None,
    seen: str | None = None,
    seen_how: str = DETECTED,
    bandwidth_tbps: float | None = None,
    allreduce_us: float | None = None,
) -> GpuHint:
    """The one rule for the GPU a budget is for (where the results do not say): the one `--gpu` names (checked
    against the hardware table: one `UserInputError` line), else the one the host shows (`seen`, found as
    `seen_how`: "detected by NVML", "fake NVML of the demo", "from the recording"), else the assumed one; with a
    measured bandwidth (`--bandwidth-tbps`) and small-message all-reduce latency (`--allreduce-us`) where given."""
    if named is not None:
        row = find_gpu(named)
        if row is None:
            raise UserInputError(f"--gpu: unknown GPU {named!r} (known: {', '.join(GPUS)})")
        hint = GpuHint(row.name, "--gpu")
    elif seen:
        hint = GpuHint(seen, seen_how)
    else:
        hint = assumed_gpu()
    return GpuHint(
        hint.name,
        hint.how,
        bandwidth_gbps=bandwidth_tbps * 1000 if bandwidth_tbps else None,
        bandwidth_source="measured (--bandwidth-tbps)" if bandwidth_tbps else "",
        allreduce_latency_us=allreduce_us,
        latency_source="measured (--allreduce-us)" if allreduce_us else "",
    )


@dataclass(frozen=True)
class BudgetContext:
    """What one budget is composed from: the same object on every surface, so the same inputs give the same figures.

    The all-reduce the engine runs is the scenario's (`--allreduce`, part of its fingerprint); the launch mode too."""

    scenario: Scenario
    results: Sequence[ProbeResult] = ()
    """Probe results: fresh, read back from a file (`probes.results.load_results`) or from the history."""
    observed: ObservedStep = field(default_factory=default_observed)
    """The observed step with its origin (`decodetop.pipeline.observed.observed_step`: the one rule)."""
    target_tps: float = DEFAULT_TARGET_TPS
    gpu: GpuHint | None = None
    """The GPU where the results do not name one (None: the assumed GPU)."""
    group_kind: str | None = None
    """cuda or cpu: the probe group's ranks, when known without results (CPU ranks get no GPU roofline)."""
    stored_at_s: Mapping[str, float] = field(default_factory=dict)
    """Probe → when its result was measured, for results read back (files, history): they are 'measured earlier'."""
    now_s: float | None = None
    """The clock the ages are taken at (None: now)."""
    plan: ProbePlan | None = None
    """The scenario's probe plan (None: built from its inventory)."""
    unmeasured: str = UNMEASURED_CURVES
    """How figures of points not measured exactly are obtained (`UNMEASURED_WAYS`)."""
    per_rank: bool = True
    """Compose every rank's own budget too (the spread and the straggler); a what-if's variants leave it out."""
    target_gpu: GpuHint | None = None
    """Another GPU model to predict for than the one the results were measured on (a what-if): every figure carried
    from the results' curves, labelled transferred (None: the results' own GPU)."""

    def __post_init__(self) -> None:
        if self.unmeasured not in UNMEASURED_WAYS:
            raise UserInputError(f"unmeasured figures: {self.unmeasured!r} is not one of {', '.join(UNMEASURED_WAYS)}")
