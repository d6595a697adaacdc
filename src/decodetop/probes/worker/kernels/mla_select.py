"""Provides the DSA path's sparse MLA that selects its own tokens (`radix8-fused`, torch side): the split kernel reads
the indexer's scores and the radix passes' threshold itself, so no compaction kernel runs between them.

`radix8-carry` ends in a compaction grid that writes the top-k positions as one list (an atomic counter a program
for the places), and the sparse MLA's split grid reads that list: on an H200 at GLM-5's TP-8 shard and 128K the
compaction ended 4.3 µs after the last radix pass and the split 7.7 µs after the compaction, of a 32.5 µs step
(benchmarks/kernels/kernel_profile.py; docs/benchmarks.md, "Kernels, ninth round"). Here each split program takes a
chunk of the context instead of a chunk of the list: it finds the threshold from the last pass's histogram (as the
compaction's `dsa._carried` does, the bin's count kept from the same load), keeps its chunk's scores above it and
the tied ones the count needs, writes their positions to its own row of a scratch buffer (no atomics: its places
are its own), and attends over them gathered from the latent cache, as `mla._mla_split_kernel` does over a list (the
same tile step, `mla._latent_tile`); `mla._mla_combine_kernel` merges the chunks and zeroes what the passes left in
the DSA workspace (read by every split program, so only after the grid).

Ties at the threshold (keys equal in all 32 bits): the fourth histogram's bin at the threshold counts them. Where the
top-k needs all of them (always but for equal scores) each program keeps its own; otherwise the earliest positions
are kept, each program counting the tied keys before its chunk (a scan of the row's scores, the slow path of equal
scores), so every head block selects the same set, as one list would give it.

The scores are the scoring kernel's (four grids back) and the query is written before it, so both are loaded before
the wait on the last radix pass (the argument of `dsa._carry_keys`' EARLY loads: each grid between waited for the one
before it before it let the next start).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from decodetop.probes.worker.context import UnsupportedError
from decodetop.probes.worker.kernels.common import (
    HAVE_TRITON,
    interpreted,
    launch,
    next_pow2,
    sm_count,
    tl,
    triton,
    triton_unavailable,
)
from decodetop.probes.worker.kernels.dsa import CARRY8_INTS, CARRY_AT, DsaWorkspace
from decodetop.probes.worker.kernels.dsa_keys import DIGIT_BINS, DIGITS
from decodetop.probes.worker.kernels.mla import BLOCK_H, LOG2E, MlaWorkspace, launch_combine

#: Scores a program keys at once (a chunk is a whole number of these).
SEL_BLOCK = 1024
#: Selected tokens per attention tile: the top-k's 2048 over ~132 chunks are ~16 a chunk at random scores.
BLOCK_N = 16
#: Chunks per SM: one program per SM takes a chunk of every head block (`select_workspace`'s `chunks_per_sm`).
CHUNKS_PER_SM = 1.0

if HAVE_TRITON:
    from decodetop.probes.worker.kernels.dsa_keys import _bin_of, _key_of
    from decodetop.probes.worker.kernels.mla import _latent_tile

    _LAST_CARRY = tl.constexpr(CARRY_AT + 2 * (DIGITS - 2))  # the fourth pass's carry: prefix, count above it

    _BINS = tl.constexpr(DIGIT_BINS)
    _LAST_HIST = tl.constexpr((DIGITS - 1) * DIGIT_BINS)  # the fourth histogram's first int in a row

    @triton.jit  # type: ignore[misc,untyped-decorator,unused-ignore]
    def _ties_before(score_ptr, row, length, start, threshold, SEL: tl.constexpr):  # type: ignore[no-untyped-def,unused-ignore]
        """Keys equal to the threshold in the row before `start` (the slow path: equal scores)."""
        n = tl.full([], 0, tl.int32)
        for b0 in range(0, start, SEL):
            offs = b0 + tl.arange(0, SEL)
            valid = offs < start
            key = _key_of(tl.load(score_ptr + row * length + offs, mask=valid, other=0.0))
            n += tl.sum((valid & (key == threshold)).to(tl.int32), 0)
        return n

    @triton.jit  # type: ignore[misc,untyped-decorator,unused-ignore]
    def _threshold(score_ptr, work_row, row, length, k, start, SEL: tl.constexpr):  # type: ignore[no-untyped-def,unused-ignore]
        """(threshold key, tied keys wanted, tied keys before `start`): the radix passes' threshold, k − above it,
        and, only where more are tied than wanted (equal scores), the row's tied keys before this chunk."""
        prefix = tl.load(work_row + _LAST_CARRY).to(tl.uint32)
        above = tl.load(work_row + _LAST_CARRY + 1)
        bins = tl.arange(0, _BINS)
        h = tl.load(work_row + _LAST_HIST + bins)  # with the carry: one round trip
        b, up = _bin_of(h, k - above, _BINS)
        threshold = (prefix << 8) | b.to(tl.uint32)
        tied = tl.sum(tl.where(bins == b, h, 0), 0)  # from registers: no second round trip
        need = k - above - up
        before = tl.full([], 0, tl.int32)
        if tied > need:  # equal scores: the earliest tied positions, the same in every program
            before = _ties_before(score_ptr, row, length, start, threshold, SEL)
        return threshold, need, before

    @triton.jit  # type: ignore[misc,untyped-decorator,unused-ignore]
    def _keep(key, valid, threshold, need, before):  # type: ignore[no-untyped-def,unused-ignore]
        """(kept, tied in this block): the keys above the threshold and the tied ones ranked below `need` in the row
        (`before` tied ones ahead of this block)."""
        at = valid & (key == threshold)
        at_i = at.to(tl.int32)
        rank = before + tl.cumsum(at_i, 0) - at_i
        return (valid & (key > threshold)) | (at & (rank < need)), tl.sum(at_i, 0)

    @triton.jit  # type: ignore[misc,untyped-decorator,unused-ignore]
    def _select_chunk(  # type: ignore[no-untyped-def,unused-ignore]
        score_ptr, pos_row, row, length, start, end, threshold, need, before, SEL: tl.constexpr
    ):
        """This chunk's selected positions into `pos_row` (its own places), block by block; returns how many."""
        count = tl.full([], 0, tl.int32)
        for b0 in range(start, end, SEL):
            offs = b0 + tl.arange(0, SEL)
            valid = offs < end
            key = _key_of(tl.load(score_ptr + row * length + offs, mask=valid, other=0.0, cache_modifier=".cg"))
            keep, n_at = _keep(key, valid, threshold, need, before)
            keep_i = keep.to(tl.int32)
            tl.store(pos_row + count + tl.cumsum(keep_i, 0) - 1, offs, mask=keep)
            count += tl.sum(keep_i, 0)
            before += n_at
        return count

    @triton.jit  # type: ignore[misc,untyped-decorator,unused-ignore]
    def _mla_select_split_kernel(  # type: ignore[no-untyped-def,unused-ignore]  # noqa: PLR0915 - pointers, strides
        q_ptr, c_ptr, score_ptr, work_ptr, scale_ptr, pos_ptr, count_ptr, acc_ptr, ml_ptr,
        heads, length, k, chunk, n_splits, q_len, stride_qr, stride_qh, stride_cb, stride_ct, sm_scale,
        WORK: tl.constexpr, FP8: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, SEL: tl.constexpr,
        ONE_BLOCK: tl.constexpr, D_NOPE: tl.constexpr, D_ROPE: tl.constexpr, F32_DOT: tl.constexpr,
        USE_GDC: tl.constexpr,
    ):  # fmt: skip
        """One head block's attention over the top-k tokens of one chunk of one row's context. ONE_BLOCK (a chunk
        of at most SEL tokens): the chunk's keys loaded before the wait. (Finding each tile's tokens in registers, the
        j-th kept position by a [16, 1024] comparison, instead of the positions' round trip through L2 took 2.2 µs
        more on an H200 at GLM-5's 128K: docs/benchmarks.md, "Kernels, ninth round".)"""
        hb = tl.program_id(0)
        split = tl.program_id(1)
        row = tl.program_id(2)
        batch = row // q_len
        offs_h = hb * BLOCK_H + tl.arange(0, BLOCK_H)
        mask_h = offs_h < heads
        offs_d = tl.arange(0, D_NOPE)
        offs_r = tl.arange(0, D_ROPE)
        q_rows = q_ptr + row * stride_qr + offs_h[:, None] * stride_qh  # written before the scores: no wait
        q_nope = tl.load(q_rows + offs_d[None, :], mask=mask_h[:, None], other=0.0)
        q_rope = tl.load(q_rows + D_NOPE + offs_r[None, :], mask=mask_h[:, None], other=0.0)
        if F32_DOT:
            q_nope = q_nope.to(tl.float32)
            q_rope = q_rope.to(tl.float32)
        cache_scale = 1.0
        if FP8:
            cache_scale = tl.load(scale_ptr)
        start = split * chunk
        end = tl.minimum(start + chunk, length)
        if ONE_BLOCK:  # the scores are four grids back: loaded before the wait
            offs = start + tl.arange(0, SEL)
            valid = offs < end
            key = _key_of(tl.load(score_ptr + row * length + offs, mask=valid, other=0.0, cache_modifier=".cg"))
        if USE_GDC:  # the last radix pass's histogram and carries
            tl.extra.cuda.gdc_wait()
        work_row = work_ptr + row * WORK
        pos_row = pos_ptr + (row * n_splits + split) * chunk
        if hb == 0 and split == 0:  # the third histogram: read only by the last pass, which is complete
            tl.store(work_row + 2 * _BINS + tl.arange(0, _BINS), tl.zeros([_BINS], tl.int32))
        threshold, need, before = _threshold(score_ptr, work_row, row, length, k, start, SEL)
        if ONE_BLOCK:
            keep, _n_at = _keep(key, valid, threshold, need, before)
            keep_i = keep.to(tl.int32)
            count = tl.sum(keep_i, 0)
            tl.store(pos_row + tl.cumsum(keep_i, 0) - 1, offs, mask=keep)
        else:
            count = _select_chunk(score_ptr, pos_row, row, length, start, end, threshold, need, before, SEL)
        tl.debug_barrier()  # the positions this program's threads wrote, read back by others of it
        if hb == 0:
            tl.store(count_ptr + row * n_splits + split, count)
        qk_scale = sm_scale * cache_scale
        m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_H], tl.float32)
        acc = tl.zeros([BLOCK_H, D_NOPE], tl.float32)
        c_base = c_ptr + batch * stride_cb
        for n0 in range(0, count, BLOCK_N):
            slot = n0 + tl.arange(0, BLOCK_N)
            mask_n = slot < count
            tok = tl.load(pos_row + slot, mask=mask_n, other=0)
            m_i, l_i, acc = _latent_tile(
                q_nope, q_rope, c_base, stride_ct, tok, mask_n, m_i, l_i, acc, qk_scale, offs_d, offs_r,
                FP8, D_NOPE, F32_DOT,
            )  # fmt: skip
        if USE_GDC:
            tl.extra.cuda.gdc_launch_dependents()
        part = (row * n_splits + split) * heads + offs_h
        tl.store(ml_ptr + part * 2, m_i, mask=mask_h)
        tl.store(ml_ptr + part * 2 + 1, l_i, mask=mask_h)
        tl.store(acc_ptr + part[:, None] * D_NOPE + offs_d[None, :], acc * cache_scale, mask=mask_h[:, None])


