"""Provides decodetop's DSA indexer kernels (torch side): the lightning indexer's scores over FP8 index keys read as
FP8, and an exact top-k by radix select, for DeepSeek-V3.2-style sparse attention (GLM-5).

score[r, t] = Σ_h w[r, h] · ReLU(q[r, h] · k[t] · s[t]) over the index heads, with the index keys `k` FP8 E4M3
and one fp32 scale per token (DeepSeek-V3.2's indexer cache: 128 FP8 values + a scale per token; DeepGEMM reads
them as FP8 too), multiplied FP8 × FP8 by default with q quantized per head as DeepSeek-V3.2's own indexer does
(`DsaWorkspace.q8`; else in FP16, `DsaWorkspace.f16`). The scores then pick the `topk` tokens the sparse MLA attends
to.

`torch.topk` of 2048 of 4096 alone takes 37 µs on an H200 under graph replay, more than the whole attention should,
so the selection is a radix select on the scores' order-preserving 32-bit keys: histogram passes over the key's
digits (each pass counts only the tokens still tied with the threshold, each program finds the threshold digit of
the earlier passes from their histograms itself), then one compaction pass that writes the tokens above the
threshold and as many tied at it as the count needs. The first histogram is taken in the scoring kernel. No sort,
no host sync; the selected set equals torch.topk's (the order inside it does not matter to attention). Where the
context holds no more than `topk` tokens every token is selected (as `min(context, topk)` in the torch form).

Six digit schemes (`SCHEMES`): `radix8-carry` (below), `radix8-fused` (its passes, then the sparse MLA selects its own
top-k: `kernels.mla_select`; the default from `LONG_SCHEME_FROM` tokens), `half16-ticket` (below; the default under
it) and `half8-ticket` (below), `radix8`, four 8-bit digits of 256 bins, and `radix11`, three
digits of 11 + 11 + 10 bits (2048 bins). Triton lowers `tl.histogram` to log2(bins) warp ballots per element plus, per
element, a popcount for each of bins/32 bins a thread owns, so a pass costs in proportion to its bins: on an H200 each
2048-bin pass took ~13 µs at 4K tokens and the scoring kernel's 2048-bin histogram ~14 µs even at one token
(docs/benchmarks.md, "Kernels"); 256 bins cost an eighth of that per pass, for one pass more. radix8's whole selection
in one launch (grid barriers between its passes, no histogram in the scoring kernel) was slower on an H200 at every
context (docs/benchmarks.md, "Kernels, fourth round").

`radix8-carry` runs radix8's passes without the workspace's memset and without each pass searching every histogram
before its own: a pass leaves the threshold's digits so far and the count above them in the workspace for the next
(one histogram searched per pass, not up to four), the passes after the second and the compaction load their scores
before they wait for the grid before (the scores' kernel is at least two grids back), and each pass zeroes what no
later pass reads (the third the first histogram, the fourth the second, the compaction the third; the compaction's
last program the fourth, the counters and the carries), so a step leaves the workspace zero for the next
(`dsa_prepare`; allocated zero). On an H200 it took ~5 µs off radix8's whole DSA step at 4K, 32K and 128K (27.4 →
22.5, 32.8 → 27.9, 43.7 → 38.9 µs; docs/benchmarks.md, "Kernels, seventh round"), so it is the default.

`half16-ticket` and `half8-ticket` select in one launch after the scoring kernel (`kernels.dsa_ticket`, whose
docstring tells their H200 figures); the probe runs half16-ticket below `LONG_SCHEME_FROM` tokens and radix8-fused
from there (`default_scheme`).

The scoring kernel, the histogram passes and the compaction, and the sparse MLA after them, are a chain of short
dependent launches (six, plus the workspace's memset but for radix8-carry; four for half8-ticket and
half16-ticket): each launches with programmatic dependent launch where the GPU has it (sm_90 and newer,
`common.pdl_enabled`; https://docs.nvidia.com/cuda/cuda-c-programming-guide/index.html#programmatic-dependent-launch-and-synchronization),
scheduled while the one before finishes and waiting in `gdc_wait` before its first load of the scores, histograms
or keys (radix8-carry's later passes: of the histograms), so the chain's launch gaps overlap; `USE_GDC=False`
compiles the kernels as before.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from decodetop.probes.worker.context import UnsupportedError
from decodetop.probes.worker.kernels.common import (
    HAVE_TRITON,
    e4m3_rows,
    e4m3_rows_torch,
    fp8_mma_supported,
    interpreted,
    launch,
    next_pow2,
    sm_count,
    tl,
    triton,
    triton_unavailable,
)
from decodetop.probes.worker.kernels.dsa_keys import DIGIT_BINS, DIGIT_BITS, DIGITS
from decodetop.probes.worker.kernels.dsa_ticket import (
    HALF8_INTS,
    HALF16_CANDIDATES,
    HALF16_FINISH_BLOCK,
    HALF16_INTS,
    HALF16_RANK,
    HALF16_RANK_CHUNK,
    HALF16_ZERO_BLOCK,
    HALF_CANDIDATES,
    HALF_FINISH_BLOCK,
    HALF_WARPS,
)

#: Tokens per scoring tile (a [heads × 128] · [128 × tile] product).
SCORE_BLOCK = 128
#: Scores per program in the histogram and compaction passes: at most this many (the first version's fixed size),
#: at least `MIN_SELECT_BLOCK`, otherwise as few as give every SM `SELECT_PROGRAMS_PER_SM` programs. On an H200 the
#: fixed 2048 left the passes on 2 programs at 4K and 64 at 128K, and the selection took 29 of 40 µs at 4K
#: (docs/benchmarks.md, "Kernels").
SELECT_BLOCK = 2048
MIN_SELECT_BLOCK = 256
SELECT_PROGRAMS_PER_SM = 2
#: Histogram bins per pass of the `radix11` scheme: 11 + 11 + 10 bits cover a 32-bit key.
BINS = (2048, 2048, 1024)
#: Workspace per row of `radix11`: the three histograms and two counters (above the threshold, tied at it).
WORK_INTS = sum(BINS) + 2
#: Workspace per row of `radix8` (four digits of 8 bits, `dsa_keys.DIGITS`): four histograms and the two counters.
WORK8_INTS = DIGITS * DIGIT_BINS + 2
#: `radix8-carry`'s workspace per row after `radix8`'s: a ticket right after the two counters (the compaction's
#: programs done) and, per pass after the second (the third, the fourth, the compaction), the threshold's digits so
#: far and the count above them, as the pass before found them.
TICKET_AT = DIGITS * DIGIT_BINS + 2
CARRY_AT = TICKET_AT + 1
CARRY8_INTS = CARRY_AT + 2 * (DIGITS - 1)
#: The digit schemes, the default first.
SCHEMES = ("radix8-carry", "half16-ticket", "half8-ticket", "radix8", "radix11", "radix8-fused")
#: The scheme whose selection the sparse MLA's split kernel makes (`kernels.mla_select`): radix8-carry's passes, no
#: compaction, no index list.
FUSED_SCHEME = "radix8-fused"
#: The scheme the probe runs by context (`default_scheme`): `half16-ticket` below `LONG_SCHEME_FROM` tokens, its
#: one select launch after the scoring kernel (on an H200 at GLM-5's TP-8 shard the whole MLA + DSA step 20.4 µs at 4K
#: against radix8-carry's 21.7: docs/benchmarks.md, "Kernels, eighth round"), `radix8-fused` from there, whose
#: sparse MLA selects its own top-k (21.6 µs at 32K, 24.3 at 64K, 30.1 at 128K against half16-ticket's 23.0 at 32K
#: and radix8-carry's 27.7 and 33.4: "Kernels, ninth round").
SHORT_SCHEME = "half16-ticket"
LONG_SCHEME = FUSED_SCHEME
#: Where radix8-carry's list is wanted (`dsa_topk`: the positions as one list), it stands in for radix8-fused.
LIST_SCHEME = "radix8-carry"
LONG_SCHEME_FROM = 32768
#: `dsa_workspace`'s scheme argument for "by context" (`default_scheme`).
BY_CONTEXT = ""
#: The schemes whose passes leave their workspace zero for the next step (no memset: `dsa_prepare`).
SELF_ZEROING = frozenset({"radix8-carry", "half8-ticket", "half16-ticket", FUSED_SCHEME})
#: The schemes with a candidate buffer (`DsaWorkspace.candidates`), with its capacity per row.
HALF_SCHEMES = ("half8-ticket", "half16-ticket")
#: Ints per row of each scheme's workspace.
SCHEME_INTS = {
    "radix8": WORK8_INTS,
    "radix11": WORK_INTS,
    "radix8-carry": CARRY8_INTS,
    FUSED_SCHEME: CARRY8_INTS,
    "half8-ticket": HALF8_INTS,
    "half16-ticket": HALF16_INTS,
}
#: Scoring programs wanted per SM and their loop's pipeline stages: the fastest of 72 launch shapes at GLM-5's indexer
#: on an H200 (`benchmarks/kernels/dsa_scores_sweep.py`; docs/benchmarks.md, "Kernels, seventh round": 13.0 µs at
#: 128K against 14.8 for 2 per SM and 3 stages, the same at 32K).
SCORE_PROGRAMS_PER_SM = 4
SCORE_STAGES = 2

if HAVE_TRITON:
    from decodetop.probes.worker.kernels.dsa_keys import _half_key, _key_of, _threshold_bin
    from decodetop.probes.worker.kernels.dsa_ticket import _HALF16_AT, _half8_select_kernel, _half16_select_kernel

    _CARRY_AT = tl.constexpr(CARRY_AT)

    @triton.jit  # type: ignore[misc,untyped-decorator,unused-ignore]
    def _indexer_query(q, w, key_ty: tl.constexpr, F32_DOT: tl.constexpr, F16: tl.constexpr, Q8: tl.constexpr):  # type: ignore[no-untyped-def,unused-ignore]
        """(q in the product's dtype, the heads' weights): Q8 quantizes q per head to the keys' FP8 (`e4m3_rows`)
        and folds the scale into the head's weight (relu(s · x) = s · relu(x) for s > 0)."""
        if Q8:
            q, q_scale = e4m3_rows(q.to(tl.float32), key_ty, F32_DOT)
            w = w * q_scale
            if F32_DOT:
                q = q.to(tl.float32)
        elif F32_DOT:
            q = q.to(tl.float32)
        elif F16:
            q = q.to(tl.float16)
        return q, w

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
        SHIFT1: tl.constexpr,
        F32_DOT: tl.constexpr,
        F16: tl.constexpr,
        HIST: tl.constexpr,
        USE_GDC: tl.constexpr,
        TRANS: tl.constexpr = False,
        Q8: tl.constexpr = False,
        HALF: tl.constexpr = False,
        HALF16: tl.constexpr = False,
    ):
        """TRANS: the product as keys · qᵀ (the key tile the MMA's M operand, [BLOCK, HP]) instead of q · keysᵀ.
        Q8: q quantized to FP8 E4M3 per head (scale max|q_h| / 448, folded into the head's weight) and the product
        FP8 × FP8, as DeepSeek-V3.2's own indexer runs it; under the interpreter (F32_DOT) the FP8 values in fp32.
        HALF: the histogram's digit is the FP16 key's top 8 bits (`_half_digit`, `half8-ticket`), not the fp32
        key's top bits. HALF16 (with HALF, `half16-ticket`): also the whole 16-bit key's histogram, by one relaxed
        global atomic per score into the workspace's 65536 bins (a 65536-bin `tl.histogram` would cost per bin; see
        the module docstring)."""
        pid = tl.program_id(0)
        row = tl.program_id(1)
        batch = row // q_len
        offs_h = tl.arange(0, HP)
        mask_h = offs_h < heads
        offs_d = tl.arange(0, D)
        if USE_GDC:  # q, the weights and the index keys are written upstream; the workspace was zeroed just before
            tl.extra.cuda.gdc_wait()
        q = tl.load(q_ptr + row * heads * D + offs_h[:, None] * D + offs_d[None, :], mask=mask_h[:, None], other=0.0)
        w = tl.load(w_ptr + row * heads + offs_h, mask=mask_h, other=0.0).to(tl.float32)
        q, w = _indexer_query(q, w, k_ptr.dtype.element_ty, F32_DOT, F16, Q8)
        hist = tl.zeros([BINS1], tl.int32)
        for i in range(tiles_per_program):
            offs_l = (pid * tiles_per_program + i) * BLOCK + tl.arange(0, BLOCK)
            mask_l = offs_l < length
            k = tl.load(
                k_ptr + batch * stride_kb + offs_l[:, None] * D + offs_d[None, :], mask=mask_l[:, None], other=0.0
            )
            if F32_DOT:
                k = k.to(tl.float32)
            elif not Q8:
                k = k.to(tl.float16) if F16 else k.to(tl.bfloat16)
            ks = tl.load(ks_ptr + batch * stride_ksb + offs_l, mask=mask_l, other=0.0)
            if TRANS:
                logits_t = tl.dot(k, tl.trans(q)) * ks[:, None]
                score = tl.sum(tl.maximum(logits_t, 0.0) * w[None, :], 1)
            else:
                logits = tl.dot(q, tl.trans(k)) * ks[None, :]
                score = tl.sum(tl.maximum(logits, 0.0) * w[:, None], 0)
            tl.store(score_ptr + row * length + offs_l, score, mask=mask_l)
            if HIST:
                if HALF:
                    key16 = _half_key(score)
                    digit = key16 >> 8
                    if HALF16:
                        hist16 = work_ptr + row * WORK + _HALF16_AT
                        tl.atomic_add(hist16 + key16, 1, mask=mask_l, sem="relaxed")
                else:
                    digit = (_key_of(score) >> SHIFT1).to(tl.int32)
                hist += tl.histogram(digit, BINS1, mask=mask_l)
        if USE_GDC:
            tl.extra.cuda.gdc_launch_dependents()
        if HIST:
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
        USE_GDC: tl.constexpr,
    ):
        pid = tl.program_id(0)
        row = tl.program_id(1)
        base = work_ptr + row * WORK
        if USE_GDC:  # the histograms and scores are the kernels' before
            tl.extra.cuda.gdc_wait()
        b1, above1 = _threshold_bin(base, k, B1)
        offs = pid * BLOCK + tl.arange(0, BLOCK)
        valid = offs < length
        key = _key_of(tl.load(score_ptr + row * length + offs, mask=valid, other=0.0))
        if LEVEL == 2:
            tied = valid & ((key >> 21).to(tl.int32) == b1)
            digit = ((key >> 10) & 0x7FF).to(tl.int32)
            hist = tl.histogram(digit, B2, mask=tied)
            if USE_GDC:
                tl.extra.cuda.gdc_launch_dependents()
            tl.atomic_add(base + B1 + tl.arange(0, B2), hist, mask=hist > 0)
        else:
            b2, _ = _threshold_bin(base + B1, k - above1, B2)
            prefix = (b1 << 11) | b2
            tied = valid & ((key >> 10).to(tl.int32) == prefix)
            digit = (key & 0x3FF).to(tl.int32)
            hist = tl.histogram(digit, B3, mask=tied)
            if USE_GDC:
                tl.extra.cuda.gdc_launch_dependents()
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
        USE_GDC: tl.constexpr,
    ):
        pid = tl.program_id(0)
        row = tl.program_id(1)
        base = work_ptr + row * WORK
        if USE_GDC:  # the histograms and scores are the kernels' before
            tl.extra.cuda.gdc_wait()
        b1, above1 = _threshold_bin(base, k, B1)
        b2, above2 = _threshold_bin(base + B1, k - above1, B2)
        b3, above3 = _threshold_bin(base + B1 + B2, k - above1 - above2, B3)
        threshold = (b1.to(tl.uint32) << 21) | (b2.to(tl.uint32) << 10) | b3.to(tl.uint32)
        n_above = above1 + above2 + above3
        offs = pid * BLOCK + tl.arange(0, BLOCK)
        _compact_block(score_ptr, base + B1 + B2 + B3, idx_ptr, row, length, k, offs, threshold, n_above, USE_GDC)

    @triton.jit  # type: ignore[misc,untyped-decorator,unused-ignore]
    def _threshold8(base, k, LEVELS: tl.constexpr):  # type: ignore[no-untyped-def,unused-ignore]
        """(the first LEVELS 8-bit digits of the `k`-th largest key as one uint32, count of keys strictly above
        that prefix) from the first LEVELS histograms at `base`."""
        prefix = tl.full([], 0, tl.uint32)
        above = tl.full([], 0, tl.int32)
        for level in tl.static_range(LEVELS):
            b, up = _threshold_bin(base + level * 256, k - above, 256)
            prefix = (prefix << 8) | b.to(tl.uint32)
            above = above + up
        return prefix, above

    @triton.jit  # type: ignore[misc,untyped-decorator,unused-ignore]
    def _hist8_block(score_ptr, base, row, length, offs, prefix, LEVEL: tl.constexpr, USE_GDC: tl.constexpr):  # type: ignore[no-untyped-def,unused-ignore]
        """Adds to the workspace's histogram LEVEL (2–4; the first is the scoring kernel's) the digit LEVEL (of 8
        bits from the top) of the scores at `offs` whose keys are tied with `prefix`, the threshold's first LEVEL − 1
        digits (the next grid may start before the atomics where `USE_GDC`)."""
        valid = offs < length
        key = _key_of(tl.load(score_ptr + row * length + offs, mask=valid, other=0.0))
        _hist8_keys(key, valid, base, prefix, LEVEL, USE_GDC)

    @triton.jit  # type: ignore[misc,untyped-decorator,unused-ignore]
    def _hist8_keys(key, valid, base, prefix, LEVEL: tl.constexpr, USE_GDC: tl.constexpr):  # type: ignore[no-untyped-def,unused-ignore]
        """`_hist8_block` on keys already loaded."""
        tied = valid & ((key >> (32 - 8 * (LEVEL - 1))) == prefix)
        digit = ((key >> (32 - 8 * LEVEL)) & 0xFF).to(tl.int32)
        hist = tl.histogram(digit, 256, mask=tied)
        if USE_GDC:
            tl.extra.cuda.gdc_launch_dependents()
        tl.atomic_add(base + (LEVEL - 1) * 256 + tl.arange(0, 256), hist, mask=hist > 0)

    @triton.jit  # type: ignore[misc,untyped-decorator,unused-ignore]
    def _compact_block(score_ptr, counters, idx_ptr, row, length, k, offs, threshold, n_above, USE_GDC: tl.constexpr):  # type: ignore[no-untyped-def,unused-ignore]
        """Writes the positions among `offs` of the keys above `threshold`, then of as many tied at it as the `k` −
        `n_above` places left for ties take (the two workspace counters at `counters` hand out the places; the next
        grid may start before the atomics where `USE_GDC`)."""
        valid = offs < length
        key = _key_of(tl.load(score_ptr + row * length + offs, mask=valid, other=0.0))
        _compact_keys(key, valid, counters, idx_ptr, row, k, offs, threshold, n_above, USE_GDC, False)

    @triton.jit  # type: ignore[misc,untyped-decorator,unused-ignore]
    def _compact_keys(  # type: ignore[no-untyped-def,unused-ignore]
        key, valid, counters, idx_ptr, row, k, offs, threshold, n_above, USE_GDC: tl.constexpr, TICKET: tl.constexpr
    ):
        """`_compact_block` on keys already loaded. A key above the threshold takes only places below `n_above` (it
        has exactly that many by construction; the guard keeps a wrong count from writing over the ties or past the
        row). TICKET: returns the programs done before this one (a third counter after the two, taken after this
        program's reads of the workspace and its counter atomics, before its stores so their latencies overlap);
        else 0."""
        over = valid & (key > threshold)
        at = valid & (key == threshold)
        over_i = over.to(tl.int32)
        at_i = at.to(tl.int32)
        if USE_GDC:
            tl.extra.cuda.gdc_launch_dependents()
        start_over = tl.atomic_add(counters, tl.sum(over_i, 0))
        start_at = tl.atomic_add(counters + 1, tl.sum(at_i, 0))
        done = tl.atomic_add(counters + 2, 1) if TICKET else 0  # acq_rel: after the reads and atomics above
        pos_over = start_over + tl.cumsum(over_i, 0) - 1
        pos_at = start_at + tl.cumsum(at_i, 0) - 1
        tl.store(idx_ptr + row * k + pos_over, offs, mask=over & (pos_over < n_above))
        tl.store(idx_ptr + row * k + n_above + pos_at, offs, mask=at & (pos_at < k - n_above))
        return done

    @triton.jit  # type: ignore[misc,untyped-decorator,unused-ignore]
    def _radix8_kernel(  # type: ignore[no-untyped-def,unused-ignore]
        score_ptr,
        work_ptr,
        length,
        k,
        WORK: tl.constexpr,
        LEVEL: tl.constexpr,
        BLOCK: tl.constexpr,
        USE_GDC: tl.constexpr,
    ):
        """Histogram of digit LEVEL (2–4, of 8 bits from the top) over the keys tied with the threshold's first
        LEVEL − 1 digits."""
        pid = tl.program_id(0)
        row = tl.program_id(1)
        base = work_ptr + row * WORK
        if USE_GDC:  # the histograms and scores are the kernels' before
            tl.extra.cuda.gdc_wait()
        prefix, _ = _threshold8(base, k, LEVEL - 1)
        _hist8_block(score_ptr, base, row, length, pid * BLOCK + tl.arange(0, BLOCK), prefix, LEVEL, USE_GDC)

    @triton.jit  # type: ignore[misc,untyped-decorator,unused-ignore]
    def _compact8_kernel(  # type: ignore[no-untyped-def,unused-ignore]
        score_ptr,
        work_ptr,
        idx_ptr,
        length,
        k,
        WORK: tl.constexpr,
        BLOCK: tl.constexpr,
        USE_GDC: tl.constexpr,
    ):
        """The positions of the keys above the threshold, then of as many tied at it as `k` needs."""
        pid = tl.program_id(0)
        row = tl.program_id(1)
        base = work_ptr + row * WORK
        if USE_GDC:  # the histograms and scores are the kernels' before
            tl.extra.cuda.gdc_wait()
        threshold, n_above = _threshold8(base, k, 4)
        _compact_block(
            score_ptr, base + 4 * 256, idx_ptr, row, length, k, pid * BLOCK + tl.arange(0, BLOCK), threshold, n_above,
            USE_GDC,
        )  # fmt: skip

    @triton.jit  # type: ignore[misc,untyped-decorator,unused-ignore]
    def _carry_keys(score_ptr, row, length, offs, USE_GDC: tl.constexpr, EARLY: tl.constexpr):  # type: ignore[no-untyped-def,unused-ignore]
        """The keys of the scores at `offs`, loaded, then the wait for the grid before. EARLY: loaded before the
        wait (the scores' writer is at least two grids back, complete before this grid could start: each grid
        between waited for the one before it before it let the next start), through L2 (`.cg`, no L1 line from an
        earlier step)."""
        valid = offs < length
        if EARLY:
            key = _key_of(tl.load(score_ptr + row * length + offs, mask=valid, other=0.0, cache_modifier=".cg"))
            if USE_GDC:
                tl.extra.cuda.gdc_wait()
        else:
            if USE_GDC:
                tl.extra.cuda.gdc_wait()
            key = _key_of(tl.load(score_ptr + row * length + offs, mask=valid, other=0.0))
        return key, valid

    @triton.jit  # type: ignore[misc,untyped-decorator,unused-ignore]
    def _carried(base, k, LEVEL: tl.constexpr):  # type: ignore[no-untyped-def,unused-ignore]
        """(the threshold's first LEVEL − 1 digits, the count of keys above them) for the pass of LEVEL (2–4; 5:
        the compaction): the pass before's carry and its histogram, one threshold search."""
        if LEVEL == 2:
            prefix = tl.full([], 0, tl.uint32)
            above = tl.full([], 0, tl.int32)
        else:
            prefix = tl.load(base + _CARRY_AT + 2 * (LEVEL - 3)).to(tl.uint32)
            above = tl.load(base + _CARRY_AT + 1 + 2 * (LEVEL - 3))
        b, up = _threshold_bin(base + (LEVEL - 2) * 256, k - above, 256)
        return (prefix << 8) | b.to(tl.uint32), above + up

    @triton.jit  # type: ignore[misc,untyped-decorator,unused-ignore]
    def _carry8_kernel(  # type: ignore[no-untyped-def,unused-ignore]
        score_ptr,
        work_ptr,
        length,
        k,
        WORK: tl.constexpr,
        LEVEL: tl.constexpr,
        BLOCK: tl.constexpr,
        USE_GDC: tl.constexpr,
    ):
        """`_radix8_kernel` with the threshold carried: the digits found so far read from the pass before, one
        histogram searched, the result left for the next pass (by program 0). From the third pass program 0 zeroes
        the histogram two levels up (read only by the pass before, complete), so no memset is needed."""
        pid = tl.program_id(0)
        row = tl.program_id(1)
        base = work_ptr + row * WORK
        offs = pid * BLOCK + tl.arange(0, BLOCK)
        key, valid = _carry_keys(score_ptr, row, length, offs, USE_GDC, LEVEL > 2)
        prefix, above = _carried(base, k, LEVEL)
        _hist8_keys(key, valid, base, prefix, LEVEL, USE_GDC)
        if pid == 0:
            tl.store(base + _CARRY_AT + 2 * (LEVEL - 2), prefix.to(tl.int32))
            tl.store(base + _CARRY_AT + 1 + 2 * (LEVEL - 2), above)
            if LEVEL > 2:
                tl.store(base + (LEVEL - 3) * 256 + tl.arange(0, 256), tl.zeros([256], tl.int32))

    @triton.jit  # type: ignore[misc,untyped-decorator,unused-ignore]
    def _compact8_carry_kernel(  # type: ignore[no-untyped-def,unused-ignore]
        score_ptr,
        work_ptr,
        idx_ptr,
        length,
        k,
        WORK: tl.constexpr,
        BLOCK: tl.constexpr,
        TAIL: tl.constexpr,
        USE_GDC: tl.constexpr,
    ):
        """`_compact8_kernel` on the carried threshold. Program 0 zeroes the third histogram; the last program to
        finish (the ticket) zeroes the fourth, the counters, the carries and the ticket: the workspace is zero for
        the next step."""
        pid = tl.program_id(0)
        row = tl.program_id(1)
        base = work_ptr + row * WORK
        offs = pid * BLOCK + tl.arange(0, BLOCK)
        key, valid = _carry_keys(score_ptr, row, length, offs, USE_GDC, True)
        threshold, n_above = _carried(base, k, 5)
        done = _compact_keys(key, valid, base + 4 * 256, idx_ptr, row, k, offs, threshold, n_above, USE_GDC, True)
        bins = tl.arange(0, 256)
        if pid == 0:
            tl.store(base + 2 * 256 + bins, tl.zeros([256], tl.int32))
        if done == tl.num_programs(0) - 1:  # every other program is done with the workspace
            tl.store(base + 3 * 256 + bins, tl.zeros([256], tl.int32))
            tail = tl.arange(0, TAIL)
            tl.store(base + 4 * 256 + tail, tl.zeros([TAIL], tl.int32), mask=tail < WORK - 4 * 256)


