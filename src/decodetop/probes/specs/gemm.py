"""Provides the `gemm` probe's spec (no torch): dense GEMMs at the model's shard shapes and a sweep over M.

Plan: the plan's GEMM keys and the other TP shards' shapes (the curve plan), with the sweep over M when sweeps are
wanted. Read: each budget point's time (fastest FP8 variant), one GEMM-vs-M `Curve` per weight shape (fastest
variant per M), every swept point as a curve point of the curve engine, and the references measured beside them
(device copy bandwidth and BF16 matrix peak, the slowest rank's).
"""

from __future__ import annotations

from decodetop.budget.keys import GemmKey, parse_key_id
from decodetop.probes.hooks import (
    MeasuredSetBuilder,
    PlanContext,
    Planned,
    ProbeRequest,
    budget_point,
    busiest,
    ok_measurements,
    with_source,
)
from decodetop.probes.probe_spec import ProbeSpec
from decodetop.probes.results import ProbeResult
from decodetop.probes.specs.defaults import COMPONENT_TIMING

#: GEMM sweep over M (docs/reference/probes.md §4: decode M = 1–64; 128, 256 for batched decode and MTP verification).
SWEEP_M = [1, 2, 4, 8, 16, 32, 64, 128, 256]


def plan(ctx: PlanContext) -> Planned:
    """The plan's GEMM keys and the other TP shards' (the curve plan), each swept over M."""
    ids = ctx.key_ids()
    if not ids:
        return Planned()
    sweep = sorted({m for s in ctx.plan.gemm_sweeps for m in s.ms} | set(ctx.curves.sweep_m))
    keys = [*ids, *ctx.curve_key_ids()]
    return Planned(ProbeRequest("gemm", {"keys": keys, "sweep": ctx.sweeps, "sweep_m": sweep}, ids))


def read(result: ProbeResult, into: MeasuredSetBuilder) -> None:
    """References, curve points and budget points."""
    for m in ok_measurements(result):
        what = m.params.get("what")
        if what == "copy" and "bandwidth_gbps" in m.metrics:
            into.copy_gbps = min(into.copy_gbps, m.metrics["bandwidth_gbps"])
            continue
        if what == "peak" and "tflops" in m.metrics:
            into.peak_tflops = min(into.peak_tflops, m.metrics["tflops"])
            continue
        t = busiest(m)
        if what == "gemm" and isinstance(m.params.get("key"), str) and t is not None:
            m_rows = m.params.get("m", 0)
            mm = int(m_rows) if isinstance(m_rows, (int, float)) else 0
            pts = into.gemm_points.setdefault(str(m.params.get("curve")), {})
            if mm > 0 and (mm not in pts or t.median_ms < pts[mm]):
                pts[mm] = t.median_ms
            key = parse_key_id(str(m.params["key"]))
            if isinstance(key, GemmKey):
                into.offer_curve(key, with_source(t, "gemm probe sweep"))
        found = budget_point(result, m)
        if found is not None:
            into.offer(*found)


SPEC = ProbeSpec(
    name="gemm",
    description="dense GEMMs at the model's shard shapes (M = batch) and a sweep over M: GB/s and TFLOP/s "
    "against the measured copy bandwidth and matrix peak; bf16, fp8 per-tensor and row-wise, nvfp4 on sm_100/120",
    module="decodetop.probes.worker.gemm",
    default_timeout_s=600.0,
    default_params={
        "keys": ["gemm:m=1,n=4096,k=4096,batch=1,dtype=bf16"],
        "sweep": True,
        "sweep_m": list(SWEEP_M),
        "cpu_sweep_max_m": 16,  # CPU ranks: M above this is skipped (a 70B shard at M=256 takes seconds)
        "fp8_variants": ["tensor", "row"],
        "reference": True,
        **COMPONENT_TIMING,
    },
    plan=plan,
    read=read,
    plan_order=200,
)
