"""Provides the `attention` probe: one layer's decode attention against a KV cache of the configured context.

Per key (`attention:kind=gqa|mla|mla+dsa,batch=…,q_len=…,context=…,…`) the budget point times the best kernel this
rank runs (`kernels.common.best_runner`), and says which on the point (`Measurement.kernel`):

1. the engine's own kernel where one is importable: FlashInfer's single-sequence decode for GQA, FlashMLA for
   dense MLA (`kernels.engines`; checked once against the torch form);
2. else decodetop's Triton kernels: GQA split-K flash decoding over the cache in its own dtype (`kernels.gqa`: an
   FP8 cache read as FP8, so its bytes halve); MLA in the absorbed form over the latent cache read once, split over
   the context (`kernels.mla`); for DSA models (GLM-5, DeepSeek-V3.2) the indexer's scores over the FP8 index keys
   read as FP8 and an exact radix top-k (`kernels.dsa`) before the sparse MLA over the selected latents;
3. else the torch form (SDPA with enable_gqa; bmm, softmax, bmm; the indexer's bmm and torch.topk; an FP8 cache
   cast to BF16 first, as torch must), which is also timed as an `alternative` point of the key wherever a faster
   kernel ran ("torch ops would take X µs"); the budget takes the faster of the two (SDPA's own flash kernel beat
   decodetop's split-K for BF16 GQA on an H200: docs/benchmarks.md, "Kernels"). On CPU ranks the torch form is the
   figure, labelled CPU.

Caches are random, rotated above 2× L2 so each call reads DRAM as a new layer would. Metrics: time, KV bytes read
(in the cache's own dtype for the fast kernels) and KV GB/s (docs/reference/probes.md §7.8).

Diagnostics: the same key at each context of `context_sweep` (GB/s of KV read vs context, docs/reference/probes.md
§7.8: 0, 16k, 32k, 64k, 128k), skipped on CPU ranks.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812 - the conventional name

from decodetop.budget.gqa_launch import GqaLaunch, launch_metrics
from decodetop.budget.keys import AttentionKey, parse_key_id
from decodetop.probes.results import RankMeasurement, RankOutput
from decodetop.probes.worker.context import ProbeContext, UnsupportedError
from decodetop.probes.worker.kernels import dsa, engines, gqa, mla, mla_select
from decodetop.probes.worker.kernels.common import (
    best_runner,
    check_close,
    pdl_enabled,
    torch_kernel,
    triton_kernel,
    triton_unavailable,
)
from decodetop.probes.worker.ops import OpRunner, TimingOptions, each_key, key_list, measure
from decodetop.probes.worker.precompile import compile_ahead
from decodetop.probes.worker.tensors import FP8_E4M3_MAX, copies_for, randn, require_free
from decodetop.probes.worker.timing import Rotation

#: Scale the probe's FP8 caches are stored with (values of std 1 over e4m3's range; any fixed scale costs the same).
FP8_CACHE_SCALE = 1.0 / 64.0


@dataclass(frozen=True)
class AttentionVariant:
    """The launch shapes decodetop's Triton attention kernels run with: the probe runs the defaults, the kernels
    benchmark (benchmarks/kernels/h200_kernels.py) sweeps the others beside them."""

    gqa: gqa.GqaConfig | None = None
    """GQA's launch shape (None: by context, `gqa.default_config`)."""
    dsa_mla: mla.MlaConfig = mla.SPARSE_DEFAULT
    """The sparse MLA over the DSA top-k (before `mla`: that field's name hides the module below it)."""
    mla: mla.MlaConfig = mla.DEFAULT
    """Dense MLA."""
    dsa_scheme: str = dsa.BY_CONTEXT
    """The DSA top-k's scheme (`dsa.SCHEMES`; `dsa.BY_CONTEXT`: `dsa.default_scheme` of the context)."""
    dsa_select_block: int = 0
    """Scores per program of the DSA selection passes (0: `dsa.auto_select_block`)."""
    dsa_f16: bool = True
    """The DSA indexer's product in FP16 (`dsa.DsaWorkspace.f16`; False: in BF16, the first form) where not `dsa_q8`."""
    dsa_q8: bool = True
    """The DSA indexer's product FP8 × FP8, q quantized per head (`dsa.DsaWorkspace.q8`, the engines' form)."""
    dsa_chunks_per_sm: float = mla_select.CHUNKS_PER_SM
    """Context chunks per SM of the selecting sparse MLA (`radix8-fused`: `mla_select.select_workspace`)."""

    def label(self, kind: str, dsa_scheme: str = "") -> str:
        """The shapes that apply to attention of `kind`: 'split 64 tok/4w/3st/8 per SM, fp16' (`dsa_scheme`: the
        top-k scheme a by-context variant resolved to)."""
        if kind == "gqa":
            return f"split {self.gqa.label}" if self.gqa else "split by context"
        text = f"split {(self.dsa_mla if kind == 'mla+dsa' else self.mla).label}"
        select = f" select {self.dsa_select_block}" if self.dsa_select_block else ""
        product = "" if self.dsa_q8 else (", indexer fp16" if self.dsa_f16 else ", indexer bf16")
        scheme = self.dsa_scheme or dsa_scheme or "by context"
        if scheme == dsa.FUSED_SCHEME:  # the selecting split's chunks, not the list split's tiles
            text = f"selecting split, {self.dsa_chunks_per_sm:g} chunks per SM"
        return f"top-k {scheme}{select}{product}, {text}" if kind == "mla+dsa" else text


