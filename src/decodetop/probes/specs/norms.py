"""Provides the `norms` probe's spec (no torch): the elementwise ops of a decode step at the model's sizes.

Plan: the plan's norms keys. Read: each key's time.
"""

from __future__ import annotations

from decodetop.probes.hooks import plan_keys
from decodetop.probes.probe_spec import ProbeSpec
from decodetop.probes.specs.defaults import COMPONENT_TIMING

SPEC = ProbeSpec(
    name="norms",
    description="RMSNorm, residual add + RMSNorm, LayerNorm, SiLU-and-mul, rotary, embedding at the model's sizes",
    module="decodetop.probes.worker.norms",
    default_timeout_s=300.0,
    default_params={
        "keys": [
            "norms:op=rmsnorm,tokens=1,width=4096,dtype=bf16",
            "norms:op=silu_mul,tokens=1,width=14336,dtype=bf16",
        ],
        **COMPONENT_TIMING,
    },
    plan=plan_keys,
    plan_order=700,
)
