"""Provides the `routing` probe's spec (no torch): the MoE router and the permute/unpermute around the experts.

Plan: the plan's routing keys. Read: each key's time (router GEMM, scoring, top-k).
"""

from __future__ import annotations

from decodetop.probes.hooks import plan_keys
from decodetop.probes.probe_spec import ProbeSpec
from decodetop.probes.specs.defaults import COMPONENT_TIMING

SPEC = ProbeSpec(
    name="routing",
    description="router GEMM, softmax/sigmoid scoring, group-limited top-k; permute and unpermute",
    module="decodetop.probes.worker.routing",
    default_timeout_s=300.0,
    default_params={
        "keys": [
            "routing:tokens=1,hidden=4096,n_experts=128,scoring=softmax,n_group=1,topk_group=1,top_k=8,dtype=bf16"
        ],
        "permute": True,
        **COMPONENT_TIMING,
    },
    plan=plan_keys,
    plan_order=400,
)
