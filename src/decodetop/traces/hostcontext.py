"""Provides each unit's host context: the annotation, module and operator ranges open on the launching thread when
its launch call ran (linked by correlation id), or the GPU-side annotations open when it ran where no launch is
linked; each distinct stack of enclosing frames is stored once."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from decodetop.traces.reader import HOST_ANNOTATION, NO_ID, Trace
from decodetop.traces.units import Units, sort_ranges


@dataclass(frozen=True)
class Stack:
    frames_inner_first: tuple[int, ...]
    kinds_inner_first: tuple[int, ...]
    shape: int


class _StackTable:
    """Distinct enclosing-frame stacks, each stored once; units hold an index into it."""

    def __init__(self) -> None:
        self.stacks: list[Stack] = []
        self._ids: dict[Stack, int] = {}

    def intern(self, stack: Stack) -> int:
        """The index of `stack`, adding it once."""
        got = self._ids.get(stack)
        if got is None:
            got = self._ids[stack] = len(self.stacks)
            self.stacks.append(stack)
        return got


def attach_context(trace: Trace, units: Units, source: str, skip: set[int]) -> list[Stack]:
    """Fill `units.stack` with an index into the returned list of distinct enclosing-frame stacks. Frames named in
    `skip` (step markers: a new name every step, and no context) are left out, so stacks repeat across steps."""
    table = _StackTable()
    ranges: dict[int, list[int]] = defaultdict(list)
    for i in range(trace.n_host):
        ranges[trace.host_thread[i]].append(i)
    queries: dict[int, list[int]] = defaultdict(list)
    for u in range(len(units.name)):
        if units.launch_thread[u] != NO_ID:
            queries[units.launch_thread[u]].append(u)
    for thread, us in queries.items():
        order = ranges.get(thread, [])
        sort_ranges(order, trace.host_ts_us, trace.host_dur_us)
        us.sort(key=units.launch_ts.__getitem__)
        _thread_stacks(trace, units, us, order, cpu=source == "cpu", skip=skip, table=table)
    # Units with no linked launch (no runtime events, or graph kernels without correlation): GPU-side annotations.
    orphans = [u for u in range(len(units.name)) if units.stack[u] == NO_ID]
    if orphans:
        _annotation_stacks(trace, units, orphans, skip=skip, table=table)
    return table.stacks


def _thread_stacks(
    trace: Trace, units: Units, us: list[int], order: list[int], *, cpu: bool, skip: set[int], table: _StackTable
) -> None:
    """One thread's sweep: the host ranges open when each unit was launched (units and ranges sorted by time)."""
    ts, dur = trace.host_ts_us, trace.host_dur_us
    open_: list[int] = []
    j = 0
    for u in us:
        q = units.launch_ts[u]
        while j < len(order) and ts[order[j]] <= q:
            r = order[j]
            while open_ and ts[open_[-1]] + dur[open_[-1]] < ts[r]:
                open_.pop()
            open_.append(r)
            j += 1
        while open_ and ts[open_[-1]] + dur[open_[-1]] < q:
            open_.pop()
        live = [r for r in open_ if ts[r] + dur[r] >= q and trace.host_name[r] not in skip]
        if cpu:  # the unit's own range is on the stack: drop it
            live = [r for r in live if not (ts[r] == units.ts[u] and trace.host_name[r] == units.name[u])]
        shape = next((trace.host_shape[r] for r in reversed(live) if trace.host_shape[r] != NO_ID), NO_ID)
        units.stack[u] = table.intern(
            Stack(
                tuple(trace.host_name[r] for r in reversed(live)),
                tuple(trace.host_kind[r] for r in reversed(live)),
                shape,
            )
        )


def _annotation_stacks(trace: Trace, units: Units, orphans: list[int], *, skip: set[int], table: _StackTable) -> None:
    """Stacks of the GPU-side annotations open when each unit ran (units in time order)."""
    ga = list(range(len(trace.ga_name)))
    sort_ranges(ga, trace.ga_ts_us, trace.ga_dur_us)
    open_: list[int] = []
    j = 0
    for u in orphans:
        q = units.ts[u]
        while j < len(ga) and trace.ga_ts_us[ga[j]] <= q:
            open_.append(ga[j])
            j += 1
        open_ = [r for r in open_ if trace.ga_ts_us[r] + trace.ga_dur_us[r] >= q]
        frames = tuple(trace.ga_name[r] for r in reversed(open_) if trace.ga_name[r] not in skip)
        units.stack[u] = table.intern(Stack(frames, tuple(HOST_ANNOTATION for _ in frames), NO_ID))
