"""Provides decodetop's MLA decode kernel (torch side): absorbed multi-head latent attention over the latent cache,
read once, split over the context (flash-decoding), dense or over a DSA top-k set of token indices.

The absorbed form (DeepSeek-V2/V3, GLM-5; FlashMLA's): each query head carries `kv_lora_rank + rope` values
(q_nope·W_UK absorbed, then q_pe); the cache holds one latent row per token, `[c_kv (kv_lora_rank) | k_pe (rope)]`.
score = q · row, p = softmax(score · scale), out = p · c_kv. One program takes a block of heads (all of a TP
shard's 8–16 heads at once, so a cache tile serves every head from registers and shared memory) and a chunk of the
context, and keeps the online-softmax state (max, sum, un-normalised output); a second kernel combines the chunks.
Heads beyond one block run as further programs on the same chunk at the same time, so the cache comes from DRAM
once and from L2 for the other blocks. With `indices` (DSA) the tiles are gathered rows of the selected tokens.

An FP8 cache (`float8_e4m3fn` with one scale) is read as FP8: 1 byte per value from memory, converted in
registers. `reference_mla` is the torch form (bmm, softmax, bmm: the cache read twice, an FP8 cache cast first).

The launch shape is an `MlaConfig` (tokens per tile, pipeline stages, warps, programs per SM). The first shape
(`FIRST`: 64-token tiles, 2 stages, 4 warps, 2 programs per SM) holds 94 KB of shared memory per program (sm_90
build), so two programs fit an SM; 32-token tiles (56 KB) fit four, 8 warps halve the registers per thread.

Both kernels launch with programmatic dependent launch where the GPU has it (sm_90 and newer,
`common.pdl_enabled`; https://docs.nvidia.com/cuda/cuda-c-programming-guide/index.html#programmatic-dependent-launch-and-synchronization):
the next grid is scheduled while this one's last programs finish and waits in `gdc_wait` before its first load
(the query, the latent cache, whose new row the kernel before writes in an engine, the DSA indices, the partials),
so the split (after the DSA top-k) and the combine overlap their launch and ramp; `USE_GDC=False` compiles the
kernels as before.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from decodetop.budget.gqa_launch import plan_splits
from decodetop.probes.worker.context import UnsupportedError
from decodetop.probes.worker.kernels.common import (
    HAVE_TRITON,
    interpreted,
    is_collecting,
    launch,
    next_pow2,
    sm_count,
    tl,
    triton,
    triton_unavailable,
)

#: Tokens per tile: 64 latent rows of 576 bf16 values are 72 KB, two stages fit Hopper's 228 KB of shared memory
#: (`TILE_CHOICES`: 32-token tiles where a GPU has less).
BLOCK_N = 64
#: (tokens per tile, pipeline stages), tried in order until one compiles on this GPU.
TILE_CHOICES = ((64, 2), (32, 2), (16, 1))
#: Heads per program: tl.dot needs at least 16 rows; a TP shard's 8 (GLM-5 at TP 8) or 16 (DeepSeek-V3 at TP 8) heads
#: fit one block.
BLOCK_H = 16
#: Programs per SM wanted for the split (more chunks: more memory streams, more partial results to combine).
PROGRAMS_PER_SM = 2
#: Output columns per combine program: 32 give GLM-5's TP-8 sparse combine 128 programs (8 heads × 16 blocks of its
#: 512 columns), a tile of up to 128 × 32 fp32 partials each (32 values a thread of 4 warps).
COMBINE_BLOCK_D = 32
#: Split partials per combine step, at most: one step (one round trip to L2) for up to 128 splits. On an H200 the
#: two-pass combine of 16 partials a step took 12.8 µs after DeepSeek-V3's TP-8 split at 128K (264 splits) and 3.1 µs
#: after GLM-5's sparse one (32): latency, not bytes (benchmarks/kernels/kernel_profile.py; docs/benchmarks.md,
#: "Kernels, ninth round").
COMBINE_BLOCK_S = 128
LOG2E = 1.4426950408889634


@dataclass(frozen=True)
class MlaConfig:
    """The split kernel's launch shape. A tile that does not fit this GPU's shared memory falls back along
    `TILE_CHOICES`."""

    block_n: int = BLOCK_N
    num_stages: int = 2
    num_warps: int = 4
    programs_per_sm: int = PROGRAMS_PER_SM

    @property
    def label(self) -> str:
        """'64 tok/2st/4w/2 per SM'."""
        return f"{self.block_n} tok/{self.num_stages}st/{self.num_warps}w/{self.programs_per_sm} per SM"


#: The first version's shape (H200: 72.4 µs, 49 % of copy bandwidth, at DeepSeek-V3's TP-8 shard and 128K;
#: docs/benchmarks.md "Kernels").
FIRST = MlaConfig()
#: The shape the probe runs (the H200 sweep of `benchmarks/kernels/h200_kernels.py` times it beside the others:
#: docs/benchmarks.md, "Kernels"; notes in benchmarks/results/kernels/notes.md).
#: On an H200 (DeepSeek-V3's TP-8 shard, 128K): 58.3 µs, 61 % of copy bandwidth, where the first shape took 72.9 µs
#: and 32-token tiles at 4 programs per SM 92.9 (docs/benchmarks.md, "Kernels"). One program per SM with three
#: stages in flight; at 4K the split is the first shape's (64 splits of one tile either way).
DEFAULT = MlaConfig(block_n=64, num_stages=3, num_warps=8, programs_per_sm=1)
#: The shape of the sparse (DSA) form: the top-k's 2048 tokens make 32 splits of one tile whatever the programs per
#: SM; on an H200 the first shape ran GLM-5's TP-8 shard in 38.9 µs at 4K against 40.3 for 32-token tiles.
SPARSE_DEFAULT = FIRST
#: The shapes the benchmark sweeps (one program per SM halves the split's partials: 264 splits of 16 heads × 512
#: fp32 values each, 8.6 MB written and read again at 2 per SM).
SWEEP = (
    FIRST,
    MlaConfig(block_n=32, num_stages=2, num_warps=4, programs_per_sm=4),
    MlaConfig(block_n=64, num_stages=2, num_warps=8, programs_per_sm=2),
    MlaConfig(block_n=32, num_stages=3, num_warps=8, programs_per_sm=2),
    MlaConfig(block_n=32, num_stages=2, num_warps=4, programs_per_sm=8),
    MlaConfig(block_n=64, num_stages=2, num_warps=4, programs_per_sm=1),
    MlaConfig(block_n=64, num_stages=2, num_warps=8, programs_per_sm=1),
    MlaConfig(block_n=64, num_stages=3, num_warps=8, programs_per_sm=1),
)

if HAVE_TRITON:

    @triton.jit  # type: ignore[misc,untyped-decorator,unused-ignore]
    def _latent_tile(  # type: ignore[no-untyped-def,unused-ignore]
        q_nope, q_rope, c_base, stride_ct, tok, mask_n, m_i, l_i, acc, qk_scale, offs_d, offs_r,
        FP8: tl.constexpr, D_NOPE: tl.constexpr, F32_DOT: tl.constexpr,
    ):  # fmt: skip
        """One tile's online-softmax step over the latent rows of tokens `tok` (masked by `mask_n`): the split
        kernels' loop body, over a chunk of the context, a chunk of a DSA list or a chunk's own selection
        (`kernels.mla_select`)."""
        rows = c_base + tok.to(tl.int64)[:, None] * stride_ct
        c_nope = tl.load(rows + offs_d[None, :], mask=mask_n[:, None], other=0.0)
        c_rope = tl.load(rows + D_NOPE + offs_r[None, :], mask=mask_n[:, None], other=0.0)
        if F32_DOT:
            c_nope = c_nope.to(tl.float32)
            c_rope = c_rope.to(tl.float32)
        elif FP8:
            c_nope = c_nope.to(tl.bfloat16)
            c_rope = c_rope.to(tl.bfloat16)
        s = tl.dot(q_nope, tl.trans(c_nope)) + tl.dot(q_rope, tl.trans(c_rope))
        s = tl.where(mask_n[None, :], s * qk_scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_use)
        p = tl.exp2(s - m_use[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(c_nope.dtype), c_nope)
        return m_new, l_i, acc

    @triton.jit  # type: ignore[misc,untyped-decorator,unused-ignore]
    def _mla_split_kernel(  # type: ignore[no-untyped-def,unused-ignore]
        q_ptr,
        c_ptr,
        idx_ptr,
        scale_ptr,
        acc_ptr,
        ml_ptr,
        heads,
        total,
        chunk,
        n_splits,
        q_len,
        stride_qr,
        stride_qh,
        stride_cb,
        stride_ct,
        stride_ir,
        sm_scale,
        SPARSE: tl.constexpr,
        FP8: tl.constexpr,
        BLOCK_H: tl.constexpr,
        BLOCK_N: tl.constexpr,
        D_NOPE: tl.constexpr,
        D_ROPE: tl.constexpr,
        F32_DOT: tl.constexpr,
        USE_GDC: tl.constexpr,
    ):
        hb = tl.program_id(0)
        split = tl.program_id(1)
        row = tl.program_id(2)
        batch = row // q_len
        offs_h = hb * BLOCK_H + tl.arange(0, BLOCK_H)
        mask_h = offs_h < heads
        offs_d = tl.arange(0, D_NOPE)
        offs_r = tl.arange(0, D_ROPE)
        if USE_GDC:  # q, the latent cache (the new token's row) and the DSA indices are written before this kernel
            tl.extra.cuda.gdc_wait()
        q_rows = q_ptr + row * stride_qr + offs_h[:, None] * stride_qh
        q_nope = tl.load(q_rows + offs_d[None, :], mask=mask_h[:, None], other=0.0)
        q_rope = tl.load(q_rows + D_NOPE + offs_r[None, :], mask=mask_h[:, None], other=0.0)
        if F32_DOT:
            q_nope = q_nope.to(tl.float32)
            q_rope = q_rope.to(tl.float32)
        cache_scale = 1.0
        if FP8:
            cache_scale = tl.load(scale_ptr)
        qk_scale = sm_scale * cache_scale
        m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_H], tl.float32)
        acc = tl.zeros([BLOCK_H, D_NOPE], tl.float32)
        start = split * chunk
        end = tl.minimum(start + chunk, total)
        for n0 in range(start, end, BLOCK_N):
            offs_n = n0 + tl.arange(0, BLOCK_N)
            mask_n = offs_n < end
            if SPARSE:
                tok = tl.load(idx_ptr + row * stride_ir + offs_n, mask=mask_n, other=-1)
                mask_n = mask_n & (tok >= 0)
                tok = tl.where(mask_n, tok, 0)
            else:
                tok = offs_n
            m_i, l_i, acc = _latent_tile(
                q_nope, q_rope, c_ptr + batch * stride_cb, stride_ct, tok, mask_n, m_i, l_i, acc, qk_scale, offs_d,
                offs_r, FP8, D_NOPE, F32_DOT,
            )  # fmt: skip
        if USE_GDC:
            tl.extra.cuda.gdc_launch_dependents()
        part = (row * n_splits + split) * heads + offs_h
        tl.store(ml_ptr + part * 2, m_i, mask=mask_h)
        tl.store(ml_ptr + part * 2 + 1, l_i, mask=mask_h)
        tl.store(acc_ptr + part[:, None] * D_NOPE + offs_d[None, :], acc * cache_scale, mask=mask_h[:, None])

    @triton.jit  # type: ignore[misc,untyped-decorator,unused-ignore]
    def _mla_combine_kernel(  # type: ignore[no-untyped-def,unused-ignore]
        acc_ptr,
        ml_ptr,
        out_ptr,
        zero_ptr,
        zero_from,
        heads,
        n_splits,
        stride_or,
        stride_oh,
        D: tl.constexpr,
        BLOCK_S: tl.constexpr,
        BLOCK_D: tl.constexpr,
        ZERO: tl.constexpr,
        ZERO_ROW: tl.constexpr,
        USE_GDC: tl.constexpr,
    ):
        """One (row, head)'s `BLOCK_D` output lanes from every split's partials, in one pass (the running max
        rescales what is summed so far, as the split's tiles do). ZERO: the first program of each row zeroes
        `zero_ptr`'s ints [zero_from, ZERO_ROW) of that row (a workspace every split program read)."""
        rh = tl.program_id(0)
        db = tl.program_id(1)
        row = rh // heads
        h = rh % heads
        offs_s = tl.arange(0, BLOCK_S)
        offs_d = db * BLOCK_D + tl.arange(0, BLOCK_D)
        if USE_GDC:  # the partials are the split kernel's
            tl.extra.cuda.gdc_wait()
        m_run = tl.full([], float("-inf"), tl.float32)
        l_run = tl.full([], 0.0, tl.float32)
        acc = tl.zeros([BLOCK_D], tl.float32)
        for s0 in range(0, n_splits, BLOCK_S):  # one step where BLOCK_S covers the splits: one round trip
            ss = s0 + offs_s
            valid = ss < n_splits
            part = (row * n_splits + ss) * heads + h
            m_s = tl.load(ml_ptr + part * 2, mask=valid, other=float("-inf"))
            l_s = tl.load(ml_ptr + part * 2 + 1, mask=valid, other=0.0)
            a = tl.load(acc_ptr + part[:, None] * D + offs_d[None, :], mask=valid[:, None], other=0.0)
            m_new = tl.maximum(m_run, tl.max(m_s, 0))
            m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
            alpha = tl.exp2(m_run - m_use)
            w = tl.exp2(m_s - m_use)
            l_run = l_run * alpha + tl.sum(w * l_s, 0)
            acc = acc * alpha + tl.sum(w[:, None] * a, 0)
            m_run = m_new
        if USE_GDC:
            tl.extra.cuda.gdc_launch_dependents()
        if ZERO > 0:  # noqa: SIM102 - a constexpr branch around a runtime one
            if h == 0 and db == 0:
                zs = zero_from + tl.arange(0, ZERO)
                tl.store(zero_ptr + row * ZERO_ROW + zs, tl.zeros([ZERO], tl.int32), mask=zs < ZERO_ROW)
        l_all = tl.where(l_run == 0.0, 1.0, l_run)
        tl.store(out_ptr + row * stride_or + h * stride_oh + offs_d, (acc / l_all).to(out_ptr.dtype.element_ty))


@dataclass
class MlaWorkspace:
    """Preallocated partial results and output of one shape, so a captured graph allocates nothing."""

    acc: torch.Tensor
    ml: torch.Tensor
    out: torch.Tensor
    splits: int
    chunk: int
    config: MlaConfig = DEFAULT


def mla_workspace(
    rows: int,
    heads: int,
    total: int,
    device: torch.device,
    *,
    lora: int = 512,
    sms: int | None = None,
    config: MlaConfig = DEFAULT,
) -> MlaWorkspace:
    """Buffers for `rows` query rows of `heads` heads over `total` tokens (dense context or selected indices). The
    split is a whole number of the largest tile `TILE_CHOICES` may fall back from, so any fallback tiles it."""
    head_blocks = -(-heads // BLOCK_H)
    splits, chunk = plan_splits(  # the GQA kernel's split rule: whole tiles, about programs_per_sm per SM
        total, head_blocks * rows, sms or sm_count(device), config.block_n, config.programs_per_sm
    )
    acc = torch.empty(rows * splits * heads * lora, device=device, dtype=torch.float32)
    ml = torch.empty(rows * splits * heads * 2, device=device, dtype=torch.float32)
    out = torch.empty(rows, heads, lora, device=device, dtype=torch.bfloat16)
    return MlaWorkspace(acc, ml, out, splits, chunk, config)


def mla_decode(
    q: torch.Tensor,
    cache: torch.Tensor,
    *,
    lora: int,
    sm_scale: float,
    q_len: int = 1,
    indices: torch.Tensor | None = None,
    cache_scale: torch.Tensor | None = None,
    work: MlaWorkspace | None = None,
) -> torch.Tensor:
    """Absorbed MLA: q [R, H, lora + rope] (R = batch × q_len rows, bf16), cache [B, L, lora + rope] (bf16, or
    float8_e4m3fn with `cache_scale`, a 1-element fp32 tensor); `indices` [R, K] int32 token positions (−1: none)
    for DSA. Returns [R, H, lora] bf16 (in `work.out` when given)."""
    if not HAVE_TRITON:
        raise UnsupportedError(triton_unavailable(q.device))
    rows, heads, width = q.shape
    batch, length, cwidth = cache.shape
    rope = width - lora
    if cwidth != width or rows != batch * q_len or rope < 16 or next_pow2(rope) != rope or next_pow2(lora) != lora:
        raise ValueError(f"MLA shapes disagree: q {tuple(q.shape)}, cache {tuple(cache.shape)}, {lora=}, {q_len=}")
    fp8 = cache.dtype == torch.float8_e4m3fn
    if fp8 and cache_scale is None:
        raise ValueError("an FP8 latent cache needs its cache_scale")
    total = length if indices is None else indices.shape[1]
    if work is None:
        work = mla_workspace(rows, heads, total, q.device, lora=lora)
    head_blocks = -(-heads // BLOCK_H)
    idx = indices if indices is not None else q  # unused pointer when dense
    scale = cache_scale if cache_scale is not None else work.ml
    _launch_split(
        (head_blocks, work.splits, rows),
        (
            q,
            cache,
            idx,
            scale,
            work.acc,
            work.ml,
            heads,
            total,
            work.chunk,
            work.splits,
            q_len,
            q.stride(0),
            q.stride(1),
            cache.stride(0),
            cache.stride(1),
            idx.stride(0),
            sm_scale * LOG2E,
        ),
        {"SPARSE": indices is not None, "FP8": fp8, "BLOCK_H": BLOCK_H, "D_NOPE": lora, "D_ROPE": rope},
        work.config,
    )
    return launch_combine(work, rows, heads, lora)


def launch_combine(
    work: MlaWorkspace, rows: int, heads: int, lora: int, *, zero: tuple[torch.Tensor, int, int] | None = None
) -> torch.Tensor:
    """The combine over `work`'s partials into `work.out`; `zero` = (an int32 workspace of rows × n ints, from, n):
    each row's ints [from, n) zeroed after every split program read them."""
    out = work.out
    block_d = min(COMBINE_BLOCK_D, lora)
    zero_ptr, zero_from, zero_row = zero if zero is not None else (work.ml, 0, 0)
    launch(
        _mla_combine_kernel,
        (rows * heads, lora // block_d),
        work.acc,
        work.ml,
        out,
        zero_ptr,
        zero_from,
        heads,
        work.splits,
        out.stride(0),
        out.stride(1),
        D=lora,
        BLOCK_S=min(COMBINE_BLOCK_S, next_pow2(work.splits)),
        BLOCK_D=block_d,
        ZERO=next_pow2(zero_row - zero_from) if zero is not None else 0,
        ZERO_ROW=zero_row,
        pdl=True,
    )
    return out


_TILE_OK: dict[tuple[object, ...], tuple[int, int]] = {}


def _launch_split(
    grid: tuple[int, int, int], args: tuple[object, ...], consts: dict[str, object], config: MlaConfig
) -> None:
    """The split kernel with the configured tile, else the first smaller one of `TILE_CHOICES` this GPU compiles
    (shared memory differs by GPU), remembered per kernel variant. The split is a whole number of tiles of the
    configured size, so of every smaller choice too."""
    variant = (*sorted(consts.items()), config)
    fallbacks = [(n, st) for n, st in TILE_CHOICES if n < config.block_n]
    choices = [_TILE_OK[variant]] if variant in _TILE_OK else [(config.block_n, config.num_stages), *fallbacks]
    for index, (block_n, stages) in enumerate(choices):
        try:
            launch(
                _mla_split_kernel,
                grid,
                *args,
                **consts,
                BLOCK_N=block_n,
                F32_DOT=interpreted(),
                num_warps=config.num_warps,
                num_stages=stages,
                pdl=True,
            )
        except Exception as exc:
            if index == len(choices) - 1 or "resource" not in str(exc).lower():
                raise
            continue
        if not is_collecting():  # a recorded launch has not shown that this tile compiles here
            _TILE_OK[variant] = (block_n, stages)
        return


def reference_mla(
    q: torch.Tensor,
    cache: torch.Tensor,
    *,
    lora: int,
    sm_scale: float,
    q_len: int = 1,
    indices: torch.Tensor | None = None,
    cache_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """The torch form of `mla_decode`: the cache (FP8: cast to bf16 and scaled) gathered at `indices`, then
    bmm(q, cacheᵀ) → softmax in fp32 → bmm(p, c_kv); [R, H, lora] bf16."""
    rows, _heads, width = q.shape
    dense = cache.to(torch.bfloat16) if cache.dtype != torch.bfloat16 else cache
    if cache_scale is not None:
        dense = (dense.float() * cache_scale.float()).to(torch.bfloat16)
    per_row = dense.repeat_interleave(q_len, dim=0) if q_len > 1 else dense  # [R, L, width]
    valid: torch.Tensor | None = None
    if indices is not None:
        valid = indices >= 0
        safe = indices.clamp(min=0).long()
        per_row = torch.gather(per_row, 1, safe.unsqueeze(-1).expand(rows, safe.shape[1], width))
    s = torch.bmm(q, per_row.transpose(1, 2)).float() * sm_scale
    if valid is not None:
        s = s.masked_fill(~valid.unsqueeze(1), float("-inf"))
    p = s.softmax(dim=-1).to(torch.bfloat16)
    return torch.bmm(p, per_row[:, :, :lora])


def default_scale(width: int) -> float:
    """1/√(q/k width) as the probe scales scores (the model's own scale differs; the cost does not)."""
    return 1.0 / math.sqrt(width)
