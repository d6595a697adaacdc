"""Provides the `attention` probe: one layer's decode attention against a KV cache of the configured context.

Per key (`attention:kind=gqa|mla|mla+dsa,batch=…,q_len=…,context=…,…`): GQA through SDPA (enable_gqa), MLA in its
absorbed form over the latent cache, and for DSA models (GLM-5, DeepSeek-V3.2) the indexer's scoring over the whole
context and top-k selection before sparse MLA over the selected latents (see `shapes.attention_runner`). Caches
are random, rotated above 2× L2 so each call reads DRAM as a new layer would. Metrics: time, KV bytes read and
KV GB/s (probes.md §7.8).

Diagnostics: the same key at each context of `context_sweep` (GB/s of KV read vs context, probes.md §7.8: 0, 16k,
32k, 64k, 128k), skipped on CPU ranks.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from decodetop.budget.keys import AttentionKey, parse_key_id
from decodetop.probes.results import RankMeasurement, RankOutput
from decodetop.probes.worker.context import ProbeContext
from decodetop.probes.worker.shapes import TimingOptions, attention_runner, key_list, measure


def run(ctx: ProbeContext, params: dict[str, Any]) -> RankOutput:
    """Each key at its context, then the context sweep (GPU only)."""
    opts = TimingOptions.from_params(ctx, params)
    keys = key_list(params, "attention")
    sweep = sorted({int(c) for c in params["context_sweep"]}) if ctx.is_cuda else []
    out: list[RankMeasurement] = []
    device = ctx.device.type
    for index, kid in enumerate(keys):
        key = parse_key_id(kid)
        assert isinstance(key, AttentionKey)
        ctx.progress(f"key {index + 1}/{len(keys)} {kid}", index, len(keys))
        pt = {"what": "attention", "key": kid, "context": key.context, "role": "budget", "device": device}
        out.append(measure(ctx, opts, kid, pt, partial(attention_runner, key, ctx, rotate=opts.rotate)))
        for context in sweep:
            if context == key.context:
                continue
            dpt = {"what": "attention", "key": kid, "context": context, "role": "diagnostic", "device": device}
            out.append(
                measure(
                    ctx,
                    opts,
                    f"{key.kind} attention at context {context}",
                    dpt,
                    partial(attention_runner, key, ctx, rotate=opts.rotate, context=context),
                )
            )
    ctx.progress("done", len(keys), len(keys))
    return RankOutput(measurements=tuple(out))
