"""Provides the likely causes of a straggler rank from what probe results recorded (stdlib only, no torch), for the
per-rank composition (`decodetop.pipeline.ranks`).

    rank_causes(envs, ranks=[0, 1], device_kind="cuda")   # {1: ['another process on GPU 1: …', …]}

Likely causes (`rank_causes`), from each result's `Environment`: the NVML snapshots the controller takes before
and after every probe (`extra["nvml_before"]`/`["nvml_after"]`, one row per GPU: SM clock, clock-event reasons
and, where recorded, compute processes, PCIe link and NUMA node) and the `nvidia-smi topo -m` text (its NUMA
Affinity column). Rank r runs on CUDA device r (`probes.worker.init_device`).
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from decodetop.budget.ranks import STRAGGLER_RELATIVE_FLOOR
from decodetop.collectors.telemetry import CLOCK_EVENT_BY_NAME, decode_clock_event_reasons
from decodetop.probes.results import Environment

_SNAPSHOT_KEYS = ("nvml_before", "nvml_after")
IDLE_BUSY_PCT = 50
"""A GPU busy this share of NVML's utilisation sample period (1/6 s to 1 s: https://docs.nvidia.com/deploy/nvml-api/
structnvmlUtilization__t.html) before a probe, while the probe's ranks wait idle, runs someone else's kernels; a
previous probe's tail shows on every GPU of the group alike, so the others' figure is subtracted."""


def rank_label(rank: int, device_kind: str) -> str:
    """'GPU 1' or 'CPU rank 1'."""
    return f"GPU {rank}" if device_kind == "cuda" else f"CPU rank {rank}"


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