def _cache(shape: tuple[int, ...], fp8: bool, device: torch.device) -> torch.Tensor:
    """A random cache of std 1 (FP8: stored ÷ FP8_CACHE_SCALE, inside e4m3's range)."""
    if not fp8:
        return randn(shape, torch.bfloat16, device, std=1.0)
    raw = randn(shape, torch.float32, device, std=1.0) / FP8_CACHE_SCALE
    return raw.clamp_(-FP8_E4M3_MAX, FP8_E4M3_MAX).to(torch.float8_e4m3fn)


def attention_runner(key: AttentionKey, ctx: ProbeContext, *, rotate: bool, context: int | None = None) -> OpRunner:
    """The best kernel for `batch` sequences of `q_len` new tokens against `context` cached ones."""
    if key.kind not in ("gqa", "mla", "mla+dsa"):
        raise UnsupportedError(f"attention kind {key.kind!r} is not gqa, mla or mla+dsa")
    length = (key.context if context is None else context) + key.q_len
    return best_runner(
        [
            ("engine kernel", lambda: engine_attention_runner(key, ctx, length, rotate=rotate)),
            ("decodetop Triton", lambda: triton_attention_runner(key, ctx, length, rotate=rotate)),
            ("torch", lambda: torch_attention_runner(key, ctx, length, rotate=rotate)),
        ]
    ).runner


# --------------------------------------------------------------------------------------------------------- GQA


@dataclass
class _Gqa:
    """One GQA key's tensors: query, rotated K/V caches in the cache dtype, FP8 scales, sizes."""

    q: torch.Tensor
    caches: Rotation[tuple[torch.Tensor, torch.Tensor]]
    scales: torch.Tensor | None
    kv_bytes: float
    flops: float
    attended: int
    sm_scale: float


def _gqa_inputs(key: AttentionKey, ctx: ProbeContext, length: int, *, rotate: bool) -> _Gqa:
    device = ctx.device
    fp8 = key.kv_dtype == "fp8"
    b, heads = key.batch, key.heads
    attended = min(length, key.window) if key.window else length
    item = 1 if fp8 else 2
    kv_bytes = float(b * key.kv_heads * attended * (key.head_dim + key.v_head_dim) * item)
    copies = copies_for(ctx, kv_bytes, rotate)
    require_free(ctx, copies * kv_bytes * 1.1 + b * heads * attended * 4, f"KV cache {key.key_id}")
    caches = Rotation(
        [
            (
                _cache((b, key.kv_heads, attended, key.head_dim), fp8, device),
                _cache((b, key.kv_heads, attended, key.v_head_dim), fp8, device),
            )
            for _ in range(copies)
        ]
    )
    scales = torch.tensor([FP8_CACHE_SCALE, FP8_CACHE_SCALE], device=device) if fp8 else None
    q = randn((b, heads, key.q_len, key.head_dim), torch.bfloat16, device, std=1.0)
    flops = 2.0 * b * key.q_len * heads * attended * (key.head_dim + key.v_head_dim)
    return _Gqa(q, caches, scales, kv_bytes, flops, attended, 1.0 / math.sqrt(key.head_dim))


def _gqa_torch(g: _Gqa) -> Callable[[], torch.Tensor]:
    def sdpa() -> torch.Tensor:
        k, v = g.caches.next()
        return gqa.reference_gqa(g.q, k, v, sm_scale=g.sm_scale, scales=g.scales)

    return sdpa


