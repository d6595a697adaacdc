"""Provides the `kvcast` probe: writing a layer's new KV-cache entries, and reading an FP8 cache as BF16 two ways.

- budget point per key (`kvcast:layout=…,tokens=…,width=…,context=…,kv_dtype=…`): cast the step's new K/V (or
  latent, or DSA index-key) entries to the cache dtype and copy them into a cache of `context` slots — what the
  budget's kvcast key means — with the best kernel this rank runs: decodetop's Triton KV write (`kernels.rope`, one
  launch: cast, FP8 scale — dynamic per 128 values for DSA index keys — and scatter to the slots), else the torch
  form (cast, index_copy_), which is also timed beside the Triton kernel as an `alternative` point. The gqa and
  mla keys are the step's rotary + KV write (the inventory counts them as one op, as engines fuse them): the key
  rows are rotated over 64 dims in the same launch (GQA: each row's first 64; MLA: the latent row's k_pe, its last
  64), the torch form rotates them by cat first. The query heads' rotation rides in the same launch as more
  programs, not timed here (0.2 µs or less of the fused kernel's 2.4–2.6 µs on an H200, docs/benchmarks.md);
- diagnostics, over `read_contexts` (plus the key's own context): an FP8 cache of the key's width read as BF16
  by **whole-cache cast** (`cache.to(bf16)` of every cached token each step: the motivating case's culprit) and by
  **gather-then-cast** (gather the `gather_tokens` tokens a step needs — a DSA top-k, in 64-token blocks — then
  cast those). The first grows linearly with context; the second stays flat once context exceeds `gather_tokens`.
  Each diagnostic's params carry `mode` and `context`, so the trend can be read back (and a test checks it).
"""

from __future__ import annotations

from functools import partial
from typing import Any

import torch

from decodetop.budget.keys import KvcastKey, parse_key_id
from decodetop.probes.results import RankMeasurement, RankOutput
from decodetop.probes.worker.context import ProbeContext, UnsupportedError
from decodetop.probes.worker.kernels.common import (
    best_runner,
    check_close,
    check_fp8_close,
    torch_kernel,
    triton_kernel,
    triton_unavailable,
)
from decodetop.probes.worker.kernels.rope import RopeSpec, reference_rope_kv_write, rope_kv_write, rotate_half
from decodetop.probes.worker.ops import OpRunner, TimingOptions, each_key, key_list, measure
from decodetop.probes.worker.tensors import FP8_E4M3_MAX, randn, require_free

#: Rotary dims of the key rows of gqa and mla keys (64: DeepSeek's and GLM-5's qk_rope_head_dim, Llama's half head).
ROPE_DIMS = 64
#: Positions of the rotary tables.
ROPE_POSITIONS = 4096
#: Layouts whose write carries the step's rotary.
ROPE_LAYOUTS = ("gqa", "mla")

#: Tokens per KV-cache block when gathering blocks (SGLang/vLLM page sizes are 1-64; FlashMLA uses 64).
KV_BLOCK_TOKENS = 64


def _kv_torch_dtype(name: str) -> torch.dtype:
    return {"fp8": torch.float8_e4m3fn, "bf16": torch.bfloat16, "fp16": torch.float16}.get(name, torch.bfloat16)


def kvcast_write_runner(key: KvcastKey, ctx: ProbeContext) -> OpRunner:
    """The best KV write this rank runs: decodetop's Triton kernel, else the torch form."""
    return best_runner(
        [("decodetop Triton", lambda: triton_write_runner(key, ctx)), ("torch", lambda: torch_write_runner(key, ctx))]
    ).runner


