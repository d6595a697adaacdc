"""Provides what a probe measured for one key (`MeasuredTime`, with the same key's time under other kernel
classes, `KernelTime`), a measured series (`Curve`), and a curve engine over such bare figures
(`engine_from_series`: a budget composed without the probes' reader, tests, diffs of stored budgets). Stdlib only."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import cast

from decodetop.budget.curve_points import CurvePoint
from decodetop.budget.curves import CurveEngine
from decodetop.budget.inventory import StepInventory
from decodetop.budget.kernels import KernelClass
from decodetop.budget.keys import AllreduceKey, GemmKey, ProbeKey, parse_key_id
from decodetop.budget.roofline import Hardware
from decodetop.errors import UserInputError


@dataclass(frozen=True)
class KernelTime:
    """One key's median time (ms) with another class of kernel than the one the budget takes."""

    kernel: KernelClass
    median_ms: float


@dataclass(frozen=True)
class MeasuredTime:
    """A probe's result for one key: median and spread of one instance, in ms, and where it came from; the mean
    (what throughput pays) and the standard deviation of one instance where the samples gave them."""

    median_ms: float
    p10_ms: float
    p90_ms: float
    source: str = "probe"
    mean_ms: float | None = None
    """Mean of one instance (None: not known, e.g. an older results file or a fit; the median stands in)."""
    std_ms: float | None = None
    """Standard deviation of one instance's samples (None: no samples; a point figure)."""
    kernel: KernelClass | None = None
    """The class of kernel the figure came from (engine, decodetop Triton, torch, CPU; None: not said)."""
    alternatives: tuple[KernelTime, ...] = ()
    """The same key timed with other kernel classes (diagnostics: "torch ops would take X")."""

    def __post_init__(self) -> None:
        for name in ("median_ms", "p10_ms", "p90_ms", "mean_ms", "std_ms"):
            value = getattr(self, name)
            if value is None and name in ("mean_ms", "std_ms"):
                continue
            if not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise UserInputError(f"measured time {name}={value!r} must be a finite number ≥ 0")

    @property
    def mean(self) -> float:
        """`mean_ms`, or the median where the mean is not known."""
        return self.median_ms if self.mean_ms is None else self.mean_ms

    @classmethod
    def point(cls, ms: float, source: str = "probe") -> MeasuredTime:
        """A time without spread."""
        return cls(ms, ms, ms, source)


@dataclass(frozen=True)
class Curve:
    """A measured series: time (ms) against a size (bytes, or M), sorted by size, sizes > 0. Charts and the JSON
    show it; figures between and beyond its points come from the curve engine (`decodetop.budget.curves`)."""

    points: tuple[tuple[float, float], ...]
    source: str = "probe"

    def __post_init__(self) -> None:
        pts = tuple(sorted((float(x), float(y)) for x, y in self.points))
        for x, y in pts:
            if not (math.isfinite(x) and math.isfinite(y)) or x <= 0 or y <= 0:
                raise UserInputError(f"curve point ({x}, {y}) must have a positive size and time")
        if len({x for x, _ in pts}) != len(pts):
            raise UserInputError("curve has two points at the same size")
        object.__setattr__(self, "points", pts)


def engine_from_series(
    inventory: StepInventory,
    measured: Mapping[str, MeasuredTime],
    allreduce_curves: Mapping[str, Curve],
    gemm_curves: Mapping[str, Curve],
    hardware: Hardware,
) -> CurveEngine:
    """A curve engine over bare key times and the two measured series (a budget composed without the probes'
    reader: tests, diffs of stored budgets); the all-reduce series are the inventory's TP group's."""
    points: list[CurvePoint] = []
    for key_id, t in measured.items():
        key = cast(ProbeKey, parse_key_id(key_id))
        points.append(CurvePoint(key, t.median_ms, t.p10_ms, t.p90_ms, t.source))
    tp = inventory.deployment.tp
    for collective, curve in allreduce_curves.items():
        if collective in ("all_reduce", "all_gather"):
            for size, ms in curve.points:
                key = AllreduceKey(collective, int(size), tp, "bf16")
                points.append(CurvePoint(key, ms, ms, ms, curve.source))
    for curve_id, curve in gemm_curves.items():
        shape = dict(part.split("=", 1) for part in curve_id.partition(":")[2].split(",") if "=" in part)
        try:
            n, k, batch, dtype = int(shape["n"]), int(shape["k"]), int(shape["batch"]), shape["dtype"]
        except (KeyError, ValueError):
            continue
        points.extend(
            CurvePoint(GemmKey(int(m), n, k, batch, dtype), ms, ms, ms, curve.source) for m, ms in curve.points
        )
    return CurveEngine(points, hardware)
