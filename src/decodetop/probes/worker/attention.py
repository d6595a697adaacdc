"""Provides the `attention` probe: one layer's decode attention against a KV cache of the configured context.

Per key (`attention:kind=gqa|mla|mla+dsa,batch=…,q_len=…,context=…,…`): GQA through SDPA (enable_gqa), MLA in its
absorbed form over the latent cache, and for DSA models (GLM-5, DeepSeek-V3.2) the indexer's scoring over the whole
context and top-k selection before sparse MLA over the selected latents (see `attention_runner` below). Caches
are random, rotated above 2× L2 so each call reads DRAM as a new layer would. Metrics: time, KV bytes read and
KV GB/s (docs/reference/probes.md §7.8).

Diagnostics: the same key at each context of `context_sweep` (GB/s of KV read vs context, docs/reference/probes.md §7.8:
0, 16k, 32k, 64k, 128k), skipped on CPU ranks."""

from __future__ import annotations

import math
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812 - the conventional name

from decodetop.budget.keys import AttentionKey, parse_key_id
from decodetop.probes.results import RankMeasurement, RankOutput
from decodetop.probes.worker.context import ProbeContext, UnsupportedError
from decodetop.probes.worker.ops import OpRunner, TimingOptions, each_key, key_list, measure
from decodetop.probes.worker.tensors import copies_for, randn, require_free
from decodetop.probes.worker.timing import Rotation


def attention_runner(key: AttentionKey, ctx: ProbeContext, *, rotate: bool, context: int | None = None) -> OpRunner:
    """Decode attention for `batch` sequences of `q_len` new tokens against `context` cached ones.

    gqa: SDPA with enable_gqa over a [batch, kv_heads, L, head_dim] K/V cache (sliding window: the last `window`).
    mla: absorbed form over the latent cache [batch, L, kv_lora_rank + rope]: scores = q·cacheᵀ, softmax,
    out = p·cache[..., :kv_lora_rank] (torch matmuls: the latent cache is read twice; FlashMLA reads it once).
    mla+dsa: the indexer first (FP8 index keys cast to bf16, ReLU logits weighted over index heads, top-k of
    `index_topk`), then the same MLA over the gathered top-k latents.
    An FP8 KV cache is read as BF16 here (SDPA takes no FP8): the cast is what `kvcast` measures.
    """
    length = (key.context if context is None else context) + key.q_len
    note = "fp8 KV cache timed as bf16 (see kvcast for the cast)" if key.kv_dtype == "fp8" else ""
    if key.kind == "gqa":
        return _gqa_runner(key, ctx, length, note, rotate=rotate)
    if key.kind not in ("mla", "mla+dsa"):
        raise UnsupportedError(f"attention kind {key.kind!r} is not gqa, mla or mla+dsa")
    note = (note + "; " if note else "") + "torch matmul MLA (reads the latent cache twice; FlashMLA reads it once)"
    return _mla_runner(key, ctx, length, note, rotate=rotate)


def _gqa_runner(key: AttentionKey, ctx: ProbeContext, length: int, note: str, *, rotate: bool) -> OpRunner:
    """SDPA with enable_gqa over a K/V cache of `length` tokens (the last `window` of them for sliding windows)."""
    device, dt = ctx.device, torch.bfloat16
    b, q, heads = key.batch, key.q_len, key.heads
    attended = min(length, key.window) if key.window else length
    kv_bytes = 2 * b * key.kv_heads * attended * key.head_dim * 2
    copies = copies_for(ctx, kv_bytes, rotate)
    require_free(ctx, copies * kv_bytes * 1.1, f"KV cache {key.key_id}")
    caches = Rotation(
        [
            (
                randn((b, key.kv_heads, attended, key.head_dim), dt, device, std=1.0),
                randn((b, key.kv_heads, attended, key.v_head_dim), dt, device, std=1.0),
            )
            for _ in range(copies)
        ]
    )
    qt = randn((b, heads, q, key.head_dim), dt, device, std=1.0)
    gqa = key.kv_heads != heads

    def sdpa() -> torch.Tensor:
        kc, vc = caches.next()
        return F.scaled_dot_product_attention(qt, kc, vc, enable_gqa=gqa)

    flops = 2.0 * b * q * heads * attended * (key.head_dim + key.v_head_dim)
    return OpRunner(sdpa, kv_bytes + 2 * qt.numel() * 2, flops, copies, note, kv_bytes=kv_bytes)