def _gqa_runner(  # noqa: PLR0917 - one runner's parts
    g: _Gqa, fn: Callable[[], object], note: str, kernel_name: str, ctx: ProbeContext, launch: GqaLaunch | None = None
) -> OpRunner:
    """The runner of one GQA form; the split-K kernel's `launch` is recorded with its point (`launch_metrics`)."""
    moved = g.kv_bytes + 2 * g.q.numel() * 2
    if kernel_name.startswith("SDPA"):
        kernel = torch_kernel(ctx, kernel_name)
    else:
        kernel = triton_kernel(kernel_name, pdl=pdl_enabled(ctx.device))
    facts = launch_metrics(launch) if launch is not None else {}
    return OpRunner(fn, moved, g.flops, len(g.caches), note, kv_bytes=g.kv_bytes, kernel=kernel, facts=facts)


# --------------------------------------------------------------------------------------------------------- MLA


@dataclass
class _Mla:
    """One MLA key's tensors: queries, rotated latent (and DSA index) caches, sizes."""

    key: AttentionKey
    q: torch.Tensor
    """[R, H, kv_lora_rank + rope] bf16 (R = batch × q_len)."""
    caches: Rotation[tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]]
    """(latent [B, L, width], index keys [B, L, Di] fp8 or None, key scales [B, L] or None)."""
    cache_scale: torch.Tensor | None
    q_idx: torch.Tensor | None
    w_idx: torch.Tensor | None
    lora: int
    attended: int
    kv_bytes: float
    flops: float
    sm_scale: float


def _mla_inputs(key: AttentionKey, ctx: ProbeContext, length: int, *, rotate: bool) -> _Mla:
    device = ctx.device
    b, heads, rows = key.batch, key.heads, key.batch * key.q_len
    width = key.head_dim  # kv_lora_rank + rope as the kernel sees it
    lora = key.kv_lora_rank or key.v_head_dim
    fp8 = key.kv_dtype == "fp8"
    dsa_on = key.kind == "mla+dsa"
    attended = min(length, key.index_topk) if dsa_on and key.index_topk else length
    item = 1 if fp8 else 2
    latent_bytes = b * length * width * item
    index_bytes = b * length * (key.index_head_dim + 4) if dsa_on else 0
    read = (rows if dsa_on else b) * attended * width * item + index_bytes
    copies = copies_for(ctx, latent_bytes + index_bytes, rotate)
    require_free(
        ctx, copies * (latent_bytes + index_bytes) * 1.1 + rows * heads * length * 4, f"MLA cache {key.key_id}"
    )
    caches = Rotation(
        [
            (
                _cache((b, length, width), fp8, device),
                _cache((b, length, key.index_head_dim), True, device) if dsa_on else None,
                torch.rand(b, length, device=device) * FP8_CACHE_SCALE + FP8_CACHE_SCALE / 2 if dsa_on else None,
            )
            for _ in range(copies)
        ]
    )
    q = randn((rows, heads, width), torch.bfloat16, device, std=1.0)
    q_idx = randn((rows, key.index_heads, key.index_head_dim), torch.bfloat16, device, std=1.0) if dsa_on else None
    w_idx = torch.rand(rows, key.index_heads, device=device) if dsa_on else None
    flops = 2.0 * rows * heads * attended * (width + lora)
    if dsa_on:
        flops += 2.0 * rows * key.index_heads * length * key.index_head_dim
    scale = torch.tensor([FP8_CACHE_SCALE], device=device) if fp8 else None
    return _Mla(key, q, caches, scale, q_idx, w_idx, lora, attended, float(read), flops, 1.0 / math.sqrt(width))


def _mla_torch(m: _Mla) -> Callable[[], torch.Tensor]:
    """bmm, softmax, bmm over the (FP8: cast) latent cache; for DSA first the indexer's bmm, ReLU, weighted sum and
    torch.topk, then the gather of the selected latents."""
    q_len = m.key.q_len

    def run() -> torch.Tensor:
        cache, index_keys, key_scales = m.caches.next()
        idx = None
        if index_keys is not None and key_scales is not None and m.q_idx is not None and m.w_idx is not None:
            scores = dsa.reference_scores(m.q_idx, m.w_idx, index_keys, key_scales, q_len=q_len)
            idx = scores.topk(m.attended, dim=-1).indices
        return mla.reference_mla(
            m.q, cache, lora=m.lora, sm_scale=m.sm_scale, q_len=q_len, indices=idx, cache_scale=m.cache_scale
        )

    return run


