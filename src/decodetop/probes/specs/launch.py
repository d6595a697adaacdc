"""Provides the `launch` probe's spec (no torch): kernel-launch cost.

Plan: always part of a model's plan (its keys are the plan's launch keys). Read: the per-kernel cost of the launch
mode: graph = the a + b·N fit's b (per node of a replayed CUDA graph), eager = the eager torch op.
"""

from __future__ import annotations

from decodetop.budget.measured import MeasuredTime
from decodetop.probes.hooks import (
    MeasuredSetBuilder,
    PlanContext,
    Planned,
    ProbeRequest,
    busiest,
    ok_measurements,
    with_source,
)
from decodetop.probes.probe_spec import ProbeSpec
from decodetop.probes.results import ProbeResult

#: The launch probe's point that gives each launch mode's per-kernel cost.
_MODE_OF_POINT = {"graph_fit": "graph", "eager_op": "eager"}


def plan(ctx: PlanContext) -> Planned:
    """Always run; on CPU ranks a graph-mode budget keeps its launch cost missing (a note says so)."""
    notes: tuple[str, ...] = ()
    if not ctx.cuda and ctx.launch_mode == "graph" and (not ctx.only or "launch" in ctx.only):
        notes = (
            "launch mode graph: the per-node cost of a CUDA graph needs a GPU, so kernel launch overhead stays "
            "missing on CPU ranks (--launch-mode eager uses the measured eager op cost)",
        )
    return Planned(ProbeRequest("launch", {}, ctx.key_ids()), notes)


def read(result: ProbeResult, into: MeasuredSetBuilder) -> None:
    """Graph: the fit's per-node cost; eager: the eager op's time."""
    for m in ok_measurements(result):
        what = m.params.get("what")
        mode = _MODE_OF_POINT.get(str(what))
        if mode is None:
            continue
        if mode == "graph":
            per = m.metrics.get("graph_per_node_us")
            t = MeasuredTime.point(per / 1e3) if per is not None and per > 0 else None
        else:
            t = busiest(m)
        if t is not None:
            into.offer(into.launch_key(mode).key_id, with_source(t, f"launch probe ({what})"))


SPEC = ProbeSpec(
    name="launch",
    description="kernel-launch cost: host enqueue, launch+sync, CUDA-graph replay a+b·N, eager torch op",
    module="decodetop.probes.worker.launch",
    default_timeout_s=120.0,
    default_params={
        "ops_per_sample": 100,
        "samples": 30,
        "graph_nodes": [1, 8, 32, 128, 512],
        "warmup_ops": 50,
    },
    plan=plan,
    read=read,
    plan_order=100,
)
