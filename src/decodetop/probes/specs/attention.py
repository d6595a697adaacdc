"""Provides the `attention` probe's spec (no torch): decode attention against the KV cache.

Plan: the plan's attention keys, with the context sweep on GPUs when sweeps are wanted. Read: each key's time.
"""

from __future__ import annotations

from decodetop.probes.hooks import PlanContext, Planned, ProbeRequest
from decodetop.probes.probe_spec import ProbeSpec
from decodetop.probes.specs.defaults import COMPONENT_TIMING, SMALL_GQA

#: Attention context sweep on GPUs (docs/reference/probes.md §7.8: KV GB/s at 0, 16k, 32k, 64k, 128k).
ATTENTION_CONTEXTS_GPU = (0, 16384, 32768, 65536, 131072)


def plan(ctx: PlanContext) -> Planned:
    """The plan's keys; the context sweep on GPUs only."""
    ids = ctx.key_ids()
    if not ids:
        return Planned()
    sweep = list(ATTENTION_CONTEXTS_GPU) if ctx.cuda and ctx.sweeps else []
    return Planned(ProbeRequest("attention", {"keys": list(ids), "context_sweep": sweep}, ids))


SPEC = ProbeSpec(
    name="attention",
    description="decode attention against the KV cache: GQA (SDPA), absorbed MLA, DSA indexer + sparse MLA; KV GB/s",
    module="decodetop.probes.worker.attention",
    default_timeout_s=300.0,
    default_params={"keys": [SMALL_GQA], "context_sweep": [], **COMPONENT_TIMING},
    plan=plan,
    plan_order=500,
)
