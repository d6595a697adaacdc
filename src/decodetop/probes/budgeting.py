"""Provides `compose`: the one composition of a budget from a scenario and probe results, called by every surface
(`decodetop budget`, `decodetop probe --budget`, the live UI's budget bar and the exporter's `decodetop_budget_*`
series), so they print the same figures with the same provenance. Stdlib only (no torch).

    budget = compose(
        scenario,                       # decodetop.budget.scenario.Scenario
        results,                        # ProbeResults: fresh, read back with results.load_results, or from history
        observed=ObservedStep(12.3, "server", "http://127.0.0.1:30000/metrics, 30 s window, 4 s ago"),
        target_tps=309.0,
        gpu=GpuHint("NVIDIA H200", "detected by NVML"),     # what the host has, when the results do not say
        group_kind="cuda",              # the probe group's device kind, when known without results
        stored_at_s={"gemm": 1.8e9},    # results read back from the history: when each was measured
        now_s=time.time(),
    )

The rules (the same for every surface):

- the device kind is the results' (their `Environment`), else the probe group's, else a GPU's when one is named;
  results of another device kind are left out, with a note.
- on CPU ranks nothing is attributed to a GPU: no roofline ("n/a on CPU"), no roofline estimates (a component not
  measured has no figure), and the header says "CPU ranks (gloo): timings show the method, not a GPU".
- on GPUs the hardware is the results' GPU, else `gpu` (detected, named by a flag, or assumed, said in words); its
  memory bandwidth is the measured device copy when the results hold one, else a flag's, else the datasheet's.
  Components not measured are roofline estimates for that hardware, marked as such.
- a measured figure says whether it was measured in this run, or earlier (age, host, device) for results read back
  from the history.
- the observed step says where it came from (`ObservedStep`): a default is "assumed, not observed".
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from decodetop import __version__
from decodetop.budget.compose import DEFAULT_TARGET_TPS, Budget, ObservedStep, Segment, compose_budget
from decodetop.budget.engine_paths import EngineCurve
from decodetop.budget.gpus import GPUS, find_gpu
from decodetop.budget.inventory import StepInventory
from decodetop.budget.keys import AllreduceKey
from decodetop.budget.plan import ProbePlan, build_plan
from decodetop.budget.ranks import mean_line, rank_lines
from decodetop.budget.roofline import Hardware, Roofline, hardware_for, roofline
from decodetop.budget.scenario import Scenario
from decodetop.history import Fingerprint, format_age, local_host_id
from decodetop.probes.hooks import MeasuredSet
from decodetop.probes.rankbudget import compose_ranks
from decodetop.probes.results import Environment, ProbeResult
from decodetop.textfmt import format_bytes, format_number, table

CPU_HEADER = "CPU ranks (gloo): timings show the method, not a GPU"
CPU_HARDWARE = "n/a on CPU"
ASSUMED_GPU_KEY = "rtx-pro-6000"
"""The GPU assumed where none is seen and none is named: the seed host's (docs/architecture.md, the 95 ms step)."""


@dataclass(frozen=True)
class GpuHint:
    """The GPU a budget is for when the results do not say: its name and how it was chosen, in words."""

    name: str
    """An NVML device name or a hardware-table key ("NVIDIA H200", "h200")."""
    how: str
    """"detected by NVML", "--gpu", "assumed: no --gpu and no GPU seen"."""
    bandwidth_gbps: float | None = None
    """A measured memory bandwidth to use instead of the datasheet's (`--bandwidth-tbps`)."""
    bandwidth_source: str = ""
    allreduce_latency_us: float | None = None
    """A measured small-message all-reduce latency (`--allreduce-us`)."""
    latency_source: str = ""


def assumed_gpu() -> GpuHint:
    """The GPU `decodetop budget` assumes where it sees none and none is named."""
    return GpuHint(GPUS[ASSUMED_GPU_KEY].name, "assumed: no --gpu and no GPU seen")


