"""Provides `OpRunner` (one op at one measurement key's exact shape, ready to time) and how the component probes
time it and report it as a point (torch side).

Each probe's worker module builds its own runners (`decodetop.probes.worker.<probe>`: the kernels live with the
probe) and exposes `op_runner(key_id, ctx, *, rotate)`, the default runner of one of its keys. The `layer` probe
strings those together through `op_runner_for`, which finds a key's probe in the registry, so a layer and the sum
of its parts are timed with the same kernels.

`TimingOptions.time` times an op: CUDA-graph replay on GPUs (the launch cost is a separate budget line; falls
back to CUDA events when capture fails, and says so), the host clock on CPU ranks. A kernel that cannot run here
raises `UnsupportedError` with the reason; `measure` turns that into an `unsupported` point instead of failing.
"""

from __future__ import annotations

import importlib
import math
import statistics
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, TypeVar, cast

import torch

from decodetop.budget.kernels import KernelClass
from decodetop.budget.keys import ProbeKey, parse_key_id
from decodetop.probes.results import MeasurementStatus, RankMeasurement
from decodetop.probes.worker.context import InsufficientMemoryError, ProbeContext, UnsupportedError
from decodetop.probes.worker.tensors import first_line
from decodetop.probes.worker.timing import capture_graph, time_events, time_graph_replay, time_host

#: Ops per captured graph at least this long in total, so one replay's fixed cost (~15 µs:
#: docs/reference/probes.md §3) and the event resolution stay small against it.
MIN_GRAPH_US = 200.0
#: Most ops captured into one graph (capture time and graph memory grow with it).
MAX_GRAPH_OPS = 256

#: A point's parameters as the probes write them (JSON scalars).
PointParams = Mapping[str, object]
#: A probe's key type (`GemmKey`, `NormKey`, ...).
KeyT = TypeVar("KeyT", bound=ProbeKey)


@dataclass
class OpRunner:
    """One op at one key's shape, ready to time."""

    fn: Callable[[], object]
    moved_bytes: float
    """Bytes one instance reads + writes from memory (weights, KV, activations)."""
    flops: float
    rotation: int = 1
    """Copies of the inputs `fn` cycles through (call it this many times to touch each once)."""
    note: str = ""
    weight_bytes: float = 0.0
    kv_bytes: float = 0.0
    kernel: KernelClass | None = None
    """The class of kernel `fn` runs (engine, decodetop Triton, torch, CPU), carried onto the point."""
    facts: Mapping[str, float] = field(default_factory=dict)
    """Metrics the point records beside its timing (a GQA split-K launch's shape, SM count and split)."""


class OpRunnerFactory(Protocol):
    """What a component probe's worker module exposes as `op_runner`: the default runner of one of its keys."""

    def __call__(self, key_id: str, ctx: ProbeContext, *, rotate: bool) -> OpRunner: ...


def op_runner_for(key_id: str, ctx: ProbeContext, *, rotate: bool) -> OpRunner:
    """The default runner of any key: the `op_runner` of the worker module its probe's spec names.

    `UnsupportedError` when the key's probe has no `op_runner` (its work cannot be one op in a layer)."""
    probe = parse_key_id(key_id).PROBE
    spec = ctx.registry.get(probe)
    module = importlib.import_module(spec.module)
    factory = module.__dict__.get("op_runner")
    if not callable(factory):
        raise UnsupportedError(f"the {probe} probe ({spec.module}) has no op_runner")
    return cast(OpRunnerFactory, factory)(key_id, ctx, rotate=rotate)


@dataclass(frozen=True)
class Timing:
    """Per-op samples (µs) and how they were taken."""

    samples: tuple[float, ...]
    method: str
    note: str = ""

    @property
    def median_us(self) -> float:
        return statistics.median(self.samples)


