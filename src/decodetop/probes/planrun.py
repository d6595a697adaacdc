"""Provides the plan runner: a `ProbePlan` run through a `ProbeController`, and its results turned into what
`decodetop.budget.compose.compose_budget` takes (stdlib only, no torch).

    requests = plan_requests(plan, inventory, world_size=2, device_kind="cpu")   # what to run, with which keys
    run = run_plan(controller, inventory, options=PlanRunOptions(launch_mode="graph"))
    run.budget                      # decodetop.budget.compose.Budget
    print(format_budget(run))       # the stacked budget as text
    budget, measured = compose_from_results(inventory, results, options)   # again from saved results

How results become budget inputs (`measured_from_results`, through each probe's `read` hook in
`decodetop.probes.specs.<probe>`; `plan_requests` likewise calls each probe's `plan` hook):

- every component-probe point with `role` "budget" and a `key` param gives that key's `MeasuredTime`: median, p10
  and p90 of the **slowest rank** (the budget is the busiest GPU's); where a key has several variants (FP8
  per-tensor / row-wise, MoE grouped / loop) the fastest supported one is taken and named in the source;
- the `gemm` sweep gives one GEMM-vs-M `Curve` per weight shape (fastest variant per M);
- the `allreduce` probe gives the all-reduce `Curve` (time vs bytes) in the mode matching the launch mode (graph
  replay for graph, pipelined for eager), only when the group has the plan's TP ranks; the `sampling` probe's
  all-gather of the logits gives the exact all-gather key the same way;
- the `launch` probe gives the per-kernel cost: graph = the a + b·N fit's b, eager = the eager torch op;
- the `layer` probe's composition errors are kept as `LayerComposition`s (reported beside the budget).

Anything a probe could not measure stays missing (never a silent 0); `compose_budget` marks it so.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from decodetop.budget.compose import (
    DEFAULT_OBSERVED_MS,
    DEFAULT_TARGET_TPS,
    Budget,
    ObservedStep,
    default_observed,
)
from decodetop.budget.inventory import StepInventory
from decodetop.budget.plan import ProbePlan, build_plan
from decodetop.errors import UserInputError
from decodetop.probes.budgeting import GpuHint, compose_inventory, format_budget_table
from decodetop.probes.controller import GroupLayout
from decodetop.probes.hooks import (
    MeasuredSet,
    MeasuredSetBuilder,
    PlanContext,
    ProbeRequest,
    read_keyed_points,
)
from decodetop.probes.protocol import Progress
from decodetop.probes.registry import ProbeRegistry
from decodetop.probes.results import (
    RESULTS_FORMAT_VERSION,
    ProbeResult,
    ProbeStatus,
)
from decodetop.probes.spec import ProbeSpec
from decodetop.textfmt import format_number


@dataclass(frozen=True)
class PlanRunOptions:
    """How to run a plan and compose its budget."""

    launch_mode: str | None = None
    """graph or eager (None: the deployment's)."""
    observed_ms: float = DEFAULT_OBSERVED_MS
    target_tps: float = DEFAULT_TARGET_TPS
    sweeps: bool = True
    """GEMM-vs-M sweep, attention and kvcast context sweeps (charts); off: only the budget's own points."""
    only: tuple[str, ...] = ()
    """Run only these probes (empty: every probe the plan needs)."""
    timeout_s: float | None = None
    """Deadline per probe (None: each probe's default)."""
    observed: ObservedStep | None = None
    """The observed step with its origin (None: `observed_ms`, from the default unless it differs from it)."""
    scenario_id: str = ""
    """`Scenario.fingerprint_id` of the run ('' for a bare inventory)."""
    tp_source: str = ""
    """`Scenario.tp_source`: where TP came from, in words ('' for a bare inventory)."""

    @property
    def observed_step(self) -> ObservedStep:
        """`observed`, else `observed_ms` marked as the default (assumed) when it is the default."""
        if self.observed is not None:
            return self.observed
        if self.observed_ms == DEFAULT_OBSERVED_MS:
            return default_observed()
        return ObservedStep(self.observed_ms, "flag", "given")


@dataclass(frozen=True)
class PlanProgress:
    """Progress of a plan run: probe i of n, and the probe's own progress (key j of m)."""

    probe_index: int
    probe_count: int
    probe: str
    text: str
    done: int
    total: int

    def line(self) -> str:
        """'probe 2/9 gemm: key 3/12 gemm:m=1,…'."""
        return f"probe {self.probe_index}/{self.probe_count} {self.probe}: {self.text}"


@dataclass(frozen=True)
class PlanRun:
    """A finished plan run: what ran, what came back, and the budget composed from it."""

    plan: ProbePlan
    requests: tuple[ProbeRequest, ...]
    results: tuple[ProbeResult, ...]
    measured: MeasuredSet
    budget: Budget
    notes: tuple[str, ...] = field(default=())


class _Controller(Protocol):
    @property
    def world_size(self) -> int: ...

    @property
    def layout(self) -> GroupLayout: ...

    def run(
        self,
        probe: str,
        params: Mapping[str, Any] | None = None,
        *,
        timeout_s: float | None = None,
        on_progress: Callable[[Progress], None] | None = None,
    ) -> ProbeResult: ...


# --------------------------------------------------------------------------------------------- requests


def plan_requests(
    plan: ProbePlan,
    inventory: StepInventory,
    *,
    world_size: int,
    device_kind: str,
    options: PlanRunOptions | None = None,
    registry: ProbeRegistry | None = None,
) -> tuple[tuple[ProbeRequest, ...], tuple[str, ...]]:
    """The probe runs a plan needs on this group (world_size ranks of `device_kind` "cuda" or "cpu"), and notes on
    what cannot be measured here (collectives on a group smaller than the plan's TP): every registered probe's
    `plan` hook, in the probes' plan order."""
    opts = options or PlanRunOptions()
    registered = [s for s in (registry or ProbeRegistry()).specs(include_hidden=True) if s.plan is not None]
    planned = sorted(registered, key=_order)
    mode = opts.launch_mode or inventory.deployment.launch_mode
    reqs: list[ProbeRequest] = []
    notes: list[str] = []
    # Notes in registration order (collectives before launch), requests in plan order.
    for spec in registered:
        assert spec.plan is not None
        ctx = PlanContext(spec.name, plan, inventory, world_size, device_kind, opts.sweeps, mode, opts.only)
        got = spec.plan(ctx)
        notes.extend(got.notes)
        if got.request is not None:
            reqs.append(got.request)
    order = [s.name for s in planned]
    if opts.only:
        unknown = [p for p in opts.only if p not in order]
        if unknown:
            raise UserInputError(f"probe(s) {', '.join(unknown)} are not part of a plan (known: {', '.join(order)})")
        reqs = [r for r in reqs if r.probe in opts.only]
    reqs.sort(key=lambda r: order.index(r.probe))
    if device_kind != "cuda":
        notes.append(
            "CPU ranks: bf16/fp32 timed with the host clock, few repetitions, no L2 rotation, GEMM sweep capped "
            "at M ≤ 16; CUDA graphs, fp8 and fp4 are unsupported there"
        )
    return tuple(reqs), tuple(notes)


def _order(spec: ProbeSpec) -> int:
    return spec.plan_order


# --------------------------------------------------------------------------------------------- results → inputs


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


def compose_from_results(
    inventory: StepInventory,
    results: Sequence[ProbeResult],
    options: PlanRunOptions | None = None,
    *,
    plan: ProbePlan | None = None,
    gpu: GpuHint | None = None,
    group_kind: str | None = None,
) -> tuple[Budget, MeasuredSet]:
    """The budget of `inventory` from probe results (fresh, or read back with `results.load_results`), through the
    one composition (`decodetop.probes.budgeting.compose_inventory`); the measured inputs beside it. `group_kind`
    (cuda or cpu) says what ran when no result carries its environment: CPU ranks get no GPU roofline."""
    opts = options or PlanRunOptions()
    plan = plan or build_plan(inventory)
    mode = opts.launch_mode or inventory.deployment.launch_mode
    comp = compose_inventory(
        inventory,
        results,
        observed=opts.observed_step,
        target_tps=opts.target_tps,
        gpu=gpu,
        group_kind=group_kind,
        plan=plan,
        launch_mode=mode,
        scenario_id=opts.scenario_id,
        tp_source=opts.tp_source,
    )
    measured = measured_from_results(comp.used, launch_mode=mode, plan=plan, allreduce=inventory.deployment.allreduce)
    return comp.budget, measured


# --------------------------------------------------------------------------------------------- running


def run_plan(
    controller: _Controller,
    inventory: StepInventory,
    *,
    options: PlanRunOptions | None = None,
    plan: ProbePlan | None = None,
    on_progress: Callable[[PlanProgress], None] | None = None,
    on_result: Callable[[ProbeResult], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> PlanRun:
    """Run every probe the plan needs on `controller`'s group, then compose the budget. Blocking; a probe that
    fails or times out leaves its keys missing (its result says why) and the rest still runs. The run stops early
    (composing what it has) after a probe comes back cancelled (`controller.cancel()` from another thread) or when
    `should_stop()` turns true between probes."""
    opts = options or PlanRunOptions()
    plan = plan or build_plan(inventory)
    layout = controller.layout
    requests, notes = plan_requests(
        plan, inventory, world_size=controller.world_size, device_kind=layout.kind, options=opts
    )
    results: list[ProbeResult] = []
    n = len(requests)
    for i, req in enumerate(requests, start=1):
        if should_stop is not None and should_stop():
            notes = (*notes, f"stopped before {req.probe} (probe {i}/{n})")
            break
        if on_progress is not None:
            on_progress(PlanProgress(i, n, req.probe, "starting", 0, 0))

        def relay(p: Progress, i: int = i, probe: str = req.probe) -> None:
            if on_progress is not None:
                on_progress(PlanProgress(i, n, probe, p.text, p.done, p.total))

        result = controller.run(req.probe, dict(req.params), timeout_s=opts.timeout_s, on_progress=relay)
        results.append(result)
        if on_result is not None:
            on_result(result)
        if result.status is ProbeStatus.CANCELLED:
            if i < n:
                notes = (*notes, f"cancelled during {req.probe} (probe {i}/{n}); later probes not run")
            break
    budget, measured = compose_from_results(inventory, results, opts, plan=plan, group_kind=layout.kind)
    all_notes = list(notes) + list(measured.notes)
    for r in results:
        if r.status is not ProbeStatus.OK:
            all_notes.append(f"{r.probe}: {r.status.value}: {r.message or r.error or ''}".rstrip(": "))
    return PlanRun(plan, requests, tuple(results), measured, budget, tuple(all_notes))


# --------------------------------------------------------------------------------------------- output


def plan_run_to_dict(run: PlanRun, baseline_diff: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The JSON document of a plan run: a `decodetop probe --json` results file (readable by `load_results`) with
    the plan, the budget, the measured key times, the layer composition errors and the notes added; with
    `baseline_diff` (`BudgetDiff.to_dict()` and the baseline's path, from `--baseline`) under "baseline_diff"."""
    m = run.measured
    return {
        "decodetop_probe_results": RESULTS_FORMAT_VERSION,
        "results": [r.to_dict() for r in run.results],
        "plan": run.plan.to_dict(),
        "budget": run.budget.to_dict(),
        "measured": {
            k: {
                "median_ms": t.median_ms,
                "p10_ms": t.p10_ms,
                "p90_ms": t.p90_ms,
                "mean_ms": t.mean,
                "std_ms": t.std_ms,
                "source": t.source,
            }
            for k, t in sorted(m.times.items())
        },
        "gemm_curves": {c: [list(p) for p in cv.points] for c, cv in sorted(m.gemm_curves.items())},
        "allreduce_curves": {c: [list(p) for p in cv.points] for c, cv in sorted(m.allreduce_curves.items())},
        "layers": [
            {
                "layer": lc.layer,
                "mode": lc.mode,
                "sum_parts_us": lc.sum_parts_us,
                "layer_us": lc.layer_us,
                "error_pct": lc.error_pct,
                "eager_us": lc.eager_us,
                "note": lc.note,
            }
            for lc in m.layers
        ],
        "copy_gbps": m.copy_gbps,
        "peak_tflops": m.peak_tflops,
        "notes": list(run.notes),
        **({"baseline_diff": dict(baseline_diff)} if baseline_diff is not None else {}),
    }


def plan_run_to_json(run: PlanRun, baseline_diff: Mapping[str, Any] | None = None) -> str:
    """`plan_run_to_dict` as JSON text."""
    return json.dumps(plan_run_to_dict(run, baseline_diff), indent=1, allow_nan=False) + "\n"


def format_budget(run: PlanRun) -> str:
    """The budget as text (`decodetop.probes.budgeting.format_budget_table`, as `decodetop budget` prints it); then
    the layer composition errors and the notes."""

    b = run.budget
    tp = f" (TP: {b.tp_source})" if b.tp_source else ""
    where = "CPU rank" if b.device_kind == "cpu" else "GPU"
    lines = [f"Budget: {b.model}, {b.deployment}{tp} — ms per decode step on the busiest {where}"]
    lines.extend(format_budget_table(b))
    lines.append(f"composed {format_number(b.total_ms)} ms/step ({b.kernels} kernels, launch {b.launch_mode})")
    if run.measured.layers:
        lines.append("Layer composition (Σ parts vs the whole layer, same kernels):")
        for lc in run.measured.layers:
            extra = f", eager {format_number(lc.eager_us)} µs" if lc.eager_us is not None else ""
            lines.append(
                f"  {lc.layer} layer [{lc.mode}]: parts {format_number(lc.sum_parts_us)} µs vs layer "
                f"{format_number(lc.layer_us)} µs → error {lc.error_pct:+.1f}%{extra}"
                + (f" ({lc.note})" if lc.note else "")
            )
    for note in run.notes:
        lines.append(f"note: {note}")
    return "\n".join(lines) + "\n"
