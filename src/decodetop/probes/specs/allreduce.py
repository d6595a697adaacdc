"""Provides the `allreduce` probe's spec (no torch): all-reduce latency and bus bandwidth per size, in three modes.

Plan: on a group of exactly the plan's TP ranks, the plan's sweep sizes (up to `CPU_ALLREDUCE_MAX_BYTES` on CPU
ranks) plus the exact sizes the step needs; on a larger group, with sweeps wanted, the same sweep at the group's
size (curve points for the curve engine, which predicts the plan's collectives from them, labelled; a TP-1 plan
without collectives too, for what-ifs at a larger TP); on a smaller
group the collectives stay missing and a note says why.
Read: the all-reduce `Curve` (time vs bytes) in the mode matching the launch mode (graph replay for graph,
pipelined for eager; pipelined when that mode was not measured, with a note), only at the plan's rank count.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from decodetop.budget.engine_paths import AllreduceTopology, engine_allreduce_curve, nvlink_all_pairs
from decodetop.budget.keys import AllreduceKey
from decodetop.budget.measured import MeasuredTime
from decodetop.budget.plan import allreduce_sweep_sizes
from decodetop.probes.hooks import MeasuredSetBuilder, PlanContext, Planned, ProbeRequest, busiest, with_source
from decodetop.probes.probe_spec import ProbeSpec
from decodetop.probes.results import MeasurementStatus, ProbeResult

MiB = 1024 * 1024
#: Largest all-reduce size swept on CPU ranks (gloo over shared memory: 128 MiB points take seconds each).
CPU_ALLREDUCE_MAX_BYTES = 1024 * 1024
#: Per-size-and-mode time target for the all-reduce sweep inside a plan (the probe's own default is 250 ms;
#: a plan sweeps ~30 sizes, so 60 ms keeps it to seconds).
PLAN_ALLREDUCE_BUDGET_MS = 60.0
#: `impl` values of torch.distributed's own all-reduce (the group's backend); any other impl is a P2P kernel.
DIST_IMPLS = ("nccl", "gloo")
#: Synced ops per size on CPU ranks inside a plan (the default 200 takes seconds per size on gloo).
CPU_PLAN_SYNCED_OPS = 50


def default_allreduce_sizes() -> list[int]:
    """8 B ... 128 MiB in ×4 steps, then 256 MiB (docs/reference/probes.md §7.2 wants a wide sweep)."""
    sizes = []
    size = 8
    while size <= 128 * MiB:
        sizes.append(size)
        size *= 4
    sizes.append(256 * MiB)
    return sizes


def plan(ctx: PlanContext) -> Planned:
    """The sweep and the exact sizes, when the group has the plan's TP ranks; on a larger group, with sweeps wanted,
    the sweep at the group's size for the curve engine (the plan's own collectives are then predicted from it)."""
    keys = [k for k in ctx.plan.by_probe("allreduce") if isinstance(k, AllreduceKey)]
    reduces = [k for k in keys if k.collective == "all_reduce"]
    if not keys:
        return _curve_only(ctx)
    tp = ctx.plan.allreduce_ranks
    exact = sorted({k.bytes for k in reduces})
    params = _sweep_params(ctx, ctx.plan.allreduce_sweep_bytes, exact)
    notes: tuple[str, ...] = ()
    if not ctx.cuda:
        notes = (f"all-reduce swept to {CPU_ALLREDUCE_MAX_BYTES // 1024} KiB on CPU ranks (plus the exact sizes)",)
    if ctx.group_fits_collectives:
        return Planned(ProbeRequest("allreduce", params, tuple(k.key_id for k in reduces)), notes)
    if ctx.sweeps and ctx.world_size > tp:
        why = (
            f"the plan is TP {tp} but the group has {ctx.world_size} ranks: the all-reduce is swept on all "
            f"{ctx.world_size} for the curves, and the TP-{tp} collectives are predicted from them (labelled)"
        )
        return Planned(ProbeRequest("allreduce", params, ()), (*notes, why))
    return Planned(
        notes=(
            f"collectives not measured: the plan is TP {tp} but the group has {ctx.world_size} rank(s); "
            "all-reduce and all-gather stay missing (per-GPU shapes are those of a TP-"
            f"{tp} shard)",
        )
    )


def _sweep_params(ctx: PlanContext, sizes: Sequence[int], exact: list[int]) -> dict[str, object]:
    """The probe's parameters for a sweep over `sizes` (capped on CPU ranks, where fewer synced ops are timed) plus
    the `exact` sizes the step needs (the sweep falls back to them when it is empty)."""
    sweep = [s for s in sizes if ctx.cuda or s <= CPU_ALLREDUCE_MAX_BYTES]
    params: dict[str, object] = {"sizes": sweep or exact, "extra_sizes": exact, "budget_ms": PLAN_ALLREDUCE_BUDGET_MS}
    if not ctx.cuda:
        params["synced_ops"] = CPU_PLAN_SYNCED_OPS
    return params


def _curve_only(ctx: PlanContext) -> Planned:
    """A plan without collectives (TP 1) on a group of several ranks, with sweeps wanted: the sweep at the group's
    size, so a what-if for a larger TP on this host predicts its all-reduce from a curve measured here, not from
    the spec sheet; nothing on a group of one rank or without sweeps."""
    if not ctx.sweeps or ctx.world_size < 2:
        return Planned()
    params = _sweep_params(ctx, allreduce_sweep_sizes(ctx.inventory), [])
    why = (
        f"the plan is TP {ctx.plan.allreduce_ranks} (no collectives) on a group of {ctx.world_size} ranks: the "
        f"all-reduce is swept on all {ctx.world_size} for the curves a what-if at a larger TP predicts from"
    )
    return Planned(ProbeRequest("allreduce", params, ()), (why,))


@dataclass
class _Seen:
    """The all-reduce points of one group size in one result: medians per mode (NCCL) and per mode and algorithm
    (custom), every point's time with its spread, and why a custom kernel could not run."""

    by_mode: dict[str, dict[float, float]] = field(default_factory=dict)
    custom: dict[str, dict[str, dict[float, float]]] = field(default_factory=dict)
    times: dict[tuple[str, str, float], MeasuredTime] = field(default_factory=dict)
    custom_tried: bool = False
    unsupported: str = ""
    capability: str | None = None


