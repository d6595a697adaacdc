"""Provides the `moe` probe's spec (no torch): one MoE layer's routed experts for the active experts.

Plan: the plan's MoE keys. Read: each key's time, the fastest of the grouped GEMM, the per-expert loop, the
Triton fused kernel that reads only the routed experts (`fused`, decodetop.probes.worker.fused_moe, tiles tuned per
GPU and shape) and the engine's own fused_experts where importable (`engine`); the budget row's source names the
variant it took ("moe probe (fused)") and the segment its kernel class.
"""

from __future__ import annotations

from decodetop.probes.hooks import plan_keys
from decodetop.probes.probe_spec import ProbeSpec
from decodetop.probes.specs.defaults import COMPONENT_TIMING, SMALL_MOE

SPEC = ProbeSpec(
    name="moe",
    description="routed experts of one MoE layer (sort, gate_up, SiLU-and-mul, down, combine) for the active "
    "experts: grouped GEMM, a per-expert loop, a Triton fused kernel reading only the routed experts (tiles tuned per "
    "shape) and the engine's fused_experts where importable",
    module="decodetop.probes.worker.moe",
    default_timeout_s=300.0,
    default_params={"keys": [SMALL_MOE], "variants": ["grouped", "loop", "fused", "engine"], **COMPONENT_TIMING},
    plan=plan_keys,
    plan_order=300,
)
