"""Builds a budget's segments from an inventory's ops: each op's time measured at its exact key, else predicted by
the curve engine (interpolated, extrapolated, transferred; each labelled, each with an 80 % range), else the roofline
estimate where hardware is given (with why no curve could), else missing (with the refusal's text and the command
that measures it); summed per component with its spread, its weakest label and the kernel classes its figures came
from. The launch's segment is kernels × the measured per-kernel cost. `decodetop.budget.compose` stacks the segments.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from decodetop.budget.components import Component
from decodetop.budget.curves import CROSS_GPU_SIGMA, RUN_TO_RUN_SIGMA, CurveEngine, Prediction
from decodetop.budget.inventory import Op
from decodetop.budget.kernels import KernelClass
from decodetop.budget.keys import AllreduceKey, LaunchKey
from decodetop.budget.measured import MeasuredTime
from decodetop.budget.roofline import Hardware, collective_time_us
from decodetop.budget.segment import CURVE_STATUSES, STATUS_RANK, STATUSES, Segment
from decodetop.budget.selfcheck import Z80

LAUNCH_ESTIMATE_US = {"graph": 0.6, "eager": 5.0}
"""Per-kernel cost when unmeasured: a CUDA-graph node ~0.6 µs (docs/benchmarks.md, "Launch": 0.70 µs per node
measured on an H200), an eager PyTorch op ~5 µs (the same section: 6.6–7.1 µs host time per empty-kernel launch)."""


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


def launch_segment(mode: str, kernels: int, measured: Mapping[str, MeasuredTime], estimate: Hardware | None) -> Segment:
    """The launch's segment: kernels × the measured per-kernel cost of the launch mode (the exact key, else the
    mode's measured one), else the typical cost where hardware is given, else missing."""
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
        return Segment(
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
            range_p10_ms=kernels * found.p10_ms,
            range_p90_ms=kernels * found.p90_ms,
        )
    if estimate is not None:
        per = LAUNCH_ESTIMATE_US[mode] / 1e3
        ms = kernels * per
        reason = f"{kernels} kernels × {LAUNCH_ESTIMATE_US[mode]:g} µs per kernel ({mode}, typical)"
        return Segment(comp, ms, "estimated", reason, 1, ms, ms, (), ("typical",), (), "estimate", "")
    reason = f"{kernels} kernels; per-kernel {mode} launch cost not measured ({key.key_id})"
    return Segment(
        comp, None, "missing", reason, 1, None, None, (key.key_id,), (), (), "missing", "no figure: " + reason
    )


def estimate_text(seg: Segment, hardware: str) -> str:
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
        if STATUS_RANK[t.status] > STATUS_RANK[self.worst]:
            self.worst = t.status
        weakness = (STATUS_RANK[t.status], t.octaves, op.count * t.ms, t.label)
        if t.label and t.status in CURVE_STATUSES and weakness > self.label:
            self.label = weakness

    def lack(self, op: Op, why: str) -> None:
        if op.key.key_id not in self.missing_keys:
            self.missing_keys.append(op.key.key_id)
            self.refusals.append(why)
        self.counts["missing"] += 1
        self.worst = "missing"


def component_segment(  # noqa: PLR0917 - the composition's lookup context
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


LAUNCH_RUN_TO_RUN_SIGMA = math.log(1.6) / Z80
"""What the per-node cost of a CUDA graph's replay may drift by between runs (80 % within ×1.6): it follows the SM
clock, which the work just before moves. On one H200 the replay of 512 empty nodes cost 0.52 µs a node at 1980 MHz
after 2 s idle and 0.62–0.64 µs at 1290–1485 MHz right after 0.3 s of BF16 matmuls; a plan's launch probe read
0.70 µs a node first in a plan and 0.91–1.10 µs in plans right after another plan's GEMMs, 1.27–1.64× over 37 pairs
(docs/benchmarks.md, "Launch cost between runs"). `RUN_TO_RUN_SIGMA` (3 %) holds for the kernels, not for it."""


def with_shared_range(seg: Segment, *, cross: bool, drift: bool) -> Segment:
    """`seg` with the share of its range every figure of the budget has in common: another GPU model's ratio
    (`CROSS_GPU_SIGMA`, transferred figures) and, where the budget is for another scenario than the one measured
    (some op's key not measured in the results), the drift between that run and the scenario's own
    (`RUN_TO_RUN_SIGMA`: one GPU's clocks and placement move every kernel of a run together). An exactly measured
    segment's repeat spread is widened by the drift (the launch's by `LAUNCH_RUN_TO_RUN_SIGMA`, its own: the clock
    moves a graph's per-node cost far more than a kernel's); a predicted one carries it already (the curve engine's)."""
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
    run_to_run = LAUNCH_RUN_TO_RUN_SIGMA if seg.component == Component.LAUNCH.value else RUN_TO_RUN_SIGMA
    widen = math.exp(Z80 * (math.hypot(own, run_to_run) - own))
    return replace(seg, range_p10_ms=lo / widen, range_p90_ms=hi * widen, shared_sigma_log=shared)
