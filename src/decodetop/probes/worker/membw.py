"""Provides the `membw` probe: device copy, pinned host↔device copies, and P2P bandwidth and latency per GPU pair.

Device copies and host copies run one rank at a time (each figure is one device's alone); P2P one source at a time.

- `device_copy`: `dst.copy_(src)` on this rank's device, `copy_bytes` each, over a rotation of buffer pairs whose
  total exceeds 2× the last-level cache; `bandwidth_gbps` counts bytes read + written (2 × size), the usual
  device-copy convention (docs/reference/h200-machine.md: 4.1 TB/s read + write on an H200). On CPU ranks this is a real
  host memory copy.
- `h2d` / `d2h`: pinned host buffer ↔ device, `copy_bytes` one way; CUDA only.
- `p2p`: for every ordered GPU pair (i → j), rank i copies `copy_bytes` from its GPU into a buffer on GPU j
  (copy engine, `cudaMemcpyPeer` through torch), and times back-to-back 4-byte copies for the latency. The ranks
  take turns (a host-side barrier between sources) so no two transfers share a link. Rank i opens a CUDA context
  on GPU j for this. CUDA only, two or more GPUs.

GPU timings use CUDA events; CPU timings the host clock. Counts are scaled to `budget_ms` per point.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

import torch

from decodetop.probes.results import MeasurementStatus, RankMeasurement, RankOutput, Stats
from decodetop.probes.worker.context import ProbeContext
from decodetop.probes.worker.timing import Rotation, plan_counts, rotation_count, time_events, time_host
from decodetop.textfmt import format_bytes

#: Bytes of one latency copy (one fp32 element), the smallest copy torch issues.
LATENCY_COPY_BYTES = 4


def _gbps(nbytes: float, time_us: float) -> float:
    return nbytes / time_us / 1e3 if time_us > 0 else 0.0


def _timer(ctx: ProbeContext) -> Callable[..., list[float]]:
    if ctx.is_cuda:
        return time_events
    return time_host


def _bandwidth_point(
    name: str,
    point: dict[str, Any],
    samples: list[float],
    bytes_moved: int,
) -> RankMeasurement:
    stats = Stats.from_samples(samples, "us")
    return RankMeasurement(
        name,
        point,
        "us",
        samples=tuple(samples),
        metrics={"time_us": stats.median, "bandwidth_gbps": _gbps(bytes_moved, stats.median)},
    )


def run(ctx: ProbeContext, params: dict[str, Any]) -> RankOutput:
    """This rank's copy figures, plus the P2P pairs whose source is this rank's GPU."""
    size = int(params["copy_bytes"])
    samples = int(params["samples"])
    warmup = int(params["warmup"])
    budget_ms = float(params["budget_ms"])
    latency_ops = int(params["latency_ops"])
    if size < LATENCY_COPY_BYTES or samples < 1 or warmup < 0 or latency_ops < 1:
        raise ValueError("membw: copy_bytes ≥ 4, samples ≥ 1, latency_ops ≥ 1 and warmup ≥ 0 are required")
    device = ctx.device.type
    out: list[RankMeasurement] = []
    numel = size // 4

    # One rank at a time: concurrent copies on several GPUs would share the host's memory and PCIe root ports
    # (and CPU ranks the same DRAM), and each figure is meant to be one device's alone.
    for turn in range(ctx.world_size):
        ctx.host_barrier()
        if turn == ctx.rank:
            ctx.progress("device copy", 0, 4)
            out.append(_device_copy(ctx, numel, samples=samples, warmup=warmup, budget_ms=budget_ms))
            ctx.progress("host<->device", 1, 4)
            out.extend(_host_device(ctx, numel, samples=samples, warmup=warmup, budget_ms=budget_ms))
    ctx.host_barrier()

    # --- P2P per ordered pair, one source rank at a time
    ctx.progress("p2p", 2, 4)
    if not ctx.is_cuda or ctx.world_size < 2:
        out.append(
            RankMeasurement(
                "p2p",
                {"what": "p2p", "device": device},
                "us",
                status=MeasurementStatus.UNSUPPORTED,
                note="P2P needs two or more GPUs" if ctx.is_cuda else "P2P needs GPUs",
            )
        )
    else:
        for source in range(ctx.world_size):
            ctx.host_barrier()
            if source == ctx.rank:
                out.extend(
                    _p2p_from_here(
                        ctx, numel, samples=samples, warmup=warmup, budget_ms=budget_ms, latency_ops=latency_ops
                    )
                )
        ctx.host_barrier()
        torch.cuda.empty_cache()
    ctx.progress("done", 4, 4)
    return RankOutput(measurements=tuple(out))


def _device_copy(ctx: ProbeContext, numel: int, *, samples: int, warmup: int, budget_ms: float) -> RankMeasurement:
    """`dst.copy_(src)` over a rotation of buffer pairs whose total exceeds 2× the last-level cache."""
    nbytes = numel * 4
    timer = _timer(ctx)
    copies = rotation_count(2 * nbytes, ctx.cache_bytes(), max_copies=8)
    ctx.require_free_bytes(2 * nbytes * copies, "device copy buffers")
    pairs = Rotation(
        [
            (torch.empty(numel, dtype=torch.float32, device=ctx.device), torch.ones(numel, device=ctx.device))
            for _ in range(copies)
        ]
    )

    def copy() -> None:
        dst, src = pairs.next()
        dst.copy_(src)

    est = statistics.median(timer(copy, 1, 2, 1))
    counts = plan_counts(est, budget_ms, max_ops=1, max_samples=samples, min_samples=3)
    return _bandwidth_point(
        f"device copy {format_bytes(nbytes)}",
        {"what": "device_copy", "device": ctx.device.type, "size_bytes": nbytes, "rotation": copies},
        timer(copy, 1, counts.samples, warmup),
        2 * nbytes,
    )


def _host_device(
    ctx: ProbeContext, numel: int, *, samples: int, warmup: int, budget_ms: float
) -> list[RankMeasurement]:
    """Pinned host → device and device → host copies (CUDA only)."""
    device = ctx.device.type
    if not ctx.is_cuda:
        return [
            RankMeasurement(
                f"{what} pinned",
                {"what": what, "device": device},
                "us",
                status=MeasurementStatus.UNSUPPORTED,
                note="host-device copies need a GPU",
            )
            for what in ("h2d", "d2h")
        ]
    nbytes = numel * 4
    ctx.require_free_bytes(nbytes, "host-device copy buffer")
    host = torch.ones(numel, dtype=torch.float32, pin_memory=True)
    dev = torch.empty(numel, dtype=torch.float32, device=ctx.device)
    out = []
    for what, fn in (
        ("h2d", lambda: dev.copy_(host, non_blocking=True)),
        ("d2h", lambda: host.copy_(dev, non_blocking=True)),
    ):
        est = statistics.median(time_events(fn, 1, 2, 1))
        counts = plan_counts(est, budget_ms, max_ops=1, max_samples=samples, min_samples=3)
        out.append(
            _bandwidth_point(
                f"{what} pinned {format_bytes(nbytes)}",
                {"what": what, "device": device, "size_bytes": nbytes, "pinned": True},
                time_events(fn, 1, counts.samples, warmup),
                nbytes,
            )
        )
    return out


def _p2p_from_here(
    ctx: ProbeContext, numel: int, *, samples: int, warmup: int, budget_ms: float, latency_ops: int
) -> list[RankMeasurement]:
    out: list[RankMeasurement] = []
    nbytes = numel * 4
    src = torch.ones(numel, dtype=torch.float32, device=ctx.device)
    tiny_src = torch.ones(1, dtype=torch.float32, device=ctx.device)
    for peer in range(ctx.world_size):
        if peer == ctx.rank:
            continue
        peer_dev = torch.device("cuda", peer)
        ctx.require_free_bytes(nbytes, f"P2P buffer on GPU {peer}", device=peer_dev)
        can_peer = bool(torch.cuda.can_device_access_peer(ctx.device.index, peer))
        dst = torch.empty(numel, dtype=torch.float32, device=peer_dev)
        tiny_dst = torch.empty(1, dtype=torch.float32, device=peer_dev)

        def bulk(dst: torch.Tensor = dst) -> None:
            dst.copy_(src, non_blocking=True)

        def tiny(tiny_dst: torch.Tensor = tiny_dst) -> None:
            tiny_dst.copy_(tiny_src, non_blocking=True)

        est = statistics.median(time_events(bulk, 1, 2, 1))
        counts = plan_counts(est, budget_ms, max_ops=1, max_samples=samples, min_samples=3)
        bw_samples = time_events(bulk, 1, counts.samples, warmup)
        lat_samples = time_events(tiny, latency_ops, samples, warmup=latency_ops)
        bw = Stats.from_samples(bw_samples, "us").median
        lat = Stats.from_samples(lat_samples, "us").median
        point = {"src_gpu": ctx.rank, "dst_gpu": peer, "peer_access": can_peer}
        out.append(
            RankMeasurement(
                f"p2p {ctx.rank}->{peer} {format_bytes(nbytes)}",
                {**point, "what": "p2p_bandwidth", "size_bytes": nbytes},
                "us",
                samples=tuple(bw_samples),
                metrics={"time_us": bw, "bandwidth_gbps": _gbps(nbytes, bw)},
                note="" if can_peer else "no peer access: the copy is staged through host memory",
            )
        )
        out.append(
            RankMeasurement(
                f"p2p {ctx.rank}->{peer} latency",
                {**point, "what": "p2p_latency", "size_bytes": LATENCY_COPY_BYTES},
                "us",
                samples=tuple(lat_samples),
                metrics={"latency_us": lat},
            )
        )
        del dst, tiny_dst
    return out
