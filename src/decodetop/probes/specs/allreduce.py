"""Provides the `allreduce` probe's spec (no torch): all-reduce latency and bus bandwidth per size, in three modes.

Plan: on a group of exactly the plan's TP ranks, the plan's sweep sizes (up to `CPU_ALLREDUCE_MAX_BYTES` on CPU
ranks) plus the exact sizes the step needs; on any other group the collectives stay missing and a note says why.
Read: the all-reduce `Curve` (time vs bytes) in the mode matching the launch mode (graph replay for graph,
pipelined for eager; pipelined when that mode was not measured, with a note), only at the plan's rank count.
"""

from __future__ import annotations

from decodetop.budget.engine_paths import AllreduceTopology, engine_allreduce_curve, nvlink_all_pairs
from decodetop.budget.keys import AllreduceKey
from decodetop.probes.hooks import MeasuredSetBuilder, PlanContext, Planned, ProbeRequest, busiest
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
    """The sweep and the exact sizes, when the group has the plan's TP ranks."""
    keys = [k for k in ctx.plan.by_probe("allreduce") if isinstance(k, AllreduceKey)]
    reduces = [k for k in keys if k.collective == "all_reduce"]
    if not keys:
        return Planned()
    tp = ctx.plan.allreduce_ranks
    if not ctx.group_fits_collectives:
        return Planned(
            notes=(
                f"collectives not measured: the plan is TP {tp} but the group has {ctx.world_size} rank(s); "
                "all-reduce and all-gather stay missing (per-GPU shapes are those of a TP-"
                f"{tp} shard)",
            )
        )
    exact = sorted({k.bytes for k in reduces})
    sweep = [s for s in ctx.plan.allreduce_sweep_bytes if ctx.cuda or s <= CPU_ALLREDUCE_MAX_BYTES]
    params: dict[str, object] = {"sizes": sweep or exact, "extra_sizes": exact, "budget_ms": PLAN_ALLREDUCE_BUDGET_MS}
    notes: tuple[str, ...] = ()
    if not ctx.cuda:
        params["synced_ops"] = CPU_PLAN_SYNCED_OPS
        notes = (f"all-reduce swept to {CPU_ALLREDUCE_MAX_BYTES // 1024} KiB on CPU ranks (plus the exact sizes)",)
    return Planned(ProbeRequest("allreduce", params, tuple(k.key_id for k in reduces)), notes)


def read(result: ProbeResult, into: MeasuredSetBuilder) -> None:
    """The all-reduce curve in the launch mode's collective mode; with custom (P2P) points in the result, the curve
    the engine rule picks per size under `into.allreduce_choice` (decodetop.budget.engine_paths), its source naming the
    path and why."""
    by_mode: dict[str, dict[float, float]] = {}
    custom: dict[str, dict[str, dict[float, float]]] = {}
    custom_tried = False
    unsupported = ""
    capability: str | None = None
    for m in result.measurements:
        impl = str(m.params.get("impl", "nccl"))
        impl = "nccl" if impl in DIST_IMPLS else impl
        ranks = m.params.get("world_size")
        if into.plan_ranks is not None and ranks != into.plan_ranks:
            continue
        if impl != "nccl":
            custom_tried = True
            if m.status is MeasurementStatus.UNSUPPORTED and not unsupported:
                unsupported = m.note
            cc = m.params.get("compute_capability")
            capability = str(cc) if cc else capability
        if m.status is not MeasurementStatus.OK:
            continue
        t = busiest(m)
        size = m.params.get("size_bytes")
        if t is None or not isinstance(size, (int, float)) or size <= 0:
            continue
        mode = str(m.params.get("mode"))
        if impl == "nccl":
            by_mode.setdefault(mode, {})[float(size)] = t.median_ms
        else:
            custom.setdefault(mode, {}).setdefault(impl, {})[float(size)] = t.median_ms
    want = into.collective_mode
    chosen = want if want in by_mode else ("pipelined" if "pipelined" in by_mode else None)
    if chosen is None:
        return
    into.allreduce_points["all_reduce"] = by_mode[chosen]
    if chosen != want:
        into.notes.append(f"all-reduce curve from {chosen} mode ({want} not measured)")
    if not custom_tried:  # results from before the custom kernels: NCCL as measured
        return
    ranks = into.plan_ranks or int(result.world_size)
    env = result.environment
    topo = AllreduceTopology(
        world_size=ranks,
        compute_capability=capability,
        p2p_all_pairs=True if custom.get(chosen) else None,
        nvlink_all_pairs=nvlink_all_pairs(env.topology if env else None, ranks),
        custom_unsupported=unsupported if not custom.get(chosen) else "",
    )
    curve = engine_allreduce_curve(into.allreduce_choice, topo, by_mode[chosen], custom.get(chosen, {}))
    for impl, points in custom.get(chosen, {}).items():
        into.allreduce_points[f"all_reduce:{impl}"] = points
    into.allreduce_points["all_reduce"] = dict(curve.points)
    into.allreduce_sources["all_reduce"] = f"allreduce probe: {curve.summary}"
    into.allreduce_paths["all_reduce"] = curve
    into.notes.extend(curve.notes)


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