@dataclass(frozen=True)
class DsaWorkspace:
    """Preallocated scores, radix workspace and selected indices of one shape (a captured graph allocates
    nothing)."""

    scores: torch.Tensor
    """[rows, length] fp32."""
    work: torch.Tensor
    """[rows, work ints] int32: histograms and counters, zero before each step (`dsa_prepare`)."""
    indices: torch.Tensor
    """[rows, min(length, topk)] int32; where the context holds no more than `topk` tokens, every position (filled
    once: no selection runs)."""
    selects: bool
    """False when every token is selected."""
    tiles_per_program: int
    score_programs: int
    scheme: str = SCHEMES[0]
    """The radix digit scheme (`SCHEMES`)."""
    select_block: int = SELECT_BLOCK
    """Scores per program of the histogram and compaction passes."""
    f16: bool = True
    """The scoring product in FP16 (FP8 → FP16 is one conversion per two values, exact; → BF16 takes more), the
    query rounded to FP16 (10 mantissa bits against BF16's 7; activations far inside its range). On an H200 at
    GLM-5's TP-8 shard: the scores at 128K in 15.6 µs against 18.2 in BF16, the whole attention 42.7 against 47.0
    (docs/benchmarks.md, "Kernels, third round"); False: BF16, the first form. Where `q8` is not set."""
    q8: bool = True
    """The scoring product FP8 × FP8, q quantized per head to E4M3 (its scale folded into the head's weight), the
    key tile as the MMA's M operand: DeepSeek-V3.2's own indexer quantizes q to FP8 the same way
    (https://huggingface.co/deepseek-ai/DeepSeek-V3.2-Exp/tree/main/inference, model.py: `act_quant`, then
    `fp8_index`), as DeepGEMM's `fp8_mqa_logits` (https://github.com/deepseek-ai/DeepGEMM) that engines call does.
    On an H200 at GLM-5's indexer: 9.6 µs at 128K against 13.0 for the FP16 product (docs/benchmarks.md, "Kernels,
    seventh round"). False: the FP16 (or BF16, `f16`) product."""
    candidates: torch.Tensor | None = None
    """`half8-ticket`'s and `half16-ticket`'s candidate buffer, [rows, 2 × capacity] int32 (positions, then fp32
    keys; the capacity `HALF_CANDIDATES`, `HALF16_CANDIDATES`); only the places below a step's count are read, so it
    needs no zeroing. None for the other schemes."""