def _seen_by_ranks(result: ProbeResult) -> dict[int, _Seen]:
    """Every all-reduce point of `result`, by the group size it ran on."""
    out: dict[int, _Seen] = {}
    for m in result.measurements:
        impl = str(m.params.get("impl", "nccl"))
        impl = "nccl" if impl in DIST_IMPLS else impl
        ranks = m.params.get("world_size")
        seen = out.setdefault(int(ranks) if isinstance(ranks, (int, float)) else int(result.world_size), _Seen())
        if impl != "nccl":
            seen.custom_tried = True
            if m.status is MeasurementStatus.UNSUPPORTED and not seen.unsupported:
                seen.unsupported = m.note
            cc = m.params.get("compute_capability")
            seen.capability = str(cc) if cc else seen.capability
        if m.status is not MeasurementStatus.OK:
            continue
        t = busiest(m)
        size = m.params.get("size_bytes")
        if t is None or not isinstance(size, (int, float)) or size <= 0:
            continue
        mode = str(m.params.get("mode"))
        if impl == "nccl":
            seen.by_mode.setdefault(mode, {})[float(size)] = t.median_ms
        else:
            seen.custom.setdefault(mode, {}).setdefault(impl, {})[float(size)] = t.median_ms
        seen.times[(mode, impl, float(size))] = t
    return out


def read(result: ProbeResult, into: MeasuredSetBuilder) -> None:
    """The all-reduce curve in the launch mode's collective mode at the plan's group size; with custom (P2P) points
    in the result, the curve the engine rule picks per size under `into.allreduce_choice`
    (decodetop.budget.engine_paths), its source naming the path and why. Every group size's points (the engine's
    path as variant '', each implementation as its own variant) become curve points of the curve engine."""
    for ranks, seen in sorted(_seen_by_ranks(result).items()):
        mine = into.plan_ranks is None or ranks == into.plan_ranks
        _read_group(result, into, ranks, seen, budget=mine)