@dataclass(frozen=True)
class Composition:
    """A composed budget with what it was composed from (the roofline, and which results were used)."""

    budget: Budget
    roofline: Roofline | None
    hardware: Hardware | None
    used: tuple[ProbeResult, ...]
    """The results the budget uses (those of the budget's device kind)."""


def compose(
    scenario: Scenario,
    results: Sequence[ProbeResult] = (),
    *,
    observed: ObservedStep,
    target_tps: float = DEFAULT_TARGET_TPS,
    gpu: GpuHint | None = None,
    group_kind: str | None = None,
    stored_at_s: Mapping[str, float] | None = None,
    now_s: float | None = None,
    allreduce: str | None = None,
) -> Budget:
    """The budget of `scenario` from `results` (see the module docstring for the rules). `allreduce`: auto, nccl or
    custom (None: the scenario's `--allreduce`)."""
    return compose_full(
        scenario,
        results,
        observed=observed,
        target_tps=target_tps,
        gpu=gpu,
        group_kind=group_kind,
        stored_at_s=stored_at_s,
        now_s=now_s,
        allreduce=allreduce,
    ).budget


def compose_full(
    scenario: Scenario,
    results: Sequence[ProbeResult] = (),
    *,
    observed: ObservedStep,
    target_tps: float = DEFAULT_TARGET_TPS,
    gpu: GpuHint | None = None,
    group_kind: str | None = None,
    stored_at_s: Mapping[str, float] | None = None,
    now_s: float | None = None,
    plan: ProbePlan | None = None,
    allreduce: str | None = None,
) -> Composition:
    """`compose`, returning the roofline and hardware too (what `decodetop budget` prints beside the budget)."""
    return compose_inventory(
        scenario.inventory(),
        results,
        observed=observed,
        target_tps=target_tps,
        gpu=gpu,
        group_kind=group_kind,
        stored_at_s=stored_at_s,
        now_s=now_s,
        plan=plan,
        scenario_id=scenario.fingerprint_id,
        tp_source=scenario.tp_source,
        allreduce=allreduce,
    )


