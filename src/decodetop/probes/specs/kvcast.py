"""Provides the `kvcast` probe's spec (no torch): KV-cache writes, and an FP8 cache read as BF16 two ways.

Plan: the plan's kvcast keys; the read modes (whole-cache cast vs gather-then-cast) over contexts up to 128k on
GPUs and 16k on CPU ranks when sweeps are wanted, gathering the model's DSA top-k. Read: each key's write time.
"""

from __future__ import annotations

from decodetop.probes.hooks import PlanContext, Planned, ProbeRequest
from decodetop.probes.probe_spec import ProbeSpec
from decodetop.probes.specs.defaults import COMPONENT_TIMING

#: kvcast read-mode contexts: 1k…64k tokens, enough to show a linear and a flat trend (docs/reference/probes.md §7.8
#: sweeps to 128k).
READ_CONTEXTS = [1024, 4096, 16384, 65536]
#: Tokens a DSA step attends to (GLM-5 / DeepSeek-V3.2 `index_topk` 2048, docs/reference/models.md §2): what
#: gather-then-cast reads.
DSA_TOPK = 2048
#: Read-mode contexts inside a plan: GPUs 1k…128k; CPU ranks 1k…16k (FP8 casts run at ~0.1 GB/s on a CPU).
KVCAST_CONTEXTS_GPU = (1024, 4096, 16384, 65536, 131072)
KVCAST_CONTEXTS_CPU = (1024, 4096, 16384)


def plan(ctx: PlanContext) -> Planned:
    """The plan's keys, the read modes as a sweep, the model's top-k as the gather size."""
    ids = ctx.key_ids()
    if not ids:
        return Planned()
    gather = ctx.inventory.spec.index_topk or DSA_TOPK
    params: dict[str, object] = {
        "keys": [*ids, *ctx.curve_key_ids()],
        "read_modes": ctx.sweeps,
        "read_contexts": list(KVCAST_CONTEXTS_GPU if ctx.cuda else KVCAST_CONTEXTS_CPU),
        "gather_tokens": int(gather),
    }
    return Planned(ProbeRequest("kvcast", params, ids))


SPEC = ProbeSpec(
    name="kvcast",
    description="KV-cache write of one layer's new entries; FP8 cache read as BF16: whole-cache cast vs "
    "gather-then-cast over context",
    module="decodetop.probes.worker.kvcast",
    default_timeout_s=300.0,
    default_params={
        "keys": ["kvcast:layout=mla,tokens=1,width=576,context=4096,kv_dtype=fp8"],
        "read_modes": True,
        "read_contexts": list(READ_CONTEXTS),
        "gather_tokens": DSA_TOPK,
        **COMPONENT_TIMING,
    },
    plan=plan,
    plan_order=600,
)
