"""Provides the timing harness: CUDA events, CUDA-graph replay, host timers, input rotation and sample counts.

Every timer returns per-op times in microseconds, one sample per repetition, after a warm-up (lazy module loading
and JIT make first launches orders of magnitude slower: docs/reference/probes.md §3). Summaries are `results.Stats`.

- `time_events(fn, ops, samples, warmup)`: CUDA events around `ops` back-to-back calls → device time per op,
  including the gaps between kernels (what nccl-tests reports as pipelined time: docs/reference/probes.md §1).
- `time_graph(fn, ops, samples, warmup)`: captures `ops` calls into one CUDA graph (warm-up on a side stream
  first), replays it `samples` times with events → per-op time with the host's launch cost removed.
- `time_host(fn, ops, samples, warmup, sync)`: perf_counter around `ops` calls followed by `sync()` → host-visible
  time per op (CPU ranks, launch costs, synced latency).
- `Rotation`: cycles through enough copies of an input that the working set exceeds the cache, so
  bandwidth-bound work reads memory rather than L2 (docs/reference/probes.md §4: rotate > 2× L2).
- `plan_counts`: scales ops/samples down for slow points so each point fits a time budget (as do_bench does
  with its time budgets: docs/reference/probes.md §4).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import torch

T = TypeVar("T")
"""What a `Rotation` holds (a tensor, a tuple of tensors)."""

#: Rotate over at least this multiple of the cache size (docs/reference/probes.md §4: "total size > 2x L2").
ROTATION_CACHE_FACTOR = 2.0


def rotation_count(
    buffer_bytes: int, cache_bytes: int, max_copies: int = 64, factor: float = ROTATION_CACHE_FACTOR
) -> int:
    """How many copies of a `buffer_bytes` input make a working set above `factor` × `cache_bytes` (≥ 1)."""
    if buffer_bytes <= 0:
        raise ValueError(f"buffer_bytes must be positive, got {buffer_bytes}")
    if cache_bytes < 0:
        raise ValueError(f"cache_bytes must not be negative, got {cache_bytes}")
    needed = math.floor(factor * cache_bytes / buffer_bytes) + 1
    return max(1, min(max_copies, needed))


class Rotation(Generic[T]):
    """A fixed ring of inputs: `next()` returns the next one, so consecutive calls touch different memory."""

    def __init__(self, items: Sequence[T]):
        if not items:
            raise ValueError("Rotation needs at least one item")
        self.items = list(items)
        self._i = 0

    @classmethod
    def build(cls, make: Callable[[], T], buffer_bytes: int, cache_bytes: int, max_copies: int = 64) -> Rotation[T]:
        """`rotation_count(...)` fresh inputs from `make()`."""
        return cls([make() for _ in range(rotation_count(buffer_bytes, cache_bytes, max_copies))])

    def __len__(self) -> int:
        return len(self.items)

    def rewind(self) -> None:
        """Start the ring again at its first input (a check reads the copy the kernel read)."""
        self._i = 0

    def next(self) -> T:
        """The next input of the ring."""
        item = self.items[self._i]
        self._i = (self._i + 1) % len(self.items)
        return item


@dataclass(frozen=True)
class Counts:
    """How many ops per sample and samples to take for one point."""

    ops: int
    samples: int


def plan_counts(
    est_op_us: float, budget_ms: float, *, max_ops: int, max_samples: int, min_samples: int = 3, min_ops: int = 1
) -> Counts:
    """Ops per sample and samples so that ops × samples × est_op_us stays near `budget_ms`.

    Samples are kept first (spread needs samples); ops per sample shrink down to `min_ops`, then samples down to
    `min_samples`. A fast point gets the maxima.
    """
    if est_op_us <= 0 or not math.isfinite(est_op_us):
        return Counts(max_ops, max_samples)
    budget_ops = max(1.0, budget_ms * 1000.0 / est_op_us)
    if budget_ops >= max_ops * max_samples:
        return Counts(max_ops, max_samples)
    ops = max(min_ops, min(max_ops, int(budget_ops // max_samples)))
    samples = max(min_samples, min(max_samples, int(budget_ops // ops)))
    return Counts(ops, samples)


def new_event() -> torch.cuda.Event:
    """A CUDA event that records time."""
    return torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]


def _check(ops: int, samples: int, warmup: int) -> None:
    if ops < 1 or samples < 1 or warmup < 0:
        raise ValueError(f"need ops ≥ 1, samples ≥ 1, warmup ≥ 0; got {ops}, {samples}, {warmup}")


def time_host(
    fn: Callable[[], Any], ops: int, samples: int, warmup: int = 1, sync: Callable[[], Any] | None = None
) -> list[float]:
    """Host time per op (µs): perf_counter around `ops` calls of `fn` and one `sync()`, `samples` times."""
    _check(ops, samples, warmup)
    for _ in range(warmup):
        fn()
    if sync is not None:
        sync()
    out: list[float] = []
    for _ in range(samples):
        t0 = time.perf_counter_ns()
        for _ in range(ops):
            fn()
        if sync is not None:
            sync()
        out.append((time.perf_counter_ns() - t0) / 1000.0 / ops)
    return out


def time_host_and_events(
    fn: Callable[[], Any], ops: int, samples: int, warmup: int = 1
) -> tuple[list[float], list[float]]:
    """Per-op µs two ways over the same loops: host clock around `ops` calls + synchronize (nccl-tests' method,
    docs/reference/probes.md §1), and CUDA events around the same calls (device span, without the final sync's
    wake-up)."""
    _check(ops, samples, warmup)
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    host: list[float] = []
    device: list[float] = []
    for _ in range(samples):
        start, end = new_event(), new_event()
        t0 = time.perf_counter_ns()
        start.record()
        for _ in range(ops):
            fn()
        end.record()
        torch.cuda.synchronize()
        host.append((time.perf_counter_ns() - t0) / 1000.0 / ops)
        device.append(start.elapsed_time(end) * 1000.0 / ops)
    return host, device


def time_events(fn: Callable[[], Any], ops: int, samples: int, warmup: int = 1) -> list[float]:
    """Device time per op (µs) from CUDA events around `ops` back-to-back calls on the current stream."""
    _check(ops, samples, warmup)
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    pairs = []
    for _ in range(samples):
        start, end = new_event(), new_event()
        start.record()
        for _ in range(ops):
            fn()
        end.record()
        pairs.append((start, end))
    torch.cuda.synchronize()
    return [s.elapsed_time(e) * 1000.0 / ops for s, e in pairs]


def capture_graph(fn: Callable[[], Any], ops: int, warmup: int = 2) -> torch.cuda.CUDAGraph:
    """A CUDA graph of `ops` calls of `fn`, warmed up on a side stream first (required for NCCL ops in capture)."""
    side = torch.cuda.Stream()  # type: ignore[no-untyped-call]
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(max(1, warmup)):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(ops):
            fn()
    torch.cuda.synchronize()
    return graph


#: Host time allowed per timed replay when the GPU is held back so the host can enqueue the whole loop first (µs).
#: On the 2 × H200 VM one replay's enqueue (two event records and a graph launch) took up to ~100 µs in a slow
#: process (docs/benchmarks.md, "The proof on 2 GPUs"); without the lead a small graph ran at the host's pace.
HOST_LEAD_US_PER_SAMPLE = 150.0
#: Clock the sleep kernel's cycle count is converted with (GHz). Below the boost clocks of H100/H200 (1.98 GHz) and
#: RTX PRO 6000 (~2.6 GHz): a slower-clocked GPU only sleeps longer, which is harmless.
SLEEP_CLOCK_GHZ = 2.0
#: Longest lead (µs), so a long loop never parks the GPU for more than this.
MAX_HOST_LEAD_US = 20_000.0


def hold_gpu_for_host(samples: int) -> None:
    """Queue a sleep kernel long enough for the host to enqueue `samples` timed replays behind it, so the timed
    replays run back to back on the GPU and no host gap lands inside an event pair (no-op without `_sleep`)."""
    sleep = getattr(torch.cuda, "_sleep", None)
    if sleep is None:
        return
    lead_us = min(MAX_HOST_LEAD_US, HOST_LEAD_US_PER_SAMPLE * samples)
    sleep(int(lead_us * SLEEP_CLOCK_GHZ * 1000.0))


def time_graph_replay(graph: torch.cuda.CUDAGraph, ops: int, samples: int, warmup: int = 2) -> list[float]:
    """Device time per op (µs): CUDA events around each replay of a graph holding `ops` ops, replayed back to back.

    The GPU is held by a sleep kernel while the host enqueues the loop (`hold_gpu_for_host`): otherwise a graph shorter
    than the host's per-replay cost is timed at the host's pace — and for a collective, at the slower rank's host pace
    on every rank."""
    _check(ops, samples, warmup)
    for _ in range(warmup):
        graph.replay()
    torch.cuda.synchronize()
    pairs = [(new_event(), new_event()) for _ in range(samples)]
    hold_gpu_for_host(samples)
    for start, end in pairs:
        start.record()
        graph.replay()
        end.record()
    torch.cuda.synchronize()
    return [s.elapsed_time(e) * 1000.0 / ops for s, e in pairs]


def time_graph(
    fn: Callable[[], Any], ops: int, samples: int, warmup: int = 2, keep: Callable[[Any], Any] | None = None
) -> list[float]:
    """Capture `ops` calls of `fn` into a graph and time its replays (per op, µs); the graph is freed after."""
    graph = capture_graph(fn, ops, warmup)
    if keep is not None:
        keep(graph)
    try:
        return time_graph_replay(graph, ops, samples, warmup)
    finally:
        graph.reset()


def fit_line(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """Least-squares y = a + b·x; returns (a, b). Needs at least two distinct x."""
    if len(xs) != len(ys) or len(xs) < 2:
        raise ValueError("fit_line needs two or more (x, y) pairs")
    n = len(xs)
    mx = math.fsum(xs) / n
    my = math.fsum(ys) / n
    sxx = math.fsum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        raise ValueError("fit_line needs at least two distinct x values")
    b = math.fsum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx
    return my - b * mx, b
