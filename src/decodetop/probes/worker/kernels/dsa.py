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

Five digit schemes (`SCHEMES`): `radix8-carry` (below; the default from `LONG_SCHEME_FROM` tokens), `half16-ticket`
(below; the default under it) and `half8-ticket` (below), `radix8`, four 8-bit digits of 256 bins, and `radix11`, three
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

`half8-ticket` selects in one launch after the scoring kernel: on an H200 at 128K radix8-carry's three passes and
compaction took 14.7 of the step's 35.3 µs, each a dependent grid over every score (docs/benchmarks.md, "Kernels,
seventh round"), mostly launch latency (the 512 KB of scores sit in L2). The scoring kernel histograms a finer first
digit, the top 8 bits of the score's FP16 order-preserving key (sign, 5 exponent and 2 mantissa bits: 4 bins per octave,
where the fp32 key's top 8 bits are one bin per 4 octaves), with the same 256 bins. The one select launch
(`_half8_select_kernel`): each program finds the threshold bin b1 from that histogram, writes the positions of its
scores above b1 straight to the output (places from an atomic counter, as the compaction's) and appends the positions
and fp32 keys of those in b1 to a candidate buffer (`HALF_CANDIDATES` a row); after a CTA barrier it takes a ticket (an
acq_rel atomic: a grid sync's pattern), and the program that draws the last one selects the `k` − (above b1) largest
fp32 keys among the candidates by a radix select of four 8-bit digits (`_half_finish`: up to `HALF_FINISH_BLOCK` in
registers; more looped over the buffer; past the buffer's capacity, e.g. many equal scores, over the whole score row:
slow but exact), then zeroes the histogram and the counters, so the scheme needs no memset. On an H200 (GLM-5 TP-8,
one row, top-k 2048) its whole MLA+DSA step took 36.9 µs at 4K, 36.6 at 32K and 49.1 at 128K against radix8-carry's
22.6, 26.7 and 34.4: the finishing program's four `tl.histogram` passes over 4096 lanes, whose candidates all share
their leading fp32 digits (one bin: serialized shared-memory atomics), and its cumsum cost more than the passes saved
(6712 candidates at 128K, the buffer path; `benchmarks/kernels/h200_kernels.py`, rows "half8-ticket").

`half16-ticket` keeps half8-ticket's one select launch but leaves its finishing program almost nothing: the scoring
kernel also histograms the whole 16-bit FP16 key (65536 bins a row, one relaxed global atomic per score, no
`tl.histogram`); each select program (`_half16_select_kernel`) finds b1 from the 256-bin histogram and the low byte
b2 from the 256 bins of the 16-bit histogram under b1, writes its scores above t16 = b1·256 + b2 straight to the
output and appends those at t16 to the candidate buffer, whose count is the 16-bit histogram's at t16: tens (10
mantissa bits: a bin 256 times finer than half8-ticket's). The last program (the ticket) ranks them by one all-pairs
comparison and writes each selected one at its rank (`_half_rank`; no histogram, no cumsum); past `HALF16_RANK`
candidates (many equal FP16 keys) it falls back to half8-ticket's radix loops over the buffer or the score row. The
16-bit histogram needs no memset: each program zeroes its grid-stride share of the 65536 bins but b1's 256 (the others
may still read them), the last program b1's, the 256-bin histogram and the counters. On an H200 (GLM-5 TP-8, one
row, top-k 2048) its whole MLA+DSA step took 20.4 µs at 4K, 24.4 at 32K and 36.5 at 128K against radix8-carry's 21.7,
26.7 and 35.5 (7 and 17 candidates, the rank path): the per-score atomics add 1.4 µs to the scoring kernel at 32K and
4.0 at 128K, where the one select launch and its finish took 13.8 µs against the four passes' 14.5
(docs/benchmarks.md, "Kernels, eighth round"). So the probe runs it below `LONG_SCHEME_FROM` tokens and radix8-carry
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
#: The `radix8` scheme: four digits of 8 bits, 256 bins each.
DIGIT_BITS = 8
DIGIT_BINS = 1 << DIGIT_BITS
DIGITS = 32 // DIGIT_BITS
#: Workspace per row of `radix8`: four histograms and the two counters.
WORK8_INTS = DIGITS * DIGIT_BINS + 2
#: `radix8-carry`'s workspace per row after `radix8`'s: a ticket right after the two counters (the compaction's
#: programs done) and, per pass after the second (the third, the fourth, the compaction), the threshold's digits so
#: far and the count above them, as the pass before found them.
TICKET_AT = DIGITS * DIGIT_BINS + 2
CARRY_AT = TICKET_AT + 1
CARRY8_INTS = CARRY_AT + 2 * (DIGITS - 1)
#: `half8-ticket`'s workspace per row: the scoring kernel's histogram of the FP16 digit, then three counters (the
#: places handed out above the threshold bin, the candidates appended, the select programs done).
HALF_ABOVE_AT = DIGIT_BINS
HALF_CAND_AT = DIGIT_BINS + 1
HALF_TICKET_AT = DIGIT_BINS + 2
HALF8_INTS = DIGIT_BINS + 3
#: `half8-ticket`'s candidate buffer per row (the positions, then the fp32 keys, of the scores whose FP16 digit is
#: the threshold bin's): capacity for 8192, and the finishing program's block, 4096 candidates held in registers.
#: With random q and keys the threshold bin holds ~2 % of the tokens at 128K (~2.6K; the bin is a quarter octave
#: of the scores), so 4096 covers it with 1.5× to spare; a `tl.histogram` costs per lane, masked or not (see the
#: module docstring), so the register block is no larger. Counts in (4096, 8192] loop over the buffer in blocks
#: of 4096, larger ones over the whole score row (exact, slow).
HALF_CANDIDATES = 8192
HALF_FINISH_BLOCK = 4096
#: Warps of each `half8-ticket` (and `half16-ticket`) select program: the finishing program's 4096 candidates are
#: 16 a thread.
HALF_WARPS = 8
#: `half16-ticket`'s workspace per row: the scoring kernel's 256-bin histogram of the FP16 key's top byte (as
#: half8-ticket's), its histogram of the whole 16-bit FP16 key (65536 bins, per-element atomics), then the three
#: counters as half8-ticket's and one int unused, so each row starts 16-byte aligned (the zeroing's vector stores).
HALF16_BINS = 1 << 16
HALF16_AT = DIGIT_BINS
HALF16_ABOVE_AT = HALF16_AT + HALF16_BINS
HALF16_CAND_AT = HALF16_ABOVE_AT + 1
HALF16_TICKET_AT = HALF16_ABOVE_AT + 2
HALF16_INTS = HALF16_ABOVE_AT + 4
#: `half16-ticket`'s candidates (the scores whose 16-bit FP16 key is the threshold's): the 16-bit bin is 256 times
#: finer than half8-ticket's 8-bit one (10 mantissa bits against 2), so where half8-ticket's bin held 6712 scores at
#: 128K on an H200 (random q and keys) this one holds ~26, at 4K under one. Up to `HALF16_RANK` the finishing
#: program ranks them by one all-pairs comparison (no histogram; 10× the expected count at 128K), in chunks of
#: `HALF16_RANK_CHUNK` candidates (a [256, 64] comparison: 64 values a thread of `HALF_WARPS` warps). More arise
#: only from many equal FP16 keys (ties, scores past FP16's range): half8-ticket's radix loops over the buffer in
#: blocks of `HALF16_FINISH_BLOCK` (registers a thread: a `tl.histogram` costs per lane), past its capacity over the
#: score row. The capacity is half half8-ticket's: counts past a few hundred are ties, which fill any buffer.
HALF16_CANDIDATES = 4096
HALF16_RANK = 256
HALF16_RANK_CHUNK = 64
HALF16_FINISH_BLOCK = 1024
#: Entries of the 16-bit histogram each select program zeroes per store (a grid-stride loop over the 65536): 4 a
#: thread of `HALF_WARPS` warps, one 16-byte store.
HALF16_ZERO_BLOCK = 1024
#: The digit schemes, the default first.
SCHEMES = ("radix8-carry", "half16-ticket", "half8-ticket", "radix8", "radix11")
#: The scheme the probe runs by context (`default_scheme`): `half16-ticket` below `LONG_SCHEME_FROM` tokens, its
#: one select launch after the scoring kernel (on an H200 at GLM-5's TP-8 shard the whole MLA + DSA step 20.4 µs at 4K
#: and 24.4 at 32K against radix8-carry's 21.7 and 26.7), `radix8-carry` from there, where the scoring kernel's
#: 16-bit histogram atomics cost more than the passes they save (36.5 µs at 128K against 35.5): docs/benchmarks.md,
#: "Kernels, eighth round".
SHORT_SCHEME = "half16-ticket"
LONG_SCHEME = "radix8-carry"
LONG_SCHEME_FROM = 65536
#: `dsa_workspace`'s scheme argument for "by context" (`default_scheme`).
BY_CONTEXT = ""
#: The schemes whose passes leave their workspace zero for the next step (no memset: `dsa_prepare`).
SELF_ZEROING = frozenset({"radix8-carry", "half8-ticket", "half16-ticket"})
#: The schemes with a candidate buffer (`DsaWorkspace.candidates`), with its capacity per row.
HALF_SCHEMES = ("half8-ticket", "half16-ticket")
#: Ints per row of each scheme's workspace.
SCHEME_INTS = {
    "radix8": WORK8_INTS,
    "radix11": WORK_INTS,
    "radix8-carry": CARRY8_INTS,
    "half8-ticket": HALF8_INTS,
    "half16-ticket": HALF16_INTS,
}
#: Scoring programs wanted per SM and their loop's pipeline stages: the fastest of 72 launch shapes at GLM-5's indexer
#: on an H200 (`benchmarks/kernels/dsa_scores_sweep.py`; docs/benchmarks.md, "Kernels, seventh round": 13.0 µs at
#: 128K against 14.8 for 2 per SM and 3 stages, the same at 32K).
SCORE_PROGRAMS_PER_SM = 4
SCORE_STAGES = 2