def time_runner(
    ctx: ProbeContext,
    runner: OpRunner,
    *,
    budget_ms: float,
    max_samples: int,
    min_samples: int = 3,
    graph: bool = True,
    collective: bool = False,
) -> Timing:
    """Time one op: CUDA-graph replay (or events) on GPUs, host clock on CPU; about `budget_ms` per point.

    collective: the op talks to the other ranks, so every rank must run the same counts (the estimate is agreed).
    """
    fn = runner.fn
    rot = max(1, runner.rotation)

    def agreed(value: float) -> float:
        return ctx.agree_max(value) if collective else value

    if not ctx.is_cuda:
        est = agreed(statistics.median(time_host(fn, 1, 1, warmup=1)))
        samples = _clamp(int(budget_ms * 1000.0 / max(est, 1e-3)), min_samples, max_samples)
        return Timing(tuple(time_host(fn, 1, samples, warmup=0)), "host")
    est = agreed(statistics.median(time_events(fn, rot, 2, warmup=rot)))
    reps = max(1, math.ceil(MIN_GRAPH_US / max(est * rot, 1e-3)))
    ops = max(rot, min(MAX_GRAPH_OPS // rot * rot or rot, rot * reps))
    samples = _clamp(int(budget_ms * 1000.0 / max(est * ops, 1e-3)), min_samples, max_samples)
    if graph:
        try:
            g = ctx.keep_graph(capture_graph(fn, ops, warmup=2))
            try:
                return Timing(tuple(time_graph_replay(g, ops, samples, warmup=2)), "graph")
            finally:
                g.reset()
        except Exception as exc:
            torch.cuda.synchronize()
            reason = f"graph capture failed ({type(exc).__name__}: {str(exc).splitlines()[0][:120]}); events timing"
            return Timing(tuple(time_events(fn, ops, samples, warmup=1)), "events", reason)
    return Timing(tuple(time_events(fn, ops, samples, warmup=1)), "events")


def _clamp(value: int, lo: int, hi: int) -> int:
    return max(lo, min(hi, value))


@dataclass(frozen=True)
class TimingOptions:
    """How long and how often to time each point, and whether to rotate inputs, on this rank."""

    budget_ms: float
    max_samples: int
    min_samples: int
    rotate: bool
    graph: bool

    @classmethod
    def from_params(cls, ctx: ProbeContext, params: Mapping[str, object]) -> TimingOptions:
        """GPU: `budget_ms`, `samples`, rotation as asked. CPU ranks: `cpu_samples` (few) and no rotation, so a
        70B shard's GEMMs finish in seconds on two cores (each note says so). The rank's loop already split the
        host's cores between the CPU ranks (`timing.share_cpu_threads`)."""
        budget_ms = float(cast(float, params["budget_ms"]))
        if ctx.is_cuda:
            return cls(budget_ms, int(cast(int, params["samples"])), 5, bool(params["rotate"]), True)
        n = max(1, int(cast(int, params["cpu_samples"])))
        return cls(budget_ms, n, min(2, n), False, False)

    @property
    def cpu_note(self) -> str:
        return "" if self.graph else f"CPU: host timer, {self.max_samples} reps max, no rotation"

    def time(
        self,
        ctx: ProbeContext,
        runner: OpRunner,
        *,
        graph: bool | None = None,
        collective: bool = False,
        budget_scale: float = 1.0,
    ) -> Timing:
        """`time_runner` with these options (`graph` None: the options' own; `budget_scale` × the time target)."""
        return time_runner(
            ctx,
            runner,
            budget_ms=self.budget_ms * budget_scale,
            max_samples=self.max_samples,
            min_samples=self.min_samples,
            graph=self.graph if graph is None else graph,
            collective=collective,
        )


def point(
    name: str,
    params: PointParams,
    runner: OpRunner,
    timing: Timing,
    *,
    copy_gbps: float = 0.0,
    peak_tflops: float = 0.0,
    note: str = "",
) -> RankMeasurement:
    """A measured point: samples in µs, plus time_us, GB/s, TFLOP/s, and % of the copy bandwidth / matrix peak."""
    med = timing.median_us
    gbps = runner.moved_bytes / med / 1e3 if med > 0 else 0.0
    metrics: dict[str, float] = {"time_us": med, "gbps": gbps, "moved_bytes": float(runner.moved_bytes)}
    if runner.flops:
        metrics["tflops"] = runner.flops / med / 1e6 if med > 0 else 0.0
    if runner.weight_bytes:
        metrics["weight_bytes"] = float(runner.weight_bytes)
    if runner.kv_bytes:
        metrics["kv_bytes"] = float(runner.kv_bytes)
        metrics["kv_gbps"] = runner.kv_bytes / med / 1e3 if med > 0 else 0.0
    if copy_gbps > 0:
        metrics["copy_bw_pct"] = 100.0 * gbps / copy_gbps
    if peak_tflops > 0 and runner.flops:
        metrics["peak_pct"] = 100.0 * metrics["tflops"] / peak_tflops
    metrics["rotation"] = float(runner.rotation)
    metrics.update(runner.facts)
    notes = [n for n in (runner.note, timing.note, note) if n]
    return RankMeasurement(
        name,
        {**params, "method": timing.method},
        "us",
        samples=timing.samples,
        metrics=metrics,
        note="; ".join(notes),
        kernel=runner.kernel,
    )


def not_run(name: str, params: PointParams, exc: BaseException) -> RankMeasurement:
    """An `unsupported` point for `UnsupportedError` (and out-of-memory), a `failed` one for anything else."""
    if isinstance(exc, (UnsupportedError, InsufficientMemoryError)):
        return RankMeasurement(name, params, "us", status=MeasurementStatus.UNSUPPORTED, note=str(exc))
    text = f"{type(exc).__name__}: {first_line(exc)}"
    return RankMeasurement(name, params, "us", status=MeasurementStatus.FAILED, note=text[:300])


def measure(
    ctx: ProbeContext,
    opts: TimingOptions,
    name: str,
    params: PointParams,
    build: Callable[[], OpRunner],
    *,
    note: str = "",
    copy_gbps: float = 0.0,
    peak_tflops: float = 0.0,
) -> RankMeasurement:
    """Build the runner, time it, and free its memory; any failure becomes a not-run point with the reason."""
    try:
        runner = build()
        timing = opts.time(ctx, runner)
        full_note = "; ".join(n for n in (note, opts.cpu_note) if n)
        return point(name, params, runner, timing, note=full_note, copy_gbps=copy_gbps, peak_tflops=peak_tflops)
    except Exception as exc:
        if ctx.is_cuda:
            torch.cuda.synchronize(ctx.device)
        return not_run(name, params, exc)
    finally:
        free_memory(ctx)


def key_list(params: Mapping[str, object], probe: str) -> list[str]:
    """The probe's `keys` parameter, each a key id of this probe (checked)."""
    out = []
    for kid in cast(list[object], params["keys"]):
        key = parse_key_id(str(kid))
        if probe != key.PROBE:
            raise ValueError(f"{probe}: key {kid!r} belongs to the {key.PROBE} probe")
        out.append(key.key_id)
    return out


def each_key(
    ctx: ProbeContext, keys: Sequence[str], kind: type[KeyT], *, total: int | None = None
) -> Iterator[tuple[str, KeyT]]:
    """Each key id with its parsed key (a `kind`), reporting "key i/n ID" progress before each (n: `total` where
    the probe counts more steps than keys)."""
    n = len(keys) if total is None else total
    for index, kid in enumerate(keys):
        key = parse_key_id(kid)
        assert isinstance(key, kind)
        ctx.progress(f"key {index + 1}/{n} {kid}", index, n)
        yield kid, key


def kernels_note(ctx: ProbeContext, build: Callable[[], OpRunner]) -> str:
    """'kernels: name (µs), …' of one call of the op under torch.profiler (CUDA only): which kernel torch picked,
    its tile and split-K shape in the cuBLAS/CUTLASS name, and each kernel's time."""
    try:
        from torch.profiler import ProfilerActivity, profile

        runner = build()
        runner.fn()
        torch.cuda.synchronize(ctx.device)
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            runner.fn()
            torch.cuda.synchronize(ctx.device)
        parts = []
        for evt in prof.key_averages():
            us = evt.self_device_time_total
            if us and us > 0:
                parts.append(f"{evt.key[:110]} ({us / max(1, evt.count):.1f} µs)")
        del runner
        return "kernels: " + ", ".join(parts) if parts else "kernels: none seen by the profiler"
    except Exception as exc:
        return f"kernel names unavailable ({type(exc).__name__}: {first_line(exc)[:80]})"
    finally:
        free_memory(ctx)


def free_memory(ctx: ProbeContext) -> None:
    """Return cached blocks to the device between keys (big weights of one key must not crowd out the next)."""
    if ctx.is_cuda:
        torch.cuda.synchronize(ctx.device)
        torch.cuda.empty_cache()
