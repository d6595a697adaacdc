"""Provides `compose_budget`: per-component decode-step time from measured times at the inventory's exact shapes.

    component ms = Σ over its ops (op count × time measured at the op's key)
    launch ms    = kernels per step × measured per-kernel cost (eager or graph, the deployment's launch mode)
    unexplained  = observed − Σ components

Where the exact key was not measured, the time comes, in order, from: the curve engine over every point measured on
this host (`decodetop.budget.curves`: interpolated between measured points, extrapolated beyond them with the
octaves it reached, or transferred from the measured shapes of the same kind and dtype; each labelled, each with
an 80 % range, `Segment.curve_label`); where the engine has nothing to anchor on, the roofline estimate (bytes /
bandwidth, collectives at the interconnect's latency) when `estimate` hardware is given (status "estimated", the
reason saying why no curve could); otherwise the op is **missing**: its segment says so, names the missing keys
and the command that measures them, and the budget's total and unexplained remainder are marked incomplete.
Missing data is never a silent 0. The budget carries the total's 80 % range (`decodetop.budget.uncertainty`), its
weakest label, the component that dominates the uncertainty, and the engine's self-check on this host's data.

The segments (`decodetop.budget.segment`) are built from the inventory's ops by `decodetop.budget.segment_costs`.

Every figure carries its provenance in words (`Segment.provenance`, `Budget.observed`, `Budget.hardware_text`):
measured (refined to "measured in this run" / "measured earlier: age, host, device" by the pipeline-level
`decodetop.pipeline.composition.compose`), a roofline estimate for named hardware and how it was chosen, or missing
with the reason. The observed step says whether it was observed at all (`ObservedStep`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from decodetop.budget.components import UNEXPLAINED_KEY, Component
from decodetop.budget.contention import Contention
from decodetop.budget.curves import CurveEngine, nominal_hardware
from decodetop.budget.inventory import StepInventory
from decodetop.budget.measured import Curve, MeasuredTime, engine_from_series
from decodetop.budget.ranks import RankSpread
from decodetop.budget.roofline import Hardware, Roofline
from decodetop.budget.segment import CURVE_STATUSES, STATUS_RANK, Segment, segments_range
from decodetop.budget.segment_costs import (
    LAUNCH_ESTIMATE_US,
    component_segment,
    estimate_text,
    launch_segment,
    with_shared_range,
)
from decodetop.budget.selfcheck import SelfCheck
from decodetop.budget.uncertainty import RANGE_METHOD
from decodetop.defaults import DEFAULT_OBSERVED_MS, DEFAULT_TARGET_TPS
from decodetop.errors import UserInputError
from decodetop.quantity import OBSERVED_MS, TARGET_TPS
from decodetop.textfmt import format_ms

STEP_PERCENTILE_Z = {"p50": 0.0, "p90": 1.2815515655446004, "p99": 2.3263478740408408}
"""Standard-normal quantiles (statistics.NormalDist().inv_cdf(0.5 / 0.9 / 0.99)) for the step's spread."""
FIGURE_STATISTICS = {
    "ms": "median per op instance × count (robust: noise bands and diffs use it)",
    "p10_ms/p90_ms": "Σ of the ops' p10 / p90 (the component's noise band)",
    "mean_ms": "mean per op instance × count (the median where no samples gave a mean)",
    "total_ms": "Σ segment medians",
    "mean_total_ms": "Σ segment means: the step throughput pays",
    "mean_tokens_per_s": "tokens per step / mean step",
    "step_percentiles_ms": "mean + z·σ of the step, σ² = Σ count × each op's sample variance (instances independent)",
    "ranks": "each rank's Σ of its own medians; step bound = slowest rank per all-reduce interval",
}
"""Which statistic each budget figure is (docs/architecture.md, "Budget statistics"); written into the JSON."""

OBSERVED_SOURCES = ("flag", "settings", "server", "trace", "default")
"""Where an observed step can come from, in the order the one rule takes them (`decodetop.pipeline.observed`)."""
_OBSERVED_WHERE = {
    "flag": "from",
    "settings": "from the settings file",
    "server": "by the server",
    "trace": "in the trace",
}


