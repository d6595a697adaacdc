"""Provides the per-rank composition of a budget from probe results (stdlib only, no torch): every rank's budget
from its own times, their spread and step bound (`decodetop.budget.ranks`), and the likely cause of a straggler
from what the results recorded.

    spread = compose_ranks(inventory, results, launch_mode="graph", plan=plan, estimate=hw, device_kind="cuda")
    spread.straggler.text       # 'straggler: GPU 1 (+2.4 ms, +35 % …; likely: another process on GPU 1 …)'

How: each result is narrowed to one rank (`rank_view`: every measurement keeps only that rank's series, stats and
metrics) and read through the same per-probe read hooks as the budget (`planrun.measured_from_results`), then
composed by the same `compose_budget`; so a rank's figure is the budget it would have alone.

Likely causes (`rank_causes`), from each result's `Environment`: the NVML snapshots the controller takes before
and after every probe (`extra["nvml_before"]`/`["nvml_after"]`, one row per GPU: SM clock, clock-event reasons
and, where recorded, compute processes, PCIe link and NUMA node) and the `nvidia-smi topo -m` text (its NUMA
Affinity column). Rank r runs on CUDA device r (`probes.worker.init_device`).
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from decodetop.budget.components import Component
from decodetop.budget.compose import compose_budget
from decodetop.budget.inventory import StepInventory
from decodetop.budget.plan import ProbePlan
from decodetop.budget.ranks import STRAGGLER_RELATIVE_FLOOR, RankSpread, RankTotal, rank_spread
from decodetop.budget.roofline import Hardware
from decodetop.collectors.telemetry import CLOCK_EVENT_BY_NAME, decode_clock_event_reasons
from decodetop.probes.results import Environment, Measurement, ProbeResult

_SNAPSHOT_KEYS = ("nvml_before", "nvml_after")
IDLE_BUSY_PCT = 50
"""A GPU busy this share of NVML's utilisation sample period (1/6 s to 1 s: https://docs.nvidia.com/deploy/nvml-api/
structnvmlUtilization__t.html) before a probe, while the probe's ranks wait idle, runs someone else's kernels; a
previous probe's tail shows on every GPU of the group alike, so the others' figure is subtracted."""


def result_ranks(results: Iterable[ProbeResult]) -> tuple[int, ...]:
    """The ranks that reported a series with stats in any of `results`."""
    found = {r.rank for res in results for m in res.measurements for r in m.per_rank if r.stats is not None}
    return tuple(sorted(found))


def _narrow(m: Measurement, rank: int) -> Measurement:
    series = [r for r in m.per_rank if r.rank == rank]
    if not series:
        return dataclasses.replace(m, per_rank=(), stats=None)
    own = series[0]
    return dataclasses.replace(m, per_rank=(own,), stats=own.stats, metrics={**dict(m.metrics), **dict(own.metrics)})


def rank_view(results: Iterable[ProbeResult], rank: int) -> list[ProbeResult]:
    """`results` as `rank` alone measured them: every measurement keeps only that rank's series (its stats, and its
    own metrics over the averaged ones); a measurement that rank did not report keeps no figure."""
    return [dataclasses.replace(res, measurements=tuple(_narrow(m, rank) for m in res.measurements)) for res in results]


def rank_label(rank: int, device_kind: str) -> str:
    """'GPU 1' or 'CPU rank 1'."""
    return f"GPU {rank}" if device_kind == "cuda" else f"CPU rank {rank}"


def compose_ranks(
    inventory: StepInventory,
    results: Sequence[ProbeResult],
    *,
    launch_mode: str,
    plan: ProbePlan | None,
    estimate: Hardware | None,
    device_kind: str,
    allreduce: str = "auto",
) -> RankSpread | None:
    """Every rank's own budget total, their spread, step bound and straggler (with likely causes); None for fewer
    than two ranks with series."""
    from decodetop.probes.planrun import measured_from_results

    ranks = result_ranks(results)
    if len(ranks) < 2:
        return None
    collective = Component.COMMUNICATION.value
    totals: list[RankTotal] = []
    for rank in ranks:
        measured = measured_from_results(
            rank_view(results, rank), launch_mode=launch_mode, plan=plan, allreduce=allreduce
        )
        b = compose_budget(
            inventory,
            measured.times,
            allreduce_curves=measured.allreduce_curves,
            gemm_curves=measured.gemm_curves,
            launch_mode=launch_mode,
            estimate=estimate,
        )
        known = [s for s in b.segments if s.ms is not None]
        totals.append(
            RankTotal(
                rank=rank,
                label=rank_label(rank, device_kind),
                total_ms=b.total_ms,
                mean_ms=b.mean_total_ms,
                p10_ms=sum(s.p10_ms if s.p10_ms is not None else s.ms or 0.0 for s in known),
                p90_ms=sum(s.p90_ms if s.p90_ms is not None else s.ms or 0.0 for s in known),
                collective_ms=sum(s.ms or 0.0 for s in known if s.component == collective),
                components={s.component: s.ms or 0.0 for s in known},
            )
        )
    intervals = sum(op.count for op in inventory.ops if op.kind == "all_reduce")
    envs = [r.environment for r in results if r.environment is not None]
    causes = rank_causes(envs, ranks, device_kind)
    return rank_spread(totals, intervals=intervals, causes=causes)


# --------------------------------------------------------------------------------------------- likely causes


@dataclass
class _GpuSeen:
    """What the results' snapshots saw on one GPU, over every snapshot."""

    sm_clock_mhz: list[float] = field(default_factory=list)
    reasons: set[str] = field(default_factory=set)
    processes: dict[int, str] = field(default_factory=dict)
    pcie: set[tuple[int, int, int, int]] = field(default_factory=set)
    """(gen, gen max, width, width max) seen."""
    numa: set[int] = field(default_factory=set)
    idle_util_pct: list[int] = field(default_factory=list)
    """Utilisation before each probe (the probe's ranks idle)."""