@dataclass(frozen=True)
class SelectWorkspace:
    """The chunks' positions and counts and the MLA partials of one shape (preallocated: graph replayable)."""

    positions: torch.Tensor
    """[rows, splits × chunk] int32: each chunk's selected positions from its start (the rest unwritten)."""
    counts: torch.Tensor
    """[rows, splits] int32: how many each chunk selected."""
    mla: MlaWorkspace
    """The partials (one split a chunk) and the output."""
    chunk: int
    """Context tokens a split program keys (a whole number of `SEL_BLOCK`, or less for a short context)."""
    sel_block: int


def select_workspace(
    rows: int,
    heads: int,
    length: int,
    device: torch.device,
    *,
    lora: int = 512,
    sms: int | None = None,
    chunks_per_sm: float = CHUNKS_PER_SM,
) -> SelectWorkspace:
    """Buffers for `rows` query rows over a context of `length` tokens: about `chunks_per_sm` chunks per SM."""
    sms = sms or sm_count(device)
    wanted = max(1, int(chunks_per_sm * sms) // rows)
    sel = min(SEL_BLOCK, next_pow2(max(16, -(-length // wanted))))
    chunk = sel * -(-length // (wanted * sel))
    splits = -(-length // chunk)
    mla = MlaWorkspace(
        torch.empty(rows * splits * heads * lora, device=device, dtype=torch.float32),
        torch.empty(rows * splits * heads * 2, device=device, dtype=torch.float32),
        torch.empty(rows, heads, lora, device=device, dtype=torch.bfloat16),
        splits,
        chunk,
    )
    positions = torch.zeros(rows, splits * chunk, device=device, dtype=torch.int32)
    counts = torch.zeros(rows, splits, device=device, dtype=torch.int32)
    return SelectWorkspace(positions, counts, mla, chunk, sel)


def mla_decode_selected(
    q: torch.Tensor,
    cache: torch.Tensor,
    dwork: DsaWorkspace,
    work: SelectWorkspace,
    *,
    lora: int,
    sm_scale: float,
    topk: int,
    q_len: int = 1,
    cache_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """Absorbed MLA over each row's top-`topk` tokens of `dwork.scores`, selected in the split kernel from the
    threshold the radix passes left in `dwork.work` (`dsa.dsa_passes` first); [R, H, lora] bf16 in `work.mla.out`."""
    if not HAVE_TRITON:
        raise UnsupportedError(triton_unavailable(q.device))
    rows, heads, width = q.shape
    batch, _length, cwidth = cache.shape
    rope = width - lora
    length = dwork.scores.shape[1]
    if cwidth != width or rows != batch * q_len or next_pow2(rope) != rope or next_pow2(lora) != lora:
        raise ValueError(f"MLA shapes disagree: q {tuple(q.shape)}, cache {tuple(cache.shape)}, {lora=}, {q_len=}")
    if dwork.scheme != "radix8-fused" or not dwork.selects:
        raise ValueError(f"the selecting MLA needs a selecting radix8-fused DSA workspace (got {dwork.scheme})")
    fp8 = cache.dtype == torch.float8_e4m3fn
    if fp8 and cache_scale is None:
        raise ValueError("an FP8 latent cache needs its cache_scale")
    scale = cache_scale if cache_scale is not None else work.mla.ml
    m = work.mla
    launch(
        _mla_select_split_kernel,
        (-(-heads // BLOCK_H), m.splits, rows),
        q, cache, dwork.scores, dwork.work, scale, work.positions, work.counts, m.acc, m.ml,
        heads, length, min(length, topk), work.chunk, m.splits, q_len, q.stride(0), q.stride(1), cache.stride(0),
        cache.stride(1), sm_scale * LOG2E,
        WORK=CARRY8_INTS, FP8=fp8, BLOCK_H=BLOCK_H, BLOCK_N=BLOCK_N, SEL=work.sel_block,
        ONE_BLOCK=work.chunk <= work.sel_block, D_NOPE=lora, D_ROPE=rope,
        F32_DOT=interpreted(), num_warps=4, num_stages=1, pdl=True,
    )  # fmt: skip
    zero_from = (DIGITS - 1) * DIGIT_BINS  # the fourth histogram, the counters and the carries: every program read them
    return launch_combine(m, rows, heads, lora, zero=(dwork.work, zero_from, CARRY8_INTS))


def selected_indices(work: SelectWorkspace) -> torch.Tensor:
    """[rows, k] int32: the positions the last call selected, chunk after chunk (for checks; not graph-safe)."""
    rows, splits = work.counts.shape
    out = []
    for r in range(rows):
        parts = [work.positions[r, s * work.chunk : s * work.chunk + int(work.counts[r, s])] for s in range(splits)]
        out.append(torch.cat(parts))
    return torch.stack(out)