def _mla_runner(key: AttentionKey, ctx: ProbeContext, length: int, note: str, *, rotate: bool) -> OpRunner:
    """Absorbed MLA over the latent cache of `length` tokens; for mla+dsa the indexer's top-k first."""
    device, dt = ctx.device, torch.bfloat16
    b, q, heads = key.batch, key.q_len, key.heads
    width = key.head_dim  # kv_lora_rank + rope as the kernel sees it
    lora = key.kv_lora_rank or key.v_head_dim
    dsa = key.kind == "mla+dsa"
    attended = min(length, key.index_topk) if dsa and key.index_topk else length
    latent_bytes = b * length * width * 2
    index_bytes = b * length * (key.index_head_dim + 4) if dsa else 0
    kv_read = b * attended * width * 2 + index_bytes
    copies = copies_for(ctx, latent_bytes + index_bytes, rotate)
    require_free(
        ctx, copies * (latent_bytes + index_bytes) * 1.1 + b * q * heads * length * 4, f"MLA cache {key.key_id}"
    )
    fp8 = torch.float8_e4m3fn
    latents: Rotation[tuple[torch.Tensor, torch.Tensor | None]] = Rotation(
        [
            (
                randn((b, length, width), dt, device, std=1.0),
                randn((b, length, key.index_head_dim), fp8, device) if dsa else None,
            )
            for _ in range(copies)
        ]
    )
    qt = randn((b, q * heads, width), dt, device, std=1.0)
    scale = 1.0 / math.sqrt(width)
    q_idx = randn((b, q * key.index_heads, key.index_head_dim), dt, device, std=1.0) if dsa else None
    w_idx = torch.rand(b, q, key.index_heads, 1, device=device) if dsa else None

    def mla_over(cache: torch.Tensor, qv: torch.Tensor) -> torch.Tensor:
        s = torch.bmm(qv, cache.transpose(1, 2)).float().mul_(scale)
        p = s.softmax(dim=-1).to(dt)
        return torch.bmm(p, cache[:, :, :lora])

    def mla() -> torch.Tensor:
        cache, _ = latents.next()
        return mla_over(cache, qt)

    def mla_dsa() -> torch.Tensor:
        cache, index_cache = latents.next()
        assert q_idx is not None and w_idx is not None and index_cache is not None
        keys = index_cache.to(dt)  # FP8 index keys → bf16 (DeepGEMM reads FP8 directly)
        logits = torch.bmm(q_idx, keys.transpose(1, 2)).view(b, q, key.index_heads, length)
        score = (logits.float().relu_() * w_idx).sum(dim=2)  # [b, q, length]
        top = score.topk(attended, dim=-1).indices  # [b, q, attended]
        sel = torch.gather(
            cache.unsqueeze(1).expand(b, q, length, width), 2, top.unsqueeze(-1).expand(b, q, attended, width)
        ).view(b * q, attended, width)
        return mla_over(sel, qt.view(b * q, heads, width))

    flops = 2.0 * b * q * heads * attended * (width + lora)
    if dsa:
        flops += 2.0 * b * q * key.index_heads * length * key.index_head_dim
    return OpRunner(mla_dsa if dsa else mla, kv_read + qt.numel() * 2 * 2, flops, copies, note, kv_bytes=kv_read)


def op_runner(key_id: str, ctx: ProbeContext, *, rotate: bool) -> OpRunner:
    """A layer's attention at the key's own context."""
    key = parse_key_id(key_id)
    assert isinstance(key, AttentionKey)
    return attention_runner(key, ctx, rotate=rotate)


def run(ctx: ProbeContext, params: dict[str, Any]) -> RankOutput:
    """Each key at its context, then the context sweep (GPU only)."""
    opts = TimingOptions.from_params(ctx, params)
    keys = key_list(params, "attention")
    sweep = sorted({int(c) for c in params["context_sweep"]}) if ctx.is_cuda else []
    out: list[RankMeasurement] = []
    device = ctx.device.type
    for kid, key in each_key(ctx, keys, AttentionKey):
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