def _read_group(result: ProbeResult, into: MeasuredSetBuilder, ranks: int, seen: _Seen, *, budget: bool) -> None:
    """One group size's curve: the budget's all-reduce curve where `budget`, curve points always."""
    want = into.collective_mode
    chosen = want if want in seen.by_mode else ("pipelined" if "pipelined" in seen.by_mode else None)
    if chosen is None:
        return
    points = seen.by_mode[chosen]
    curve = None
    if ranks < 2 and not budget:
        return  # one rank exchanges nothing: no curve point of a collective
    if seen.custom_tried:  # results from before the custom kernels: NCCL as measured
        env = result.environment
        topo = AllreduceTopology(
            world_size=ranks,
            compute_capability=seen.capability,
            p2p_all_pairs=True if seen.custom.get(chosen) else None,
            nvlink_all_pairs=nvlink_all_pairs(env.topology if env else None, ranks),
            custom_unsupported=seen.unsupported if not seen.custom.get(chosen) else "",
        )
        curve = engine_allreduce_curve(into.allreduce_choice, topo, points, seen.custom.get(chosen, {}))
        points = dict(curve.points)
    _offer_points(
        into, ranks, seen, chosen, points, f"allreduce probe: {curve.summary}" if curve else "allreduce probe"
    )
    if not budget:
        return
    into.allreduce_points["all_reduce"] = points
    if chosen != want:
        into.notes.append(f"all-reduce curve from {chosen} mode ({want} not measured)")
    if curve is None:
        return
    for impl, custom_points in seen.custom.get(chosen, {}).items():
        into.allreduce_points[f"all_reduce:{impl}"] = custom_points
    into.allreduce_sources["all_reduce"] = f"allreduce probe: {curve.summary}"
    into.allreduce_paths["all_reduce"] = curve
    into.notes.extend(curve.notes)


def _offer_points(  # noqa: PLR0917 - private; one group size's parts
    into: MeasuredSetBuilder, ranks: int, seen: _Seen, mode: str, engine_points: Mapping[float, float], source: str
) -> None:
    """Curve points of one group size: the engine's path (variant '', each point's spread that of the time it
    took) and every implementation measured in `mode` (variant nccl, one_shot, two_shot, …)."""
    spreads = {size: t for (m, _impl, size), t in seen.times.items() if m == mode}
    for size, ms in engine_points.items():
        t = next((x for (m, _i, s), x in seen.times.items() if m == mode and s == size and x.median_ms == ms), None)
        t = t or spreads.get(size)
        scale = ms / t.median_ms if t is not None and t.median_ms > 0 else 1.0
        low, high = (t.p10_ms * scale, t.p90_ms * scale) if t is not None else (ms, ms)
        key = AllreduceKey("all_reduce", int(size), ranks, "bf16")
        into.offer_curve(key, MeasuredTime(ms, low, high, source))
    for (m, impl, size), t in seen.times.items():
        if m == mode:
            key = AllreduceKey("all_reduce", int(size), ranks, "bf16")
            into.offer_curve(key, with_source(t, f"allreduce probe ({impl})"), variant=impl)


SPEC = ProbeSpec(
    name="allreduce",
    description="all-reduce latency and bus bandwidth per size: pipelined, CUDA-graph and synced modes",
    module="decodetop.probes.worker.allreduce",
    default_timeout_s=300.0,
    collective=True,
    table_columns=("size_bytes", "mode", "impl"),
    default_params={
        "sizes": default_allreduce_sizes(),
        # nccl (torch.distributed) and the engines' P2P kernel class through torch symmetric memory
        # (decodetop.probes.worker.symm_allreduce); "multimem" only with the multimem opt-in below.
        "impls": ["nccl", "one_shot", "two_shot"],
        # Largest custom size swept: twice the engines' 8 MiB custom all-reduce limit (budget/engine_paths.py).
        "custom_max_bytes": 16 * MiB,
        "multimem": False,  # NVLink multicast stays off on shared machines; true opts in to the multimem kernel
        "extra_sizes": [],  # sizes the caller adds (e.g. a model's exact message sizes), bytes
        "modes": ["pipelined", "graph", "synced"],
        # N back-to-back ops per timed sample (nccl-tests default -n 20: docs/reference/probes.md §1)
        "ops_per_sample": 20,
        "samples": 25,  # timed samples per size and mode (upper bound; large sizes take fewer)
        "min_samples": 5,
        "synced_ops": 200,  # synced mode: individually synchronized ops, for p50/p99
        "warmup_ops": 5,  # nccl-tests -w 5 on the H200 machine (docs/reference/h200-machine.md)
        "budget_ms": 250.0,  # target time per size and mode; large sizes scale the counts down to fit
    },
    plan=plan,
    read=read,
    plan_order=900,
)