if HAVE_TRITON:
    _CARRY_AT = tl.constexpr(CARRY_AT)
    _HALF_ABOVE_AT = tl.constexpr(HALF_ABOVE_AT)
    _HALF_CAND_AT = tl.constexpr(HALF_CAND_AT)
    _HALF_TICKET_AT = tl.constexpr(HALF_TICKET_AT)
    _HALF16_AT = tl.constexpr(HALF16_AT)
    _HALF16_BINS = tl.constexpr(HALF16_BINS)
    _HALF16_ABOVE_AT = tl.constexpr(HALF16_ABOVE_AT)
    _HALF16_CAND_AT = tl.constexpr(HALF16_CAND_AT)
    _HALF16_TICKET_AT = tl.constexpr(HALF16_TICKET_AT)

    @triton.jit  # type: ignore[misc,untyped-decorator,unused-ignore]
    def _key_of(score):  # type: ignore[no-untyped-def,unused-ignore]
        """fp32 → uint32 whose unsigned order is the float order (negatives: all bits flipped; else the sign bit)."""
        bits = score.to(tl.uint32, bitcast=True)
        flip = tl.where((bits >> 31) == 1, 0xFFFFFFFF, 0x80000000).to(tl.uint32)
        return bits ^ flip

    @triton.jit  # type: ignore[misc,untyped-decorator,unused-ignore]
    def _half_key(score):  # type: ignore[no-untyped-def,unused-ignore]
        """fp32 → its FP16 form's 16-bit order-preserving key (int32 in [0, 65536)), as `_key_of` flips 32 bits.
        The conversion rounds to nearest even (Triton's default downcast; numpy's under the interpreter) and
        saturates at ±inf, so the key never decreases as the score grows: every score of a higher key is larger
        than every score of a lower one."""
        bits = score.to(tl.float16).to(tl.uint16, bitcast=True)
        flip = tl.where((bits >> 15) == 1, 0xFFFF, 0x8000).to(tl.uint16)
        return (bits ^ flip).to(tl.int32)

    @triton.jit  # type: ignore[misc,untyped-decorator,unused-ignore]
    def _half_digit(score):  # type: ignore[no-untyped-def,unused-ignore]
        """fp32 → the top 8 bits (sign, 5 exponent, 2 mantissa bits: 4 bins per octave) of `_half_key`."""
        return _half_key(score) >> 8

    @triton.jit  # type: ignore[misc,untyped-decorator,unused-ignore]
    def _bin_of(h, k_rem, NB: tl.constexpr):  # type: ignore[no-untyped-def,unused-ignore]
        """`_threshold_bin` of a histogram in registers."""
        bins = tl.arange(0, NB)
        at_or_above = tl.sum(h, 0) - tl.cumsum(h, 0) + h
        b = tl.max(tl.where(at_or_above >= k_rem, bins, -1), 0)
        above = tl.sum(tl.where(bins > b, h, 0), 0)
        return b, above

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

    @triton.jit  # type: ignore[misc,untyped-decorator,unused-ignore]
    def _half_candidates(  # type: ignore[no-untyped-def,unused-ignore]
        score_ptr, cand, row, length, n, b1, start, FIN: tl.constexpr, CAP: tl.constexpr, SHIFT: tl.constexpr
    ):
        """(fp32 keys, positions, valid) of the `FIN` candidates from `start`: the buffer's (`n` of them, positions
        then keys), or where the buffer overflowed (`n` > `CAP`) the score row's whose FP16 key shifted right by
        `SHIFT` (8: half8-ticket's digit; 0: half16-ticket's whole key) is `b1`. Loads through L2 (`.cg`): the other
        programs' stores are not in this SM's L1."""
        offs = start + tl.arange(0, FIN)
        in_row = offs < tl.where(n > CAP, length, 0)  # bounds, not a scalar & a block: Triton 3.9's interpreter
        in_buf = offs < tl.where(n > CAP, 0, n)  # leaves that int32, which a load refuses as a mask
        score = tl.load(score_ptr + row * length + offs, mask=in_row, other=0.0, cache_modifier=".cg")
        pos = tl.load(cand + offs, mask=in_buf, other=0, cache_modifier=".cg")
        key = tl.load(cand + CAP + offs, mask=in_buf, other=0, cache_modifier=".cg").to(tl.uint32, bitcast=True)
        key = tl.where(in_row, _key_of(score), key)
        pos = tl.where(in_row, offs, pos)
        return key, pos, in_buf | (in_row & ((_half_key(score) >> SHIFT) == b1))

    @triton.jit  # type: ignore[misc,untyped-decorator,unused-ignore]
    def _digit_hist(key, valid, prefix, LEVEL: tl.constexpr):  # type: ignore[no-untyped-def,unused-ignore]
        """Histogram of the fp32 keys' 8-bit digit LEVEL (0: the top) over the valid ones tied with `prefix`, the
        threshold's first LEVEL digits."""
        tied = valid if LEVEL == 0 else valid & ((key >> (32 - 8 * LEVEL)) == prefix)
        return tl.histogram(((key >> (24 - 8 * LEVEL)) & 0xFF).to(tl.int32), 256, mask=tied)

    @triton.jit  # type: ignore[misc,untyped-decorator,unused-ignore]
    def _half_write(out, key, pos, valid, threshold, n_over, rem, o_over, o_at):  # type: ignore[no-untyped-def,unused-ignore]
        """Writes the positions of the keys above `threshold` from place `o_over` (of `n_over`), then of those at
        it from place `n_over` + `o_at` while fewer than `rem` are; returns the places taken so far."""
        over = (valid & (key > threshold)).to(tl.int32)
        at = (valid & (key == threshold)).to(tl.int32)
        p_over = o_over + tl.cumsum(over, 0) - 1
        p_at = o_at + tl.cumsum(at, 0) - 1
        tl.store(out + p_over, pos, mask=(over == 1) & (p_over < n_over))
        tl.store(out + n_over + p_at, pos, mask=(at == 1) & (p_at < rem))
        return o_over + tl.sum(over, 0), o_at + tl.sum(at, 0)

    @triton.jit  # type: ignore[misc,untyped-decorator,unused-ignore]
    def _half_finish(  # type: ignore[no-untyped-def,unused-ignore]
        score_ptr, cand, out, row, length, need, n, b1, FIN: tl.constexpr, CAP: tl.constexpr, SHIFT: tl.constexpr
    ):
        """Writes at `out` the positions of the `need` largest fp32 keys among the `n` candidates (ties at the last
        threshold: any of them): a radix select of four 8-bit digits. Up to `FIN` candidates are held in registers
        (one load, four histograms); more are looped over in blocks of `FIN` for each pass, from the buffer, or
        from the score row where the buffer overflowed (its scores whose FP16 key >> `SHIFT` is `b1`)."""
        prefix = tl.full([], 0, tl.uint32)
        rem = need
        none = tl.full([], 0, tl.int32)
        if n <= FIN:
            key, pos, valid = _half_candidates(score_ptr, cand, row, length, n, b1, 0, FIN, CAP, SHIFT)
            for level in tl.static_range(4):
                b, up = _bin_of(_digit_hist(key, valid, prefix, level), rem, 256)
                prefix = (prefix << 8) | b.to(tl.uint32)
                rem = rem - up
            _half_write(out, key, pos, valid, prefix, need - rem, rem, none, none)
        else:
            total = tl.where(n > CAP, length, n)
            for level in tl.static_range(4):
                h = tl.zeros([256], tl.int32)
                for start in range(0, total, FIN):
                    key, pos, valid = _half_candidates(score_ptr, cand, row, length, n, b1, start, FIN, CAP, SHIFT)
                    h += _digit_hist(key, valid, prefix, level)
                b, up = _bin_of(h, rem, 256)
                prefix = (prefix << 8) | b.to(tl.uint32)
                rem = rem - up
            o_over = none
            o_at = none
            for start in range(0, total, FIN):
                key, pos, valid = _half_candidates(score_ptr, cand, row, length, n, b1, start, FIN, CAP, SHIFT)
                o_over, o_at = _half_write(out, key, pos, valid, prefix, need - rem, rem, o_over, o_at)

    @triton.jit  # type: ignore[misc,untyped-decorator,unused-ignore]
    def _half8_select_kernel(  # type: ignore[no-untyped-def,unused-ignore]
        score_ptr,
        work_ptr,
        cand_ptr,
        idx_ptr,
        length,
        k,
        WORK: tl.constexpr,
        BLOCK: tl.constexpr,
        FIN: tl.constexpr,
        CAP: tl.constexpr,
        USE_GDC: tl.constexpr,
    ):
        """`half8-ticket`'s whole selection after the scoring kernel's FP16-digit histogram, in one launch: each
        program writes its scores above the threshold bin b1 straight to the output and appends those in it to the
        candidate buffer; the last program to finish (the ticket) selects the rest among the candidates
        (`_half_finish`) and zeroes the histogram and the counters, so the workspace is zero for the next step."""
        pid = tl.program_id(0)
        row = tl.program_id(1)
        base = work_ptr + row * WORK
        cand = cand_ptr + row * 2 * CAP
        if USE_GDC:  # the histogram and the scores are the scoring kernel's, the grid before
            tl.extra.cuda.gdc_wait()
        bins = tl.arange(0, 256)
        hist = tl.load(base + bins)
        b1, above1 = _bin_of(hist, k, 256)
        offs = pid * BLOCK + tl.arange(0, BLOCK)
        valid = offs < length
        score = tl.load(score_ptr + row * length + offs, mask=valid, other=0.0)
        digit = _half_digit(score)
        over = (valid & (digit > b1)).to(tl.int32)
        at = (valid & (digit == b1)).to(tl.int32)
        if USE_GDC:
            tl.extra.cuda.gdc_launch_dependents()
        start_over = tl.atomic_add(base + _HALF_ABOVE_AT, tl.sum(over, 0))
        start_at = tl.atomic_add(base + _HALF_CAND_AT, tl.sum(at, 0))
        p_over = start_over + tl.cumsum(over, 0) - 1
        p_at = start_at + tl.cumsum(at, 0) - 1
        tl.store(idx_ptr + row * k + p_over, offs, mask=(over == 1) & (p_over < above1))
        stored = (at == 1) & (p_at < CAP)
        tl.store(cand + p_at, offs, mask=stored)
        tl.store(cand + CAP + p_at, _key_of(score).to(tl.int32, bitcast=True), mask=stored)
        tl.debug_barrier()  # every thread's stores before the ticket's release (a grid sync's pattern)
        done = tl.atomic_add(base + _HALF_TICKET_AT, 1, sem="acq_rel")
        if done == tl.num_programs(0) - 1:  # every other program has stored its candidates and read the histogram
            n = tl.sum(tl.where(bins == b1, hist, 0), 0)  # the candidates: the histogram's count in bin b1
            _half_finish(score_ptr, cand, idx_ptr + row * k + above1, row, length, k - above1, n, b1, FIN, CAP, 8)
            tl.store(base + bins, tl.zeros([256], tl.int32))
            tail = tl.arange(0, 4)
            tl.store(base + _HALF_ABOVE_AT + tail, tl.zeros([4], tl.int32), mask=tail < 3)

    @triton.jit  # type: ignore[misc,untyped-decorator,unused-ignore]
    def _half_rank(cand, out, n, need, RANK: tl.constexpr, CHUNK: tl.constexpr, CAP: tl.constexpr):  # type: ignore[no-untyped-def,unused-ignore]
        """Writes at `out` the positions of the `need` largest fp32 keys among the buffer's `n` ≤ `RANK`
        candidates, each at its rank: rank_i = #{j : key_j > key_i, or key_j = key_i and j < i} (a permutation of
        0..n − 1, ties broken by buffer place), counted over the candidates `CHUNK` at a time; exactly `need`
        stores, no histogram, no cumsum."""
        i = tl.arange(0, RANK)
        mine = i < n
        pos = tl.load(cand + i, mask=mine, other=0, cache_modifier=".cg")
        key = tl.load(cand + CAP + i, mask=mine, other=0, cache_modifier=".cg").to(tl.uint32, bitcast=True)
        rank = tl.zeros([RANK], tl.int32)
        for start in range(0, n, CHUNK):
            j = start + tl.arange(0, CHUNK)
            theirs = j < n
            other = tl.load(cand + CAP + j, mask=theirs, other=0, cache_modifier=".cg").to(tl.uint32, bitcast=True)
            ahead = (other[None, :] > key[:, None]) | ((other[None, :] == key[:, None]) & (j[None, :] < i[:, None]))
            rank += tl.sum((ahead & theirs[None, :]).to(tl.int32), 1)
        tl.store(out + rank, pos, mask=mine & (rank < need))

    @triton.jit  # type: ignore[misc,untyped-decorator,unused-ignore]
    def _half16_select_kernel(  # type: ignore[no-untyped-def,unused-ignore]
        score_ptr,
        work_ptr,
        cand_ptr,
        idx_ptr,
        length,
        k,
        WORK: tl.constexpr,
        BLOCK: tl.constexpr,
        RANK: tl.constexpr,
        CHUNK: tl.constexpr,
        FIN: tl.constexpr,
        CAP: tl.constexpr,
        ZERO: tl.constexpr,
        USE_GDC: tl.constexpr,
    ):
        """`half16-ticket`'s whole selection after the scoring kernel's two histograms, in one launch: each program
        finds the threshold's 16-bit FP16 key t16 (its top byte b1 from the 256-bin histogram, its low byte from
        the 256 bins of the 16-bit histogram under b1), writes its scores above t16 straight to the output and
        appends those at it to the candidate buffer, and zeroes its share of the 16-bit histogram but b1's 256
        bins (which the others still read); the last program to finish (the ticket) ranks the candidates
        (`_half_rank`; past `RANK` of them half8-ticket's radix loops, `_half_finish`) and zeroes b1's bins, the
        256-bin histogram and the counters, so the workspace is zero for the next step."""
        pid = tl.program_id(0)
        row = tl.program_id(1)
        base = work_ptr + row * WORK
        hist16 = base + _HALF16_AT
        cand = cand_ptr + row * 2 * CAP
        if USE_GDC:  # the histograms and the scores are the scoring kernel's, the grid before
            tl.extra.cuda.gdc_wait()
        bins = tl.arange(0, 256)
        b1, above1 = _bin_of(tl.load(base + bins), k, 256)
        low = tl.load(hist16 + b1 * 256 + bins)
        b2, above2 = _bin_of(low, k - above1, 256)
        t16 = b1 * 256 + b2
        n_over = above1 + above2
        offs = pid * BLOCK + tl.arange(0, BLOCK)
        valid = offs < length
        score = tl.load(score_ptr + row * length + offs, mask=valid, other=0.0)
        key16 = _half_key(score)
        over = (valid & (key16 > t16)).to(tl.int32)
        at = (valid & (key16 == t16)).to(tl.int32)
        if USE_GDC:
            tl.extra.cuda.gdc_launch_dependents()
        start_over = tl.atomic_add(base + _HALF16_ABOVE_AT, tl.sum(over, 0))
        start_at = tl.atomic_add(base + _HALF16_CAND_AT, tl.sum(at, 0))
        p_over = start_over + tl.cumsum(over, 0) - 1
        p_at = start_at + tl.cumsum(at, 0) - 1
        tl.store(idx_ptr + row * k + p_over, offs, mask=(over == 1) & (p_over < n_over))
        stored = (at == 1) & (p_at < CAP)
        tl.store(cand + p_at, offs, mask=stored)
        tl.store(cand + CAP + p_at, _key_of(score).to(tl.int32, bitcast=True), mask=stored)
        tl.debug_barrier()  # every thread's stores before the ticket's release (a grid sync's pattern)
        done = tl.atomic_add(base + _HALF16_TICKET_AT, 1, sem="acq_rel")
        if done == tl.num_programs(0) - 1:  # every other program has stored its candidates and read the histograms
            n = tl.sum(tl.where(bins == b2, low, 0), 0)  # the candidates: the 16-bit histogram's count at t16
            out = idx_ptr + row * k + n_over
            if n <= RANK:
                _half_rank(cand, out, n, k - n_over, RANK, CHUNK, CAP)
            else:
                _half_finish(score_ptr, cand, out, row, length, k - n_over, n, t16, FIN, CAP, 0)
            tl.store(hist16 + b1 * 256 + bins, tl.zeros([256], tl.int32))
            tl.store(base + bins, tl.zeros([256], tl.int32))
            tail = tl.arange(0, 4)
            tl.store(base + _HALF16_ABOVE_AT + tail, tl.zeros([4], tl.int32), mask=tail < 3)
        zero = tl.arange(0, ZERO)
        for start in range(pid * ZERO, _HALF16_BINS, tl.num_programs(0) * ZERO):  # b1's bins: the last program's
            tl.store(hist16 + start + zero, tl.zeros([ZERO], tl.int32), mask=((start + zero) >> 8) != b1)


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
    if work.scheme == "radix8-carry":
        for level in range(2, DIGITS + 1):
            launch(
                _carry8_kernel, grid, work.scores, work.work, length, topk, WORK=CARRY8_INTS, LEVEL=level,
                BLOCK=block, pdl=True,
            )  # fmt: skip
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
        work = dsa_workspace(q.shape[0], keys.shape[1], topk, q.device)
    dsa_prepare(work)
    dsa_scores(q, weights, keys, key_scales, work, q_len=q_len)
    return dsa_select(work, topk)