def _int(value: Any) -> int | None:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _seen_on_gpus(envs: Iterable[Environment]) -> dict[int, _GpuSeen]:
    seen: dict[int, _GpuSeen] = {}
    for env in envs:
        for key in _SNAPSHOT_KEYS:
            rows = env.extra.get(key)
            if not isinstance(rows, list):
                continue
            for row in rows:
                if not isinstance(row, Mapping) or _int(row.get("cuda_index")) is None:
                    continue
                gpu = seen.setdefault(int(row["cuda_index"]), _GpuSeen())
                _add_row(gpu, row)
                util = _int(row.get("gpu_util_pct"))
                if key == "nvml_before" and util is not None:
                    gpu.idle_util_pct.append(util)
        for index, node in topology_numa(env.topology).items():
            seen.setdefault(index, _GpuSeen()).numa.add(node)
    return seen


def _add_row(gpu: _GpuSeen, row: Mapping[str, Any]) -> None:
    clock = _int(row.get("sm_clock_mhz"))
    if clock is not None and clock > 0:
        gpu.sm_clock_mhz.append(float(clock))
    mask = _int(row.get("clock_event_reasons"))
    if mask is not None:
        gpu.reasons.update(
            n
            for n in decode_clock_event_reasons(mask)
            if n in CLOCK_EVENT_BY_NAME and CLOCK_EVENT_BY_NAME[n].severity != "info"
        )
    procs = row.get("processes")
    if isinstance(procs, list):
        for p in procs:
            pid = _int(p.get("pid")) if isinstance(p, Mapping) else None
            if pid is not None:
                gpu.processes[pid] = str(p.get("name", "?"))
    link = tuple(_int(row.get(k)) for k in ("pcie_gen", "pcie_gen_max", "pcie_width", "pcie_width_max"))
    if all(v is not None for v in link):
        gpu.pcie.add((int(link[0] or 0), int(link[1] or 0), int(link[2] or 0), int(link[3] or 0)))
    numa = _int(row.get("numa_node_id"))
    if numa is not None and numa >= 0:
        gpu.numa.add(numa)


def topology_numa(topology: str | None) -> dict[int, int]:
    """GPU index → NUMA node from `nvidia-smi topo -m` text (its "NUMA Affinity" column); empty where absent."""
    if not topology:
        return {}
    lines = topology.splitlines()
    header = next((ln for ln in lines if "NUMA Affinity" in ln), None)
    if header is None:
        return {}
    cells = [c.strip() for c in header.split("\t")]
    col = cells.index("NUMA Affinity") if "NUMA Affinity" in cells else -1
    out: dict[int, int] = {}
    for ln in lines:
        row = [c.strip() for c in ln.split("\t")]
        name = row[0] if row else ""
        if col < 0 or len(row) <= col or not name.startswith("GPU") or not name[3:].isdigit():
            continue
        value = row[col]
        if value.isdigit():
            out[int(name[3:])] = int(value)
    return out


