"""Provides `contention_of`: the other processes (and the foreign load) NVML saw on the probed GPUs while probes ran,
read from the snapshots every result carries (no torch; the type and its words are `decodetop.budget.contention`).

Each result's `Environment.extra` holds, per GPU, an NVML snapshot before the probe (`nvml_before`: utilisation with
the ranks idle, compute processes) and after it (`nvml_after`: compute processes, each with its mean SM utilisation
over NVML's samples since the probe started), and the probe group's own pids (`probe_pids`, the ranks and their
children): a compute process outside those is someone else's. A GPU busy before a probe (NVML utilisation at least
`FOREIGN_BUSY_PCT`) while the ranks waited, where NVML names no such process (another container's), is foreign load.
Results without `probe_pids` (older files) cannot tell a rank from a neighbour: only their foreign load counts.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from decodetop.budget.contention import Contention, ForeignLoad, GpuNeighbour
from decodetop.probes.results import ProbeResult

FOREIGN_BUSY_PCT = 50
"""NVML's utilisation of a GPU (the share of its sample period, 1/6 s to 1 s, with a kernel running:
https://docs.nvidia.com/deploy/nvml-api/structnvmlUtilization__t.html) at or above which a GPU whose probe ranks
wait idle before a probe is running someone else's kernels; the same bar as the straggler's 'busy before the
probes' (`decodetop.probes.rankbudget.IDLE_BUSY_PCT`), there relative to the other GPUs, here absolute since one
GPU has no others."""


def _int(value: Any) -> int | None:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _rows(extra: Mapping[str, Any], key: str) -> Iterable[Mapping[str, Any]]:
    rows = extra.get(key)
    for row in rows if isinstance(rows, list) else []:
        if isinstance(row, Mapping) and _int(row.get("cuda_index")) is not None:
            yield row


def _others(row: Mapping[str, Any], own: set[int]) -> Iterable[tuple[int, str, int | None]]:
    """(pid, name, SM %) of the row's compute processes outside `own`."""
    procs = row.get("processes")
    for proc in procs if isinstance(procs, list) else []:
        pid = _int(proc.get("pid")) if isinstance(proc, Mapping) else None
        if pid is None or pid in own:
            continue
        name = proc.get("name")
        yield pid, name if isinstance(name, str) and name else "?", _int(proc.get("sm_util_pct"))


def contention_of(results: Sequence[ProbeResult]) -> Contention:
    """Everything else that ran on the probed GPUs during `results` (empty on CPU ranks and without snapshots)."""
    seen: dict[tuple[int, int], dict[str, Any]] = {}
    busy_before: dict[int, list[int]] = {}
    for result in results:
        env = result.environment
        if env is None or env.device_kind != "cuda":
            continue
        pids = env.extra.get("probe_pids")
        own = {p for p in (_int(x) for x in pids) if p is not None} if isinstance(pids, list) else None
        for key in ("nvml_before", "nvml_after"):
            for row in _rows(env.extra, key):
                gpu = int(row["cuda_index"])
                util = _int(row.get("gpu_util_pct"))
                if key == "nvml_before" and util is not None:
                    busy_before.setdefault(gpu, []).append(util)
                for pid, name, sm in _others(row, own) if own is not None else ():
                    entry = seen.setdefault((gpu, pid), {"name": name, "sm": None, "probes": []})
                    if sm is not None and key == "nvml_after":  # the after snapshot's samples span the run
                        entry["sm"] = max(sm, entry["sm"] or 0)
                    if result.probe not in entry["probes"]:
                        entry["probes"].append(result.probe)
    neighbours = tuple(
        GpuNeighbour(gpu, pid, e["name"], e["sm"], tuple(e["probes"])) for (gpu, pid), e in sorted(seen.items())
    )
    named = {n.gpu for n in neighbours}
    foreign = tuple(
        ForeignLoad(gpu, round(statistics.median(utils)))
        for gpu, utils in sorted(busy_before.items())
        if gpu not in named and statistics.median(utils) >= FOREIGN_BUSY_PCT
    )
    return Contention(neighbours, foreign)
