"""Provides a model plan's two passes through the probe specs' hooks (stdlib only, no torch): `plan_requests` (every
spec's `plan` hook: which probe runs, with which parameters, for a `ProbePlan` on this group) and
`measured_from_results` (every spec's `read` hook: probe results into what `decodetop.budget.compose.compose_budget`
takes). The plan runner (`decodetop.pipeline.plan_runner`) and the composition (`decodetop.pipeline.composition`)
call them.

    requests, notes = plan_requests(plan, inventory, world_size=2, device_kind="cpu")   # what to run, with which keys
    measured = measured_from_results(results, launch_mode="graph", plan=plan)           # times, curves, layer checks

How results become budget inputs (each probe's `read` hook in `decodetop.probes.specs.<probe>`):

- every component-probe point with `role` "budget" and a `key` param gives that key's `MeasuredTime`: median, p10
  and p90 of the **slowest rank** (the budget is the busiest GPU's); where a key has several variants (FP8
  per-tensor / row-wise, MoE grouped / loop) the fastest supported one is taken and named in the source;
- the `gemm` sweep gives one GEMM-vs-M `Curve` per weight shape (fastest variant per M);
- every point the curve engine can use (each key's time, the sweeps' points, the attention context sweep, the
  all-reduce at every group size and implementation) is a `CurvePoint` of `MeasuredSet.curve_points`;
- the `allreduce` probe gives the all-reduce `Curve` (time vs bytes) in the mode matching the launch mode (graph
  replay for graph, pipelined for eager), only when the group has the plan's TP ranks; the `sampling` probe's
  all-gather of the logits gives the exact all-gather key the same way;
- the `launch` probe gives the per-kernel cost: graph = the a + b·N fit's b, eager = the eager torch op;
- the `layer` probe's composition errors are kept as `LayerComposition`s (reported beside the budget).

Anything a probe could not measure stays missing (never a silent 0); `compose_budget` marks it so.
"""

from __future__ import annotations

from collections.abc import Sequence

from decodetop.budget.inventory import StepInventory
from decodetop.budget.plan import CurvePlan, ProbePlan, build_curve_plan
from decodetop.errors import UserInputError
from decodetop.probes.hooks import MeasuredSet, MeasuredSetBuilder, PlanContext, ProbeRequest, read_keyed_points
from decodetop.probes.probe_spec import ProbeSpec
from decodetop.probes.registry import ProbeRegistry
from decodetop.probes.results import ProbeResult

CPU_PLAN_NOTE = (
    "CPU ranks: bf16/fp32 timed with the host clock, few repetitions, no L2 rotation, GEMM sweep capped "
    "at M ≤ 16; CUDA graphs, fp8 and fp4 are unsupported there"
)


def plan_requests(
    plan: ProbePlan,
    inventory: StepInventory,
    *,
    world_size: int,
    device_kind: str,
    sweeps: bool = True,
    only: Sequence[str] = (),
    registry: ProbeRegistry | None = None,
) -> tuple[tuple[ProbeRequest, ...], tuple[str, ...]]:
    """The probe runs a plan needs on this group (world_size ranks of `device_kind` "cuda" or "cpu"), and notes on
    what cannot be measured here (collectives on a group smaller than the plan's TP): every registered probe's
    `plan` hook, in the probes' plan order. `sweeps`: also the GEMM-vs-M and context sweeps (charts) and the curve
    plan's points for what-ifs (`decodetop.budget.plan.build_curve_plan`); `only`: keep these probes (a name no plan
    holds is a `UserInputError`)."""
    registered = [s for s in (registry or ProbeRegistry()).specs(include_hidden=True) if s.plan is not None]
    planned = sorted(registered, key=_order)
    mode = inventory.deployment.launch_mode
    only = tuple(only)
    reqs: list[ProbeRequest] = []
    notes: list[str] = []
    curves = build_curve_plan(inventory, device_kind=device_kind) if sweeps else CurvePlan()
    notes.extend(curves.notes)
    # Notes in registration order (collectives before launch), requests in plan order.
    for spec in registered:
        assert spec.plan is not None
        ctx = PlanContext(spec.name, plan, inventory, world_size, device_kind, sweeps, mode, only, curves=curves)
        got = spec.plan(ctx)
        notes.extend(got.notes)
        if got.request is not None:
            reqs.append(got.request)
    order = [s.name for s in planned]
    if only:
        unknown = [p for p in only if p not in order]
        if unknown:
            raise UserInputError(f"probe(s) {', '.join(unknown)} are not part of a plan (known: {', '.join(order)})")
        reqs = [r for r in reqs if r.probe in only]
    reqs.sort(key=lambda r: order.index(r.probe))
    if device_kind != "cuda":
        notes.append(CPU_PLAN_NOTE)
    return tuple(reqs), tuple(notes)


def _order(spec: ProbeSpec) -> int:
    return spec.plan_order


def measured_from_results(
    results: Sequence[ProbeResult],
    *,
    launch_mode: str = "graph",
    plan: ProbePlan | None = None,
    registry: ProbeRegistry | None = None,
    allreduce: str = "auto",
) -> MeasuredSet:
    """Read probe results into budget inputs: each result through its probe's `read` hook (the generic keyed
    reader for a probe this registry does not know); see the module docstring for the rules. `allreduce`:
    auto, nccl or custom (`decodetop.budget.engine_paths`)."""
    reg = registry or ProbeRegistry()
    into = MeasuredSetBuilder(launch_mode=launch_mode, plan=plan, allreduce_choice=allreduce)
    for res in results:
        read = reg.get(res.probe).read if res.probe in reg else read_keyed_points
        read(res, into)
    return into.build()