@dataclass(frozen=True)
class ObservedStep:
    """The observed decode step and where it came from: a flag, the settings file, a serving engine's /metrics, a
    profiler trace of the engine's steps, or the built-in default (then it is assumed, not observed, and every surface
    says so)."""

    ms: float
    source: str = "default"
    """flag, settings, server, trace or default."""
    detail: str = ""
    """flag: its name; server: 'URL, 30 s window, 4s ago'; trace: 'FILE, 8 decode steps (2.80–2.91 ms), written 3m
    ago'; default: why no observation (e.g. the server's error)."""

    def __post_init__(self) -> None:
        OBSERVED_MS.check(self.ms, "observed step")
        if self.source not in OBSERVED_SOURCES:
            raise UserInputError(f"observed step source {self.source!r} is not one of {', '.join(OBSERVED_SOURCES)}")

    @property
    def assumed(self) -> bool:
        """True when nothing was observed: the figure is the default."""
        return self.source == "default"

    @property
    def text(self) -> str:
        """One line: '95 ms assumed, not observed (the default; …)' or '12.3 ms observed (server …)'."""
        ms = format_ms(self.ms)
        if self.assumed:
            why = self.detail or "the default: no --observed-ms and no --server"
            return f"{ms} assumed, not observed ({why})"
        where = _OBSERVED_WHERE[self.source]
        return f"{ms} observed {where}{' ' + self.detail if self.detail else ''}".rstrip()

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {"ms": self.ms, "source": self.source, "detail": self.detail, "assumed": self.assumed, "text": self.text}


def default_observed(detail: str = "") -> ObservedStep:
    """The built-in observed step (`DEFAULT_OBSERVED_MS`), marked as assumed; `detail` says why nothing was observed."""
    return ObservedStep(DEFAULT_OBSERVED_MS, "default", detail)


def roofline_verdict(target_ms: float, roofline_ms: float | None) -> str:
    """The one sentence every surface prints when the target is out of reach of any kernel tuning ('' otherwise)."""
    if roofline_ms is None or target_ms >= roofline_ms:
        return ""
    return (
        f"the target is below this deployment's roofline ({format_ms(roofline_ms)}): no kernel tuning reaches it; it "
        "needs fewer bytes per GPU (more GPUs, lower precision, speculative decoding)"
    )