def half_capacity(scheme: str) -> int:
    """The candidate buffer's capacity per row of a `HALF_SCHEMES` scheme (read when called: tests shrink it)."""
    return HALF16_CANDIDATES if scheme == "half16-ticket" else HALF_CANDIDATES


def auto_select_block(rows: int, length: int, sms: int) -> int:
    """Scores per selection program: the power of two in [MIN_SELECT_BLOCK, SELECT_BLOCK] nearest above what
    spreads `rows` × `length` scores over SELECT_PROGRAMS_PER_SM programs per SM."""
    want = -(-rows * length // max(1, SELECT_PROGRAMS_PER_SM * sms))
    return min(SELECT_BLOCK, max(MIN_SELECT_BLOCK, next_pow2(want)))


def default_scheme(length: int) -> str:
    """The top-k scheme the probe runs over a context of `length` tokens (`SHORT_SCHEME`, `LONG_SCHEME`)."""
    return LONG_SCHEME if length >= LONG_SCHEME_FROM else SHORT_SCHEME


def dsa_workspace(
    rows: int,
    length: int,
    topk: int,
    device: torch.device,
    sms: int | None = None,
    *,
    scheme: str = BY_CONTEXT,
    select_block: int = 0,
    f16: bool = True,
    q8: bool = True,
) -> DsaWorkspace:
    """Buffers for `rows` query rows over a context of `length` tokens selecting `topk` by `scheme` (`BY_CONTEXT`:
    `default_scheme`); `select_block` scores per selection program (a power of two; 0: `auto_select_block`). `q8`
    holds only where the device multiplies FP8 (`fp8_mma_supported`); elsewhere the product is FP16 (or BF16)."""
    scheme = scheme or default_scheme(length)
    if scheme not in SCHEMES:
        raise ValueError(f"DSA radix scheme {scheme!r} is not one of {', '.join(SCHEMES)}")
    if select_block and (select_block < 16 or next_pow2(select_block) != select_block):
        raise ValueError(f"DSA select block {select_block} is not a power of two ≥ 16")
    sms = sms or sm_count(device)
    k = min(length, topk)
    tiles = -(-length // SCORE_BLOCK)
    programs_wanted = max(1, -(-SCORE_PROGRAMS_PER_SM * sms // rows))
    per = max(1, -(-tiles // programs_wanted))
    selects = length > topk
    if selects:
        indices = torch.empty(rows, k, device=device, dtype=torch.int32)
    else:
        indices = torch.arange(length, device=device, dtype=torch.int32).expand(rows, length).contiguous()
    return DsaWorkspace(
        torch.empty(rows, length, device=device, dtype=torch.float32),
        torch.zeros(rows, SCHEME_INTS[scheme], device=device, dtype=torch.int32),  # zero: what `SELF_ZEROING` needs
        indices,
        selects,
        per,
        -(-tiles // per),
        scheme,
        select_block or auto_select_block(rows, length, sms),
        f16,
        q8 and fp8_mma_supported(device),
        torch.empty(rows, 2 * half_capacity(scheme), device=device, dtype=torch.int32)
        if scheme in HALF_SCHEMES and selects
        else None,
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
    zero: `dsa_prepare`): q [R, Hi, Di] bf16, weights [R, Hi] fp32, keys [B, L, Di] float8_e4m3fn, key_scales [B, L]
    fp32."""
    if not HAVE_TRITON:
        raise UnsupportedError(triton_unavailable(q.device))
    rows, heads, dim = q.shape
    batch, length, kdim = keys.shape
    if kdim != dim or rows != batch * q_len or next_pow2(dim) != dim or tuple(weights.shape) != (rows, heads):
        raise ValueError(f"DSA shapes disagree: q {tuple(q.shape)}, keys {tuple(keys.shape)}, {q_len=}")
    radix8 = work.scheme != "radix11"
    half = work.scheme in HALF_SCHEMES
    launch(
        _score_kernel,
        (work.score_programs, rows),
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
        WORK=work.work.shape[1],
        HP=max(16, next_pow2(heads)),
        D=dim,
        BLOCK=SCORE_BLOCK,
        BINS1=DIGIT_BINS if radix8 else BINS[0],
        SHIFT1=32 - DIGIT_BITS if radix8 else 32 - 11,
        F32_DOT=interpreted() and (work.q8 or not work.f16),  # fp16 dots run right under the interpreter
        F16=work.f16,
        HIST=work.selects,  # no selection: no histogram (nothing would read it, nor zero it for `SELF_ZEROING`)
        TRANS=work.q8,
        Q8=work.q8,
        HALF=half,
        HALF16=work.scheme == "half16-ticket",
        num_stages=SCORE_STAGES,
        pdl=True,
    )
    return work.scores


def dsa_prepare(work: DsaWorkspace) -> None:
    """What the scheme needs before a step's `dsa_scores`: the workspace's memset, except for `SELF_ZEROING`
    schemes, whose passes leave it zero (it was allocated zero)."""
    if work.scheme not in SELF_ZEROING:
        work.work.zero_()


def dsa_select(work: DsaWorkspace, topk: int) -> torch.Tensor:
    """The top-`topk` token positions of each row of `work.scores` into `work.indices` (after `dsa_scores`):
    `DIGITS` − 1 more histogram passes and the compaction for `radix8` and `radix8-carry`, two and the compaction
    for `radix11`, one launch for `half8-ticket` and `half16-ticket`."""
    rows, length = work.scores.shape
    if not work.selects:
        return work.indices
    block = work.select_block
    grid = (-(-length // block), rows)
    if work.scheme == "radix8":
        for level in range(2, DIGITS + 1):
            launch(
                _radix8_kernel, grid, work.scores, work.work, length, topk, WORK=WORK8_INTS, LEVEL=level, BLOCK=block,
                pdl=True,
            )  # fmt: skip
        launch(
            _compact8_kernel, grid, work.scores, work.work, work.indices, length, topk, WORK=WORK8_INTS, BLOCK=block,
            pdl=True,
        )  # fmt: skip
        return work.indices
    if work.scheme == "half8-ticket":
        if work.candidates is None:
            raise ValueError("a half8-ticket workspace without its candidate buffer")
        cap = work.candidates.shape[1] // 2
        launch(
            _half8_select_kernel, grid, work.scores, work.work, work.candidates, work.indices, length, topk,
            WORK=HALF8_INTS, BLOCK=block, FIN=min(HALF_FINISH_BLOCK, cap), CAP=cap, num_warps=HALF_WARPS, pdl=True,
        )  # fmt: skip
        return work.indices
    if work.scheme == "half16-ticket":
        if work.candidates is None:
            raise ValueError("a half16-ticket workspace without its candidate buffer")
        cap = work.candidates.shape[1] // 2
        launch(
            _half16_select_kernel, grid, work.scores, work.work, work.candidates, work.indices, length, topk,
            WORK=HALF16_INTS, BLOCK=block, RANK=min(HALF16_RANK, cap), CHUNK=min(HALF16_RANK_CHUNK, HALF16_RANK, cap),
            FIN=min(HALF16_FINISH_BLOCK, cap), CAP=cap, ZERO=HALF16_ZERO_BLOCK, num_warps=HALF_WARPS, pdl=True,
        )  # fmt: skip
        return work.indices
    if work.scheme == FUSED_SCHEME:
        raise ValueError("radix8-fused selects inside the sparse MLA (mla_select.mla_decode_selected after dsa_passes)")
    if work.scheme == "radix8-carry":
        dsa_passes(work, topk)
        launch(
            _compact8_carry_kernel, grid, work.scores, work.work, work.indices, length, topk, WORK=CARRY8_INTS,
            BLOCK=block, TAIL=next_pow2(CARRY8_INTS - DIGITS * DIGIT_BINS), pdl=True,
        )  # fmt: skip
        return work.indices
    sizes = {"WORK": WORK_INTS, "BLOCK": block, "B1": BINS[0], "B2": BINS[1], "B3": BINS[2]}
    launch(_radix_pass_kernel, grid, work.scores, work.work, length, topk, LEVEL=2, pdl=True, **sizes)
    launch(_radix_pass_kernel, grid, work.scores, work.work, length, topk, LEVEL=3, pdl=True, **sizes)
    launch(_compact_kernel, grid, work.scores, work.work, work.indices, length, topk, pdl=True, **sizes)
    return work.indices


def dsa_passes(work: DsaWorkspace, topk: int) -> None:
    """radix8-carry's histogram passes after the scoring kernel's, leaving the threshold in `work.work` (for
    `radix8-carry` and `radix8-fused`; the selection after them is the compaction or the selecting MLA)."""
    rows, length = work.scores.shape
    if work.scheme not in ("radix8-carry", FUSED_SCHEME):
        raise ValueError(f"no carried passes in the {work.scheme} scheme")
    grid = (-(-length // work.select_block), rows)
    for level in range(2, DIGITS + 1):
        launch(
            _carry8_kernel, grid, work.scores, work.work, length, topk, WORK=CARRY8_INTS, LEVEL=level,
            BLOCK=work.select_block, pdl=True,
        )  # fmt: skip


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
    """Scores and selection in one call: [R, min(L, topk)] int32 token positions (`dsa_prepare` first)."""
    if work is None:
        scheme = default_scheme(keys.shape[1])
        scheme = LIST_SCHEME if scheme == FUSED_SCHEME else scheme
        work = dsa_workspace(q.shape[0], keys.shape[1], topk, q.device, scheme=scheme)
    dsa_prepare(work)
    dsa_scores(q, weights, keys, key_scales, work, q_len=q_len)
    return dsa_select(work, topk)


def quantize_query(q: torch.Tensor, weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(q [R, Hi, Di] as FP8 E4M3 values in fp32, weights [R, Hi] with the scales folded in): q quantized per head
    as the FP8 indexer does it in the kernel (`_indexer_query`)."""
    q8, scale = e4m3_rows_torch(q)
    return q8, weights.float() * scale


def reference_scores(
    q: torch.Tensor,
    weights: torch.Tensor,
    keys: torch.Tensor,
    key_scales: torch.Tensor,
    *,
    q_len: int = 1,
    q8: bool = False,
) -> torch.Tensor:
    """The torch form of the scores (FP8 keys cast to bf16 first, as a torch implementation must): [R, L] fp32.
    `q8`: q quantized per head to FP8 first, the FP8 indexer's product (`DsaWorkspace.q8`), in fp32."""
    if q8:
        qq, ww = quantize_query(q, weights)
        kf = keys.float()
        if q_len > 1:
            kf = kf.repeat_interleave(q_len, dim=0)
            key_scales = key_scales.repeat_interleave(q_len, dim=0)
        logits = torch.bmm(qq, kf.transpose(1, 2)) * key_scales.unsqueeze(1)
        return (logits.relu() * ww.unsqueeze(-1)).sum(dim=1)
    kb = keys.to(torch.bfloat16)
    if q_len > 1:
        kb = kb.repeat_interleave(q_len, dim=0)
        key_scales = key_scales.repeat_interleave(q_len, dim=0)
    logits = torch.bmm(q, kb.transpose(1, 2)).float() * key_scales.unsqueeze(1)  # [R, Hi, L]
    return (logits.relu() * weights.float().unsqueeze(-1)).sum(dim=1)