def _mla_triton(
    m: _Mla, device: torch.device, variant: AttentionVariant
) -> tuple[Callable[[], torch.Tensor], dsa.DsaWorkspace | None, Callable[[], torch.Tensor] | None]:
    """DSA scores + radix top-k (for mla+dsa), then the split-K MLA kernel, every buffer preallocated (the
    `radix8-fused` scheme: the passes, then the MLA that selects); the DSA workspace and, for radix8-fused, a reader
    of the positions the last call selected are returned for the check."""
    key, rows = m.key, m.q.shape[0]
    length = m.caches.items[0][0].shape[1]
    dsa_on = m.caches.items[0][1] is not None
    config = variant.dsa_mla if dsa_on else variant.mla
    work = mla.mla_workspace(rows, key.heads, m.attended, device, lora=m.lora, config=config)
    dwork = None
    if dsa_on:
        dwork = dsa.dsa_workspace(
            rows,
            length,
            m.attended,
            device,
            scheme=variant.dsa_scheme,
            select_block=variant.dsa_select_block,
            f16=variant.dsa_f16,
            q8=variant.dsa_q8,
        )

    swork = None
    if dwork is not None and dwork.scheme == dsa.FUSED_SCHEME and dwork.selects:
        swork = mla_select.select_workspace(
            rows, key.heads, length, device, lora=m.lora, chunks_per_sm=variant.dsa_chunks_per_sm
        )

    def run() -> torch.Tensor:
        cache, index_keys, key_scales = m.caches.next()
        idx = None
        if dwork is not None and index_keys is not None and key_scales is not None:
            assert m.q_idx is not None and m.w_idx is not None
            dsa.dsa_prepare(dwork)  # the memset, except where the scheme leaves the workspace zero
            dsa.dsa_scores(m.q_idx, m.w_idx, index_keys, key_scales, dwork, q_len=key.q_len)
            if swork is not None:  # the split kernel selects: no index list
                dsa.dsa_passes(dwork, m.attended)
                return mla_select.mla_decode_selected(
                    m.q, cache, dwork, swork, lora=m.lora, sm_scale=m.sm_scale, topk=m.attended, q_len=key.q_len,
                    cache_scale=m.cache_scale,
                )  # fmt: skip
            idx = dsa.dsa_select(dwork, m.attended)
        return mla.mla_decode(
            m.q,
            cache,
            lora=m.lora,
            sm_scale=m.sm_scale,
            q_len=key.q_len,
            indices=idx,
            cache_scale=m.cache_scale,
            work=work,
        )

    selected = (lambda: mla_select.selected_indices(swork)) if swork is not None else None
    return run, dwork, selected


def _check_mla(
    m: _Mla,
    run: Callable[[], torch.Tensor],
    dwork: dsa.DsaWorkspace | None,
    what: str,
    selected: Callable[[], torch.Tensor] | None = None,
) -> None:
    """The fast form against the torch form on the first rotation copy. DSA: the scores against the torch form's,
    the selection exactly a top-k set of the kernel's own scores, and the attention over that set against the torch
    form over the same set (so near-ties between two score roundings cannot make the check flaky)."""
    m.caches.rewind()
    got = run().clone()
    m.caches.rewind()
    cache, index_keys, key_scales = m.caches.items[0]
    idx = None
    if dwork is not None and index_keys is not None and key_scales is not None:
        assert m.q_idx is not None and m.w_idx is not None
        ref = dsa.reference_scores(m.q_idx, m.w_idx, index_keys, key_scales, q_len=m.key.q_len, q8=dwork.q8)
        check_close(dwork.scores, ref, what + " indexer scores")
        idx = selected() if selected is not None else dwork.indices.clone()
        chosen = torch.gather(dwork.scores, 1, idx.long()).sort(dim=-1).values
        best = dwork.scores.topk(idx.shape[1], dim=-1).values.sort(dim=-1).values
        if not torch.equal(chosen, best):
            raise RuntimeError(f"{what}: the radix top-k is not a top-{idx.shape[1]} set of the scores")
    want = mla.reference_mla(
        m.q, cache, lora=m.lora, sm_scale=m.sm_scale, q_len=m.key.q_len, indices=idx, cache_scale=m.cache_scale
    )
    check_close(got, want, what)


