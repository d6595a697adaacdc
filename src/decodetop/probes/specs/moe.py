"""Provides the `moe` probe's spec (no torch): one MoE layer's routed experts for the active experts.

Plan: the plan's MoE keys. Read: each key's time, the fastest of the grouped GEMM, the per-expert loop and the
Triton fused kernel that reads only the routed experts (`fused`, decodetop.probes.worker.fused_moe: the engines'
kernel class); the budget row's source names the variant it took ("moe probe (fused)").
"""

from __future__ import annotations

from decodetop.probes.hooks import plan_keys
from decodetop.probes.spec import ProbeSpec
from decodetop.probes.specs.defaults import COMPONENT_TIMING, SMALL_MOE

SPEC = ProbeSpec(
    name="moe",
    description="routed experts of one MoE layer (sort, gate_up, SiLU-and-mul, down, combine) for the active "
    "experts: grouped GEMM, a per-expert loop and a Triton fused kernel reading only the routed experts",
    module="decodetop.probes.worker.moe",
    default_timeout_s=300.0,
    default_params={"keys": [SMALL_MOE], "variants": ["grouped", "loop", "fused"], **COMPONENT_TIMING},
    plan=plan_keys,
    plan_order=300,
)