def taken_at_s(result: ProbeResult) -> float | None:
    """When a result was taken (Unix seconds, from its start time), or None where it does not say."""
    if not result.started_utc:
        return None
    try:
        return datetime.fromisoformat(result.started_utc.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


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
        return dataclasses.replace(seg, provenance_kind="measured_now", provenance="measured in this run")
    oldest = min(earlier, key=lambda p: stored[p])
    res = origin.get(oldest)
    env = res.environment if res is not None else None
    host = env.host if env is not None else "unknown host"
    age = format_age(max(0.0, now_s - stored[oldest]))
    text = f"measured earlier: {age} ago on {host} ({_device_text(env)})"
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


def compose_inventory(
    inventory: StepInventory,
    results: Sequence[ProbeResult] = (),
    *,
    observed: ObservedStep,
    target_tps: float = DEFAULT_TARGET_TPS,
    gpu: GpuHint | None = None,
    group_kind: str | None = None,
    stored_at_s: Mapping[str, float] | None = None,
    now_s: float | None = None,
    plan: ProbePlan | None = None,
    launch_mode: str | None = None,
    scenario_id: str = "",
    tp_source: str = "",
    allreduce: str | None = None,
) -> Composition:
    """`compose` over a bare inventory (the scenario's, or one a caller built): the single implementation.
    `allreduce` (auto, nccl or custom; None: the inventory deployment's) picks the engine's all-reduce path, and the
    rows holding all-reduces say which path they assumed and why (`allreduce_path`)."""
    # planrun imports this module, and pulls in the probe controller (multiprocessing) that budgets never need
    from decodetop.probes.planrun import measured_from_results

    stored = dict(stored_at_s or {})
    now = time.time() if now_s is None else now_s
    good = [r for r in results if r.ok]
    env = next((r.environment for r in good if r.environment is not None), None)
    kind = env.device_kind if env is not None else (group_kind or "cuda")
    notes: list[str] = []
    used = [r for r in good if r.environment is None or r.environment.device_kind == kind]
    if len(used) < len(good):
        left = sorted({r.probe for r in good if r not in used})
        notes.append(f"left out results from another device kind than {kind}: {', '.join(left)}")
    plan = plan or build_plan(inventory)
    mode = launch_mode or inventory.deployment.launch_mode
    choice = allreduce or inventory.deployment.allreduce
    measured = measured_from_results(used, launch_mode=mode, plan=plan, allreduce=choice)
    notes.extend(measured.notes)
    roof: Roofline | None = None
    hw: Hardware | None = None
    header = ""
    if kind == "cpu":
        hw_text, header = CPU_HARDWARE, CPU_HEADER
    else:
        hw, hw_text = _hardware(env, gpu, measured.copy_gbps)
        if hw is not None:
            roof = roofline(inventory, hw)
    budget = compose_budget(
        inventory,
        measured.times,
        allreduce_curves=measured.allreduce_curves,
        gemm_curves=measured.gemm_curves,
        launch_mode=mode,
        target_tps=target_tps,
        roofline=roof,
        estimate=hw,
        observed=observed,
        hardware_text=hw_text,
        device_kind=kind,
        header=header,
        scenario=scenario_id,
        notes=tuple(notes),
    )
    origin = {r.probe: r for r in used}
    sizes = allreduce_sizes(inventory)
    segments = tuple(
        allreduce_path(
            _provenance(s, origin, stored, now),
            measured,
            sizes.get(s.component, ()),
            choice,
            kind,
            group=env.world_size if env is not None else None,
        )
        for s in budget.segments
    )
    ranks = compose_ranks(inventory, used, launch_mode=mode, plan=plan, estimate=hw, device_kind=kind, allreduce=choice)
    budget = dataclasses.replace(budget, segments=segments, ranks=ranks)
    if tp_source:
        budget = dataclasses.replace(budget, tp_source=tp_source)
    return Composition(budget=budget, roofline=roof, hardware=hw, used=tuple(used))


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


# --- text ------------------------------------------------------------------------------------------------------

TEXT_BAR_WIDTH = 40
MEASURED_CHAR = "█"
ESTIMATED_CHAR = "▒"
REMAINDER_CHAR = "░"


def _bar(ms: float | None, scale: float, char: str) -> str:
    if ms is None or scale <= 0:
        return "?"
    cells = ms / scale * TEXT_BAR_WIDTH
    full = int(cells)
    text = char * full
    if cells - full >= 0.5 or (ms > 0 and not text):
        text += "▌" if char == MEASURED_CHAR else char
    return text


def observed_line(budget: Budget) -> str:
    """'observed 95 ms assumed, not observed (…) | target 309 tok/s = 3.24 ms/step | roofline 4.17 ms/step …'."""
    obs = budget.observed_step
    roof = (
        f"roofline {format_number(budget.roofline_ms)} ms/step for {budget.hardware_text}"
        if budget.roofline_ms is not None
        else f"roofline: {budget.hardware_text or 'n/a here'}"
    )
    return (
        f"observed {obs.text} | target {format_number(budget.target_tps)} tok/s = "
        f"{format_number(budget.target_ms)} ms/step | {roof}"
    )


def format_budget_table(budget: Budget, *, bars: bool = True) -> list[str]:
    """The budget as text lines, the same in `decodetop budget` and `decodetop probe --budget`: a header (CPU ranks),
    one row per component with ms, share of observed, status, bar (measured █, estimated ▒) and where the figure came
    from; total and unexplained; the observed/target/roofline line; the roofline verdict; the summary."""
    b = budget
    scale = max(b.observed_ms, b.total_ms, 1e-9)
    rows: list[list[object]] = []
    for seg in b.segments:
        share = f"{seg.ms / b.observed_ms * 100:.1f}%" if seg.ms is not None else "-"
        char = ESTIMATED_CHAR if seg.estimated else MEASURED_CHAR
        row: list[object] = [seg.label, format_number(seg.ms) if seg.ms is not None else "missing", share, seg.status]
        if bars:
            row.append(_bar(seg.ms, scale, char))
        row.append(seg.provenance)
        rows.append(row)
    total: list[object] = [
        "total" + ("" if b.complete else " (≥, incomplete)"),
        format_number(b.total_ms),
        f"{b.total_ms / b.observed_ms * 100:.1f}%",
        "",
    ]
    un = b.unexplained
    rest: list[object] = [
        "unexplained" + ("" if b.complete else " (≤)"),
        format_number(un.ms or 0.0),
        f"{(un.ms or 0.0) / b.observed_ms * 100:.1f}%",
        un.status,
    ]
    if bars:
        total.append(_bar(b.total_ms, scale, MEASURED_CHAR))
        rest.append(_bar(max(un.ms or 0.0, 0.0), scale, REMAINDER_CHAR))
    total.append("")
    rest.append(un.reason + ("; the observed step is assumed, not observed" if b.observed_step.assumed else ""))
    rows += [total, rest]
    headers = ["component", "ms", "of observed", "status", *(["bar"] if bars else []), "where it came from"]
    lines: list[str] = []
    if b.header:
        lines.append(b.header)
    lines.append(table(headers, rows, align="lrrl" + ("l" if bars else "") + "l"))
    lines.append(observed_line(b))
    if b.verdict:
        lines.append(b.verdict)
    lines.append(b.summary() + (f"; estimates for {b.hardware_text}" if any(s.estimated for s in b.segments) else ""))
    lines.extend(line for line in (mean_line(b), *rank_lines(b)) if line)
    return lines


# --- where results were measured ------------------------------------------------------------------------------

_VERSION_FIELDS = ("driver_version", "cuda_version", "torch_version", "nccl_version")


def fingerprint_of(env: Environment, scenario: Scenario | str) -> Fingerprint:
    """The history fingerprint of a result taken in `env` for `scenario` (its `fingerprint_id`)."""
    scenario_id = scenario if isinstance(scenario, str) else scenario.fingerprint_id
    cuda = env.device_kind == "cuda"
    return Fingerprint(
        host_id=env.host or local_host_id(),
        device_kind="cuda" if cuda else "cpu",
        gpu_name=(env.gpu_names[0] if env.gpu_names else None) if cuda else None,
        gpu_count=env.world_size,
        driver_version=env.driver if cuda else None,
        cuda_version=env.cuda if cuda else None,
        torch_version=env.torch,
        nccl_version=env.nccl if cuda else None,
        decodetop_version=__version__,
        scenario=scenario_id,
    )


def expected_fingerprint(
    scenario: Scenario | str, *, device_kind: str, gpu_count: int, gpu_name: str | None = None
) -> Fingerprint:
    """The fingerprint this session's results will carry, as far as it is known before the probe group has run:
    host, device kind, GPU name and count, decodetop version and scenario; the versions the ranks report (driver,
    CUDA, torch, NCCL) are None until a fresh result gives them (`fingerprint_accepts` treats them as not yet
    known)."""
    scenario_id = scenario if isinstance(scenario, str) else scenario.fingerprint_id
    cuda = device_kind == "cuda"
    return Fingerprint(
        host_id=local_host_id(),
        device_kind="cuda" if cuda else "cpu",
        gpu_name=gpu_name if cuda else None,
        gpu_count=gpu_count,
        driver_version=None,
        cuda_version=None,
        torch_version=None,
        nccl_version=None,
        decodetop_version=__version__,
        scenario=scenario_id,
    )


def fingerprint_accepts(stored: Fingerprint | None, current: Fingerprint, *, exact: bool) -> bool:
    """Whether a stored record may feed the current budget: never one of unknown origin; with `exact` (the current
    fingerprint came from a fresh result), only an equal one; otherwise one equal on every field the current
    fingerprint knows (the versions the ranks report are not known before they ran, a GPU's name not before the
    first NVML tick)."""
    if stored is None:
        return False
    if exact:
        return stored == current
    for f in dataclasses.fields(Fingerprint):
        want = getattr(current, f.name)
        if want is None and (f.name in _VERSION_FIELDS or (f.name == "gpu_name" and current.device_kind == "cuda")):
            continue  # not known before the ranks (or the first NVML tick) said it
        if getattr(stored, f.name) != want:
            return False
    return True