def _clock_cause(rank: int, mine: _GpuSeen, others: list[_GpuSeen], label: str) -> str | None:
    theirs = [min(o.sm_clock_mhz) for o in others if o.sm_clock_mhz]
    if not mine.sm_clock_mhz or not theirs:
        return None
    low, ref = min(mine.sm_clock_mhz), statistics.median(theirs)
    if low < ref * (1.0 - STRAGGLER_RELATIVE_FLOOR):
        return f"SM clock on {label} down to {low:.0f} MHz, the other GPUs' lowest {ref:.0f} MHz"
    return None


def _idle_busy_cause(mine: _GpuSeen, others: list[_GpuSeen], label: str) -> str | None:
    """The GPU was busy before the probes while the probe's ranks were idle (someone else's kernels)."""
    theirs = [statistics.median(o.idle_util_pct) for o in others if o.idle_util_pct]
    if not mine.idle_util_pct or not theirs:
        return None
    own, ref = statistics.median(mine.idle_util_pct), statistics.median(theirs)
    if own - ref >= IDLE_BUSY_PCT:
        return f"{label} {own:.0f} % busy before the probes while their ranks were idle (the other GPUs {ref:.0f} %)"
    return None


def _link_cause(mine: _GpuSeen, others: list[_GpuSeen], label: str) -> str | None:
    """A PCIe link below its maximum where the other GPUs' links are faster (an idle GPU lowers its link speed to
    save power, so a link below its maximum alone is no cause: it must be below the others' too)."""
    theirs = [min((g, w) for g, _, w, _ in o.pcie) for o in others if o.pcie]
    if not mine.pcie or not theirs:
        return None
    gen, gen_max, width, width_max = min(mine.pcie)
    best_gen, best_width = max(g for g, _ in theirs), max(w for _, w in theirs)
    if (gen < gen_max and gen < best_gen) or (width < width_max and width < best_width):
        return (
            f"PCIe link of {label} at Gen{gen} x{width}, below its maximum Gen{gen_max} x{width_max} "
            f"(the other GPUs at Gen{best_gen} x{best_width} or better)"
        )
    return None


def _causes_of(rank: int, seen: Mapping[int, _GpuSeen], label: str) -> list[str]:
    mine = seen.get(rank)
    if mine is None:
        return []
    others = [g for i, g in seen.items() if i != rank]
    causes: list[str] = []
    usual = statistics.median(len(o.processes) for o in others) if others else 0
    if others and len(mine.processes) > usual:
        pids = ", ".join(f"{pid} ({name})" for pid, name in sorted(mine.processes.items()))
        causes.append(
            f"another process on {label}: {len(mine.processes)} compute processes there, {usual:g} on the other GPUs "
            f"(pids {pids})"
        )
    busy = _idle_busy_cause(mine, others, label)
    if busy:
        causes.append(busy)
    clock = _clock_cause(rank, mine, others, label)
    if clock:
        causes.append(clock)
    extra = sorted(mine.reasons - set().union(*(o.reasons for o in others)) if others else mine.reasons)
    if extra:
        causes.append(f"clock-event reasons on {label}: {', '.join(extra)}")
    link = _link_cause(mine, others, label)
    if link:
        causes.append(link)
    their_nodes = [n for o in others for n in o.numa]
    if mine.numa and their_nodes:
        common = statistics.mode(their_nodes)
        if common not in mine.numa:
            nodes = ", ".join(str(n) for n in sorted(mine.numa))
            causes.append(f"{label} is on NUMA node {nodes}, the other GPUs on node {common}")
    return causes


def rank_causes(envs: Sequence[Environment], ranks: Sequence[int], device_kind: str) -> dict[int, list[str]]:
    """Likely causes per rank from the results' recorded environment (module docstring); empty on CPU ranks."""
    if device_kind != "cuda":
        return {}
    seen = _seen_on_gpus(envs)
    return {r: c for r in ranks if (c := _causes_of(r, seen, rank_label(r, device_kind)))}
