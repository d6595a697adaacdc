"""Provides the DSA top-k's one-launch schemes (Triton kernels and their torch forms): `half8-ticket` and
`half16-ticket`, which select in one launch after the scoring kernel (`kernels.dsa`, which dispatches to them and
owns the workspace), the last program to finish drawing a ticket and selecting among the threshold bin's
candidates.

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
(docs/benchmarks.md, "Kernels, eighth round"). So the probe runs it below `dsa.LONG_SCHEME_FROM` tokens and
radix8-fused from there (`dsa.default_scheme`).
"""

from __future__ import annotations

import torch

from decodetop.probes.worker.kernels.common import HAVE_TRITON, tl, triton
from decodetop.probes.worker.kernels.dsa_keys import DIGIT_BINS

if HAVE_TRITON:
    from decodetop.probes.worker.kernels.dsa_keys import _bin_of, _half_digit, _half_key, _key_of

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

if HAVE_TRITON:
    _HALF_ABOVE_AT = tl.constexpr(HALF_ABOVE_AT)
    _HALF16_AT = tl.constexpr(HALF16_AT)
    _HALF16_BINS = tl.constexpr(HALF16_BINS)
    _HALF16_ABOVE_AT = tl.constexpr(HALF16_ABOVE_AT)

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
    def _place_and_append(counters, out, cand, offs, score, over, at, n_over, CAP: tl.constexpr):  # type: ignore[no-untyped-def,unused-ignore]
        """A select program's share of both one-launch schemes: the positions of its scores above the threshold
        (`over`) into `out` below `n_over`, those at it (`at`) with their fp32 keys appended to the candidate buffer
        `cand` below CAP, places from the counters at `counters` (above, candidates: `HALF_ABOVE_AT`,
        `HALF_CAND_AT`); then, after a CTA barrier, the ticket at `counters` + 2 (`HALF_TICKET_AT`; a grid sync's
        pattern): returns the programs done before this one."""
        start_over = tl.atomic_add(counters, tl.sum(over, 0))
        start_at = tl.atomic_add(counters + 1, tl.sum(at, 0))
        p_over = start_over + tl.cumsum(over, 0) - 1
        p_at = start_at + tl.cumsum(at, 0) - 1
        tl.store(out + p_over, offs, mask=(over == 1) & (p_over < n_over))
        stored = (at == 1) & (p_at < CAP)
        tl.store(cand + p_at, offs, mask=stored)
        tl.store(cand + CAP + p_at, _key_of(score).to(tl.int32, bitcast=True), mask=stored)
        tl.debug_barrier()  # every thread's stores before the ticket's release
        return tl.atomic_add(counters + 2, 1, sem="acq_rel")

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
        done = _place_and_append(base + _HALF_ABOVE_AT, idx_ptr + row * k, cand, offs, score, over, at, above1, CAP)
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
        done = _place_and_append(base + _HALF16_ABOVE_AT, idx_ptr + row * k, cand, offs, score, over, at, n_over, CAP)
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
