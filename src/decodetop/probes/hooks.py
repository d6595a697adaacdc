"""Provides what a probe's spec hooks see and give back (stdlib only, no torch): the plan side (`PlanContext` in,
`Planned` out: the probe's `ProbeRequest` for a model's plan) and the reading side (`MeasuredSetBuilder`: budget
inputs accumulated from results, built into a `MeasuredSet`).

`decodetop.probes.plan_hooks.plan_requests` calls every registered probe's `plan` hook and
`measured_from_results` every result's probe's `read` hook; neither names a probe. Most component probes use the
two generic hooks here: `plan_keys` (run the probe on the plan's keys of that probe) and `read_keyed_points`
(every point with `role` "budget" and a `key` param gives that key's time, the slowest rank's median, the fastest
variant winning).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from decodetop.budget.curve_points import FAMILIES, CurvePoint
from decodetop.budget.curves import CurveEngine, nominal_hardware
from decodetop.budget.engine_paths import EngineCurve
from decodetop.budget.gqa_launch import GqaLaunchFacts
from decodetop.budget.inventory import StepInventory
from decodetop.budget.kernels import KernelClass
from decodetop.budget.keys import LaunchKey, MeasurementKeyError, ProbeKey, parse_key_id
from decodetop.budget.measured import Curve, KernelTime, MeasuredTime
from decodetop.budget.plan import CurvePlan, ProbePlan
from decodetop.budget.roofline import Hardware
from decodetop.probes.results import Measurement, MeasurementStatus, ProbeResult


@dataclass(frozen=True)
class ProbeRequest:
    """One probe run of a plan: its parameters, and the plan keys it measures."""

    probe: str
    params: Mapping[str, Any]
    """Parameters as the probe's spec takes them (JSON values; checked by `ProbeSpec.resolve_params`)."""
    keys: tuple[str, ...]


@dataclass(frozen=True)
class PlanContext:
    """What a `plan` hook plans for: a model's plan on a group of `world_size` ranks of `device_kind`."""

    probe: str
    """The probe being planned (the hook's own spec's name)."""
    plan: ProbePlan
    inventory: StepInventory
    world_size: int
    device_kind: str
    """cuda or cpu."""
    sweeps: bool = True
    """Charts' sweeps wanted (GEMM over M, context sweeps); off: only the budget's own points."""
    launch_mode: str = "graph"
    only: tuple[str, ...] = ()
    """The probes the user asked for (empty: all)."""
    curves: CurvePlan = field(default_factory=CurvePlan)
    """The extra points the curve engine needs for what-ifs (other TP shards, batches, contexts, KV dtypes, EP
    degrees, token counts); empty unless sweeps are wanted (`decodetop.budget.plan.build_curve_plan`)."""

    @property
    def cuda(self) -> bool:
        return self.device_kind == "cuda"

    def key_ids(self, probe: str | None = None) -> tuple[str, ...]:
        """The plan's key ids of `probe` (this hook's probe by default)."""
        return tuple(k.key_id for k in self.plan.by_probe(probe or self.probe))

    def curve_key_ids(self, probe: str | None = None) -> tuple[str, ...]:
        """The curve plan's extra key ids of `probe` that the plan does not already hold."""
        own = set(self.key_ids(probe))
        return tuple(k.key_id for k in self.curves.by_probe(probe or self.probe) if k.key_id not in own)

    @property
    def group_fits_collectives(self) -> bool:
        """The group has exactly the plan's TP ranks (> 1): collectives at the plan's sizes can be measured."""
        tp = self.plan.allreduce_ranks
        return tp > 1 and self.world_size == tp


@dataclass(frozen=True)
class Planned:
    """A `plan` hook's answer: the probe's run (None: nothing to run) and notes on what cannot be measured."""

    request: ProbeRequest | None = None
    notes: tuple[str, ...] = ()


def plan_keys(ctx: PlanContext) -> Planned:
    """The generic plan hook: run the probe on the plan's keys of that probe and the curve plan's extra keys
    (nothing when the plan has none)."""
    ids = ctx.key_ids()
    extra = ctx.curve_key_ids()
    return Planned(ProbeRequest(ctx.probe, {"keys": [*ids, *extra]}, ids) if ids else None)