def half_keys(scores: torch.Tensor) -> torch.Tensor:
    """The torch form of the kernels' `_half_key`: each fp32 score's FP16 form (round to nearest even, ±inf past
    its range) as its order-preserving 16-bit key, int64 in [0, 65536)."""
    bits = scores.float().half().view(torch.int16).long() & 0xFFFF
    return torch.where(bits >= 0x8000, bits ^ 0xFFFF, bits ^ 0x8000)


def half_digits(scores: torch.Tensor) -> torch.Tensor:
    """The torch form of the kernels' `_half_digit`: `half_keys`' top 8 bits, int64 in [0, 256)."""
    return half_keys(scores) >> 8


def half_histogram(scores: torch.Tensor) -> torch.Tensor:
    """[rows, 256] int32: the histogram of `half_digits` per row, the torch form of what the scoring kernel adds to
    a `half8-ticket` workspace."""
    digits = half_digits(scores)
    hist = torch.zeros(scores.shape[0], DIGIT_BINS, dtype=torch.int64, device=scores.device)
    hist.scatter_add_(1, digits, torch.ones_like(digits))
    return hist.int()


def half_candidates(scores: torch.Tensor, topk: int) -> torch.Tensor:
    """[rows] int64: how many scores of each row share the FP16 digit of its `topk`-th largest, the candidates
    `half8-ticket`'s finishing program selects among (at most HALF_FINISH_BLOCK: held in registers; at most
    HALF_CANDIDATES: looped over the buffer; more: over the score row)."""
    hist = half_histogram(scores).long()
    at_or_above = hist.flip(1).cumsum(1).flip(1)  # non-increasing: the bins holding the topk-th come first
    b1 = (at_or_above >= min(topk, scores.shape[1])).sum(1, keepdim=True) - 1
    return hist.gather(1, b1).squeeze(1)


def half16_histogram(scores: torch.Tensor) -> torch.Tensor:
    """[rows, 65536] int32: the histogram of `half_keys` per row, the torch form of the 16-bit histogram the
    scoring kernel adds to a `half16-ticket` workspace (after `half_histogram`'s 256 bins)."""
    keys = half_keys(scores)
    hist = torch.zeros(scores.shape[0], HALF16_BINS, dtype=torch.int64, device=scores.device)
    hist.scatter_add_(1, keys, torch.ones_like(keys))
    return hist.int()


def half16_candidates(scores: torch.Tensor, topk: int) -> torch.Tensor:
    """[rows] int64: how many scores of each row share the 16-bit FP16 key of its `topk`-th largest, the candidates
    `half16-ticket`'s finishing program selects among (at most HALF16_RANK: ranked; more: half8-ticket's radix
    loops, over the buffer up to HALF16_CANDIDATES, else over the score row). The key never decreases as the score
    grows, so the `topk`-th largest score's key is the threshold's."""
    keys = half_keys(scores)
    kth = scores.topk(min(topk, scores.shape[1]), dim=1).values[:, -1:]
    return (keys == half_keys(kth)).sum(1)


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
