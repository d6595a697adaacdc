"""Provides the plan runner: a `ProbePlan` run through a `ProbeController`, and its results turned into what
`decodetop.budget.compose.compose_budget` takes (stdlib only, no torch).

    requests = plan_requests(plan, inventory, world_size=2, device_kind="cpu")   # what to run, with which keys
    run = run_plan(controller, inventory, options=PlanRunOptions(launch_mode="graph"))
    run.budget                      # decodetop.budget.compose.Budget
    print(format_budget(run))       # the stacked budget as text
    budget, measured = compose_from_results(inventory, results, options)   # again from saved results

How results become budget inputs (`measured_from_results`):

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
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from decodetop.budget.compose import (
    DEFAULT_OBSERVED_MS,
    DEFAULT_TARGET_TPS,
    Budget,
    Curve,
    MeasuredTime,
    ObservedStep,
    default_observed,
)
from decodetop.budget.inventory import StepInventory
from decodetop.budget.keys import AllreduceKey, LaunchKey
from decodetop.budget.plan import ProbePlan, build_plan
from decodetop.errors import UserInputError
from decodetop.probes.budgeting import GpuHint
from decodetop.probes.results import (
    RESULTS_FORMAT_VERSION,
    Measurement,
    MeasurementStatus,
    ProbeResult,
    ProbeStatus,
)

#: Probes in the order a plan runs them: cheap and global first (launch), the layer last (it reuses everything).
PLAN_ORDER = ("launch", "gemm", "moe", "routing", "attention", "kvcast", "norms", "sampling", "allreduce", "layer")
#: Attention context sweep on GPUs (probes.md §7.8: KV GB/s at 0, 16k, 32k, 64k, 128k).
ATTENTION_CONTEXTS_GPU = (0, 16384, 32768, 65536, 131072)
#: kvcast read-mode contexts: GPUs 1k…128k; CPU ranks 1k…16k (FP8 casts run at ~0.1 GB/s on a CPU).
KVCAST_CONTEXTS_GPU = (1024, 4096, 16384, 65536, 131072)
KVCAST_CONTEXTS_CPU = (1024, 4096, 16384)
#: Largest all-reduce size swept on CPU ranks (gloo over shared memory: 128 MiB points take seconds each).
CPU_ALLREDUCE_MAX_BYTES = 1024 * 1024
#: Per-size-and-mode time target for the all-reduce sweep inside a plan (the probe's own default is 250 ms;
#: a plan sweeps ~30 sizes, so 60 ms keeps it to seconds).
PLAN_ALLREDUCE_BUDGET_MS = 60.0
#: Tokens a DSA step attends to when the model does not say (models.md §2: index_topk 2048).
DEFAULT_GATHER_TOKENS = 2048


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
    deployment_text: str = ""
    """`Scenario.describe()`: the deployment line with where TP came from ('' for the inventory's own)."""

    @property
    def observed_step(self) -> ObservedStep:
        """`observed`, else `observed_ms` marked as the default (assumed) when it is the default."""
        if self.observed is not None:
            return self.observed
        if self.observed_ms == DEFAULT_OBSERVED_MS:
            return default_observed()
        return ObservedStep(self.observed_ms, "flag", "given")


@dataclass(frozen=True)
class ProbeRequest:
    """One probe run of a plan: its parameters, and the plan keys it measures."""

    probe: str
    params: Mapping[str, Any]
    keys: tuple[str, ...]


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
    def layout(self) -> Any: ...

    def run(
        self,
        probe: str,
        params: Mapping[str, Any] | None = None,
        *,
        timeout_s: float | None = None,
        on_progress: Callable[[Any], None] | None = None,
    ) -> ProbeResult: ...


# --------------------------------------------------------------------------------------------- requests


def _layer_span(label: str) -> set[int]:
    """'0-2,5' → {0, 1, 2, 5}; '-' and 'mtp' → empty."""
    out: set[int] = set()
    for part in label.split(","):
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", part.strip())
        if m:
            lo = int(m.group(1))
            hi = int(m.group(2) or lo)
            out.update(range(lo, hi + 1))
    return out


def layer_ops(inventory: StepInventory, layer: int) -> list[str]:
    """One decoder layer's ops as `COUNT*KEY_ID` (the `layer` probe's `dense_ops`/`moe_ops`), in inventory order."""
    out = []
    for op in inventory.ops:
        span = _layer_span(op.layers)
        if layer not in span:
            continue
        per_layer = op.count // len(span) if op.count % len(span) == 0 else max(1, round(op.count / len(span)))
        out.append(f"{per_layer}*{op.key.key_id}")
    return out


def representative_layers(inventory: StepInventory) -> tuple[int | None, int | None]:
    """(a dense layer, a MoE layer) of the main model, the last of each kind (layer 0's input norm differs)."""
    spec = inventory.spec
    moe = set(spec.moe_layers)
    dense = [i for i in range(spec.n_layers) if i not in moe]
    return (dense[-1] if dense else None), (max(moe) if moe else None)


def plan_requests(
    plan: ProbePlan,
    inventory: StepInventory,
    *,
    world_size: int,
    device_kind: str,
    options: PlanRunOptions | None = None,
) -> tuple[tuple[ProbeRequest, ...], tuple[str, ...]]:
    """The probe runs a plan needs on this group (world_size ranks of `device_kind` "cuda" or "cpu"), and notes on
    what cannot be measured here (collectives on a group smaller than the plan's TP)."""
    opts = options or PlanRunOptions()
    cuda = device_kind == "cuda"
    notes: list[str] = []
    reqs: list[ProbeRequest] = []

    def ids(probe: str) -> list[str]:
        return [k.key_id for k in plan.by_probe(probe)]

    reqs.append(ProbeRequest("launch", {}, tuple(ids("launch"))))
    if ids("gemm"):
        sweep = sorted({m for s in plan.gemm_sweeps for m in s.ms})
        reqs.append(
            ProbeRequest("gemm", {"keys": ids("gemm"), "sweep": opts.sweeps, "sweep_m": sweep}, tuple(ids("gemm")))
        )
    for probe in ("moe", "routing", "norms"):
        if ids(probe):
            reqs.append(ProbeRequest(probe, {"keys": ids(probe)}, tuple(ids(probe))))
    if ids("attention"):
        sweep_ctx = list(ATTENTION_CONTEXTS_GPU) if cuda and opts.sweeps else []
        reqs.append(
            ProbeRequest("attention", {"keys": ids("attention"), "context_sweep": sweep_ctx}, tuple(ids("attention")))
        )
    if ids("kvcast"):
        gather = inventory.spec.index_topk or DEFAULT_GATHER_TOKENS
        contexts = KVCAST_CONTEXTS_GPU if cuda else KVCAST_CONTEXTS_CPU
        params: dict[str, Any] = {
            "keys": ids("kvcast"),
            "read_modes": opts.sweeps,
            "read_contexts": list(contexts),
            "gather_tokens": int(gather),
        }
        reqs.append(ProbeRequest("kvcast", params, tuple(ids("kvcast"))))
    tp = plan.allreduce_ranks
    gathers = [k for k in plan.by_probe("allreduce") if isinstance(k, AllreduceKey) and k.collective == "all_gather"]
    reduces = [k for k in plan.by_probe("allreduce") if isinstance(k, AllreduceKey) and k.collective == "all_reduce"]
    group_fits = tp > 1 and world_size == tp
    if ids("sampling"):
        gather_bytes = sorted({k.bytes for k in gathers}) if group_fits else []
        reqs.append(
            ProbeRequest(
                "sampling",
                {"keys": ids("sampling"), "allgather_bytes": gather_bytes},
                tuple(ids("sampling")) + (tuple(k.key_id for k in gathers) if group_fits else ()),
            )
        )
    if reduces or gathers:
        if group_fits:
            exact = sorted({k.bytes for k in reduces})
            sweep_b = [s for s in plan.allreduce_sweep_bytes if cuda or s <= CPU_ALLREDUCE_MAX_BYTES]
            ar: dict[str, Any] = {
                "sizes": sweep_b or exact,
                "extra_sizes": exact,
                "budget_ms": PLAN_ALLREDUCE_BUDGET_MS,
            }
            if not cuda:
                ar["synced_ops"] = 50
                notes.append(
                    f"all-reduce swept to {CPU_ALLREDUCE_MAX_BYTES // 1024} KiB on CPU ranks (plus the exact sizes)"
                )
            reqs.append(ProbeRequest("allreduce", ar, tuple(k.key_id for k in reduces)))
        else:
            notes.append(
                f"collectives not measured: the plan is TP {tp} but the group has {world_size} rank(s); "
                "all-reduce and all-gather stay missing (per-GPU shapes are those of a TP-"
                f"{tp} shard)"
            )
    dense_i, moe_i = representative_layers(inventory)
    dense_ops = layer_ops(inventory, dense_i) if dense_i is not None else []
    moe_ops = layer_ops(inventory, moe_i) if moe_i is not None else []
    if dense_ops or moe_ops:
        reqs.append(ProbeRequest("layer", {"dense_ops": dense_ops, "moe_ops": moe_ops}, ()))
    if opts.only:
        unknown = [p for p in opts.only if p not in PLAN_ORDER]
        if unknown:
            raise UserInputError(
                f"probe(s) {', '.join(unknown)} are not part of a plan (known: {', '.join(PLAN_ORDER)})"
            )
        reqs = [r for r in reqs if r.probe in opts.only]
    reqs.sort(key=lambda r: PLAN_ORDER.index(r.probe))
    mode = opts.launch_mode or inventory.deployment.launch_mode
    if not cuda and mode == "graph" and (not opts.only or "launch" in opts.only):
        notes.append(
            "launch mode graph: the per-node cost of a CUDA graph needs a GPU, so kernel launch overhead stays "
            "missing on CPU ranks (--launch-mode eager uses the measured eager op cost)"
        )
    if not cuda:
        notes.append(
            "CPU ranks: bf16/fp32 timed with the host clock, few repetitions, no L2 rotation, GEMM sweep capped "
            "at M ≤ 16; CUDA graphs, fp8 and fp4 are unsupported there"
        )
    return tuple(reqs), tuple(notes)


# --------------------------------------------------------------------------------------------- results → inputs


def busiest(m: Measurement) -> MeasuredTime | None:
    """The slowest rank's median/p10/p90 of one measurement, in ms (the budget is the busiest GPU's)."""
    series = [r for r in m.per_rank if r.stats is not None]
    if series:
        worst = max(series, key=lambda r: r.stats.median if r.stats else 0.0)
        st = worst.stats
        assert st is not None
        if st.median > 0:
            return MeasuredTime(st.median / 1e3, st.p10 / 1e3, st.p90 / 1e3)
    if m.stats is not None and m.stats.median > 0:
        return MeasuredTime(m.stats.median / 1e3, m.stats.p10 / 1e3, m.stats.p90 / 1e3)
    t = m.metrics.get("time_us")
    if t is not None and t > 0 and math.isfinite(t):
        return MeasuredTime.point(t / 1e3)
    return None


def _with_source(t: MeasuredTime, source: str) -> MeasuredTime:
    return MeasuredTime(t.median_ms, t.p10_ms, t.p90_ms, source)


def measured_from_results(
    results: Sequence[ProbeResult], *, launch_mode: str = "graph", plan: ProbePlan | None = None
) -> MeasuredSet:
    """Read probe results into budget inputs (see the module docstring for the rules)."""
    times: dict[str, MeasuredTime] = {}
    gemm_pts: dict[str, dict[int, float]] = {}
    ar_pts: dict[str, dict[float, float]] = {}
    layers: list[LayerComposition] = []
    notes: list[str] = []
    copy_gbps = peak = None
    want_mode = "graph" if launch_mode == "graph" else "pipelined"
    plan_ranks = plan.allreduce_ranks if plan is not None else None
    launch_keys = {k.mode: k for k in plan.by_probe("launch") if isinstance(k, LaunchKey)} if plan else {}

    def offer(key: str, t: MeasuredTime) -> None:
        prev = times.get(key)
        if prev is None or t.median_ms < prev.median_ms:
            times[key] = t

    for res in results:
        ok = [m for m in res.measurements if m.status is MeasurementStatus.OK]
        if res.probe == "launch":
            for m in ok:
                what = m.params.get("what")
                mode = "graph" if what == "graph_fit" else "eager" if what == "eager_op" else None
                if mode is None:
                    continue
                if mode == "graph":
                    per = m.metrics.get("graph_per_node_us")
                    t = MeasuredTime.point(per / 1e3) if per is not None and per > 0 else None
                else:
                    t = busiest(m)
                if t is not None:
                    lk = launch_keys.get(mode) or LaunchKey(mode, 1)
                    offer(lk.key_id, _with_source(t, f"launch probe ({what})"))
        elif res.probe == "allreduce":
            by_mode: dict[str, dict[float, float]] = {}
            for m in ok:
                ranks = m.params.get("world_size")
                if plan_ranks is not None and ranks != plan_ranks:
                    continue
                t = busiest(m)
                size = m.params.get("size_bytes")
                if t is None or not isinstance(size, (int, float)) or size <= 0:
                    continue
                by_mode.setdefault(str(m.params.get("mode")), {})[float(size)] = t.median_ms
            chosen = want_mode if want_mode in by_mode else ("pipelined" if "pipelined" in by_mode else None)
            if chosen is not None:
                ar_pts["all_reduce"] = by_mode[chosen]
                if chosen != want_mode:
                    notes.append(f"all-reduce curve from {chosen} mode ({want_mode} not measured)")
        elif res.probe == "layer":
            for m in ok:
                if m.params.get("what") != "composition":
                    continue
                mt = m.metrics
                if "error_pct" in mt:
                    layers.append(
                        LayerComposition(
                            str(m.params.get("layer")),
                            str(m.params.get("mode")),
                            mt["sum_parts_us"],
                            mt["layer_us"],
                            mt["error_pct"],
                            mt.get("eager_us"),
                            m.note,
                        )
                    )
        else:
            for m in ok:
                what = m.params.get("what")
                if what == "copy" and "bandwidth_gbps" in m.metrics:
                    copy_gbps = min(copy_gbps or math.inf, m.metrics["bandwidth_gbps"])
                    continue
                if what == "peak" and "tflops" in m.metrics:
                    peak = min(peak or math.inf, m.metrics["tflops"])
                    continue
                key = m.params.get("key")
                if not isinstance(key, str):
                    continue
                t = busiest(m)
                if t is None:
                    continue
                variant = m.params.get("variant") or m.params.get("sampler") or m.params.get("mode") or ""
                src = f"{res.probe} probe" + (f" ({variant})" if variant else "")
                if res.probe == "gemm" and what == "gemm":
                    curve = str(m.params.get("curve"))
                    mm = int(m.params.get("m", 0))
                    pts = gemm_pts.setdefault(curve, {})
                    if mm > 0 and (mm not in pts or t.median_ms < pts[mm]):
                        pts[mm] = t.median_ms
                if m.params.get("role") != "budget":
                    continue
                if what == "all_gather":
                    mode = str(m.params.get("mode"))
                    if mode != want_mode and any(
                        x.params.get("key") == key and x.params.get("mode") == want_mode for x in ok
                    ):
                        continue
                    times[key] = _with_source(t, src)
                    continue
                offer(key, _with_source(t, src))
    gemm_curves = {c: Curve(tuple(sorted(p.items())), "gemm probe sweep") for c, p in gemm_pts.items() if p}
    ar_curves = {c: Curve(tuple(sorted(p.items())), "allreduce probe") for c, p in ar_pts.items() if p}
    return MeasuredSet(
        times=times,
        gemm_curves=gemm_curves,
        allreduce_curves=ar_curves,
        layers=tuple(layers),
        copy_gbps=copy_gbps if copy_gbps not in (None, math.inf) else None,
        peak_tflops=peak if peak not in (None, math.inf) else None,
        notes=tuple(notes),
    )


def compose_from_results(
    inventory: StepInventory,
    results: Sequence[ProbeResult],
    options: PlanRunOptions | None = None,
    *,
    plan: ProbePlan | None = None,
    gpu: GpuHint | None = None,
) -> tuple[Budget, MeasuredSet]:
    """The budget of `inventory` from probe results (fresh, or read back with `results.load_results`), through the
    one composition (`decodetop.probes.budgeting.compose_inventory`); the measured inputs beside it."""
    from decodetop.probes.budgeting import compose_inventory

    opts = options or PlanRunOptions()
    plan = plan or build_plan(inventory)
    mode = opts.launch_mode or inventory.deployment.launch_mode
    comp = compose_inventory(
        inventory,
        results,
        observed=opts.observed_step,
        target_tps=opts.target_tps,
        gpu=gpu,
        plan=plan,
        launch_mode=mode,
        scenario_id=opts.scenario_id,
        deployment_text=opts.deployment_text,
    )
    measured = measured_from_results(comp.used, launch_mode=mode, plan=plan)
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

        def relay(p: Any, i: int = i, probe: str = req.probe) -> None:
            if on_progress is not None:
                on_progress(PlanProgress(i, n, probe, str(p.text), int(p.done), int(p.total)))

        result = controller.run(req.probe, dict(req.params), timeout_s=opts.timeout_s, on_progress=relay)
        results.append(result)
        if on_result is not None:
            on_result(result)
        if result.status is ProbeStatus.CANCELLED:
            if i < n:
                notes = (*notes, f"cancelled during {req.probe} (probe {i}/{n}); later probes not run")
            break
    budget, measured = compose_from_results(inventory, results, opts, plan=plan)
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
            k: {"median_ms": t.median_ms, "p10_ms": t.p10_ms, "p90_ms": t.p90_ms, "source": t.source}
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
    from decodetop.probes.budgeting import format_budget_table
    from decodetop.textfmt import format_number

    b = run.budget
    lines = [f"Budget: {b.model}, {b.deployment} — ms per decode step on the busiest GPU"]
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
