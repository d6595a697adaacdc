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
from decodetop.budget.curves import CROSS_GPU_SIGMA, RUN_TO_RUN_SIGMA, CurveEngine, Prediction, nominal_hardware
from decodetop.budget.inventory import Op, StepInventory
from decodetop.budget.kernels import KernelClass, kernels_text
from decodetop.budget.keys import AllreduceKey, LaunchKey
from decodetop.budget.measured import Curve, MeasuredTime, engine_from_series
from decodetop.budget.ranks import RankSpread
from decodetop.budget.roofline import Hardware, Roofline, collective_time_us
from decodetop.budget.selfcheck import Z80, SelfCheck
from decodetop.budget.uncertainty import RANGE_METHOD, Combined, Part, combine
from decodetop.defaults import DEFAULT_OBSERVED_MS, DEFAULT_TARGET_TPS
from decodetop.errors import UserInputError
from decodetop.quantity import OBSERVED_MS, TARGET_TPS
from decodetop.textfmt import format_ms

LAUNCH_ESTIMATE_US = {"graph": 0.6, "eager": 5.0}
"""Per-kernel cost when unmeasured: a CUDA-graph node ~0.6 µs (docs/benchmarks.md, "Launch": 0.70 µs per node
measured on an H200), an eager PyTorch op ~5 µs (the same section: 6.6–7.1 µs host time per empty-kernel launch)."""

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

STATUSES = ("measured", "interpolated", "extrapolated", "transferred", "estimated", "missing")
"""A segment's status, best first: measured at its exact keys, from the curve engine (interpolated, extrapolated,
transferred), a roofline estimate, or no figure."""
CURVE_STATUSES = ("interpolated", "extrapolated", "transferred")
_RANK = {s: i for i, s in enumerate(STATUSES)}
PROVENANCE_KINDS = ("measured_now", "measured_earlier", "measured", "estimate", "not_applicable", "missing")
"""Where a segment's figure came from: measured in this run, measured earlier (read back from the history),
measured (origin not refined: a budget composed from bare key times), a roofline estimate, not applicable here, or
no figure at all."""
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
class Segment:
    """One component's share of the step."""

    component: str
    """A `Component` value, or "unexplained"."""
    ms: float | None
    """Sum of what is known; None when nothing is. With status "missing" it is a lower bound."""
    status: str
    """measured | interpolated | estimated | missing (the worst status among its ops)."""
    reason: str
    n_ops: int = 0
    p10_ms: float | None = None
    p90_ms: float | None = None
    missing_keys: tuple[str, ...] = ()
    sources: tuple[str, ...] = ()
    probes: tuple[str, ...] = ()
    """The probes whose measurements the figure uses (for where and when they were taken)."""
    provenance_kind: str = "missing"
    """One of PROVENANCE_KINDS."""
    provenance: str = ""
    """Where the figure came from, in words ("measured in this run", "roofline estimate for NVIDIA H200 (detected
    by NVML)", "measured 3h ago on gpu-host-1 (2 × NVIDIA H200)")."""
    mean_ms: float | None = None
    """Σ count × each op's mean (the median where an op's mean is not known); None with `ms`."""
    std_ms: float = 0.0
    """Standard deviation of the component's step time, the ops' instances taken as independent (0: no samples)."""
    path: str = ""
    """The kernel path the figure assumes, short enough for a label ('custom one-shot', 'NCCL'; '' where there is
    no choice): for the all-reduce, the path of the step's own message sizes (`decodetop.budget.engine_paths`)."""
    path_text: str = ""
    """That path in words with why ('custom one-shot ≤ 4 MiB, NCCL above (vLLM at TP 2 over NVLink: …)')."""
    path_rule: str = ""
    """What chose the path: the engine rule's source (a public URL) or the flag ('--allreduce nccl'); '' where the
    figure is simply what was measured."""
    range_p10_ms: float | None = None
    """The 80 % range of the figure (`decodetop.budget.uncertainty`): the repeat spread where every op was measured,
    wider where the curve engine predicted an op (None with `ms`)."""
    range_p90_ms: float | None = None
    shared_sigma_log: float = 0.0
    """The part of its range (σ in log space) every figure carried to another GPU model shares (one GPU-to-GPU ratio
    for all of them): the total's range keeps it whole instead of averaging it away over the components."""
    curve_label: str = ""
    """The weakest label among its ops ('interpolated', 'extrapolated 2 octaves', 'transferred from gemm:…');
    '' where every op was measured."""
    kernels: tuple[KernelClass, ...] = ()
    """The classes of kernel the measured figures came from, distinct, in op order (empty: not said)."""
    torch_ms: float | None = None
    """What the segment would take where its ops ran as torch ops (Σ count × each op's torch-form time, its own
    time where it has none); None when no op's torch form was timed beside a faster kernel."""

    @property
    def kernel_text(self) -> str:
        """The kernel classes in words, '; '-joined, with "torch ops would take X ms" where that was timed."""
        text = kernels_text(self.kernels)
        if self.torch_ms is not None:
            text += ("; " if text else "") + f"torch ops would take {self.torch_ms:.3g} ms"
        return text

    @property
    def mean(self) -> float | None:
        """`mean_ms`, or `ms` where the mean was not composed."""
        return self.ms if self.mean_ms is None else self.mean_ms

    @property
    def estimated(self) -> bool:
        """True when any part of the figure is a roofline estimate rather than a measurement."""
        return self.status == "estimated"

    @property
    def label(self) -> str:
        """Human title."""
        if self.component == UNEXPLAINED_KEY:
            return "unexplained"
        return Component(self.component).label


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
        worst = max((s.status for s in self.segments), key=_RANK.__getitem__, default="measured")
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