# ------------------------------------------------------------------------------------------------- the classes


def torch_attention_runner(key: AttentionKey, ctx: ProbeContext, length: int, *, rotate: bool) -> OpRunner:
    """The torch form (an FP8 cache cast to BF16 on every call, as torch must)."""
    cast = "; FP8 cache cast to bf16 each call" if key.kv_dtype == "fp8" else ""
    if key.kind == "gqa":
        g = _gqa_inputs(key, ctx, length, rotate=rotate)
        return _gqa_runner(g, _gqa_torch(g), "SDPA with enable_gqa" + cast, "SDPA (enable_gqa)" + cast, ctx)
    m = _mla_inputs(key, ctx, length, rotate=rotate)
    ops = "bmm, softmax, bmm (the latent cache read twice)"
    if key.kind == "mla+dsa":
        ops = "indexer bmm, relu, sum, topk; gather; " + ops
    moved = m.kv_bytes + m.q.numel() * 2 * 2
    return OpRunner(
        _mla_torch(m),
        moved,
        m.flops,
        len(m.caches),
        ops + cast,
        kv_bytes=m.kv_bytes,
        kernel=torch_kernel(ctx, ops + cast),
    )


def triton_attention_runner(
    key: AttentionKey,
    ctx: ProbeContext,
    length: int,
    *,
    rotate: bool,
    variant: AttentionVariant | None = None,
) -> OpRunner:
    """decodetop's Triton kernels (the default launch shapes unless `variant` says others), checked once against
    the torch form."""
    reason = triton_unavailable(ctx.device)
    if reason:
        raise UnsupportedError(reason)
    variant = variant or AttentionVariant()
    fp8 = " (FP8 cache read as FP8)" if key.kv_dtype == "fp8" else ""
    shapes = variant.label(key.kind)
    if key.kind == "gqa":
        g = _gqa_inputs(key, ctx, length, rotate=rotate)
        work = gqa.gqa_workspace(
            key.batch, key.heads, key.kv_heads, key.q_len, g.attended, key.v_head_dim, ctx.device, config=variant.gqa,
            fp8=key.kv_dtype == "fp8",
        )  # fmt: skip

        def split_k() -> torch.Tensor:
            k, v = g.caches.next()
            return gqa.gqa_decode(g.q, k, v, sm_scale=g.sm_scale, scales=g.scales, work=work)

        k0, v0 = g.caches.items[0]
        work.out.fill_(float("nan"))  # poisoned: every element must be written
        got = split_k().clone()
        g.caches.rewind()
        check_close(got, gqa.reference_gqa(g.q, k0, v0, sm_scale=g.sm_scale, scales=g.scales), "Triton GQA decode")
        return _gqa_runner(g, split_k, f"split {work.config.label}", f"GQA decode split-K{fp8}", ctx, work.launch)
    m = _mla_inputs(key, ctx, length, rotate=rotate)
    run, dwork, selected = _mla_triton(m, ctx.device, variant)
    name = f"MLA decode split-K over the latent cache read once{fp8}"
    if key.kind == "mla+dsa":
        indexer = "FP8 × FP8 (q quantized per head)" if dwork is not None and dwork.q8 else "over FP8 keys"
        where = (
            " (selected in the sparse MLA's split)" if dwork is not None and dwork.scheme == dsa.FUSED_SCHEME else ""
        )
        name = f"DSA indexer {indexer} + radix top-k{where}, sparse {name}"
    _check_mla(m, run, dwork, "Triton " + key.kind, selected)
    shapes = variant.label(key.kind, dwork.scheme if dwork is not None else "")
    moved = m.kv_bytes + m.q.numel() * 2 * 2
    kernel = triton_kernel(name, pdl=pdl_enabled(ctx.device))
    return OpRunner(run, moved, m.flops, len(m.caches), shapes, kv_bytes=m.kv_bytes, kernel=kernel)


