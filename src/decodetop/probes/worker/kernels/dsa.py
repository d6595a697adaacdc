"""Provides decodetop's DSA indexer kernels (torch side): the lightning indexer's scores over FP8 index keys read as
FP8, and an exact top-k by radix select, for DeepSeek-V3.2-style sparse attention (GLM-5).

score[r, t] = Σ_h w[r, h] · ReLU(q[r, h] · k[t] · s[t]) over the index heads, with the index keys `k` FP8 E4M3
and one fp32 scale per token (DeepSeek-V3.2's indexer cache: 128 FP8 values + a scale per token; DeepGEMM reads
them as FP8 too). The scores then pick the `topk` tokens the sparse MLA attends to.

`torch.topk` of 2048 of 4096 alone takes 37 µs on an H200 under graph replay, more than the whole attention should,
so the selection is a radix select on the scores' order-preserving 32-bit keys: three histogram passes
(11 + 11 + 10 bits; each pass counts only the tokens still tied with the threshold, each program finds the
threshold digit from the previous pass's histogram itself) and one compaction pass that writes the tokens above the
threshold and as many tied at it as the count needs. The first histogram is taken in the scoring kernel. Five
launches (with the workspace's memset) whatever the context, no sort, no host sync; the selected set equals
torch.topk's (the order inside it does not matter to attention). Where the context holds no more than `topk`
tokens every token is selected (as `min(context, topk)` in the torch form).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from decodetop.probes.worker.context import UnsupportedError
from decodetop.probes.worker.kernels.common import (
    HAVE_TRITON,
    interpreted,
    next_pow2,
    sm_count,
    tl,
    triton,
    triton_unavailable,
)

#: Tokens per scoring tile (a [heads × 128] · [128 × tile] product).
SCORE_BLOCK = 128
#: Scores per program in the histogram and compaction passes.
SELECT_BLOCK = 2048
#: Histogram bins per pass: 11 + 11 + 10 bits cover a 32-bit key.
BINS = (2048, 2048, 1024)
#: Workspace per row: the three histograms and two counters (above the threshold, tied at it).
WORK_INTS = sum(BINS) + 2
#: Scoring programs wanted per SM (each scores 1–16 tiles).
SCORE_PROGRAMS_PER_SM = 2

if HAVE_TRITON:

    @triton.jit  # type: ignore[misc,untyped-decorator,unused-ignore]
    def _key_of(score):  # type: ignore[no-untyped-def,unused-ignore]
        """fp32 → uint32 whose unsigned order is the float order (negatives: all bits flipped; else the sign bit)."""
        bits = score.to(tl.uint32, bitcast=True)
        flip = tl.where((bits >> 31) == 1, 0xFFFFFFFF, 0x80000000).to(tl.uint32)
        return bits ^ flip

    @triton.jit  # type: ignore[misc,untyped-decorator,unused-ignore]
    def _threshold_bin(hist_ptr, k_rem, NB: tl.constexpr):  # type: ignore[no-untyped-def,unused-ignore]
        """(bin, count strictly above it) of the bin holding the `k_rem`-th largest element of a histogram."""
        bins = tl.arange(0, NB)
        h = tl.load(hist_ptr + bins)
        at_or_above = tl.sum(h, 0) - tl.cumsum(h, 0) + h
        b = tl.max(tl.where(at_or_above >= k_rem, bins, -1), 0)
        above = tl.sum(tl.where(bins > b, h, 0), 0)
        return b, above

    @triton.jit  # type: ignore[misc,untyped-decorator,unused-ignore]
    def _score_kernel(  # type: ignore[no-untyped-def,unused-ignore]
        q_ptr,
        w_ptr,
        k_ptr,
        ks_ptr,
        score_ptr,
        work_ptr,
        heads,
        length,
        q_len,
        tiles_per_program,
        stride_kb,
        stride_ksb,
        WORK: tl.constexpr,
        HP: tl.constexpr,
        D: tl.constexpr,
        BLOCK: tl.constexpr,
        BINS1: tl.constexpr,
        F32_DOT: tl.constexpr,
    ):
        pid = tl.program_id(0)
        row = tl.program_id(1)
        batch = row // q_len
        offs_h = tl.arange(0, HP)
        mask_h = offs_h < heads
        offs_d = tl.arange(0, D)
        q = tl.load(q_ptr + row * heads * D + offs_h[:, None] * D + offs_d[None, :], mask=mask_h[:, None], other=0.0)
        if F32_DOT:
            q = q.to(tl.float32)
        w = tl.load(w_ptr + row * heads + offs_h, mask=mask_h, other=0.0).to(tl.float32)
        hist = tl.zeros([BINS1], tl.int32)
        for i in range(tiles_per_program):
            offs_l = (pid * tiles_per_program + i) * BLOCK + tl.arange(0, BLOCK)
            mask_l = offs_l < length
            k = tl.load(
                k_ptr + batch * stride_kb + offs_l[:, None] * D + offs_d[None, :], mask=mask_l[:, None], other=0.0
            )
            k = k.to(tl.float32) if F32_DOT else k.to(tl.bfloat16)
            ks = tl.load(ks_ptr + batch * stride_ksb + offs_l, mask=mask_l, other=0.0)
            logits = tl.dot(q, tl.trans(k)) * ks[None, :]
            score = tl.sum(tl.maximum(logits, 0.0) * w[:, None], 0)
            tl.store(score_ptr + row * length + offs_l, score, mask=mask_l)
            digit = (_key_of(score) >> 21).to(tl.int32)
            hist += tl.histogram(digit, BINS1, mask=mask_l)
        bins = tl.arange(0, BINS1)
        tl.atomic_add(work_ptr + row * WORK + bins, hist, mask=hist > 0)

    @triton.jit  # type: ignore[misc,untyped-decorator,unused-ignore]
    def _radix_pass_kernel(  # type: ignore[no-untyped-def,unused-ignore]
        score_ptr,
        work_ptr,
        length,
        k,
        WORK: tl.constexpr,
        LEVEL: tl.constexpr,
        BLOCK: tl.constexpr,
        B1: tl.constexpr,
        B2: tl.constexpr,
        B3: tl.constexpr,
    ):
        pid = tl.program_id(0)
        row = tl.program_id(1)
        base = work_ptr + row * WORK
        b1, above1 = _threshold_bin(base, k, B1)
        offs = pid * BLOCK + tl.arange(0, BLOCK)
        valid = offs < length
        key = _key_of(tl.load(score_ptr + row * length + offs, mask=valid, other=0.0))
        if LEVEL == 2:
            tied = valid & ((key >> 21).to(tl.int32) == b1)
            digit = ((key >> 10) & 0x7FF).to(tl.int32)
            hist = tl.histogram(digit, B2, mask=tied)
            tl.atomic_add(base + B1 + tl.arange(0, B2), hist, mask=hist > 0)
        else:
            b2, _ = _threshold_bin(base + B1, k - above1, B2)
            prefix = (b1 << 11) | b2
            tied = valid & ((key >> 10).to(tl.int32) == prefix)
            digit = (key & 0x3FF).to(tl.int32)
            hist = tl.histogram(digit, B3, mask=tied)
            tl.atomic_add(base + B1 + B2 + tl.arange(0, B3), hist, mask=hist > 0)

    @triton.jit  # type: ignore[misc,untyped-decorator,unused-ignore]
    def _compact_kernel(  # type: ignore[no-untyped-def,unused-ignore]
        score_ptr,
        work_ptr,
        idx_ptr,
        length,
        k,
        WORK: tl.constexpr,
        BLOCK: tl.constexpr,
        B1: tl.constexpr,
        B2: tl.constexpr,
        B3: tl.constexpr,
    ):
        pid = tl.program_id(0)
        row = tl.program_id(1)
        base = work_ptr + row * WORK
        b1, above1 = _threshold_bin(base, k, B1)
        b2, above2 = _threshold_bin(base + B1, k - above1, B2)
        b3, above3 = _threshold_bin(base + B1 + B2, k - above1 - above2, B3)
        threshold = (b1.to(tl.uint32) << 21) | (b2.to(tl.uint32) << 10) | b3.to(tl.uint32)
        n_above = above1 + above2 + above3
        n_tied = k - n_above
        offs = pid * BLOCK + tl.arange(0, BLOCK)
        valid = offs < length
        key = _key_of(tl.load(score_ptr + row * length + offs, mask=valid, other=0.0))
        over = valid & (key > threshold)
        at = valid & (key == threshold)
        over_i = over.to(tl.int32)
        at_i = at.to(tl.int32)
        start_over = tl.atomic_add(base + B1 + B2 + B3, tl.sum(over_i, 0))
        start_at = tl.atomic_add(base + B1 + B2 + B3 + 1, tl.sum(at_i, 0))
        pos_over = start_over + tl.cumsum(over_i, 0) - 1
        pos_at = start_at + tl.cumsum(at_i, 0) - 1
        tl.store(idx_ptr + row * k + pos_over, offs, mask=over)
        tl.store(idx_ptr + row * k + n_above + pos_at, offs, mask=at & (pos_at < n_tied))


@dataclass
class DsaWorkspace:
    """Preallocated scores, radix workspace and selected indices of one shape (a captured graph allocates
    nothing)."""

    scores: torch.Tensor
    """[rows, length] fp32."""
    work: torch.Tensor
    """[rows, WORK_INTS] int32: histograms and counters, zeroed each call."""
    indices: torch.Tensor
    """[rows, min(length, topk)] int32."""
    all_tokens: torch.Tensor | None
    """When the context holds no more than `topk` tokens: every position (copied, no selection)."""
    tiles_per_program: int
    score_programs: int


def dsa_workspace(rows: int, length: int, topk: int, device: torch.device, sms: int | None = None) -> DsaWorkspace:
    """Buffers for `rows` query rows over a context of `length` tokens selecting `topk`."""
    k = min(length, topk)
    tiles = -(-length // SCORE_BLOCK)
    programs_wanted = max(1, -(-SCORE_PROGRAMS_PER_SM * (sms or sm_count(device)) // rows))
    per = max(1, -(-tiles // programs_wanted))
    all_tokens = None
    if length <= topk:
        all_tokens = torch.arange(length, device=device, dtype=torch.int32).expand(rows, length).contiguous()
    return DsaWorkspace(
        torch.empty(rows, length, device=device, dtype=torch.float32),
        torch.zeros(rows, WORK_INTS, device=device, dtype=torch.int32),
        torch.empty(rows, k, device=device, dtype=torch.int32),
        all_tokens,
        per,
        -(-tiles // per),
    )


def dsa_scores(
    q: torch.Tensor,
    weights: torch.Tensor,
    keys: torch.Tensor,
    key_scales: torch.Tensor,
    work: DsaWorkspace,
    *,
    q_len: int = 1,
) -> torch.Tensor:
    """Indexer scores [R, L] fp32 into `work.scores` (and the first radix histogram into `work.work`, which must be
    zero): q [R, Hi, Di] bf16, weights [R, Hi] fp32, keys [B, L, Di] float8_e4m3fn, key_scales [B, L] fp32."""
    if not HAVE_TRITON:
        raise UnsupportedError(triton_unavailable(q.device))
    rows, heads, dim = q.shape
    batch, length, kdim = keys.shape
    if kdim != dim or rows != batch * q_len or next_pow2(dim) != dim or tuple(weights.shape) != (rows, heads):
        raise ValueError(f"DSA shapes disagree: q {tuple(q.shape)}, keys {tuple(keys.shape)}, {q_len=}")
    _score_kernel[(work.score_programs, rows)](
        q,
        weights,
        keys,
        key_scales,
        work.scores,
        work.work,
        heads,
        length,
        q_len,
        work.tiles_per_program,
        keys.stride(0),
        key_scales.stride(0),
        WORK=WORK_INTS,
        HP=max(16, next_pow2(heads)),
        D=dim,
        BLOCK=SCORE_BLOCK,
        BINS1=BINS[0],
        F32_DOT=interpreted(),
    )
    return work.scores


def dsa_select(work: DsaWorkspace, topk: int) -> torch.Tensor:
    """The top-`topk` token positions of each row of `work.scores` into `work.indices` (after `dsa_scores`)."""
    rows, length = work.scores.shape
    if work.all_tokens is not None:
        work.indices.copy_(work.all_tokens)
        return work.indices
    grid = (-(-length // SELECT_BLOCK), rows)
    sizes = {"WORK": WORK_INTS, "BLOCK": SELECT_BLOCK, "B1": BINS[0], "B2": BINS[1], "B3": BINS[2]}
    _radix_pass_kernel[grid](work.scores, work.work, length, topk, LEVEL=2, **sizes)
    _radix_pass_kernel[grid](work.scores, work.work, length, topk, LEVEL=3, **sizes)
    _compact_kernel[grid](work.scores, work.work, work.indices, length, topk, **sizes)
    return work.indices


def dsa_topk(
    q: torch.Tensor,
    weights: torch.Tensor,
    keys: torch.Tensor,
    key_scales: torch.Tensor,
    topk: int,
    *,
    q_len: int = 1,
    work: DsaWorkspace | None = None,
) -> torch.Tensor:
    """Scores and selection in one call: [R, min(L, topk)] int32 token positions (the workspace zeroed first)."""
    if work is None:
        work = dsa_workspace(q.shape[0], keys.shape[1], topk, q.device)
    work.work.zero_()
    dsa_scores(q, weights, keys, key_scales, work, q_len=q_len)
    return dsa_select(work, topk)


def reference_scores(
    q: torch.Tensor, weights: torch.Tensor, keys: torch.Tensor, key_scales: torch.Tensor, *, q_len: int = 1
) -> torch.Tensor:
    """The torch form of the scores (FP8 keys cast to bf16 first, as a torch implementation must): [R, L] fp32."""
    kb = keys.to(torch.bfloat16)
    if q_len > 1:
        kb = kb.repeat_interleave(q_len, dim=0)
        key_scales = key_scales.repeat_interleave(q_len, dim=0)
    logits = torch.bmm(q, kb.transpose(1, 2)).float() * key_scales.unsqueeze(1)  # [R, Hi, L]
    return (logits.relu() * weights.float().unsqueeze(-1)).sum(dim=1)