@dataclass(frozen=True)
class _OpTime:
    ms: float
    p10: float
    p90: float
    status: str
    source: str
    probe: str = ""
    mean: float | None = None
    std: float = 0.0
    low: float | None = None
    """The 80 % range (None: the repeat spread p10–p90)."""
    high: float | None = None
    label: str = ""
    octaves: float = 0.0
    kernel: KernelClass | None = None
    torch_ms: float | None = None
    """The op's torch-form time where it was timed beside a faster kernel."""


def _torch_alternative(found: MeasuredTime) -> float | None:
    """The median of the torch form among a measured time's alternatives (None: not timed)."""
    return next((a.median_ms for a in found.alternatives if a.kernel.kind in ("torch", "cpu")), None)


def _estimate(op: Op, hw: Hardware, tp: int) -> float:
    """Roofline time of one op instance in ms."""
    if op.is_collective and isinstance(op.key, AllreduceKey):
        return collective_time_us(op.kind, op.key.bytes, tp, hw) / 1e3
    mem = (op.read_bytes + op.write_bytes) / (hw.mem_bandwidth_gbps * 1e9) * 1e3
    if hw.bf16_dense_tflops:
        return max(mem, op.flops / (hw.bf16_dense_tflops * 1e12) * 1e3)
    return mem


def _op_time(
    op: Op, measured: Mapping[str, MeasuredTime], engine: CurveEngine | None, estimate: Hardware | None, tp: int
) -> _OpTime | str:
    """One op instance's time: measured at its key, else the curve engine's prediction, else the roofline estimate
    (with why no curve could), else why there is no figure (the refusal's text)."""
    found = measured.get(op.key.key_id)
    if found is not None:
        return _OpTime(
            found.median_ms, found.p10_ms, found.p90_ms, "measured", found.source, op.key.probe, found.mean,
            found.std_ms or 0.0, kernel=found.kernel, torch_ms=_torch_alternative(found),
        )  # fmt: skip
    why = f"no curve engine: {op.key.key_id} not measured"
    if engine is not None:
        got = engine.predict(op.key)
        if isinstance(got, Prediction):
            spread = math.exp(Z80 * got.spread_sigma)
            return _OpTime(
                got.ms, got.ms / spread, got.ms * spread, got.status, got.source, op.key.probe, low=got.p10_ms,
                high=got.p90_ms, label="" if got.status == "measured" else got.label, octaves=got.octaves,
            )  # fmt: skip
        why = got.text
    if estimate is not None:
        ms = _estimate(op, estimate, tp)
        return _OpTime(ms, ms, ms, "estimated", "roofline", label=why)
    return why


def _launch_time(
    mode: str, kernels: int, measured: Mapping[str, MeasuredTime], estimate: Hardware | None
) -> tuple[Segment, float | None]:
    key = LaunchKey(mode, kernels)
    found = measured.get(key.key_id)
    if found is None:
        prefix = f"launch:mode={mode},"
        found = next((v for k, v in sorted(measured.items()) if k.startswith(prefix)), None)
    comp = Component.LAUNCH.value
    if found is not None:
        ms = kernels * found.median_ms
        mean = kernels * found.mean
        std = math.sqrt(kernels) * (found.std_ms or 0.0)
        reason = f"{kernels} kernels × {found.median_ms * 1e3:.3g} µs per kernel ({mode}, measured)"
        seg = Segment(
            comp,
            ms,
            "measured",
            reason,
            1,
            kernels * found.p10_ms,
            kernels * found.p90_ms,
            (),
            (found.source,),
            ("launch",),
            "measured",
            "measured",
            mean,
            std,
        )
        return seg, ms
    if estimate is not None:
        per = LAUNCH_ESTIMATE_US[mode] / 1e3
        ms = kernels * per
        reason = f"{kernels} kernels × {LAUNCH_ESTIMATE_US[mode]:g} µs per kernel ({mode}, typical)"
        seg = Segment(comp, ms, "estimated", reason, 1, ms, ms, (), ("typical",), (), "estimate", "")
        return seg, ms
    reason = f"{kernels} kernels; per-kernel {mode} launch cost not measured ({key.key_id})"
    seg = Segment(
        comp, None, "missing", reason, 1, None, None, (key.key_id,), (), (), "missing", "no figure: " + reason
    )
    return seg, None


