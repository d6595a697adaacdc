"""Provides the units a trace's analysis attributes, in time order: the kernels (with memcpys and memsets) of the
busiest GPU, each linked to its launch by correlation id; or, in a CPU-only trace, the CPU operators by self time."""

from __future__ import annotations

import bisect
from array import array
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

from decodetop.errors import UserInputError
from decodetop.traces.reader import GPU_KERNEL, HOST_OP, NO_ID, Trace

GRAPH_LAUNCH = "GraphLaunch"
"""Runtime calls whose name holds this launch a CUDA (or HIP) graph: cudaGraphLaunch, cudaGraphLaunch_v10000,
hipGraphLaunch. Every kernel of the replay carries the launch's correlation id (CUPTI/roctracer)."""


@dataclass
class Units:
    """The things attributed, in time order: one row per kernel (or CPU operator)."""

    name: array[int]
    ts: array[float]
    dur: array[float]
    """Time attributed to the unit: a kernel's duration; a CPU operator's self time (children excluded)."""
    launch_ts: array[float]
    launch_thread: array[int]
    stack: array[int]
    end: array[float]
    """Where the unit's span ends (ts + full duration), for step windows."""
    exclusive: bool = False
    """True when `dur` are self times that partition the covered time (CPU ops): busy = their sum."""
    graph: array[int] = field(default_factory=lambda: array("b"))
    """1 where the unit was replayed by a graph launch (no host operators around it), else 0."""
    corr: array[int] = field(default_factory=lambda: array("q"))
    """The unit's correlation id (graph-replayed kernels share their launch's)."""


def gpu_units(trace: Trace, device: int | None) -> tuple[Units, str]:
    per_device: dict[int, float] = defaultdict(float)
    for kind, dev, dur in zip(trace.gpu_kind, trace.gpu_device, trace.gpu_dur_us, strict=False):
        if kind == GPU_KERNEL:
            per_device[dev] += dur
    if device is None:
        device = max(per_device, key=per_device.__getitem__)
    elif device not in per_device:
        raise UserInputError(
            f"{trace.path}: no kernels on device {device} (devices with kernels: {sorted(per_device)})"
        )
    order = sorted((i for i in range(trace.n_gpu) if trace.gpu_device[i] == device), key=trace.gpu_ts_us.__getitem__)
    # Launch lookup by correlation id over sorted columns (a dict of tuples would cost ~200 B per launch).
    by_corr = sorted((i for i, c in enumerate(trace.rt_corr) if c != NO_ID), key=trace.rt_corr.__getitem__)
    corr_sorted = array("q", (trace.rt_corr[i] for i in by_corr))
    launch_ts = array("d", (trace.rt_ts_us[i] for i in by_corr))
    launch_thread = array("i", (trace.rt_thread[i] for i in by_corr))
    graph_ids = {i for i, name in enumerate(trace.names) if GRAPH_LAUNCH in name}
    graph_corr = {trace.rt_corr[i] for i in by_corr if trace.rt_name[i] in graph_ids} if graph_ids else set()
    del by_corr
    units = _empty_units()
    for i in order:
        units.name.append(trace.gpu_name[i])
        units.ts.append(trace.gpu_ts_us[i])
        units.dur.append(trace.gpu_dur_us[i])
        corr = trace.gpu_corr[i]
        k = bisect.bisect_left(corr_sorted, corr) if corr != NO_ID else len(corr_sorted)
        found = k < len(corr_sorted) and corr_sorted[k] == corr
        units.launch_ts.append(launch_ts[k] if found else -1.0)
        units.launch_thread.append(launch_thread[k] if found else NO_ID)
        units.stack.append(NO_ID)
        units.end.append(trace.gpu_ts_us[i] + trace.gpu_dur_us[i])
        units.graph.append(1 if corr != NO_ID and corr in graph_corr else 0)
        units.corr.append(corr)
    return units, f"cuda:{device}" if device >= 0 else "gpu"


def _empty_units() -> Units:
    return Units(array("l"), array("d"), array("d"), array("d"), array("l"), array("l"), array("d"))


def cpu_units(trace: Trace) -> Units:
    """Every CPU operator, with its self time (its duration minus its direct children's), so that an op that
    does its work itself (aten::mm) and one that only calls others (aten::linear) are both counted once."""
    by_thread: dict[int, list[int]] = defaultdict(list)
    for i in range(trace.n_host):
        if trace.host_kind[i] == HOST_OP:
            by_thread[trace.host_thread[i]].append(i)
    ts, dur = trace.host_ts_us, trace.host_dur_us
    self_us: dict[int, float] = {}
    for idx in by_thread.values():
        sort_ranges(idx, ts, dur)
        open_: list[int] = []
        for i in idx:
            while open_ and ts[open_[-1]] + dur[open_[-1]] <= ts[i]:
                open_.pop()
            self_us[i] = dur[i]
            if open_:
                parent = open_[-1]
                self_us[parent] = self_us[parent] - dur[i]
            open_.append(i)
    ops = sorted(self_us, key=ts.__getitem__)
    units = _empty_units()
    units.exclusive = True
    for i in ops:
        units.name.append(trace.host_name[i])
        units.ts.append(ts[i])
        units.dur.append(max(0.0, self_us[i]))
        units.launch_ts.append(ts[i])
        units.launch_thread.append(trace.host_thread[i])
        units.stack.append(NO_ID)
        units.end.append(ts[i] + dur[i])
        units.graph.append(0)
        units.corr.append(NO_ID)
    return units


def sort_ranges(idx: list[int], ts: Sequence[float], dur: Sequence[float]) -> None:
    """Sort range indices by start, the longer (enclosing) range first on equal starts, in place. Two stable sorts
    with float keys: tuple keys would cost ~100 B per range at once."""
    idx.sort(key=dur.__getitem__, reverse=True)
    idx.sort(key=ts.__getitem__)
