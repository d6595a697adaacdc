"""Provides `compose`: the one composition of a budget, called by every surface (`decodetop budget`, `decodetop probe
--budget`, `decodetop trace --model`, the live UI's budget bar and the exporter's `decodetop_budget_*` series) with
one `BudgetContext`, so they print the same figures with the same provenance. Stdlib only (no torch).

    composition = compose(BudgetContext(scenario, results, observed=observed, gpu=gpu_hint(seen="NVIDIA H200")))
    composition.budget          # decodetop.budget.compose.Budget: what every surface draws
    composition.measured        # the budget inputs read from the results (key times, curves, layer checks)

The rules (the same for every surface):

- the device kind is the results' (their `Environment`), else the probe group's, else a GPU's when one is named;
  results of another device kind are left out, with a note.
- on CPU ranks nothing is attributed to a GPU: no roofline ("n/a on CPU"), no roofline estimates (a component not
  measured has no figure), and the header says "CPU ranks (gloo): timings show the method, not a GPU".
- a figure not measured exactly comes from the curve engine over every point the results hold
  (`decodetop.budget.curves`: interpolated, extrapolated or transferred, labelled, with an 80 % range), computed
  against the budget's hardware (on CPU ranks against the measured copy bandwidth and matrix peak: ratios only);
  where no curve anchors it, a roofline estimate (GPUs) or no figure with the command that measures it (CPU ranks).
  `BudgetContext.unmeasured="roofline"` takes exact points only and estimates every other from the roofline.
- on GPUs the hardware is the results' GPU, else the context's `GpuHint` (detected, named by a flag, or assumed,
  said in words); its memory bandwidth is the measured device copy when the results hold one, else a flag's, else
  the datasheet's. Estimates are for that hardware, marked as such.
- a measured figure says whether it was measured in this run, or earlier (age, host, device) for results read back
  from a file or the history (`BudgetContext.stored_at_s`).
- the observed step says where it came from (`ObservedStep`; the one rule is `decodetop.pipeline.observed`): a
  default is "assumed, not observed".
- rows holding all-reduces say which path the engine runs (`--allreduce`, `decodetop.budget.engine_paths`) and why.
- with two or more ranks, every rank's own total, the spread and the straggler (`decodetop.pipeline.ranks`).
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from decodetop.budget.compose import Budget, compose_budget
from decodetop.budget.curves import CurveEngine
from decodetop.budget.engine_paths import EngineCurve
from decodetop.budget.gpus import find_gpu
from decodetop.budget.inventory import StepInventory
from decodetop.budget.keys import AllreduceKey
from decodetop.budget.plan import ProbePlan, build_plan
from decodetop.budget.roofline import Hardware, Roofline, hardware_for, roofline, weights_fit_warning
from decodetop.budget.scenario import Scenario
from decodetop.budget.segment import Segment
from decodetop.history import format_age
from decodetop.pipeline.context import UNMEASURED_ROOFLINE, BudgetContext, GpuHint, assumed_gpu
from decodetop.pipeline.ranks import compose_ranks
from decodetop.probes.contention import contention_of
from decodetop.probes.hooks import MeasuredSet
from decodetop.probes.plan_hooks import measured_from_results
from decodetop.probes.results import Environment, ProbeResult
from decodetop.textfmt import format_bytes

CPU_HEADER = "CPU ranks (gloo): timings show the method, not a GPU"
CPU_HARDWARE = "n/a on CPU"


@dataclass(frozen=True)
class Composition:
    """A composed budget with what it was composed from: the roofline and hardware, which results were used, and
    the budget inputs read from them."""

    budget: Budget
    roofline: Roofline | None
    hardware: Hardware | None
    used: tuple[ProbeResult, ...]
    """The results the budget uses (those of the budget's device kind)."""
    measured: MeasuredSet
    """Key times, curves, layer composition checks and reference figures read from `used`."""


def taken_at_s(result: ProbeResult) -> float | None:
    """When a result was taken (Unix seconds, from its start time), or None where it does not say."""
    if not result.started_utc:
        return None
    try:
        return datetime.fromisoformat(result.started_utc.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def stored_times(results: Sequence[ProbeResult], *, before_s: float | None = None) -> dict[str, float]:
    """Probe → when its result was taken, for results measured earlier (all of them, or those taken before
    `before_s`: the start of this session)."""
    taken = {r.probe: t for r in results if (t := taken_at_s(r)) is not None}
    return {p: t for p, t in taken.items() if before_s is None or t < before_s}


def _device_text(env: Environment | None) -> str:
    if env is None:
        return "unknown device"
    if env.device_kind != "cuda":
        return f"{env.world_size} CPU ranks"
    name = env.gpu_names[0] if env.gpu_names else "GPU"
    return f"{env.world_size} × {name}"


def _provenance(seg: Segment, origin: Mapping[str, ProbeResult], stored: Mapping[str, float], now_s: float) -> Segment:
    """A measured segment's provenance refined to 'measured in this run' or 'measured earlier: age, host, device'."""
    if seg.provenance_kind != "measured":
        return seg
    earlier = [p for p in seg.probes if p in stored]
    if not earlier:
        text = f"{seg.curve_label} (curves measured in this run)" if seg.curve_label else "measured in this run"
        return dataclasses.replace(seg, provenance_kind="measured_now", provenance=text)
    oldest = min(earlier, key=lambda p: stored[p])
    res = origin.get(oldest)
    env = res.environment if res is not None else None
    host = env.host if env is not None else "unknown host"
    age = format_age(max(0.0, now_s - stored[oldest]))
    text = f"measured earlier: {age} ago on {host} ({_device_text(env)})"
    if seg.curve_label:
        text = f"{seg.curve_label} (curves {text})"
    return dataclasses.replace(seg, provenance_kind="measured_earlier", provenance=text)


def _hardware(env: Environment | None, gpu: GpuHint | None, copy_gbps: float | None) -> tuple[Hardware | None, str]:
    """The hardware of a GPU budget and the words saying what it is and how it was chosen."""
    if env is not None and env.gpu_names:
        name, how = env.gpu_names[0], "the probe results' GPU"
    else:
        hint = gpu if gpu is not None else assumed_gpu()
        name, how = hint.name, hint.how
    row = find_gpu(name)
    bandwidth, bw_source = None, ""
    if copy_gbps:
        bandwidth, bw_source = copy_gbps, "measured device copy (gemm probe reference, read + write)"
    elif gpu is not None and gpu.bandwidth_gbps:
        bandwidth, bw_source = gpu.bandwidth_gbps, gpu.bandwidth_source or "given"
    if row is None and bandwidth is None:
        return None, f"{name}: not in the hardware table (pass --gpu or --bandwidth-tbps)"
    latency = gpu.allreduce_latency_us if gpu is not None else None
    hw = hardware_for(
        row,
        bandwidth_gbps=bandwidth,
        bandwidth_source=bw_source or "measured",
        allreduce_latency_us=latency,
        latency_source=(gpu.latency_source if gpu is not None else "") or "measured",
        gpu_name=row.name if row is not None else name,
    )
    return hw, f"{hw.gpu_name} ({how})"


def _usable(ctx: BudgetContext) -> tuple[list[ProbeResult], Environment | None, str, list[str]]:
    """The results of the budget's device kind, their environment, that kind, and a note on what was left out."""
    good = [r for r in ctx.results if r.ok]
    env = next((r.environment for r in good if r.environment is not None), None)
    kind = env.device_kind if env is not None else (ctx.group_kind or "cuda")
    used = [r for r in good if r.environment is None or r.environment.device_kind == kind]
    notes: list[str] = []
    if len(used) < len(good):
        left = sorted({r.probe for r in good if r not in used})
        notes.append(f"left out results from another device kind than {kind}: {', '.join(left)}")
    return used, env, kind, notes


def _warnings(inventory: StepInventory, hw: Hardware | None) -> tuple[str, ...]:
    """What makes a GPU budget's figures moot (weights that do not fit the GPU's memory)."""
    fit = weights_fit_warning(inventory, hw.gpu_name) if hw is not None else ""
    return (fit,) if fit else ()


def compose(ctx: BudgetContext) -> Composition:
    """The budget of `ctx.scenario` from `ctx.results` (see the module docstring for the rules)."""
    scenario = ctx.scenario
    inventory = scenario.inventory()
    used, env, kind, notes = _usable(ctx)
    plan = ctx.plan or build_plan(inventory)
    mode = inventory.deployment.launch_mode
    choice = inventory.deployment.allreduce
    measured = _read(used, mode, plan, choice)
    notes.extend(measured.notes)
    roof: Roofline | None = None
    hw: Hardware | None = None
    header = ""
    if kind == "cpu":
        hw_text, header = CPU_HARDWARE, CPU_HEADER
    else:  # the roofline of this hardware estimates what no curve anchors (or everything, `unmeasured="roofline"`)
        hw, hw_text = _hardware(env, ctx.gpu, measured.copy_gbps)
        if hw is not None:
            roof = roofline(inventory, hw)
    exact_only = ctx.unmeasured == UNMEASURED_ROOFLINE
    times = measured.times
    target = _target(ctx, hw, notes)
    estimate = hw
    if target is not None and hw is not None:  # another GPU model: nothing was measured on it, all is carried
        header = (
            f"predicted for {target.gpu_name} from the curves measured on {hw.gpu_name} (no curves from such a GPU): "
            "every figure transferred (±50 %, one ratio for all: the total's range keeps it), the all-reduce and the "
            f"launch cost roofline estimates for {target.gpu_name}"
        )
        roof, estimate, times = roofline(inventory, target), target, {}
        hw_text = f"{target.gpu_name} ({ctx.target_gpu.how if ctx.target_gpu else ''})"
    engine = _engine(measured, hw, measure_hint(scenario), exact_only, target)
    budget = compose_budget(
        inventory,
        times,
        curves=engine,
        launch_mode=mode,
        target_tps=ctx.target_tps,
        roofline=roof,
        estimate=estimate,
        observed=ctx.observed,
        hardware_text=hw_text,
        device_kind=kind,
        header=header,
        scenario=scenario.fingerprint_id,
        notes=tuple(notes),
    )
    now = time.time() if ctx.now_s is None else ctx.now_s
    origin = {r.probe: r for r in used}
    sizes = allreduce_sizes(inventory)
    group = env.world_size if env is not None else None
    segments = tuple(
        allreduce_path(
            _provenance(s, origin, ctx.stored_at_s, now),
            measured,
            sizes.get(s.component, ()),
            choice,
            kind,
            group=group,
        )
        for s in budget.segments
    )
    ranks = None
    if target is None and ctx.per_rank:
        ranks = compose_ranks(
            inventory, used, launch_mode=mode, plan=plan, estimate=hw, device_kind=kind, allreduce=choice
        )
    budget = dataclasses.replace(
        budget,
        segments=segments,
        ranks=ranks,
        tp_source=scenario.tp_source,
        contention=contention_of(used),
        warnings=_warnings(inventory, hw),
    )
    return Composition(budget=budget, roofline=roof, hardware=hw, used=tuple(used), measured=measured)


# --- what one set of results gives every composition of it (what-ifs compose many) -------------------------------

_CACHE_SIZE = 8
_cache_lock = threading.Lock()
_reads: OrderedDict[tuple[object, ...], tuple[tuple[ProbeResult, ...], MeasuredSet]] = OrderedDict()
_engines: OrderedDict[tuple[object, ...], tuple[MeasuredSet, CurveEngine]] = OrderedDict()


def _read(used: Sequence[ProbeResult], mode: str, plan: ProbePlan, choice: str) -> MeasuredSet:
    """`measured_from_results` of `used`, kept for the next composition of the same results read the same way
    (the launch mode, the plan's TP group for the all-reduce, the all-reduce choice): a what-if composes each of its
    variants from one set of results."""
    held = tuple(used)
    key = (tuple(id(r) for r in held), mode, plan.allreduce_ranks, choice)
    with _cache_lock:
        hit = _reads.get(key)
        if hit is not None and all(a is b for a, b in zip(hit[0], held, strict=True)):
            _reads.move_to_end(key)
            return hit[1]
    measured = measured_from_results(held, launch_mode=mode, plan=plan, allreduce=choice)
    with _cache_lock:
        _reads[key] = (held, measured)
        while len(_reads) > _CACHE_SIZE:
            _reads.popitem(last=False)
    return measured


def _target(ctx: BudgetContext, hw: Hardware | None, notes: list[str]) -> Hardware | None:
    """The GPU model to predict for where `ctx.target_gpu` names one other than the results' (`hw`), at its
    datasheet figures; None where it is the same model, not in the table, or the results come from CPU ranks."""
    if ctx.target_gpu is None:
        return None
    row = find_gpu(ctx.target_gpu.name)
    if hw is None:
        notes.append(f"{ctx.target_gpu.name}: curves of CPU ranks do not carry to a GPU; the target GPU is ignored")
        return None
    if row is None or find_gpu(hw.gpu_name) is row:
        return None
    return hardware_for(row, gpu_name=row.name)


def _engine(
    measured: MeasuredSet, hw: Hardware | None, hint: str, exact_only: bool, target: Hardware | None = None
) -> CurveEngine:
    """The curve engine of `measured` against `hw`, kept with its self-check for the next composition of it."""
    key = (id(measured), hw, hint, exact_only, target)
    with _cache_lock:
        hit = _engines.get(key)
        if hit is not None and hit[0] is measured:
            _engines.move_to_end(key)
            return hit[1]
    engine = measured.engine(hw, measure_hint=hint, exact_only=exact_only, target=target)
    with _cache_lock:
        _engines[key] = (measured, engine)
        while len(_engines) > _CACHE_SIZE:
            _engines.popitem(last=False)
    return engine


def measure_hint(scenario: Scenario) -> str:
    """The command a refusal of the curve engine names: this model's plan at this TP (its plan measures the curves
    beside its own keys)."""
    return f"`decodetop probe {scenario.source.flag_text} --tp {scenario.tp} --budget --json FILE`"


# --- the engine's all-reduce path -------------------------------------------------------------------------------


def allreduce_sizes(inventory: StepInventory) -> dict[str, tuple[int, ...]]:
    """Component → the message sizes (bytes) of the step's all-reduces in it, ascending."""
    out: dict[str, tuple[int, ...]] = {}
    for comp, ops in inventory.by_component().items():
        sizes = {op.key.bytes for op in ops if isinstance(op.key, AllreduceKey) and op.key.collective == "all_reduce"}
        if sizes:
            out[comp.value] = tuple(sorted(sizes))
    return out


def _dist_label(label: str, device_kind: str) -> str:
    """torch.distributed's own all-reduce is gloo on CPU ranks (the engine rule calls it NCCL)."""
    return "gloo" if label == "NCCL" and device_kind == "cpu" else label


def curve_path_text(curve: EngineCurve, device_kind: str = "cuda") -> str:
    """'custom one-shot ≤ 4 MiB, NCCL above (vLLM at TP 2 over NVLink: custom all-reduce below 8 MiB)', or 'NCCL
    assumed: custom all-reduce cannot run here (NCCL_P2P_DISABLE=1 is set: …)' where one path covers every size."""
    runs: list[tuple[str, int, str]] = []  # (label, largest size, reason of the run's first size)
    for size, path in curve.paths:
        label = _dist_label(path.label, device_kind)
        if runs and runs[-1][0] == label:
            runs[-1] = (label, size, runs[-1][2])
        else:
            runs.append((label, size, path.reason))
    if not runs:
        return ""
    reason = next((r for label, _s, r in runs if label.startswith("custom")), runs[0][2])
    if len(runs) == 1:
        label = runs[0][0]
        return f"{label} ({reason})" if label.startswith("custom") else f"{label} assumed: {reason}"
    parts = [f"{label} ≤ {format_bytes(size)}" for label, size, _r in runs[:-1]] + [f"{runs[-1][0]} above"]
    return f"{', '.join(parts)} ({reason})"


def allreduce_path(
    seg: Segment,
    measured: MeasuredSet,
    sizes: Sequence[int],
    choice: str,
    device_kind: str,
    *,
    group: int | None = None,
) -> Segment:
    """`seg` with the all-reduce path its figure assumes (`Segment.path`, `path_text`, `path_rule`) and that text after
    its provenance, where the segment holds all-reduces (`sizes`, bytes) and has a figure. `group`: the ranks the
    results ran on (a group of one GPU measures no all-reduce)."""
    if not sizes or seg.ms is None:
        return seg
    dist = _dist_label("NCCL", device_kind)
    engine = measured.allreduce_paths.get("all_reduce")
    rule = f"--allreduce {choice}" if choice != "auto" else ""
    if engine is not None:
        at = [p for p in (engine.path_at(size) for size in sizes) if p is not None]
        labels = list(dict.fromkeys(_dist_label(p.label, device_kind) for p in at))
        path, text = "+".join(labels), curve_path_text(engine, device_kind)
        chosen = [p for _s, p in engine.paths]
        first = next((p for p in chosen if p.path == "custom"), chosen[0] if chosen else None)
        rule = (first.source if first is not None else "") or rule or "--allreduce auto"
    elif "all_reduce" in measured.allreduce_curves:
        why = "--allreduce nccl" if choice == "nccl" else "these results hold no custom all-reduce points"
        path, text = dist, f"{dist} as measured ({why})"
    elif seg.estimated:
        path = dist
        why = "no all-reduce measured here"
        if group == 1:
            why = "one GPU in the probe group measures no all-reduce (a P2P all-reduce needs two or more)"
        text = f"NCCL assumed: {why}; the roofline's latency is NCCL's (or --allreduce-us)"
        if choice == "custom":
            text += "; --allreduce custom needs the allreduce probe's custom points"
    else:
        return seg
    provenance = f"{seg.provenance}; all-reduce: {text}"
    return dataclasses.replace(seg, path=path, path_text=text, path_rule=rule, provenance=provenance)