def _estimate_text(seg: Segment, hardware: str) -> str:
    """'roofline estimate for NVIDIA H200 (detected by NVML)', with the reason where only part is estimated."""
    if seg.reason.startswith("roofline estimate ("):
        return f"roofline estimate for {hardware}"
    return f"estimate for {hardware}: {seg.reason}"


def _segment_reason(worst: str, counts: Mapping[str, int], missing: Sequence[str], n_ops: int) -> str:
    """Why a segment has the status it has, in words ("all 12 ops measured", "roofline estimate (3 ops)", …);
    `missing`: the refusals of the ops without a figure."""
    summary = ", ".join(f"{n} {s}" for s, n in counts.items() if n)
    if worst == "missing":
        reason = f"{len(missing)} measurement(s) missing ({summary} ops): " + "; ".join(missing[:3])
        return reason + (f"; … {len(missing) - 3} more" if len(missing) > 3 else "")
    if worst == "estimated" and counts["estimated"] == n_ops:
        return f"roofline estimate ({n_ops} ops)"
    if worst == "estimated":
        return f"roofline estimate for {counts['estimated']} of {n_ops} ops ({summary})"
    if worst == "interpolated":
        return f"{counts['interpolated']} of {n_ops} ops interpolated on a measured curve ({summary})"
    if worst in CURVE_STATUSES:
        return f"{n_ops - counts['measured']} of {n_ops} ops predicted from this host's curves ({summary})"
    return f"all {n_ops} ops measured"


@dataclass
class _SegmentSum:
    """A component's ops summed as they are composed."""

    ms: float = 0.0
    p10: float = 0.0
    p90: float = 0.0
    mean: float = 0.0
    var: float = 0.0
    low: float = 0.0
    high: float = 0.0
    known: int = 0
    worst: str = "measured"
    label: tuple[int, float, float, str] = (0, 0.0, 0.0, "")
    """(status rank, octaves, share of the time, label) of the weakest predicted op."""
    missing_keys: list[str] = field(default_factory=list)
    refusals: list[str] = field(default_factory=list)
    kernels: list[KernelClass] = field(default_factory=list)
    torch_ms: float = 0.0
    any_torch: bool = False
    sources: list[str] = field(default_factory=list)
    probes: list[str] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(STATUSES, 0))

    def add(self, op: Op, t: _OpTime) -> None:
        self.known += 1
        self.counts[t.status] += 1
        self.ms += op.count * t.ms
        self.mean += op.count * (t.ms if t.mean is None else t.mean)
        self.var += op.count * t.std**2
        self.p10 += op.count * t.p10
        self.p90 += op.count * t.p90
        self.low += op.count * (t.p10 if t.low is None else t.low)
        self.high += op.count * (t.p90 if t.high is None else t.high)
        if t.source not in self.sources:
            self.sources.append(t.source)
        if t.probe and t.probe not in self.probes:
            self.probes.append(t.probe)
        if t.kernel is not None and t.kernel not in self.kernels:
            self.kernels.append(t.kernel)
        self.any_torch = self.any_torch or t.torch_ms is not None
        self.torch_ms += op.count * (t.ms if t.torch_ms is None else t.torch_ms)
        if _RANK[t.status] > _RANK[self.worst]:
            self.worst = t.status
        weakness = (_RANK[t.status], t.octaves, op.count * t.ms, t.label)
        if t.label and t.status in CURVE_STATUSES and weakness > self.label:
            self.label = weakness

    def lack(self, op: Op, why: str) -> None:
        if op.key.key_id not in self.missing_keys:
            self.missing_keys.append(op.key.key_id)
            self.refusals.append(why)
        self.counts["missing"] += 1
        self.worst = "missing"