@dataclass(frozen=True)
class Budget:
    """A decode step's time split by component, against observed, target and roofline (all ms per step)."""

    model: str
    deployment: str
    segments: tuple[Segment, ...]
    """One per Component that has ops (+ launch), in Component order."""
    total_ms: float
    """Σ segment ms (known parts only)."""
    complete: bool
    """False when any segment is missing data: then total is a lower bound and unexplained an upper bound."""
    observed_ms: float
    target_tps: float
    target_ms: float
    """Step time that meets the target: tokens per step × 1000 / target tok/s."""
    roofline_ms: float | None
    unexplained_ms: float
    """observed − total."""
    tokens_per_step: float
    kernels: int
    launch_mode: str
    missing: tuple[str, ...] = field(default=())
    """Components with missing data."""
    observed: ObservedStep | None = None
    """Where `observed_ms` came from (None: a caller that did not say; treated as assumed)."""
    hardware_text: str = ""
    """What the roofline and the estimates are for: 'NVIDIA H200 (detected by NVML)', 'n/a on CPU', ''."""
    device_kind: str = ""
    """cuda or cpu: the ranks the measurements ran on ('' when nothing was measured)."""
    header: str = ""
    """A line every surface shows above the figures ('CPU ranks (gloo): timings show the method, not a GPU')."""
    scenario: str = ""
    """`Scenario.fingerprint_id` of what was composed ('' for a bare inventory)."""
    notes: tuple[str, ...] = ()
    """What the composition could not do and why (one line each)."""
    tp_source: str = ""
    """Where the deployment's TP came from, in words (`Scenario.tp_source`)."""
    warnings: tuple[str, ...] = ()
    """What makes the figures moot, first on every surface ('190 GB of weights per GPU do not fit in the 141 GiB of a
    NVIDIA H200 …'); set by `decodetop.probes.budgeting.compose_inventory`."""
    ranks: RankSpread | None = None
    """Every rank's own composed total, the spread, the step bound and the straggler (None: one rank, or the results
    carry no per-rank series); set by `decodetop.pipeline.composition.compose`."""
    range_p10_ms: float | None = None
    """The 80 % range of the total (`decodetop.budget.uncertainty.combine` over the segments' ranges)."""
    range_p90_ms: float | None = None
    weakest: str = ""
    """The weakest figure in the total: 'attention: extrapolated 2 octaves' ('' when every op was measured)."""
    dominant: str = ""
    """The component that dominates the total's uncertainty ('' when every figure is a point)."""
    self_check: SelfCheck | None = None
    """The curve engine's leave-one-out error per family on this host's data (None: no curve was used)."""
    contention: Contention | None = None
    """Other processes (or foreign load) on the probed GPUs during the measurements: the likely cause of their tails
    and layer errors (`decodetop.budget.contention`; None or empty: nothing else ran, or nothing was measured)."""

    @property
    def mean_total_ms(self) -> float:
        """Σ segment means (known parts only): the step time throughput pays (tok/s = tokens / mean step)."""
        return sum(m for s in self.segments if (m := s.mean) is not None)

    @property
    def mean_tokens_per_s(self) -> float | None:
        """tokens per step × 1000 / `mean_total_ms` (None when nothing is known)."""
        mean = self.mean_total_ms
        return self.tokens_per_step * 1000.0 / mean if mean > 0 else None

    @property
    def step_std_ms(self) -> float:
        """Standard deviation of the composed step: √Σ segment variances (ops' instances independent)."""
        return math.sqrt(math.fsum(s.std_ms**2 for s in self.segments))

    def step_percentiles(self) -> dict[str, float] | None:
        """p50/p90/p99 of the composed step from the samples' means and variances (the normal approximation of a
        sum of many independent instances: p = mean + z·σ); None when no segment had samples."""
        sigma = self.step_std_ms
        if sigma <= 0:
            return None
        mean = self.mean_total_ms
        return {name: mean + z * sigma for name, z in STEP_PERCENTILE_Z.items()}

    @property
    def observed_step(self) -> ObservedStep:
        """`observed`, or the observed figure marked as assumed when the caller did not say where it came from."""
        if self.observed is not None:
            return self.observed
        return ObservedStep(self.observed_ms, "default", "origin not given")

    @property
    def verdict(self) -> str:
        """`roofline_verdict` for this budget ('' when the target is within reach or there is no roofline)."""
        return roofline_verdict(self.target_ms, self.roofline_ms)

    @property
    def counts(self) -> dict[str, int]:
        """Segments per provenance kind (measured now/earlier, estimate, missing, …)."""
        out: dict[str, int] = {}
        for seg in self.segments:
            out[seg.provenance_kind] = out.get(seg.provenance_kind, 0) + 1
        return out

    def summary(self) -> str:
        """'5 of 7 components measured, 2 roofline estimates' — true by construction (counted from the segments):
        a segment estimated in part counts as an estimate, one with missing data as without a figure."""
        n = len(self.segments)
        measured = sum(1 for s in self.segments if s.status in ("measured", "interpolated"))
        estimated = sum(1 for s in self.segments if s.estimated)
        missing = sum(1 for s in self.segments if s.status == "missing")
        parts = [f"{measured} of {n} components measured"]
        for status in ("extrapolated", "transferred"):
            count = sum(1 for s in self.segments if s.status == status)
            if count:
                parts.append(f"{count} {status}")
        if estimated:
            parts.append(f"{estimated} roofline estimate{'s' if estimated != 1 else ''}")
        if missing:
            parts.append(f"{missing} without a figure")
        return ", ".join(parts)

    @property
    def unexplained(self) -> Segment:
        """The remainder as a segment (status follows completeness)."""
        reason = "observed − Σ components" + ("" if self.complete else " (upper bound: some components are missing)")
        worst = max((s.status for s in self.segments), key=STATUS_RANK.__getitem__, default="measured")
        return Segment(UNEXPLAINED_KEY, self.unexplained_ms, worst, reason)

    def segment(self, component: Component | str) -> Segment | None:
        """The segment of one component, or None."""
        key = component.value if isinstance(component, Component) else component
        for seg in self.segments:
            if seg.component == key:
                return seg
        return None

    def per_token_ms(self, step_ms: float) -> float:
        """A step time as ms per token of one sequence."""
        return step_ms / self.tokens_per_step

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "model": self.model,
            "deployment": self.deployment,
            "segments": [
                {
                    "component": s.component,
                    "label": s.label,
                    "ms": s.ms,
                    "p10_ms": s.p10_ms,
                    "p90_ms": s.p90_ms,
                    "status": s.status,
                    "reason": s.reason,
                    "n_ops": s.n_ops,
                    "missing_keys": list(s.missing_keys),
                    "sources": list(s.sources),
                    "probes": list(s.probes),
                    "provenance_kind": s.provenance_kind,
                    "provenance": s.provenance,
                    "mean_ms": s.mean,
                    "std_ms": s.std_ms,
                    "path": s.path,
                    "path_text": s.path_text,
                    "path_rule": s.path_rule,
                    "range_p10_ms": s.range_p10_ms,
                    "range_p90_ms": s.range_p90_ms,
                    "curve_label": s.curve_label,
                    "kernels": [k.to_dict() for k in s.kernels],
                    "kernel_text": s.kernel_text,
                    "torch_ms": s.torch_ms,
                }
                for s in self.segments
            ],
            "total_ms": self.total_ms,
            "complete": self.complete,
            "missing": list(self.missing),
            "observed_ms": self.observed_ms,
            "target_tps": self.target_tps,
            "target_ms": self.target_ms,
            "roofline_ms": self.roofline_ms,
            "unexplained_ms": self.unexplained_ms,
            "tokens_per_step": self.tokens_per_step,
            "kernels": self.kernels,
            "launch_mode": self.launch_mode,
            "observed": self.observed_step.to_dict(),
            "hardware": self.hardware_text,
            "device_kind": self.device_kind,
            "header": self.header,
            "warnings": list(self.warnings),
            "scenario": self.scenario,
            "tp_source": self.tp_source,
            "verdict": self.verdict,
            "summary": self.summary(),
            "notes": list(self.notes),
            "mean_total_ms": self.mean_total_ms,
            "mean_tokens_per_s": self.mean_tokens_per_s,
            "step_percentiles_ms": self.step_percentiles(),
            "statistics": dict(FIGURE_STATISTICS),
            "ranks": self.ranks.to_dict() if self.ranks is not None else None,
            "range_ms": [self.range_p10_ms, self.range_p90_ms] if self.range_p10_ms is not None else None,
            "range_method": RANGE_METHOD,
            "weakest": self.weakest,
            "dominant_uncertainty": self.dominant,
            "self_check": self.self_check.to_dict() if self.self_check is not None else None,
            "contention": self.contention.to_dict() if self.contention else None,
        }


