"""Provides decodetop's GQA decode kernel (torch side): split-K flash decoding over a K/V cache read in its own
dtype, BF16 or FP8 E4M3 (one scale each for K and V), never cast as a whole.

One program takes one KV head of one sequence — its whole query group (q heads / kv heads × new tokens, padded to
the 16 rows tl.dot needs) — and a chunk of the context, and keeps the online-softmax state; a second kernel
combines the chunks (the split-K "flash-decoding" of FlashAttention's decode path and vLLM's paged attention v2).
An FP8 cache moves 1 byte per value from memory and is converted in registers, so its bytes halve against BF16.
`reference_gqa` is the torch form: SDPA with enable_gqa over the cache (an FP8 cache cast to BF16 first).

Head dims need not be powers of two (Phi-3's 96, 80, 192 over 128; `MIN_HEAD_DIM` to `MAX_HEAD_DIM`): the tiles'
d axes are padded to the next power of two (the split kernel's DP and DVP) and every q, K and V load masks the lanes
past the dim to zero (never the next row's bytes: an FP8 byte there may be NaN, and 0 × NaN = NaN), the rows stay
packed at their real dims, as do the partials and the output; the combine's value lanes past DV are masked, and
TMA's descriptors take the padded block, the copy zero-filling past the row. Where a dim is a power of two no mask
is added (constexpr branches): the kernel compiles as before.

The launch shape is a `GqaConfig`; the grid and constexprs of every launch come from `decodetop.budget.gqa_launch`
(`gqa_launch`, a pure function of the shape and the SM count: the curve engine tells the kernel's launch regimes
apart with the same function). On an H200 the first version (`FIRST`: the query group as the MMA's 16-row M
operand, FP8 converted to BF16, 64-token tiles, 4 programs per SM) ran an FP8 cache at the same time per tile as a
BF16 one, 2.5× bytes / copy bandwidth at 32K (docs/benchmarks.md, "Kernels"): the tile loop, not memory, bounded
it. The options: `f16` converts FP8 to FP16 (one `cvt.rn.f16x2.e4m3x2` per two values; BF16 takes a second
conversion per value) and multiplies in FP16 (query and probabilities in FP16: queries beyond ±65504 would
overflow, far outside what attention sees); bigger tiles, more pipeline stages and more programs per SM put more
bytes in flight. A transposed form (the K/V tile as the MMA's M operand, the query group its N, so that Llama-70B's
8-row groups stop padding a 16-row tile) ran 1.3–2.3× slower than the first on an H200 and was dropped
(benchmarks/results/kernels/h200_kernels_sweep2.log).

Both kernels launch with programmatic dependent launch where the GPU has it (sm_90 and newer,
`common.pdl_enabled`; https://docs.nvidia.com/cuda/cuda-c-programming-guide/index.html#programmatic-dependent-launch-and-synchronization):
the combine's programs are scheduled while the split's last ones finish, and the split's while the kernel before
attention finishes, each waiting in `gdc_wait` before its first load, so the graph nodes of a decode step overlap
their launch and ramp as Hopper engines' kernels do. Every load comes after the wait, the KV cache's too (in an
engine the kernel before writes the new token's K and V); `USE_GDC=False` compiles the kernels as before.

The loop forms (`GqaConfig`'s `fold_scale`, `unmasked`, `lazy_rescale`, `tma`, `early_trigger`; all off in every
default shape, whose loop body is the one measured so far): at 32K the loop, not memory, still bounds the kernel
(1.85× bytes / copy, ~26 warp-instructions a cached token for `LONG`, docs/benchmarks.md "Kernels, third round"),
so each form takes work out of it. `fold_scale` multiplies sm_scale · k_scale · log2 e into q once (no multiply a
score): q is rounded to FP16 (BF16 over a BF16 cache: one rounding more, ~2^-9 a value) after the multiply, as
it was before it, and the factor (sm_scale · log2 e ≈ 0.13 at head dim 128, times k_scale = the keys' amax / 448)
shrinks q, so nothing overflows; below 2^-14 FP16 steps by 2^-24, so over 128 dims of E4M3 keys (≤ 448) such
values move a score by < 2e-3 in log2 units. `unmasked`
reads whole tiles without a mask or select (every split's chunk is whole tiles, `plan_splits`) and masks only
the tile the context ends in. `lazy_rescale` (FlashAttention-4's conditional rescaling) keeps the running max
until a row's grows past `LAZY_RESCALE_LOG2`: exact, since l and acc share the max the combine rescales them by,
and p ≤ 2^8 in FP16 and fp32 has the headroom. `tma` loads K and V through tensor descriptors made on the
device (`tl.make_tensor_descriptor`, scratch from `triton.set_allocator`; the interpreter runs them too).
`early_trigger` lets the combine launch before the tile loop (PDL: the combine's `gdc_wait` still waits for
the split grid). 256-token tiles (64 KB of FP8 K and V a stage) are a `block_n`. benchmarks/kernels/
gqa_loop_forms.py times them: on an H200 none took more than 3 % off Llama-3.1-70B's 8 pairs × 32K over FP8
(28.1 µs against 29.1; docs/benchmarks.md, "Kernels, eighth round"), so every shape the probe runs keeps them off.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F  # noqa: N812 - the conventional name

from decodetop.budget.gqa_launch import (
    BLOCK_N,
    FIRST,
    LAZY_RESCALE_LOG2,
    LONG,
    LONG_BF16,
    LONG_FROM,
    LOOP_OPTIONS,
    PROGRAMS_PER_SM,
    SHORT,
    SHORT_BEFORE,
    SPLIT_RULE,
    GqaConfig,
    GqaLaunch,
    default_config,
    gqa_launch,
    plan_splits,
)
from decodetop.probes.worker.context import UnsupportedError
from decodetop.probes.worker.kernels.common import (
    HAVE_TRITON,
    e4m3_rows,
    interpreted,
    launch,
    next_pow2,
    sm_count,
    tl,
    triton,
    triton_unavailable,
)
from decodetop.probes.worker.kernels.mla import LOG2E

__all__ = [  # the launch shapes and rules re-exported from the budget layer, where they live
    "BLOCK_N",
    "FIRST",
    "LAZY_RESCALE_LOG2",
    "LONG",
    "LONG_BF16",
    "LONG_FROM",
    "LOOP_FORMS",
    "PROGRAMS_PER_SM",
    "SHORT",
    "SHORT_BEFORE",
    "SWEEP",
    "GqaConfig",
    "GqaWorkspace",
    "default_config",
    "gqa_decode",
    "gqa_workspace",
    "plan_splits",
    "reference_gqa",
]

#: The shapes the benchmark sweeps beside `SHORT` and `LONG`: `SHORT` with last round's combine (16 partials a step
#: over two passes: 11.7 µs at 4K against 9.2 with one step), the first, then fewer warps per program over more
#: programs per SM. The tile loop is issue-bound, not memory-bound: in the
#: sm_90 SASS of Triton 3.6 the default's loop takes 36.5 warp-instructions per cached token (8 CTA barriers per
#: tile, for the row max and sum across warps), one warp over 64-token tiles 24.0 (2 barriers), where streaming
#: 4.2 TB/s of FP8 K and V over 132 SMs leaves ~56 per token at full issue (docs/benchmarks.md, "Kernels, third
#: round").
SWEEP = (
    GqaConfig(block_n=128, num_warps=8, num_stages=3, programs_per_sm=2, f16=True, combine_block=16),
    FIRST,
    GqaConfig(block_n=64, num_warps=1, num_stages=3, programs_per_sm=6, f16=True),
    GqaConfig(block_n=64, num_warps=1, num_stages=2, programs_per_sm=8, f16=True),
    GqaConfig(block_n=64, num_warps=1, num_stages=4, programs_per_sm=4, f16=True),
    GqaConfig(block_n=32, num_warps=1, num_stages=4, programs_per_sm=8, f16=True),
    GqaConfig(block_n=128, num_warps=2, num_stages=3, programs_per_sm=2, f16=True),
    GqaConfig(block_n=64, num_warps=2, num_stages=4, programs_per_sm=4, f16=True),
    GqaConfig(block_n=128, num_warps=4, num_stages=3, programs_per_sm=2, f16=True),
)

#: The split kernel's loop forms (`GqaConfig`'s fields, `decodetop.budget.gqa_launch.LOOP_OPTIONS`) one at a time
#: and together, as benchmarks/kernels/gqa_loop_forms.py times them and tests/probes/kernel_checks.py checks them.
LOOP_FORMS: dict[str, dict[str, bool]] = {
    "scale in q": {"fold_scale": True},
    "unmasked": {"unmasked": True},
    "lazy rescale": {"lazy_rescale": True},
    "TMA": {"tma": True},
    "early trigger": {"early_trigger": True},
    "fold+unmasked+lazy": {"fold_scale": True, "unmasked": True, "lazy_rescale": True},
    "all": dict.fromkeys(LOOP_OPTIONS, True),
}

#: The head dims the kernel takes (K's and V's alike, padded to powers of two on the tiles' d axes): from the k of
#: a 16-row MMA (`tl.dot` needs ≥ 16 along the reduced axis) to 256, the largest FlashAttention's and FlashInfer's
#: decode kernels take (64, 80, 96, 112, 128, 192, 256; https://github.com/Dao-AILab/flash-attention README: "all
#: head dimensions up to 256").
MIN_HEAD_DIM = 16
MAX_HEAD_DIM = 256

#: Warps of one combine program (`decodetop.budget.gqa_launch.COMBINE_ELEMS` partials over 256 threads).
COMBINE_WARPS = 8

if HAVE_TRITON:

    @triton.jit  # type: ignore[misc,untyped-decorator,unused-ignore]
    def _kv_tile(  # type: ignore[no-untyped-def,unused-ignore]
        src,
        n0,
        end,
        offs_d,
        ROW: tl.constexpr,
        ROW_PAD: tl.constexpr,
        BLOCK_N: tl.constexpr,
        MASKED: tl.constexpr,
        TMA: tl.constexpr,
    ):
        """One [BLOCK_N, ROW_PAD] tile of K or V from token n0 (rows of ROW values, lanes past ROW read as zeros):
        through its tensor descriptor (TMA: rows past the context's end and lanes past ROW read as zeros), else by
        pointers from `src`, masked past `end` where MASKED and past ROW where ROW_PAD pads it."""
        if TMA:  # one return at the end: Triton 3.6 compiles the code after an early return in a constexpr branch
            tile = src.load([n0, 0])
        else:
            offs_n = n0 + tl.arange(0, BLOCK_N)
            ptrs = src + offs_n[:, None] * ROW + offs_d[None, :]
            if ROW != ROW_PAD:  # zeros, never the next row's bytes (an FP8 byte may be NaN: 0 × NaN = NaN)
                in_row = (offs_d < ROW)[None, :]
                tile = tl.load(ptrs, mask=(offs_n < end)[:, None] & in_row if MASKED else in_row, other=0.0)
            elif MASKED:
                tile = tl.load(ptrs, mask=(offs_n < end)[:, None], other=0.0)
            else:
                tile = tl.load(ptrs)
        return tile

    @triton.jit  # type: ignore[misc,untyped-decorator,unused-ignore]
    def _load_rows(ptrs, rows, offs, N: tl.constexpr, NP: tl.constexpr):  # type: ignore[no-untyped-def,unused-ignore]
        """[rows, NP] values at `ptrs`: zero in the rows off in `rows`, and in lanes `offs` past N where NP pads N."""
        if N != NP:  # one return at the end (see `_kv_tile`)
            x = tl.load(ptrs, mask=rows[:, None] & (offs < N)[None, :], other=0.0)
        else:
            x = tl.load(ptrs, mask=rows[:, None], other=0.0)
        return x

    @triton.jit  # type: ignore[misc,untyped-decorator,unused-ignore]
    def _store_rows(ptrs, x, rows, offs, N: tl.constexpr, NP: tl.constexpr):  # type: ignore[no-untyped-def,unused-ignore]
        """Stores the [rows, NP] `x` at `ptrs`: rows where `rows`, lanes `offs` below N where NP pads N."""
        if N != NP:
            tl.store(ptrs, x, mask=rows[:, None] & (offs < N)[None, :])
        else:
            tl.store(ptrs, x, mask=rows[:, None])

    @triton.jit  # type: ignore[misc,untyped-decorator,unused-ignore]
    def _gqa_tile(  # type: ignore[no-untyped-def,unused-ignore]
        q,
        k_src,
        v_src,
        n0,
        end,
        m_i,
        l_i,
        acc,
        q_scale,
        qk_scale,
        offs_d,
        offs_dv,
        FP8: tl.constexpr,
        D: tl.constexpr,
        DV: tl.constexpr,
        DP: tl.constexpr,
        DVP: tl.constexpr,
        BLOCK_N: tl.constexpr,
        F16: tl.constexpr,
        F32_DOT: tl.constexpr,
        Q8: tl.constexpr,
        MASKED: tl.constexpr,
        FOLD: tl.constexpr,
        LAZY: tl.constexpr,
        TAU: tl.constexpr,
        TMA: tl.constexpr,
    ):
        """One tile's online-softmax step: (m_i, l_i, acc) after the tile of tokens from n0. With every form off
        (MASKED, no FOLD, LAZY or TMA) it is the loop body the kernel ran before the forms."""
        kt = _kv_tile(k_src, n0, end, offs_d, D, DP, BLOCK_N, MASKED, TMA)
        vt = _kv_tile(v_src, n0, end, offs_dv, DV, DVP, BLOCK_N, MASKED, TMA)
        if F32_DOT:
            kt = kt.to(tl.float32)
            vt = vt.to(tl.float32)
        elif F16:
            if not Q8:
                kt = kt.to(tl.float16)
            vt = vt.to(tl.float16)
        elif FP8:
            kt = kt.to(tl.bfloat16)
            vt = vt.to(tl.bfloat16)
        s = tl.dot(q, tl.trans(kt))
        if Q8:
            s = s * q_scale[:, None]
        if not FOLD:
            s = s * qk_scale
        if MASKED:
            offs_n = n0 + tl.arange(0, BLOCK_N)
            s = tl.where((offs_n < end)[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        if LAZY:  # each tile has a token in range, so m_new is finite: the first tile always rescales (from -inf)
            if tl.max(m_new - m_i, 0) > TAU:
                alpha = tl.exp2(m_i - m_new)
                l_i = l_i * alpha
                acc = acc * alpha[:, None]
                m_i = m_new
            p = tl.exp2(s - m_i[:, None])
            l_i = l_i + tl.sum(p, 1)
            acc = acc + tl.dot(p.to(vt.dtype), vt)
        else:
            m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
            alpha = tl.exp2(m_i - m_use)
            p = tl.exp2(s - m_use[:, None])
            l_i = l_i * alpha + tl.sum(p, 1)
            acc = acc * alpha[:, None] + tl.dot(p.to(vt.dtype), vt)
            m_i = m_new
        return m_i, l_i, acc

    @triton.jit  # type: ignore[misc,untyped-decorator,unused-ignore]
    def _gqa_split_kernel(  # type: ignore[no-untyped-def,unused-ignore]  # noqa: PLR0912, PLR0915 - constexpr forms
        q_ptr,
        k_ptr,
        v_ptr,
        scale_ptr,
        acc_ptr,
        ml_ptr,
        kv_heads,
        group_rows,
        length,
        chunk,
        n_splits,
        stride_qb,
        stride_kb,
        stride_kh,
        stride_vb,
        stride_vh,
        sm_scale,
        FP8: tl.constexpr,
        GP: tl.constexpr,
        D: tl.constexpr,
        DV: tl.constexpr,
        DP: tl.constexpr,
        DVP: tl.constexpr,
        BLOCK_N: tl.constexpr,
        F16: tl.constexpr,
        F32_DOT: tl.constexpr,
        USE_GDC: tl.constexpr,
        Q8: tl.constexpr = False,
        FOLD: tl.constexpr = False,
        UNMASKED: tl.constexpr = False,
        LAZY: tl.constexpr = False,
        TAU: tl.constexpr = 8.0,
        TMA: tl.constexpr = False,
        EARLY_TRIGGER: tl.constexpr = False,
    ):
        """Q8 (an FP8 cache only): q · kᵀ FP8 × FP8, each q row quantized to E4M3 (scale max|q_row| / 448, folded
        into the row's score scale), as FlashAttention-3's FP8 path multiplies; p · v stays FP16. The loop forms
        (`GqaConfig`'s): FOLD the score scale into q (with Q8 into the row scales), UNMASKED whole tiles and one
        masked tail, LAZY rescale past TAU (log2 units), TMA descriptors for K and V, EARLY_TRIGGER the
        dependents' launch before the loop. DP and DVP: D and DV padded to powers of two (the tiles' d axes)."""
        bh = tl.program_id(0)
        split = tl.program_id(1)
        b = bh // kv_heads
        h = bh % kv_heads
        offs_g = tl.arange(0, GP)
        mask_g = offs_g < group_rows
        offs_d = tl.arange(0, DP)
        offs_dv = tl.arange(0, DVP)
        if USE_GDC:  # q and the KV cache (the new token's row) are written by the kernels before this one
            tl.extra.cuda.gdc_wait()
            if EARLY_TRIGGER:  # the combine's gdc_wait still waits for this grid's completion and flush
                tl.extra.cuda.gdc_launch_dependents()
        # q rows of this kv head: [b, h · group_rows + g, D]
        # lanes past D zero: they add nothing to q · kᵀ (nor to a Q8 row's max)
        q_ptrs = q_ptr + b * stride_qb + (h * group_rows + offs_g)[:, None] * D + offs_d[None, :]
        q = _load_rows(q_ptrs, mask_g, offs_d, D, DP)
        k_scale = 1.0
        v_scale = 1.0
        if FP8:
            k_scale = tl.load(scale_ptr)
            v_scale = tl.load(scale_ptr + 1)
        qk_scale = sm_scale * k_scale
        q_scale = tl.full([GP], 1.0, tl.float32)
        if Q8:
            q, q_scale = e4m3_rows(q.to(tl.float32), k_ptr.dtype.element_ty, F32_DOT)
            if FOLD:
                q_scale = q_scale * qk_scale
        elif FOLD:  # one multiply per q value instead of one per score; cast below as the loop multiplies
            q = (q.to(tl.float32) * qk_scale).to(q_ptr.dtype.element_ty if not F16 else tl.float16)
        if F32_DOT:
            q = q.to(tl.float32)
        elif F16 and not Q8:
            q = q.to(tl.float16)
        m_i = tl.full([GP], float("-inf"), tl.float32)
        l_i = tl.zeros([GP], tl.float32)
        acc = tl.zeros([GP, DVP], tl.float32)
        start = split * chunk
        end = tl.minimum(start + chunk, length)
        k_base = k_ptr + b * stride_kb + h * stride_kh
        v_base = v_ptr + b * stride_vb + h * stride_vh
        if TMA:  # the pair's [length, D] rows; the context's end and lanes past D zero-filled by the copy
            k_src = tl.make_tensor_descriptor(k_base, shape=[length, D], strides=[D, 1], block_shape=[BLOCK_N, DP])
            v_src = tl.make_tensor_descriptor(v_base, shape=[length, DV], strides=[DV, 1], block_shape=[BLOCK_N, DVP])
        else:
            k_src = k_base
            v_src = v_base
        if UNMASKED:  # chunks are whole tiles: only the last split's may end inside one
            main_end = start + (end - start) // BLOCK_N * BLOCK_N
            for n0 in range(start, main_end, BLOCK_N):
                m_i, l_i, acc = _gqa_tile(
                    q, k_src, v_src, n0, end, m_i, l_i, acc, q_scale, qk_scale, offs_d, offs_dv,
                    FP8, D, DV, DP, DVP, BLOCK_N, F16, F32_DOT, Q8, False, FOLD, LAZY, TAU, TMA,
                )  # fmt: skip
            if main_end < end:
                m_i, l_i, acc = _gqa_tile(
                    q, k_src, v_src, main_end, end, m_i, l_i, acc, q_scale, qk_scale, offs_d, offs_dv,
                    FP8, D, DV, DP, DVP, BLOCK_N, F16, F32_DOT, Q8, True, FOLD, LAZY, TAU, TMA,
                )  # fmt: skip
        else:
            for n0 in range(start, end, BLOCK_N):
                m_i, l_i, acc = _gqa_tile(
                    q, k_src, v_src, n0, end, m_i, l_i, acc, q_scale, qk_scale, offs_d, offs_dv,
                    FP8, D, DV, DP, DVP, BLOCK_N, F16, F32_DOT, Q8, True, FOLD, LAZY, TAU, TMA,
                )  # fmt: skip
        if USE_GDC and not EARLY_TRIGGER:
            tl.extra.cuda.gdc_launch_dependents()
        part = (bh * n_splits + split) * GP + offs_g
        tl.store(ml_ptr + part * 2, m_i, mask=mask_g)
        tl.store(ml_ptr + part * 2 + 1, l_i, mask=mask_g)
        _store_rows(acc_ptr + part[:, None] * DV + offs_dv[None, :], acc * v_scale, mask_g, offs_dv, DV, DVP)

    @triton.jit  # type: ignore[misc,untyped-decorator,unused-ignore]
    def _gqa_combine_kernel(  # type: ignore[no-untyped-def,unused-ignore]
        acc_ptr,
        ml_ptr,
        out_ptr,
        kv_heads,
        group_rows,
        n_splits,
        stride_ob,
        GP: tl.constexpr,
        DV: tl.constexpr,
        BLOCK_S: tl.constexpr,
        DV_BLOCK: tl.constexpr,
        USE_GDC: tl.constexpr,
    ):
        pid = tl.program_id(0)  # (b · kv_heads + h) · group_rows + g
        lanes = tl.program_id(1) * DV_BLOCK + tl.arange(0, DV_BLOCK)  # this program's value lanes
        bh = pid // group_rows
        g = pid % group_rows
        b = bh // kv_heads
        h = bh % kv_heads
        if USE_GDC:  # the partials are the split kernel's
            tl.extra.cuda.gdc_wait()
        offs_s = tl.arange(0, BLOCK_S)
        m_run = tl.full([], float("-inf"), tl.float32)
        l_run = tl.full([], 0.0, tl.float32)
        acc = tl.zeros([DV_BLOCK], tl.float32)
        for s0 in range(0, n_splits, BLOCK_S):  # one step when BLOCK_S covers the splits: one round trip
            ss = s0 + offs_s
            valid = ss < n_splits
            part = (bh * n_splits + ss) * GP + g
            m_s = tl.load(ml_ptr + part * 2, mask=valid, other=float("-inf"))
            l_s = tl.load(ml_ptr + part * 2 + 1, mask=valid, other=0.0)
            a_ptrs = acc_ptr + part[:, None] * DV + lanes[None, :]
            if DV % DV_BLOCK != 0:  # a padded DV: the last block's lanes past DV are no partial's
                a = tl.load(a_ptrs, mask=valid[:, None] & (lanes < DV)[None, :], other=0.0)
            else:
                a = tl.load(a_ptrs, mask=valid[:, None], other=0.0)
            m_new = tl.maximum(m_run, tl.max(m_s, 0))
            m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
            alpha = tl.exp2(m_run - m_use)
            w = tl.exp2(m_s - m_use)
            l_run = l_run * alpha + tl.sum(w * l_s, 0)
            acc = acc * alpha + tl.sum(w[:, None] * a, 0)
            m_run = m_new
        if USE_GDC:
            tl.extra.cuda.gdc_launch_dependents()
        l_all = tl.where(l_run == 0.0, 1.0, l_run)
        out = out_ptr + b * stride_ob + (h * group_rows + g) * DV + lanes
        if DV % DV_BLOCK != 0:
            tl.store(out, (acc / l_all).to(out_ptr.dtype.element_ty), mask=lanes < DV)
        else:
            tl.store(out, (acc / l_all).to(out_ptr.dtype.element_ty))


@dataclass
class GqaWorkspace:
    """Preallocated partials and output of one shape, and the launch they are sized for."""

    acc: torch.Tensor
    ml: torch.Tensor
    out: torch.Tensor
    launch: GqaLaunch

    @property
    def splits(self) -> int:
        return self.launch.splits

    @property
    def chunk(self) -> int:
        """Tokens per split."""
        return self.launch.tokens_per_split

    @property
    def group_pad(self) -> int:
        return self.launch.group_pad_rows

    @property
    def config(self) -> GqaConfig:
        return self.launch.config


def gqa_workspace(
    batch: int,
    heads: int,
    kv_heads: int,
    q_len: int,
    length: int,
    v_dim: int,
    device: torch.device,
    sms: int = 0,
    config: GqaConfig | None = None,
    *,
    fp8: bool = False,
    rule: str = SPLIT_RULE,
) -> GqaWorkspace:
    """Buffers for `batch` sequences of `q_len` new tokens over `length` cached ones (an FP8 cache where `fp8`),
    split by `rule` for `config` (None: `default_config`) on `sms` SMs (0: the device's)."""
    geo = gqa_launch(
        batch, heads, kv_heads, q_len, length, sms=sms or sm_count(device), config=config, v_dim=v_dim,
        kv_dtype="fp8" if fp8 else "bf16", rule=rule,
    )  # fmt: skip
    parts = geo.pairs * geo.splits * geo.group_pad_rows
    return GqaWorkspace(
        torch.empty(parts * v_dim, device=device, dtype=torch.float32),
        torch.empty(parts * 2, device=device, dtype=torch.float32),
        torch.empty(batch, heads * q_len, v_dim, device=device, dtype=torch.bfloat16),
        geo,
    )


def _check_shapes(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scales: torch.Tensor | None, q8: bool = False
) -> None:
    """ValueError unless q, k and v are one GQA shape with head dims in [`MIN_HEAD_DIM`, `MAX_HEAD_DIM`], an FP8
    cache with its scales (and an FP8 cache where `q8` asks for the FP8 × FP8 q · kᵀ)."""
    batch, heads, _q_len, dim = q.shape
    _, kv_heads, length, kdim = k.shape
    v_dim = v.shape[-1]
    if kdim != dim or heads % kv_heads or tuple(v.shape[:3]) != (batch, kv_heads, length):
        raise ValueError(f"GQA shapes disagree: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")
    if min(dim, v_dim) < MIN_HEAD_DIM or max(dim, v_dim) > MAX_HEAD_DIM:
        raise ValueError(f"GQA head dims must be in [{MIN_HEAD_DIM}, {MAX_HEAD_DIM}] (got {dim}, {v_dim})")
    if k.dtype == torch.float8_e4m3fn and scales is None:
        raise ValueError("an FP8 K/V cache needs its [k_scale, v_scale]")
    if q8 and k.dtype != torch.float8_e4m3fn:
        raise ValueError("GQA's FP8 × FP8 q · kᵀ needs an FP8 cache")


def _descriptor_scratch(size: int, _alignment: int, _stream: int | None) -> torch.Tensor:
    """Global scratch for the tensor descriptors a kernel makes on the device (`triton.set_allocator`): a CUDA
    allocation on the current device, from the graph's pool under capture (vLLM's `set_triton_allocator` so)."""
    return torch.empty(size, device="cuda", dtype=torch.int8)


def _tma_ready(k: torch.Tensor, v: torch.Tensor) -> None:
    """ValueError unless TMA descriptors can take K and V's rows (16-byte rows and bases: the CUDA driver's
    `cuTensorMapEncodeTiled` rules); on a GPU, give Triton the allocator for their scratch."""
    for what, x in (("K", k), ("V", v)):
        row = x.shape[-1] * x.element_size()
        if x.stride(-1) != 1 or x.stride(-2) != x.shape[-1] or row % 16 or x.data_ptr() % 16:
            raise ValueError(f"GQA's TMA tiles need contiguous 16-byte {what} rows (got {row} bytes)")
    if k.device.type == "cuda":
        triton.set_allocator(_descriptor_scratch)


def _launch_combine(work: GqaWorkspace, kv_heads: int, v_dim: int) -> None:
    """The combine kernel over `work`'s split partials into `work.out`."""
    geo = work.launch
    launch(
        _gqa_combine_kernel,
        geo.combine_grid,
        work.acc,
        work.ml,
        work.out,
        kv_heads,
        geo.group_rows,
        geo.splits,
        work.out.stride(0),
        GP=geo.group_pad_rows,
        DV=v_dim,
        BLOCK_S=geo.combine_block,
        DV_BLOCK=geo.combine_lanes,
        num_warps=COMBINE_WARPS,
        pdl=True,
    )


def gqa_decode(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    sm_scale: float,
    scales: torch.Tensor | None = None,
    work: GqaWorkspace | None = None,
    q8: bool = False,
) -> torch.Tensor:
    """q [B, H, Q, D] bf16 (Q new tokens per sequence), k [B, Hkv, L, D] and v [B, Hkv, L, Dv] (bf16, or
    float8_e4m3fn with `scales` = [k_scale, v_scale] fp32). Returns [B, H·Q, Dv] bf16, rows in (head, token) order
    (the output of every query row against the whole cache, as SDPA without a mask). `q8` (an FP8 cache, FP16
    tiles): q · kᵀ in FP8 × FP8 with each q row quantized (the split kernel's `Q8`; benchmarks only so far)."""
    if not HAVE_TRITON:
        raise UnsupportedError(triton_unavailable(q.device))
    _check_shapes(q, k, v, scales, q8)
    batch, heads, q_len, dim = q.shape
    _, kv_heads, length, _ = k.shape
    v_dim = v.shape[-1]
    fp8 = k.dtype == torch.float8_e4m3fn
    if work is None:
        work = gqa_workspace(batch, heads, kv_heads, q_len, length, v_dim, q.device, fp8=fp8)
    geo = work.launch
    if (geo.pairs, geo.group_rows, geo.length_tokens) != (batch * kv_heads, heads // kv_heads * q_len, length):
        raise ValueError(f"GQA workspace sized for another shape than q {tuple(q.shape)}, k {tuple(k.shape)}")
    qc = q.contiguous()
    scale = scales if scales is not None else work.ml
    cfg = geo.config
    if cfg.tma:
        _tma_ready(k, v)
    launch(
        _gqa_split_kernel,
        geo.split_grid,
        qc,
        k,
        v,
        scale,
        work.acc,
        work.ml,
        kv_heads,
        geo.group_rows,
        length,
        geo.tokens_per_split,
        geo.splits,
        qc.stride(0),
        k.stride(0),
        k.stride(1),
        v.stride(0),
        v.stride(1),
        sm_scale * LOG2E,
        FP8=fp8,
        GP=geo.group_pad_rows,
        D=dim,
        DV=v_dim,
        DP=next_pow2(dim),
        DVP=next_pow2(v_dim),
        BLOCK_N=cfg.block_n,
        F16=cfg.f16 and fp8,
        F32_DOT=interpreted() and (q8 or not (cfg.f16 and fp8)),  # fp16 dots run right under the interpreter
        Q8=q8 and cfg.f16,
        FOLD=cfg.fold_scale,
        UNMASKED=cfg.unmasked,
        LAZY=cfg.lazy_rescale,
        TAU=LAZY_RESCALE_LOG2,
        TMA=cfg.tma,
        EARLY_TRIGGER=cfg.early_trigger,
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
        pdl=True,
    )
    _launch_combine(work, kv_heads, v_dim)
    return work.out


def reference_gqa(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, sm_scale: float, scales: torch.Tensor | None = None
) -> torch.Tensor:
    """The torch form: SDPA with enable_gqa (an FP8 cache cast to BF16 and scaled first); [B, H·Q, Dv]."""
    if k.dtype != q.dtype:  # tensor ops, not float(): the torch form is captured into a CUDA graph
        k = (k.float() * scales[0]).to(q.dtype) if scales is not None else k.to(q.dtype)
        v = (v.float() * scales[1]).to(q.dtype) if scales is not None else v.to(q.dtype)
    out = F.scaled_dot_product_attention(q, k, v, scale=sm_scale, enable_gqa=k.shape[1] != q.shape[1])
    batch, heads, q_len, v_dim = out.shape
    return out.reshape(batch, heads * q_len, v_dim)
