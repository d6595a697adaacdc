"""Provides the `allreduce` probe: latency and bandwidth of torch.distributed all-reduce per message size.

Three modes per size (docs/reference/probes.md §7.1, docs/reference/h200-machine.md):

- `pipelined`: N back-to-back ops per sample then one synchronize, host clock / N, exactly as nccl-tests times
  (docs/reference/probes.md §1). On GPUs CUDA events around the same N ops give `event_time_us` too (the device span).
- `graph`: the N ops captured into one CUDA graph, replayed; time / N. CUDA only: strips the host's launch cost.
- `synced`: every op followed by a device synchronize, host-timed; p50 and p99.

bf16 on GPUs (the TP activation dtype), fp32 on gloo (gloo has no bf16 sum on every build). Metrics per point:
`time_us` (median; p50 for synced), `algbw_gbps` = bytes / time, `busbw_gbps` = algbw · 2(n−1)/n
(nccl-tests' all-reduce bus bandwidth: docs/reference/probes.md §1), and `p99_us` for synced. The sum is checked once
per size, outside the timing (inputs rank+1 everywhere; expected n(n+1)/2). Timed buffers hold zeros, so repeated
in-place sums never overflow.

Implementations (`impls`): `nccl` — torch.distributed's own all-reduce, all three modes, each point's `impl` naming
the group's backend (`nccl` on GPUs, `gloo` on CPU ranks) — and the engines'
kernel class, P2P `one_shot` / `two_shot` through torch's symmetric memory (graph and pipelined modes, sizes up to
`custom_max_bytes`; `multimem` only with the `multimem` opt-in): `decodetop.probes.worker.symm_allreduce`.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from decodetop.budget.keys import AllreduceKey, parse_key_id
from decodetop.probes.results import MeasurementStatus, RankMeasurement, RankOutput, Stats
from decodetop.probes.worker.context import ProbeContext, UnsupportedError
from decodetop.probes.worker.ops import OpRunner
from decodetop.probes.worker.tensors import randn
from decodetop.probes.worker.timing import Counts, plan_counts, time_graph, time_host, time_host_and_events
from decodetop.textfmt import format_bytes

MODES = ("pipelined", "graph", "synced")
#: One all-gather into one output tensor. torch 2.13 renamed `all_gather_into_tensor` to `all_gather_single` (same
#: arguments) and made the old name warn FutureWarning on every call (pytorch/pytorch#186124), which counted as two
#: warnings of the ranks on every plan with an all-gather; older torch has only the old name.
_all_gather_single = dist.all_gather_single if hasattr(dist, "all_gather_single") else dist.all_gather_into_tensor
#: Ops used to estimate one op's time before planning the counts (not kept).
_ESTIMATE_OPS = 3


def bus_factor(world_size: int) -> float:
    """busbw / algbw for all-reduce: 2(n−1)/n (nccl-tests doc/PERFORMANCE.md, docs/reference/probes.md §1)."""
    return 2.0 * (world_size - 1) / world_size


def metrics_for(nbytes: int, time_us: float, world_size: int) -> dict[str, float]:
    """time_us, algbw_gbps (1 GB = 1e9 B, as nccl-tests) and busbw_gbps for one all-reduce of `nbytes`."""
    algbw = nbytes / time_us / 1e3 if time_us > 0 else 0.0
    return {"time_us": time_us, "algbw_gbps": algbw, "busbw_gbps": algbw * bus_factor(world_size)}


def collective_runner(key: AllreduceKey, ctx: ProbeContext) -> OpRunner:
    """One all-reduce or all-gather of exactly `bytes` per rank, bf16 on GPUs (fp32 on gloo), on the group."""
    if key.ranks != ctx.world_size:
        raise UnsupportedError(f"plan needs {key.ranks} ranks for {key.collective}, the group has {ctx.world_size}")
    if ctx.world_size < 2:
        raise UnsupportedError("a collective needs two or more ranks")
    dt = torch.bfloat16 if ctx.is_cuda else torch.float32
    numel = max(1, key.bytes // dt.itemsize)
    buf = randn((numel,), dt, ctx.device, std=1e-3)
    if key.collective == "all_reduce":

        def all_reduce() -> None:
            dist.all_reduce(buf)

        return OpRunner(all_reduce, 2.0 * key.bytes, 0.0)
    if key.collective == "all_gather":
        out = torch.empty(numel * ctx.world_size, dtype=dt, device=ctx.device)

        def all_gather() -> None:
            _all_gather_single(out, buf)

        return OpRunner(all_gather, key.bytes * (1 + ctx.world_size), 0.0)
    raise UnsupportedError(f"collective {key.collective!r} is not all_reduce or all_gather")


def op_runner(key_id: str, ctx: ProbeContext, *, rotate: bool) -> OpRunner:
    """A layer's all-reduce (or all-gather) of the key's exact size on this group."""
    key = parse_key_id(key_id)
    assert isinstance(key, AllreduceKey)
    return collective_runner(key, ctx)


def _sizes(params: dict[str, Any]) -> list[int]:
    sizes = [int(s) for s in params["sizes"]] + [int(s) for s in params["extra_sizes"]]
    for s in sizes:
        if s <= 0:
            raise ValueError(f"all-reduce size must be positive, got {s}")
    return sorted(set(sizes))


def run(ctx: ProbeContext, params: dict[str, Any]) -> RankOutput:
    """Sweep the sizes on every rank; returns this rank's samples and metrics per (size, mode, impl)."""
    from decodetop.probes.worker import symm_allreduce

    sizes = _sizes(params)
    impls = [str(i) for i in params.get("impls", ["nccl"])]
    modes = [str(m) for m in params["modes"]]
    bad = [m for m in modes if m not in MODES]
    if bad:
        raise ValueError(f"unknown all-reduce mode(s) {bad} (known: {', '.join(MODES)})")
    for key in ("ops_per_sample", "samples", "min_samples", "synced_ops"):
        if int(params[key]) < 1:
            raise ValueError(f"all-reduce parameter {key} must be at least 1, got {params[key]}")
    dtype = torch.bfloat16 if ctx.is_cuda else torch.float32
    elsize = torch.tensor([], dtype=dtype).element_size()
    ctx.require_free_bytes(max(sizes) + elsize, "all-reduce buffer")
    out: list[RankMeasurement] = []
    for index, size in enumerate(sizes if "nccl" in impls else []):
        ctx.progress(f"{format_bytes(size)}", index, len(sizes))
        out.extend(_nccl_size(ctx, params, size, dtype, modes))
    custom = [i for i in impls if i != "nccl"]
    out.extend(symm_allreduce.run_custom(ctx, params, sizes=sizes, modes=modes, impls=custom, metrics_for=metrics_for))
    ctx.progress("done", len(sizes), len(sizes))
    return RankOutput(measurements=tuple(out))