def _checked_inputs(mode: str, observed_ms: float, target_tps: float) -> str:
    """The launch mode, after checking it and the observed step and target (one-line UserInputError)."""
    if mode not in LAUNCH_ESTIMATE_US:
        raise UserInputError(f"launch mode {mode!r} is not graph or eager")
    OBSERVED_MS.check(observed_ms, "observed_ms")
    TARGET_TPS.check(target_tps, "target_tps")
    return mode


def _hardware_name(hw: Hardware | None) -> str:
    """The GPU the estimates and the roofline are for, or '' when there is none."""
    return hw.gpu_name if hw is not None else ""


def compose_budget(
    inventory: StepInventory,
    measured: Mapping[str, MeasuredTime] | None = None,
    *,
    curves: CurveEngine | None = None,
    allreduce_curves: Mapping[str, Curve] | None = None,
    gemm_curves: Mapping[str, Curve] | None = None,
    launch_mode: str | None = None,
    observed_ms: float = DEFAULT_OBSERVED_MS,
    target_tps: float = DEFAULT_TARGET_TPS,
    roofline: Roofline | None = None,
    estimate: Hardware | None = None,
    observed: ObservedStep | None = None,
    hardware_text: str | None = None,
    device_kind: str = "",
    header: str = "",
    scenario: str = "",
    notes: tuple[str, ...] = (),
    self_check: bool = True,
) -> Budget:
    """Compose a budget for `inventory`.

    measured: key id → MeasuredTime of one instance. curves: the curve engine over every point measured on this
    host (None: one is built from `measured` and the two series below, against `estimate`'s or the roofline's
    hardware, else nominal rates). allreduce_curves: collective kind ("all_reduce", "all_gather") → Curve of time
    vs bytes; gemm_curves: `GemmKey.curve_id` → Curve of time vs M (series measured beside the keys).
    launch_mode: "graph" or "eager" (default: the deployment's). estimate: hardware to estimate ops no curve can
    anchor (roofline-only budget when `measured` is empty); None leaves them missing. observed: the observed step
    with its origin (overrides `observed_ms`). hardware_text: what the estimates and the roofline are for, in words
    (default: the estimate's or roofline's GPU name). device_kind, header, scenario, notes: carried to the Budget for
    every surface to show. self_check: run (or reuse) the engine's leave-one-out self-check and carry it.
    """
    if observed is not None:
        observed_ms = observed.ms
    measured = measured or {}
    mode = _checked_inputs(launch_mode or inventory.deployment.launch_mode, observed_ms, target_tps)
    if curves is None:
        hw = estimate or (roofline.hardware if roofline is not None else None) or nominal_hardware()
        curves = engine_from_series(inventory, measured, allreduce_curves or {}, gemm_curves or {}, hw)
    hw_text = hardware_text
    if hw_text is None:
        hw_text = _hardware_name(estimate or (roofline.hardware if roofline is not None else None))
    segments = _segments(inventory, measured, curves, estimate, mode, hw_text or "the assumed GPU")
    reused = any(op.key.key_id not in measured for op in inventory.ops if not op.is_collective)
    segments = [with_shared_range(seg, cross=curves.target is not None, drift=reused) for seg in segments]
    missing_components = [seg.component for seg in segments if seg.status == "missing"]
    total = sum(s.ms for s in segments if s.ms is not None)
    tokens = inventory.tokens_per_step
    predicted = any(s.status in CURVE_STATUSES for s in segments)
    return Budget(
        model=inventory.spec.name,
        deployment=inventory.deployment.describe(inventory.spec),
        segments=tuple(segments),
        total_ms=total,
        complete=not missing_components,
        observed_ms=observed_ms,
        target_tps=target_tps,
        target_ms=tokens * 1000.0 / target_tps,
        roofline_ms=roofline.step_ms if roofline is not None else None,
        unexplained_ms=observed_ms - total,
        tokens_per_step=tokens,
        kernels=inventory.kernels,
        launch_mode=mode,
        missing=tuple(missing_components),
        observed=observed,
        hardware_text=hw_text,
        device_kind=device_kind,
        header=header,
        scenario=scenario,
        notes=tuple(notes),
        self_check=curves.self_check() if self_check and predicted else None,
        **_uncertainty(segments),
    )