@dataclass(frozen=True)
class LayerComposition:
    """The `layer` probe's verdict for one layer kind: Σ parts against the whole layer."""

    layer: str
    """dense or moe."""
    mode: str
    """graph (GPUs) or eager (CPU ranks)."""
    sum_parts_us: float
    layer_us: float
    error_pct: float
    eager_us: float | None = None
    note: str = ""


@dataclass(frozen=True)
class MeasuredSet:
    """Budget inputs read from probe results."""

    times: Mapping[str, MeasuredTime]
    gemm_curves: Mapping[str, Curve]
    allreduce_curves: Mapping[str, Curve]
    layers: tuple[LayerComposition, ...] = ()
    copy_gbps: float | None = None
    peak_tflops: float | None = None
    notes: tuple[str, ...] = ()
    allreduce_paths: Mapping[str, EngineCurve] = field(default_factory=dict)
    """Per all-reduce curve, the path the engine rule took at each size and why (absent: NCCL as measured)."""
    curve_points: tuple[CurvePoint, ...] = ()
    """Every measured point the curve engine can use (`decodetop.budget.curves.CurveEngine`): each key's time,
    the sweeps' points and the all-reduce at every size, rank count and implementation."""

    def engine(
        self,
        hardware: Hardware | None,
        *,
        measure_hint: str = "",
        exact_only: bool = False,
        checked: bool = True,
        target: Hardware | None = None,
    ) -> CurveEngine:
        """The curve engine over these points. Efficiencies are taken against `hardware` (a GPU's roofline, its
        matrix peak the measured one where the gemm probe measured it), or, on CPU ranks (None), against the
        measured copy bandwidth and matrix peak (ratios only). `exact_only`: answer exact points only; `checked`:
        run the self-check; `target`: another GPU model to carry the figures to."""
        if hardware is None:
            hw = nominal_hardware(self.copy_gbps, self.peak_tflops)
        elif self.peak_tflops:
            hw = dataclasses.replace(hardware, bf16_dense_tflops=self.peak_tflops)
        else:
            hw = hardware
        return CurveEngine(
            self.curve_points, hw, measure_hint=measure_hint, exact_only=exact_only, checked=checked, target=target
        )