def _nccl_size(
    ctx: ProbeContext, params: dict[str, Any], size: int, dtype: torch.dtype, modes: list[str]
) -> list[RankMeasurement]:
    """The backend's all-reduce of one size, checked to sum right, then measured in each mode."""
    elsize = torch.tensor([], dtype=dtype).element_size()
    numel = max(1, size // elsize)
    nbytes = numel * elsize
    buf = torch.empty(numel, dtype=dtype, device=ctx.device)
    _check_sum(ctx, buf)
    buf.zero_()

    def op(buf: torch.Tensor = buf) -> None:
        dist.all_reduce(buf)

    # Estimate one op (host time, synced), agreed across ranks so every rank runs the same number of ops.
    est_us = statistics.median(time_host(op, 1, _ESTIMATE_OPS, warmup=int(params["warmup_ops"]), sync=ctx.synchronize))
    est_us = ctx.agree_max(est_us)
    base = {
        "size_bytes": nbytes,
        "dtype": str(dtype).replace("torch.", ""),
        "world_size": ctx.world_size,
        "impl": ctx.backend,
    }
    return [_measure_mode(ctx, params, op, est_us, {**base, "mode": mode}) for mode in modes]


def _measure_mode(
    ctx: ProbeContext, params: dict[str, Any], op: Callable[[], None], est_us: float, point: dict[str, Any]
) -> RankMeasurement:
    """One size in one mode (`point["mode"]`): its samples, bus bandwidth and, where they apply, the tail and the
    device-event time."""
    mode, nbytes, n = point["mode"], point["size_bytes"], ctx.world_size
    name = f"allreduce {format_bytes(nbytes)} {mode}"
    if mode == "graph" and not ctx.is_cuda:
        return RankMeasurement(name, point, "us", status=MeasurementStatus.UNSUPPORTED, note="CUDA graphs need a GPU")
    counts = mode_counts(params, est_us, mode)
    ctx.host_barrier()
    device_samples: list[float] = []
    if mode == "pipelined":
        if ctx.is_cuda:
            samples, device_samples = time_host_and_events(
                op, counts.ops, counts.samples, warmup=int(params["warmup_ops"])
            )
        else:
            samples = time_host(op, counts.ops, counts.samples, warmup=1)
    elif mode == "graph":
        samples = time_graph(op, counts.ops, counts.samples, warmup=2, keep=ctx.keep_graph)
        ctx.release_graphs()
    else:
        samples = time_host(op, 1, counts.samples, warmup=1, sync=ctx.synchronize)
    stats = Stats.from_samples(samples, "us")
    metrics = metrics_for(nbytes, stats.median, n)
    metrics["ops_per_sample"] = float(counts.ops)
    if mode == "synced":
        metrics["p99_us"] = stats.p99
    if device_samples:
        metrics["event_time_us"] = Stats.from_samples(device_samples, "us").median
    note = "one rank: nothing is exchanged, this is the call's own cost" if n == 1 else ""
    return RankMeasurement(name, point, "us", samples=tuple(samples), metrics=metrics, note=note)


def mode_counts(params: dict[str, Any], est_us: float, mode: str) -> Counts:
    """Ops per sample and samples for one size in `mode` (synced: one op per sample, up to `synced_ops`)."""
    synced = mode == "synced"
    return plan_counts(
        est_us,
        float(params["budget_ms"]),
        max_ops=1 if synced else int(params["ops_per_sample"]),
        max_samples=int(params["synced_ops" if synced else "samples"]),
        min_samples=int(params["min_samples"]),
    )


def _check_sum(ctx: ProbeContext, buf: torch.Tensor) -> None:
    """Fill with rank+1, all-reduce once, expect n(n+1)/2 everywhere.

    bf16 holds integers exactly up to 256 (8 significant bits), so rank+1 works up to 22 ranks; beyond that every
    rank adds 1 (sum n, exact up to 256 ranks).
    """
    n = ctx.world_size
    exact_limit = 22
    value = ctx.rank + 1 if n <= exact_limit else 1
    buf.fill_(value)
    dist.all_reduce(buf)
    expected = n * (n + 1) / 2 if n <= exact_limit else float(n)
    wrong = int((buf != expected).sum().item())
    if wrong:
        first = buf[(buf != expected).nonzero()[0]].item()
        raise RuntimeError(
            f"all-reduce sum is wrong at {format_bytes(buf.numel() * buf.element_size())}: "
            f"{wrong} of {buf.numel()} elements differ from {expected:g} (e.g. {first:g})"
        )