def _segments(  # noqa: PLR0917 - private; the composition's lookup context
    inventory: StepInventory,
    measured: Mapping[str, MeasuredTime],
    curves: CurveEngine,
    estimate: Hardware | None,
    mode: str,
    hw_text: str,
) -> list[Segment]:
    """One segment per component, then the launch's; estimates say which hardware they are for."""
    tp = inventory.deployment.tp
    segments = [
        component_segment(comp.value, ops, measured, curves, estimate, tp)
        for comp, ops in inventory.by_component().items()
    ]
    segments.append(launch_segment(mode, inventory.kernels, measured, estimate))
    return [
        replace(seg, provenance=estimate_text(seg, hw_text)) if seg.provenance_kind == "estimate" else seg
        for seg in segments
    ]


def _uncertainty(segments: Sequence[Segment]) -> dict[str, Any]:
    """The total's 80 % range, its weakest figure and the component dominating its uncertainty (Budget fields)."""
    parts = [s for s in segments if s.ms is not None]
    if not parts:
        return {}
    total = segments_range(parts)
    worst = max(segments, key=lambda s: (STATUS_RANK[s.status], s.ms or 0.0))
    weakest = ""
    if worst.status != "measured":
        weakest = f"{worst.label}: {worst.curve_label or worst.status}"
    return {
        "range_p10_ms": total.p10_ms,
        "range_p90_ms": total.p90_ms,
        "weakest": weakest,
        "dominant": Component(total.dominant).label if total.dominant else "",
    }
