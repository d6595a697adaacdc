"""Provides the `moe` probe's spec (no torch): one MoE layer's routed experts for the active experts.

Plan: the plan's MoE keys in every variant, and the curve plan's points (`curve_keys`) in the variants that can be
the fastest (`CURVE_VARIANTS`: the per-expert loop, a reference that is rarely fastest and slow to build for many
experts, left out). Read: each key's time, the fastest of the grouped GEMM, the per-expert loop, the
Triton fused kernel that reads only the routed experts (`fused`, decodetop.probes.worker.fused_moe, tiles tuned per
GPU and shape) and the engine's own fused_experts where importable (`engine`); the budget row's source names the
variant it took ("moe probe (fused)") and the segment its kernel class.
"""

from __future__ import annotations

from decodetop.probes.hooks import PlanContext, Planned, ProbeRequest
from decodetop.probes.probe_spec import ProbeSpec
from decodetop.probes.specs.defaults import COMPONENT_TIMING, SMALL_MOE

VARIANTS = ("grouped", "loop", "fused", "engine")
CURVE_VARIANTS = ("grouped", "fused", "engine")
"""The variants a curve point is timed in. On the H200 GLM-5 plan the loop was the fastest at 1 of 31 points
(benchmarks/results/whatif/h200x1/glm5_results.json: 76 µs against the fused kernel's 95 µs, 1 token over 32 local
experts), and every variant of a point builds its runner and checks it against the reference."""


def plan(ctx: PlanContext) -> Planned:
    """The plan's keys in every variant, the curve plan's extra keys in `CURVE_VARIANTS`."""
    ids = ctx.key_ids()
    if not ids:
        return Planned()
    params = {"keys": list(ids), "curve_keys": list(ctx.curve_key_ids())}
    return Planned(ProbeRequest("moe", params, ids))


SPEC = ProbeSpec(
    name="moe",
    description="routed experts of one MoE layer (sort, gate_up, SiLU-and-mul, down, combine) for the active "
    "experts: grouped GEMM, a per-expert loop, a Triton fused kernel reading only the routed experts (tiles tuned per "
    "shape) and the engine's fused_experts where importable",
    module="decodetop.probes.worker.moe",
    default_timeout_s=300.0,
    default_params={
        "keys": [SMALL_MOE],
        "variants": list(VARIANTS),
        "curve_keys": [],
        "curve_variants": list(CURVE_VARIANTS),
        **COMPONENT_TIMING,
    },
    plan=plan,
    plan_order=300,
    string_lists=("curve_keys",),
)