@dataclass
class MeasuredSetBuilder:
    """Budget inputs being read from results, one `read` hook at a time; `build()` gives the `MeasuredSet`."""

    launch_mode: str = "graph"
    plan: ProbePlan | None = None
    allreduce_choice: str = "auto"
    """`--allreduce`: auto (what vLLM would run), nccl or custom (decodetop.budget.engine_paths)."""
    times: dict[str, MeasuredTime] = field(default_factory=dict)
    gemm_points: dict[str, dict[int, float]] = field(default_factory=dict)
    allreduce_points: dict[str, dict[float, float]] = field(default_factory=dict)
    allreduce_sources: dict[str, str] = field(default_factory=dict)
    """Source text per all-reduce curve (the path the engine rule chose and why); 'allreduce probe' otherwise."""
    allreduce_paths: dict[str, EngineCurve] = field(default_factory=dict)
    """Per all-reduce curve, the engine rule's path at each size (set where the result holds custom points)."""
    layers: list[LayerComposition] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    copy_gbps: float = math.inf
    peak_tflops: float = math.inf
    alternatives: dict[str, list[KernelTime]] = field(default_factory=dict)
    """Per key id, its times with other kernel classes than the budget's (the torch form beside a fused kernel)."""
    curve_points: dict[tuple[str, str], CurvePoint] = field(default_factory=dict)
    """(key id, variant) → a point measured beside the budget's own keys (sweeps, grids, other implementations)."""
    launches: dict[str, GqaLaunchFacts] = field(default_factory=dict)
    """Key id → the GQA split-K launch its point was timed with (where the results say it)."""
    curve_kernels: dict[str, set[KernelClass]] = field(default_factory=dict)
    """Probe → the kernel classes its grid points were timed with (where the probe says): a key timed with several
    classes joins its curve at the grid's class, so one curve holds one kernel's times."""

    @property
    def collective_mode(self) -> str:
        """The collective timing mode matching the launch mode: graph replay for graph, pipelined for eager."""
        return "graph" if self.launch_mode == "graph" else "pipelined"

    @property
    def plan_ranks(self) -> int | None:
        """The plan's TP degree (None without a plan): collectives measured on other group sizes do not count."""
        return self.plan.allreduce_ranks if self.plan is not None else None

    def launch_key(self, mode: str) -> LaunchKey:
        """The plan's launch key of `mode` (a one-kernel key without a plan)."""
        if self.plan is not None:
            for key in self.plan.by_probe("launch"):
                if isinstance(key, LaunchKey) and key.mode == mode:
                    return key
        return LaunchKey(mode, 1)

    def offer(self, key_id: str, time: MeasuredTime) -> None:
        """Keep `time` for `key_id` unless a faster one is there (variants of one key, and the kernel classes timed
        for it: the fastest counts); the slower one, where it says its kernel class, is kept as an alternative."""
        prev = self.times.get(key_id)
        keep, other = (time, prev) if prev is None or time.median_ms < prev.median_ms else (prev, time)
        self.times[key_id] = keep
        if other is not None and other.kernel is not None:
            self.offer_alternative(key_id, KernelTime(other.kernel, other.median_ms))

    def offer_alternative(self, key_id: str, alt: KernelTime) -> None:
        """Keep `alt` as another kernel class's time for `key_id` (shown beside the budget's figure)."""
        self.alternatives.setdefault(key_id, []).append(alt)

    def _with_alternatives(self, key_id: str, t: MeasuredTime) -> MeasuredTime:
        """`t` with the other kernel classes' times of its key (the fastest of each class; not its own class)."""
        best: dict[KernelClass, float] = {}
        for alt in self.alternatives.get(key_id, ()):
            if alt.kernel != t.kernel and alt.median_ms < best.get(alt.kernel, math.inf):
                best[alt.kernel] = alt.median_ms
        if not best:
            return t
        return dataclasses.replace(t, alternatives=tuple(KernelTime(k, ms) for k, ms in best.items()))

    def offer_curve(self, key: ProbeKey, time: MeasuredTime, variant: str = "") -> None:
        """Keep a curve point for `key` (the fastest where a key was measured more than once), and the kernel class
        it was timed with where `time` says it."""
        if key.PROBE not in FAMILIES or not time.median_ms > 0:
            return
        if time.kernel is not None:
            self.curve_kernels.setdefault(key.PROBE, set()).add(time.kernel)
        slot = (key.key_id, variant)
        prev = self.curve_points.get(slot)
        if prev is None or time.median_ms < prev.median_ms:
            self.curve_points[slot] = CurvePoint(key, time.median_ms, time.p10_ms, time.p90_ms, time.source, variant)

    def offer_launch(self, key_id: str, facts: GqaLaunchFacts) -> None:
        """Keep the kernel launch `key_id`'s point was timed with; it goes onto the point's `CurvePoint`."""
        self.launches[key_id] = facts

    def _all_curve_points(self) -> tuple[CurvePoint, ...]:
        """The offered curve points and every key time (a key measured exactly is a point of its curve)."""
        points = dict(self.curve_points)
        for key_id, t in self.times.items():
            try:
                key = cast(ProbeKey, parse_key_id(key_id))
            except MeasurementKeyError:
                continue
            slot = (key_id, "")
            if (
                key.PROBE in FAMILIES
                and t.median_ms > 0
                and (slot not in points or t.median_ms < points[slot].median_ms)
            ):
                points[slot] = self._at_grid_kernel(key, t)
        return tuple(dataclasses.replace(points[s], launch=self.launches.get(s[0])) for s in sorted(points))

    def _at_grid_kernel(self, key: ProbeKey, t: MeasuredTime) -> CurvePoint:
        """A key's time as a point of its curve: where the budget took another kernel class than the one its
        probe's grid was timed with (SDPA beating decodetop's split-K kernel at the plan's own attention key) and
        the key was timed with the grid's class too, that class's time (its spread scaled), so a curve never mixes
        two kernels' steps; the budget's own figure stays the fastest."""
        classes = self.curve_kernels.get(key.PROBE)
        if classes and t.kernel is not None and t.kernel not in classes:
            same = [a.median_ms for a in self.alternatives.get(key.key_id, ()) if a.kernel in classes]
            if same and min(same) > 0:
                ms = min(same)
                f = ms / t.median_ms
                return CurvePoint(key, ms, t.p10_ms * f, t.p90_ms * f, f"{t.source.split(' (')[0]} (grid's kernel)")
        return CurvePoint(key, t.median_ms, t.p10_ms, t.p90_ms, t.source)

    def build(self) -> MeasuredSet:
        times = {k: self._with_alternatives(k, t) for k, t in self.times.items()}
        gemm_curves = {c: Curve(tuple(sorted(p.items())), "gemm probe sweep") for c, p in self.gemm_points.items() if p}
        ar_curves = {
            c: Curve(tuple(sorted(p.items())), self.allreduce_sources.get(c, "allreduce probe"))
            for c, p in self.allreduce_points.items()
            if p
        }
        return MeasuredSet(
            times=times,
            gemm_curves=gemm_curves,
            allreduce_curves=ar_curves,
            layers=tuple(self.layers),
            copy_gbps=self.copy_gbps if self.copy_gbps != math.inf else None,
            peak_tflops=self.peak_tflops if self.peak_tflops != math.inf else None,
            notes=tuple(self.notes),
            allreduce_paths=dict(self.allreduce_paths),
            curve_points=self._all_curve_points(),
        )