def _rope_of(key: KvcastKey, ctx: ProbeContext, row: int) -> tuple[RopeSpec, torch.Tensor, torch.Tensor]:
    """(rotary spec, cos and sin tables) of a key's rows of `row` values: `ROPE_DIMS` at the row's start (GQA) or
    end (MLA's k_pe) for the gqa and mla layouts, none for the others or rows narrower than that."""
    if key.layout not in ROPE_LAYOUTS or row < ROPE_DIMS:
        one = torch.ones(1, 1, device=ctx.device)
        return RopeSpec(0), one, one
    cos = torch.rand(ROPE_POSITIONS, ROPE_DIMS // 2, device=ctx.device)
    sin = torch.rand(ROPE_POSITIONS, ROPE_DIMS // 2, device=ctx.device)
    return RopeSpec(ROPE_DIMS, 0, row - ROPE_DIMS if key.layout == "mla" else 0), cos, sin


def triton_write_runner(key: KvcastKey, ctx: ProbeContext) -> OpRunner:
    """One launch: the new rows rotated (gqa and mla keys), cast (FP8: a fixed scale, or for DSA index keys a
    dynamic one per 128 values) and written to their slots; checked once against the torch form. GQA rows are K
    then V halves."""
    reason = triton_unavailable(ctx.device)
    if reason:
        raise UnsupportedError(reason)
    device = ctx.device
    kv = _kv_torch_dtype(key.kv_dtype)
    slots = key.context + key.tokens
    dynamic = key.layout == "dsa_index" and kv == torch.float8_e4m3fn
    halves = 2 if key.layout == "gqa" and key.width % 2 == 0 else 1
    width = key.width // halves
    group = 128 if dynamic and width % 128 == 0 else width
    heads = width // group
    require_free(ctx, slots * key.width * kv.itemsize * 2.2, f"KV cache {key.key_id}")
    k_cache = randn((slots, heads, group), kv, device, std=1.0)
    v_cache = randn((slots, heads, group), kv, device, std=1.0) if halves == 2 else None
    k_new = randn((key.tokens, heads, group), torch.bfloat16, device, std=1.0)
    v_new = randn((key.tokens, heads, group), torch.bfloat16, device, std=1.0) if halves == 2 else None
    where = torch.arange(key.context, slots, device=device)
    spec, cos, sin = _rope_of(key, ctx, group)
    pos = torch.randint(0, cos.shape[0], (key.tokens,), device=device)
    scales: torch.Tensor | None = None
    if dynamic:
        scales = torch.ones(slots, heads, device=device)
    elif kv == torch.float8_e4m3fn:
        scales = torch.ones(2, device=device)

    def write() -> None:
        rope_kv_write(
            None,
            k_new,
            v_new,
            rope=spec,
            cos=cos,
            sin=sin,
            positions=pos,
            slots=where,
            k_cache=k_cache,
            v_cache=v_cache,
            scales=scales,
            dynamic_scale=dynamic,
        )

    k_ref, v_ref = k_cache.clone(), v_cache.clone() if v_cache is not None else None
    s_ref = scales.clone() if scales is not None else None
    write()
    reference_rope_kv_write(None, k_new, v_new, spec, cos, sin, pos, where, k_ref, v_ref, s_ref, dynamic)
    if kv == torch.float8_e4m3fn:
        check_fp8_close(k_cache[key.context :], k_ref[key.context :], "Triton KV write")
    else:
        check_close(k_cache[key.context :], k_ref[key.context :], "Triton KV write")
    moved = key.tokens * key.width * (2 + kv.itemsize)
    name = "KV write (cast and scatter, one launch)" + (", dynamic FP8 scale per 128 values" if dynamic else "")
    if spec.rot:
        name = "rope + KV write (rotary, cast and scatter, one launch)"
    return OpRunner(write, moved, 0.0, kernel=triton_kernel(name))


def torch_write_runner(key: KvcastKey, ctx: ProbeContext) -> OpRunner:
    """Write one layer's new entries: `tokens` rows of `width` BF16 values cast to the cache dtype and copied into a
    cache of `context` + `tokens` slots (FP8 index keys of a DSA layout get a dynamic scale per 128 values)."""
    device = ctx.device
    kv = _kv_torch_dtype(key.kv_dtype)
    slots = key.context + key.tokens
    require_free(ctx, slots * key.width * kv.itemsize * 1.1, f"KV cache {key.key_id}")
    cache = randn((slots, key.width), kv, device, std=1.0)
    new = randn((key.tokens, key.width), torch.bfloat16, device, std=1.0)
    where = torch.arange(key.context, slots, device=device)
    group = 128 if key.layout == "dsa_index" and key.width % 128 == 0 else 0
    scales = torch.ones(slots, max(1, key.width // 128), device=device) if group else None
    k_width = key.width // 2 if key.layout == "gqa" and key.width % 2 == 0 else key.width
    spec, cos, sin = _rope_of(key, ctx, k_width)
    pos = torch.randint(0, cos.shape[0], (key.tokens,), device=device)

    # FP8 rows are copied through a uint8 view: index_copy_ has no Float8 kernel on CPU (same bytes, same work).
    raw = cache.view(torch.uint8) if kv.itemsize == 1 else cache

    def write() -> None:
        rows = new
        if spec.rot:  # rotary by cat on the key rows (the K half of GQA rows), as torch must
            kv_rows = new.view(key.tokens, -1, k_width)
            c, s = cos[pos].unsqueeze(1), sin[pos].unsqueeze(1)
            rotated = rotate_half(kv_rows[:, :1], c, s, spec.offset_k, spec.rot)
            rows = torch.cat((rotated, kv_rows[:, 1:]), dim=1).view(key.tokens, key.width)
        if kv == torch.float8_e4m3fn:
            if group and scales is not None:
                blocks = rows.float().view(key.tokens, -1, group)
                sc = blocks.abs().amax(dim=-1).clamp_(min=1e-6) / FP8_E4M3_MAX
                q = (blocks / sc.unsqueeze(-1)).view(key.tokens, key.width).to(kv)
                raw.index_copy_(0, where, q.view(torch.uint8))
                scales.index_copy_(0, where, sc)
            else:
                raw.index_copy_(0, where, rows.to(kv).view(torch.uint8))
        else:
            cache.index_copy_(0, where, rows.to(kv))

    moved = key.tokens * key.width * (2 + kv.itemsize)
    ops = "amax, div, cast, index_copy_" if group else "cast, index_copy_"
    if spec.rot:
        ops = "rotary (mul, sub, add, cat), " + ops
    return OpRunner(write, moved, 0.0, kernel=torch_kernel(ctx, ops))


def kvcast_read_runners(width: int, context: int, gather_tokens: int, ctx: ProbeContext) -> tuple[OpRunner, OpRunner]:
    """(whole-cache cast, gather-then-cast) of an FP8 cache of `context` tokens read as BF16.

    whole: `cache.to(bf16)` over every cached token: grows with context (the motivating bug's pattern).
    gather: the blocks a step needs — `gather_tokens` tokens in blocks of 64 (a DSA top-k) — gathered, then cast:
    flat in context once context exceeds `gather_tokens`.
    """
    device = ctx.device
    fp8 = torch.float8_e4m3fn
    require_free(ctx, context * width * 3.2, f"FP8 cache of {context} tokens")
    cache = randn((context, width), fp8, device, std=1.0)
    need = min(context, gather_tokens)
    blocks = max(1, -(-context // KV_BLOCK_TOKENS))
    want_blocks = max(1, -(-need // KV_BLOCK_TOKENS))
    gen = torch.Generator(device="cpu").manual_seed(context)
    chosen = torch.randperm(blocks, generator=gen)[:want_blocks].sort().values
    idx = (chosen.unsqueeze(1) * KV_BLOCK_TOKENS + torch.arange(KV_BLOCK_TOKENS)).flatten()
    idx = idx[idx < context][:need].to(device)

    def whole() -> torch.Tensor:
        return cache.to(torch.bfloat16)

    def gather() -> torch.Tensor:
        return cache.index_select(0, idx).to(torch.bfloat16)

    whole_bytes = context * width * 3.0
    gather_bytes = idx.numel() * width * 3.0
    return OpRunner(whole, whole_bytes, 0.0), OpRunner(gather, gather_bytes, 0.0)


def op_runner(key_id: str, ctx: ProbeContext, *, rotate: bool) -> OpRunner:
    """A layer's KV-cache write (rotation does not apply: the write goes to one cache)."""
    key = parse_key_id(key_id)
    assert isinstance(key, KvcastKey)
    return kvcast_write_runner(key, ctx)


def _read(width: int, context: int, gather_tokens: int, ctx: ProbeContext, which: int) -> OpRunner:
    return kvcast_read_runners(width, context, gather_tokens, ctx)[which]


def run(ctx: ProbeContext, params: dict[str, Any]) -> RankOutput:
    """Each key's write, then the two read modes at every context of the sweep."""
    opts = TimingOptions.from_params(ctx, params)
    keys = key_list(params, "kvcast")
    gather_tokens = int(params["gather_tokens"])
    if gather_tokens < 1:
        raise ValueError(f"kvcast: gather_tokens must be positive, got {gather_tokens}")
    out: list[RankMeasurement] = []
    device = ctx.device.type
    widths_done: set[int] = set()
    for kid, key in each_key(ctx, keys, KvcastKey):
        pt = {"what": "write", "key": kid, "role": "budget", "device": device}
        best = measure(ctx, opts, f"{kid} write", pt, partial(kvcast_write_runner, key, ctx), note="write")
        out.append(best)
        if best.kernel is not None and best.kernel.kind not in ("torch", "cpu"):
            apt = {**pt, "role": "alternative", "variant": "torch"}
            out.append(measure(ctx, opts, f"{kid} write [torch]", apt, partial(torch_write_runner, key, ctx)))
        if not params["read_modes"] or key.width in widths_done:
            continue
        widths_done.add(key.width)
        contexts = sorted({int(c) for c in params["read_contexts"]} | {key.context})
        for context in contexts:
            if context < 1:
                continue
            for which, mode in enumerate(("whole_cast", "gather_cast")):
                dpt = {
                    "what": "read",
                    "mode": mode,
                    "key": kid,
                    "context": context,
                    "width": key.width,
                    "gather_tokens": gather_tokens,
                    "role": "diagnostic",
                    "device": device,
                }
                label = "whole-cache cast" if which == 0 else f"gather {gather_tokens} then cast"
                out.append(
                    measure(
                        ctx,
                        opts,
                        f"fp8→bf16 {label}, width {key.width}, context {context}",
                        dpt,
                        partial(_read, key.width, context, gather_tokens, ctx, which),
                    )
                )
    ctx.progress("done", len(keys), len(keys))
    return RankOutput(measurements=tuple(out))