def _component_segment(  # noqa: PLR0917 - private; the composition's lookup context
    component: str, ops: Sequence[Op], measured: Mapping[str, MeasuredTime], engine: CurveEngine | None,
    estimate: Hardware | None, tp: int,
) -> Segment:  # fmt: skip
    """One component's segment: Σ count × each op's time (median, spread, mean, variance, 80 % range), the worst
    status among its ops, the weakest label, and where the times came from."""
    acc = _SegmentSum()
    estimated_why = ""
    for op in ops:
        t = _op_time(op, measured, engine, estimate, tp)
        if isinstance(t, str):
            acc.lack(op, t)
            continue
        acc.add(op, t)
        if t.status == "estimated" and not estimated_why:
            estimated_why = t.label
    reason = _segment_reason(acc.worst, acc.counts, acc.refusals, len(ops))
    if acc.worst == "missing":
        kind, prov = "missing", "no figure: " + reason
    elif acc.worst == "estimated":
        kind, prov = "estimate", reason + (f" ({estimated_why})" if estimated_why.startswith("cannot") else "")
    else:
        kind, prov = "measured", "measured"
    known = acc.known > 0
    return Segment(
        component, acc.ms if known else None, acc.worst, reason, len(ops), acc.p10 if known else None,
        acc.p90 if known else None, tuple(acc.missing_keys), tuple(acc.sources), tuple(acc.probes), kind, prov,
        acc.mean if known else None, math.sqrt(acc.var), range_p10_ms=acc.low if known else None,
        range_p90_ms=acc.high if known else None, curve_label=acc.label[3], kernels=tuple(acc.kernels),
        torch_ms=acc.torch_ms if acc.any_torch and known else None,
    )  # fmt: skip


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
    segments = [_shared(seg, cross=curves.target is not None, drift=reused) for seg in segments]
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
        _component_segment(comp.value, ops, measured, curves, estimate, tp)
        for comp, ops in inventory.by_component().items()
    ]
    segments.append(_launch_time(mode, inventory.kernels, measured, estimate)[0])
    return [
        replace(seg, provenance=_estimate_text(seg, hw_text)) if seg.provenance_kind == "estimate" else seg
        for seg in segments
    ]


def _shared(seg: Segment, *, cross: bool, drift: bool) -> Segment:
    """`seg` with the share of its range every figure of the budget has in common: another GPU model's ratio
    (`CROSS_GPU_SIGMA`, transferred figures) and, where the budget is for another scenario than the one measured
    (some op's key not measured in the results), the drift between that run and the scenario's own
    (`RUN_TO_RUN_SIGMA`: one GPU's clocks and placement move every kernel of a run together). An exactly measured
    segment's repeat spread is widened by the drift; a predicted one carries it already (the curve engine's)."""
    if seg.ms is None or seg.status in ("estimated", "missing"):
        return seg
    shared = math.hypot(CROSS_GPU_SIGMA if cross and seg.status == "transferred" else 0.0,
                        RUN_TO_RUN_SIGMA if drift else 0.0)  # fmt: skip
    if shared == 0.0:
        return seg
    if not drift or seg.status != "measured" or seg.range_p10_ms is None or seg.range_p90_ms is None:
        return replace(seg, shared_sigma_log=shared)
    lo, hi = seg.range_p10_ms, seg.range_p90_ms
    own = math.log(hi / lo) / (2 * Z80) if 0 < lo < hi else 0.0
    widen = math.exp(Z80 * (math.hypot(own, RUN_TO_RUN_SIGMA) - own))
    return replace(seg, range_p10_ms=lo / widen, range_p90_ms=hi * widen, shared_sigma_log=shared)


def segments_range(segments: Sequence[Segment]) -> Combined:
    """The 80 % range of the sum of `segments` (their own ranges, else their figures; missing ones left out):
    `decodetop.budget.uncertainty.combine`. The budget's total range is that of all its segments."""
    return combine(
        [
            Part(s.component, s.ms, s.range_p10_ms if s.range_p10_ms is not None else s.ms,
                 s.range_p90_ms if s.range_p90_ms is not None else s.ms, s.shared_sigma_log)
            for s in segments
            if s.ms is not None
        ]
    )  # fmt: skip


def _uncertainty(segments: Sequence[Segment]) -> dict[str, Any]:
    """The total's 80 % range, its weakest figure and the component dominating its uncertainty (Budget fields)."""
    parts = [s for s in segments if s.ms is not None]
    if not parts:
        return {}
    total = segments_range(parts)
    worst = max(segments, key=lambda s: (_RANK[s.status], s.ms or 0.0))
    weakest = ""
    if worst.status != "measured":
        weakest = f"{worst.label}: {worst.curve_label or worst.status}"
    return {
        "range_p10_ms": total.p10_ms,
        "range_p90_ms": total.p90_ms,
        "weakest": weakest,
        "dominant": Component(total.dominant).label if total.dominant else "",
    }