def ok_measurements(result: ProbeResult) -> list[Measurement]:
    """The result's measurements that were taken (not unsupported or failed)."""
    return [m for m in result.measurements if m.status is MeasurementStatus.OK]


def busiest(m: Measurement) -> MeasuredTime | None:
    """The slowest rank's median/p10/p90 of one measurement, in ms (the budget is the busiest GPU's), with its mean
    and the standard deviation of its samples (the step's mean and spread)."""
    series = [r for r in m.per_rank if r.stats is not None]
    if series:
        worst = max(series, key=lambda r: r.stats.median if r.stats else 0.0)
        st = worst.stats
        assert st is not None
        if st.median > 0:
            std = _pstdev(worst.samples) / 1e3 if len(worst.samples) > 1 else None
            return MeasuredTime(st.median / 1e3, st.p10 / 1e3, st.p90 / 1e3, mean_ms=st.mean / 1e3, std_ms=std)
    if m.stats is not None and m.stats.median > 0:
        return MeasuredTime(m.stats.median / 1e3, m.stats.p10 / 1e3, m.stats.p90 / 1e3, mean_ms=m.stats.mean / 1e3)
    t = m.metrics.get("time_us")
    if t is not None and t > 0 and math.isfinite(t):
        return MeasuredTime.point(t / 1e3)
    return None


def _pstdev(samples: Sequence[float]) -> float:
    """The population standard deviation of `samples` in floats (`statistics.pstdev` is exact in fractions, and
    reading a plan's results for a what-if took 0.4 ms a measurement in it)."""
    mean = math.fsum(samples) / len(samples)
    return math.sqrt(math.fsum((x - mean) ** 2 for x in samples) / len(samples))


def with_source(t: MeasuredTime, source: str) -> MeasuredTime:
    """`t` with where it came from."""
    return dataclasses.replace(t, source=source)


def budget_point(result: ProbeResult, m: Measurement) -> tuple[str, MeasuredTime] | None:
    """(key id, time with its source) of a point the budget takes: `role` "budget", a `key` param, a time."""
    key = m.params.get("key")
    if not isinstance(key, str) or m.params.get("role") != "budget":
        return None
    t = busiest(m)
    if t is None:
        return None
    variant = m.params.get("variant") or m.params.get("sampler") or m.params.get("mode") or ""
    timed = with_source(t, f"{result.probe} probe" + (f" ({variant})" if variant else ""))
    return key, dataclasses.replace(timed, kernel=m.kernel)


def alternative_point(result: ProbeResult, m: Measurement) -> tuple[str, MeasuredTime] | None:
    """(key id, time) of an `alternative` point: the same key timed with another kernel class (the torch form beside
    a fused kernel)."""
    key = m.params.get("key")
    if not isinstance(key, str) or m.params.get("role") != "alternative" or m.kernel is None:
        return None
    t = busiest(m)
    if t is None:
        return None
    return key, dataclasses.replace(with_source(t, f"{result.probe} probe ({m.kernel.short})"), kernel=m.kernel)


def read_keyed_points(result: ProbeResult, into: MeasuredSetBuilder) -> None:
    """The generic read hook: every budget point and every alternative point (the same key with another kernel class)
    offers its key's time; the fastest counts (SDPA's own kernel can beat decodetop's for BF16 GQA), the others are
    kept beside it ("torch ops would take X")."""
    for m in ok_measurements(result):
        found = budget_point(result, m) or alternative_point(result, m)
        if found is not None:
            into.offer(*found)
