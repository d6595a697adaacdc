"""Provides the chart series taken from probe results: all-reduce latency against size, GEMM bandwidth against M."""

from __future__ import annotations

from decodetop.probes.results import ProbeResult
from decodetop.tui.model import Series
from decodetop.tui.sources.probe_views import ok_measurements

_DIST_IMPLS = ("nccl", "gloo")
"""`impl` values of torch.distributed's own all-reduce (the group's backend): their series are named by mode alone."""


def allreduce_curves(result: ProbeResult) -> tuple[Series, ...]:
    """Latency vs size, one series per (mode, implementation) from an all-reduce result: 'graph' (NCCL, or gloo on
    CPU ranks), 'graph one-shot', 'graph two-shot' (the engines' P2P kernel class), so the paths never mix."""
    by_series: dict[tuple[str, int, str], list[tuple[float, float]]] = {}
    for m in ok_measurements(result):
        size = m.params.get("size_bytes", m.params.get("size"))
        mode = m.params.get("mode", m.name)
        impl = str(m.params.get("impl", "nccl"))
        value = m.metrics.get("time_us")
        if value is None and m.stats is not None and m.unit == "us":
            value = m.stats.median
        if isinstance(size, int) and value is not None:
            dist = impl in _DIST_IMPLS
            label = str(mode) if dist else f"{mode} {impl.replace('_', '-')}"
            by_series.setdefault((str(mode), 0 if dist else 1, label), []).append((float(size), float(value)))
    return tuple(
        Series(label, tuple(x for x, _ in sorted(points)), tuple(y for _, y in sorted(points)))
        for (_mode, _order, label), points in sorted(by_series.items())
    )


def gemm_curves(result: ProbeResult, max_series: int = 6) -> tuple[Series, ...]:
    """Achieved GB/s vs M, one series per weight shape (the point's `curve` param; the fastest variant per M)."""
    by_curve: dict[str, dict[float, float]] = {}
    for m in ok_measurements(result):
        rows = m.params.get("m")
        gbps = m.metrics.get("gbps")
        curve = m.params.get("curve")
        if isinstance(rows, int) and gbps is not None and isinstance(curve, str):
            label = curve.removeprefix("gemm:")
            points = by_curve.setdefault(label, {})
            points[float(rows)] = max(points.get(float(rows), 0.0), float(gbps))
    ordered = sorted(by_curve.items(), key=lambda item: -len(item[1]))[:max_series]
    return tuple(
        Series(label, tuple(sorted(points)), tuple(points[x] for x in sorted(points))) for label, points in ordered
    )
