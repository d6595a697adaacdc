"""Provides the `launch` probe: what launching work costs, the four figures of docs/reference/probes.md §3.

1. `enqueue`: host time per launch of an empty kernel (`torch.cuda._sleep(0)`: a spin kernel told to spin zero
   cycles), N launches without a sync.
2. `launch_sync`: launch one empty kernel and synchronize, host-timed: the round trip a synced op pays.
3. `graph`: CUDA graphs of N empty kernels, replay + sync host-timed for several N, fitted as a + b·N
   (`graph_fixed_us` = a, `graph_per_node_us` = b).
4. `eager_op`: `x.add_(1)` on a 1-element tensor, N calls then one sync, host-timed: the per-op cost of eager torch.

Each rank measures its own GPU. On CPU ranks only the eager op runs (a CPU op through torch's dispatcher); the
kernel figures are unsupported there.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from decodetop.probes.results import MeasurementStatus, RankMeasurement, RankOutput, Stats
from decodetop.probes.worker.context import ProbeContext
from decodetop.probes.worker.timing import capture_graph, fit_line, time_host


def _empty_kernel() -> None:
    torch.cuda._sleep(0)  # type: ignore[no-untyped-call]


def _enqueue_samples(ops: int, samples: int, warmup: int) -> list[float]:
    """Host µs per async launch; the queue is drained between samples, outside the timing."""
    for _ in range(warmup):
        _empty_kernel()
    torch.cuda.synchronize()
    out = []
    for _ in range(samples):
        t0 = time.perf_counter_ns()
        for _ in range(ops):
            _empty_kernel()
        out.append((time.perf_counter_ns() - t0) / 1000.0 / ops)
        torch.cuda.synchronize()
    return out


def _sample(name: str, params: dict[str, Any], samples: list[float], metric: str) -> RankMeasurement:
    stats = Stats.from_samples(samples, "us")
    return RankMeasurement(name, params, "us", samples=tuple(samples), metrics={metric: stats.median})


def run(ctx: ProbeContext, params: dict[str, Any]) -> RankOutput:
    """This rank's launch figures."""
    ops = int(params["ops_per_sample"])
    samples = int(params["samples"])
    warmup = int(params["warmup_ops"])
    nodes = sorted({int(n) for n in params["graph_nodes"]})
    if ops < 1 or samples < 1 or warmup < 0:
        raise ValueError("launch: ops_per_sample and samples must be ≥ 1, warmup_ops ≥ 0")
    if len(nodes) < 2 or nodes[0] < 1:
        raise ValueError(f"launch: graph_nodes needs two or more distinct positive counts, got {nodes}")
    out: list[RankMeasurement] = []
    device = ctx.device.type
    if ctx.is_cuda:
        ctx.progress("enqueue", 0, 4)
        out.append(
            _sample(
                "empty kernel enqueue",
                {"what": "enqueue", "device": device},
                _enqueue_samples(ops, samples, warmup),
                "enqueue_us",
            )
        )
        ctx.progress("launch+sync", 1, 4)
        out.append(
            _sample(
                "empty kernel launch+sync",
                {"what": "launch_sync", "device": device},
                time_host(_empty_kernel, 1, samples * 4, warmup=warmup, sync=torch.cuda.synchronize),
                "launch_sync_us",
            )
        )
        ctx.progress("graph replay", 2, 4)
        medians: list[float] = []
        for n in nodes:
            graph = ctx.keep_graph(capture_graph(_empty_kernel, n, warmup=1))
            replay = time_host(graph.replay, 1, samples, warmup=3, sync=torch.cuda.synchronize)
            graph.reset()
            med = Stats.from_samples(replay, "us").median
            medians.append(med)
            out.append(
                RankMeasurement(
                    f"graph replay {n} nodes",
                    {"what": "graph_replay", "nodes": n, "device": device},
                    "us",
                    samples=tuple(replay),
                    metrics={"replay_us": med, "per_node_us": med / n},
                )
            )
        ctx.release_graphs()
        a, b = fit_line([float(n) for n in nodes], medians)
        out.append(
            RankMeasurement(
                "graph replay fit a + b·N",
                {"what": "graph_fit", "device": device, "nodes": ",".join(map(str, nodes))},
                "us",
                metrics={"graph_fixed_us": a, "graph_per_node_us": b},
            )
        )
    else:
        reason = "needs a GPU (no kernels on CPU ranks)"
        for what, name in (
            ("enqueue", "empty kernel enqueue"),
            ("launch_sync", "empty kernel launch+sync"),
            ("graph_fit", "graph replay fit a + b·N"),
        ):
            out.append(
                RankMeasurement(
                    name, {"what": what, "device": device}, "us", status=MeasurementStatus.UNSUPPORTED, note=reason
                )
            )
    ctx.progress("eager op", 3, 4)
    x = torch.zeros(1, device=ctx.device)

    def add() -> None:
        x.add_(1)

    eager = time_host(add, ops, samples, warmup=warmup, sync=ctx.synchronize)
    out.append(_sample("eager torch op x.add_(1)", {"what": "eager_op", "device": device}, eager, "eager_op_us"))
    ctx.progress("done", 4, 4)
    return RankOutput(measurements=tuple(out))