def engine_attention_runner(key: AttentionKey, ctx: ProbeContext, length: int, *, rotate: bool) -> OpRunner:
    """FlashInfer's single-sequence decode for a BF16 GQA cache of one sequence (other shapes: no engine kernel
    is looked for; FlashMLA's paged layout is not adapted here)."""
    if key.kind != "gqa" or key.batch != 1 or key.q_len != 1 or key.kv_dtype != "bf16":
        raise UnsupportedError(f"no engine kernel adapted for {key.kind} at batch {key.batch}, {key.kv_dtype} KV")
    found = engines.find("gqa_decode")
    g = _gqa_inputs(key, ctx, length, rotate=rotate)
    q1 = g.q[0, :, 0, :].contiguous()

    def decode() -> torch.Tensor:
        k, v = g.caches.next()
        return found.fn(q1, k[0], v[0], kv_layout="HND", sm_scale=g.sm_scale)  # type: ignore[no-any-return]

    k0, v0 = g.caches.items[0]
    want = F.scaled_dot_product_attention(g.q, k0, v0, scale=g.sm_scale, enable_gqa=key.kv_heads != key.heads)
    got = found.fn(q1, k0[0], v0[0], kv_layout="HND", sm_scale=g.sm_scale)
    check_close(got, want[0, :, 0, :], found.kernel.text)
    moved = g.kv_bytes + 2 * g.q.numel() * 2
    return OpRunner(decode, moved, g.flops, len(g.caches), kv_bytes=g.kv_bytes, kernel=found.kernel)


def launch_triton_once(key: AttentionKey, length: int, ctx: ProbeContext) -> None:
    """decodetop's Triton kernels of one key at `length` tokens, launched once with the default launch shapes and
    no check: what `precompile.compile_ahead` collects on meta tensors before the probe times them."""
    if key.kind == "gqa":
        g = _gqa_inputs(key, ctx, length, rotate=False)
        work = gqa.gqa_workspace(
            key.batch, key.heads, key.kv_heads, key.q_len, g.attended, key.v_head_dim, ctx.device,
            fp8=key.kv_dtype == "fp8",
        )  # fmt: skip
        k, v = g.caches.next()
        gqa.gqa_decode(g.q, k, v, sm_scale=g.sm_scale, scales=g.scales, work=work)
    elif key.kind in ("mla", "mla+dsa"):
        run, _, _ = _mla_triton(_mla_inputs(key, ctx, length, rotate=False), ctx.device, AttentionVariant())
        run()


def op_runner(key_id: str, ctx: ProbeContext, *, rotate: bool) -> OpRunner:
    """A layer's attention at the key's own context."""
    key = parse_key_id(key_id)
    assert isinstance(key, AttentionKey)
    return attention_runner(key, ctx, rotate=rotate)


def run(ctx: ProbeContext, params: dict[str, Any]) -> RankOutput:
    """Each key at its context (best kernel, then the torch form beside it), then the context sweep (GPU only); then
    each of `curve_keys` (the curve plan's batch × context × KV-dtype grid) with the best kernel only, role "curve"."""
    opts = TimingOptions.from_params(ctx, params)
    keys = key_list(params, "attention")
    sweep = sorted({int(c) for c in params["context_sweep"]}) if ctx.is_cuda else []
    grid = key_list({"keys": params.get("curve_keys", [])}, "attention")
    points = [(k, k.context) for k in map(parse_key_id, keys) if isinstance(k, AttentionKey)]
    points += [(k, c) for k, _ in list(points) for c in sweep if c != k.context]
    points += [(k, k.context) for k in map(parse_key_id, grid) if isinstance(k, AttentionKey)]
    ahead = compile_ahead(ctx, [partial(launch_triton_once, k, c + k.q_len) for k, c in points])
    if ahead.requested:
        ctx.progress(ahead.text)
    out: list[RankMeasurement] = []
    device = ctx.device.type
    for kid, key in each_key(ctx, keys, AttentionKey):
        pt = {"what": "attention", "key": kid, "context": key.context, "role": "budget", "device": device}
        best = measure(ctx, opts, kid, pt, partial(attention_runner, key, ctx, rotate=opts.rotate))
        out.append(best)
        if best.kernel is not None and best.kernel.kind not in ("torch", "cpu"):
            length = key.context + key.q_len
            apt = {**pt, "role": "alternative", "variant": "torch"}
            build = partial(torch_attention_runner, key, ctx, length, rotate=opts.rotate)
            out.append(measure(ctx, opts, f"{kid} [torch]", apt, build))
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
    for kid, key in each_key(ctx, grid, AttentionKey):  # the curve plan's grid: the best kernel only
        pt = {"what": "attention", "key": kid, "context": key.context, "role": "curve", "device": device}
        out.append(measure(ctx, opts, kid, pt, partial(attention_runner, key, ctx, rotate=opts.rotate)))
    ctx.progress("done", len(keys) + len(grid), len(keys) + len(grid))
    return RankOutput(measurements=tuple(out))
