"""Provides the fused-MoE decode kernels (Triton): a grouped GEMV over the routed experts in three kernels — gate_up
(in a reduction form and a `tl.dot` form), down, combine — and the fold form's combine inside the down kernel, with
each kernel's trigger placement for programmatic dependent launch. `decodetop.probes.worker.fused_moe` launches them,
tunes their tiles and forms, and says why each is as it is (its module docstring)."""

from __future__ import annotations

from decodetop.probes.worker.kernels.common import HAVE_TRITON, tl, triton

if HAVE_TRITON:

    @triton.jit  # type: ignore[misc,untyped-decorator,unused-ignore]
    def _gate_up_kernel(  # type: ignore[no-untyped-def,unused-ignore]
        x_ptr,
        w13_ptr,
        ids_ptr,
        h_ptr,
        hidden,
        inter,
        k_chunk,
        stride_we,
        stride_wn,
        top_k: tl.constexpr,
        block_n: tl.constexpr,
        block_k: tl.constexpr,
        split: tl.constexpr,
        EARLY: tl.constexpr,
        USE_GDC: tl.constexpr,
    ):
        slot = tl.program_id(0)  # token · top_k + k
        nb = tl.program_id(1)
        ks = tl.program_id(2)
        token = slot // top_k
        if USE_GDC:  # the expert ids (the router's) address the weights, and x is the layer's input: nothing before
            tl.extra.cuda.gdc_wait()
        expert = tl.load(ids_ptr + slot).to(tl.int64)
        _trigger(USE_GDC, EARLY)
        offs_n = nb * block_n + tl.arange(0, block_n)
        mask_n = offs_n < inter
        w_gate = w13_ptr + expert * stride_we + offs_n[:, None].to(tl.int64) * stride_wn
        w_up = w_gate + inter * stride_wn
        acc_g = tl.zeros([block_n], dtype=tl.float32)
        acc_u = tl.zeros([block_n], dtype=tl.float32)
        k_end = tl.minimum(hidden, (ks + 1) * k_chunk)
        for k0 in range(ks * k_chunk, k_end, block_k):
            offs_k = k0 + tl.arange(0, block_k)
            mask_k = offs_k < k_end
            xv = tl.load(x_ptr + token * hidden + offs_k, mask=mask_k, other=0.0).to(tl.float32)
            mask = mask_n[:, None] & mask_k[None, :]
            wg = tl.load(w_gate + offs_k[None, :], mask=mask, other=0.0).to(tl.float32)
            wu = tl.load(w_up + offs_k[None, :], mask=mask, other=0.0).to(tl.float32)
            acc_g += tl.sum(wg * xv[None, :], axis=1)
            acc_u += tl.sum(wu * xv[None, :], axis=1)
        _trigger(USE_GDC, not EARLY)
        _store_gate_up(h_ptr + slot * 2 * inter, inter, offs_n, mask_n, acc_g, acc_u, split)

    @triton.jit  # type: ignore[misc,untyped-decorator,unused-ignore]
    def _trigger(USE_GDC: tl.constexpr, HERE: tl.constexpr):  # type: ignore[no-untyped-def,unused-ignore]
        """`gdc_launch_dependents` where this placement is the form's (HERE) and the launch uses PDL: where it sits
        decides only how early the next grid's programs become resident, never what they read (their `gdc_wait`
        still waits for this grid's completion and memory flush)."""
        if USE_GDC and HERE:
            tl.extra.cuda.gdc_launch_dependents()

    @triton.jit  # type: ignore[misc,untyped-decorator,unused-ignore]
    def _store_gate_up(row, inter, offs_n, mask_n, g, u, split: tl.constexpr):  # type: ignore[no-untyped-def,unused-ignore]
        """A slot's gate and up block into its h row (gate then up, `inter` apart); added where the reduction is
        split over programs."""
        if split:
            tl.atomic_add(row + offs_n, g, mask=mask_n)
            tl.atomic_add(row + inter + offs_n, u, mask=mask_n)
        else:
            tl.store(row + offs_n, g, mask=mask_n)
            tl.store(row + inter + offs_n, u, mask=mask_n)

    @triton.jit  # type: ignore[misc,untyped-decorator,unused-ignore]
    def _gate_up_mma_kernel(  # type: ignore[no-untyped-def,unused-ignore]
        x_ptr,
        w13_ptr,
        ids_ptr,
        h_ptr,
        hidden,
        inter,
        k_chunk,
        stride_we,
        stride_wn,
        top_k: tl.constexpr,
        block_n: tl.constexpr,
        block_k: tl.constexpr,
        split: tl.constexpr,
        even_k: tl.constexpr,
        MMA_M: tl.constexpr,
        F32_DOT: tl.constexpr,
        EARLY: tl.constexpr,
        USE_GDC: tl.constexpr,
    ):
        """`_gate_up_kernel` with its products taken by `tl.dot`: the slot's token is row 0 of MMA_M rows (the
        rest zero), so Triton pipelines the weight tiles' loads through shared memory (`num_stages`)."""
        slot = tl.program_id(0)  # token · top_k + k
        nb = tl.program_id(1)
        ks = tl.program_id(2)
        token = slot // top_k
        if USE_GDC:  # the expert ids (the router's) address the weights, and x is the layer's input: nothing before
            tl.extra.cuda.gdc_wait()
        expert = tl.load(ids_ptr + slot).to(tl.int64)
        _trigger(USE_GDC, EARLY)
        offs_n = nb * block_n + tl.arange(0, block_n)
        mask_n = offs_n < inter
        rows = tl.arange(0, MMA_M)[:, None]
        first = rows == 0  # the token's row; the padding rows load nothing
        w_gate = w13_ptr + expert * stride_we + offs_n[:, None].to(tl.int64) * stride_wn
        w_up = w_gate + inter * stride_wn
        acc_g = tl.zeros([MMA_M, block_n], dtype=tl.float32)
        acc_u = tl.zeros([MMA_M, block_n], dtype=tl.float32)
        k_end = tl.minimum(hidden, (ks + 1) * k_chunk)
        for k0 in range(ks * k_chunk, k_end, block_k):
            offs_k = k0 + tl.arange(0, block_k)
            x_rows = x_ptr + token * hidden + offs_k[None, :] + 0 * rows
            if even_k:  # masks constant along k: whole vectors, which Triton's pipeliner needs to stage a load
                xv = tl.load(x_rows, mask=first, other=0.0)
                wg = tl.load(w_gate + offs_k[None, :], mask=mask_n[:, None], other=0.0)
                wu = tl.load(w_up + offs_k[None, :], mask=mask_n[:, None], other=0.0)
            else:
                mask_k = offs_k < k_end
                xv = tl.load(x_rows, mask=first & mask_k[None, :], other=0.0)
                mask = mask_n[:, None] & mask_k[None, :]
                wg = tl.load(w_gate + offs_k[None, :], mask=mask, other=0.0)
                wu = tl.load(w_up + offs_k[None, :], mask=mask, other=0.0)
            if F32_DOT:
                xv = xv.to(tl.float32)
                wg = wg.to(tl.float32)
                wu = wu.to(tl.float32)
            else:  # fp8 / fp16 weights against a bf16 token: the dot's operands share the token's type
                wg = wg.to(xv.dtype)
                wu = wu.to(xv.dtype)
            acc_g = tl.dot(xv, tl.trans(wg), acc_g)
            acc_u = tl.dot(xv, tl.trans(wu), acc_u)
        _trigger(USE_GDC, not EARLY)
        g = tl.sum(acc_g, axis=0)  # row 0: the padding rows are zero
        u = tl.sum(acc_u, axis=0)
        _store_gate_up(h_ptr + slot * 2 * inter, inter, offs_n, mask_n, g, u, split)

    @triton.jit  # type: ignore[misc,untyped-decorator,unused-ignore]
    def _down_part(h_row, inter, offs_k, mask_k, w):  # type: ignore[no-untyped-def,unused-ignore]
        """One k-step of the down projection: SiLU(gate) · up at `offs_k` from the slot's h row, times the loaded
        weight tile `w` [block_n, block_k], summed over k (fp32)."""
        g = tl.load(h_row + offs_k, mask=mask_k, other=0.0)
        u = tl.load(h_row + inter + offs_k, mask=mask_k, other=0.0)
        av = g / (1.0 + tl.exp(-g)) * u
        return tl.sum(w.to(tl.float32) * av[None, :], axis=1)

    @triton.jit  # type: ignore[misc,untyped-decorator,unused-ignore]
    def _down_kernel(  # type: ignore[no-untyped-def,unused-ignore]
        h_ptr,
        w2_ptr,
        ids_ptr,
        wts_ptr,
        ys_ptr,
        out_ptr,
        tickets_ptr,
        hidden,
        inter,
        k_chunk,
        stride_we,
        stride_wn,
        top_k: tl.constexpr,
        block_n: tl.constexpr,
        block_k: tl.constexpr,
        split: tl.constexpr,
        EARLY: tl.constexpr,
        FOLD: tl.constexpr,
        USE_GDC: tl.constexpr,
    ):
        """EARLY: the expert id, the router weight and the first k-step's weight tile (the whole slice where one
        step covers the program's part of I) loaded before `gdc_wait`, and the trigger right after it. The router
        wrote the ids and weights two grids back: the gate_up grid could let this one start only once each of its
        programs had passed its own `gdc_wait` on the router, so they are complete and flushed (the argument of
        `dsa._carry_keys`' EARLY loads; read through L2, `.cg`); the expert weights no kernel writes. FOLD: the
        combine done here (`_fold_into_out`); out_ptr and tickets_ptr are read only then."""
        slot = tl.program_id(0)
        nb = tl.program_id(1)
        ks = tl.program_id(2)
        offs_n = nb * block_n + tl.arange(0, block_n)
        mask_n = offs_n < hidden
        h_row = h_ptr + slot * 2 * inter
        k_start = ks * k_chunk
        k_end = tl.minimum(inter, (ks + 1) * k_chunk)
        if EARLY:
            expert = tl.load(ids_ptr + slot, cache_modifier=".cg").to(tl.int64)
            weight = tl.load(wts_ptr + slot, cache_modifier=".cg").to(tl.float32)
            w_rows = w2_ptr + expert * stride_we + offs_n[:, None].to(tl.int64) * stride_wn
            offs_k = k_start + tl.arange(0, block_k)
            mask_k = offs_k < k_end
            w = tl.load(w_rows + offs_k[None, :], mask=mask_n[:, None] & mask_k[None, :], other=0.0)
            if USE_GDC:  # h is the gate_up kernel's
                tl.extra.cuda.gdc_wait()
                tl.extra.cuda.gdc_launch_dependents()
            acc = _down_part(h_row, inter, offs_k, mask_k, w)
            k_next = k_start + block_k
        else:
            if USE_GDC:  # h is the gate_up kernel's, the expert ids and weights the router's
                tl.extra.cuda.gdc_wait()
            expert = tl.load(ids_ptr + slot).to(tl.int64)
            weight = tl.load(wts_ptr + slot).to(tl.float32)
            w_rows = w2_ptr + expert * stride_we + offs_n[:, None].to(tl.int64) * stride_wn
            acc = tl.zeros([block_n], dtype=tl.float32)
            k_next = k_start
        for k0 in range(k_next, k_end, block_k):
            offs_k = k0 + tl.arange(0, block_k)
            mask_k = offs_k < k_end
            w = tl.load(w_rows + offs_k[None, :], mask=mask_n[:, None] & mask_k[None, :], other=0.0)
            acc += _down_part(h_row, inter, offs_k, mask_k, w)
        _trigger(USE_GDC, not EARLY)
        if FOLD:
            _fold_into_out(ys_ptr, out_ptr, tickets_ptr, h_row, hidden, inter, k_start, k_end, offs_n, mask_n,
                           weight * acc, top_k, block_n, block_k)  # fmt: skip
        elif split:
            tl.atomic_add(ys_ptr + slot * hidden + offs_n, weight * acc, mask=mask_n)
        else:
            tl.store(ys_ptr + slot * hidden + offs_n, weight * acc, mask=mask_n)

    @triton.jit  # type: ignore[misc,untyped-decorator,unused-ignore]
    def _fold_into_out(  # type: ignore[no-untyped-def,unused-ignore]
        ys_ptr,
        out_ptr,
        tickets_ptr,
        h_row,
        hidden,
        inter,
        k_start,
        k_end,
        offs_n,
        mask_n,
        part,
        top_k: tl.constexpr,
        block_n: tl.constexpr,
        block_k: tl.constexpr,
    ):
        """This program's weighted rows `part` added into its token's fp32 row (row `token` of ys), then a ticket
        per (token, hidden block): the program that draws the last (top_k · splits programs add into the block)
        writes the block to out in out's dtype and zeroes the fp32 block and the counter. A second ticket per
        (slot, k part): the last of the hidden blocks' programs to have read that part of the slot's h row zeroes
        it and the counter, so the next call's split reductions add onto zeros (no memsets). The tickets are the
        CUDA cooperative-groups grid-sync pattern: every thread's adds before a barrier, then one acq_rel atomic
        (https://docs.nvidia.com/cuda/cuda-c-programming-guide/index.html#grid-synchronization); tickets_ptr holds
        tokens · blocks counters, then slots · splits (`ticket_count`), all zero between calls."""
        slot = tl.program_id(0)
        nb = tl.program_id(1)
        ks = tl.program_id(2)
        blocks = tl.num_programs(1)
        splits = tl.num_programs(2)
        token = slot // top_k
        row = ys_ptr + token * hidden + offs_n
        tl.atomic_add(row, part, mask=mask_n, sem="relaxed")
        tl.debug_barrier()  # every thread's adds (and its h loads, consumed in part) before the ticket
        block_count = tickets_ptr + token * blocks + nb
        if tl.atomic_add(block_count, 1, sem="acq_rel") == top_k * splits - 1:
            tl.debug_barrier()
            total = tl.load(row, mask=mask_n, other=0.0, cache_modifier=".cg")
            tl.store(out_ptr + token * hidden + offs_n, total.to(out_ptr.dtype.element_ty), mask=mask_n)
            tl.debug_barrier()  # the block's loads performed before its zeros are stored (`_combine_kernel`)
            tl.store(row, tl.zeros([block_n], dtype=tl.float32), mask=mask_n)
            tl.store(block_count, 0)
        h_count = tickets_ptr + (tl.num_programs(0) // top_k) * blocks + slot * splits + ks
        if tl.atomic_add(h_count, 1, sem="acq_rel") == blocks - 1:
            empty = tl.zeros([block_k], dtype=tl.float32)
            for k0 in range(k_start, k_end, block_k):
                offs_k = k0 + tl.arange(0, block_k)
                mask_k = offs_k < k_end
                tl.store(h_row + offs_k, empty, mask=mask_k)
                tl.store(h_row + inter + offs_k, empty, mask=mask_k)
            tl.store(h_count, 0)

    @triton.jit  # type: ignore[misc,untyped-decorator,unused-ignore]
    def _combine_kernel(  # type: ignore[no-untyped-def,unused-ignore]
        ys_ptr,
        out_ptr,
        h_ptr,
        hidden,
        h_row,
        top_k: tl.constexpr,
        block: tl.constexpr,
        zero: tl.constexpr,
        EARLY: tl.constexpr,
        USE_GDC: tl.constexpr,
    ):
        """Each token's top-k rows of ys summed into out; with `zero`, the ys elements it read and its share of the
        token's h rows (`h_row` = top_k · 2I elements, read by the down kernel, done before this one) are set to
        zero, so the next step's split reductions add onto zeros without a memset."""
        token = tl.program_id(0)
        offs = tl.program_id(1) * block + tl.arange(0, block)
        mask = offs < hidden
        acc = tl.zeros([block], dtype=tl.float32)
        if USE_GDC:  # ys is the down kernel's (and h, zeroed here, its input)
            tl.extra.cuda.gdc_wait()
        _trigger(USE_GDC, EARLY)
        for j in tl.static_range(top_k):
            acc += tl.load(ys_ptr + (token * top_k + j) * hidden + offs, mask=mask, other=0.0)
        _trigger(USE_GDC, not EARLY)
        tl.store(out_ptr + token * hidden + offs, acc.to(out_ptr.dtype.element_ty), mask=mask)
        if zero:
            # Every load of ys performed before its zeros are stored: on an H200 without this barrier the zeros
            # overtook the loads wherever no other instruction sat between them (the late form's trigger did),
            # e.g. with PDL off: DeepSeek-V3's TP-8 slice off by 77 % (benchmarks/kernels/moe_early_probe.py).
            tl.debug_barrier()
            empty = tl.zeros([block], dtype=tl.float32)
            for j in tl.static_range(top_k):
                tl.store(ys_ptr + (token * top_k + j) * hidden + offs, empty, mask=mask)
            for h0 in range(tl.program_id(1) * block, h_row, tl.num_programs(1) * block):
                h_offs = h0 + tl.arange(0, block)
                tl.store(h_ptr + token * h_row + h_offs, empty, mask=h_offs < h_row)

    # FP4 expert weights (weight-only, w4a16), `decodetop.probes.worker.fp4` says the layout: each row's E2M1 codes
    # two to a byte along k (the even element in the low nibble), one block scale per GROUP elements along k
    # (MXFP4: E8M0 per 32; NVFP4: E4M3 per 16, and an fp32 scale per expert). A k-step's bytes are loaded as a
    # [block_n, block_k / GROUP, GROUP / 2] tile (a scale block per middle index), so each block's products are
    # summed before its scale multiplies them; the activation is loaded as its even and odd elements (two strided
    # loads of a few hundred bytes, cached), which multiply the low and high nibbles.

    @triton.jit  # type: ignore[misc,untyped-decorator,unused-ignore]
    def _e2m1(q):  # type: ignore[no-untyped-def,unused-ignore]
        """FP4 E2M1 codes (int32, 0–15) as fp32 values × 2^-14 (the FP4 element type of the OCP Microscaling Formats
        spec v1.0: https://www.opencompute.org/documents/ocp-microscaling-formats-mx-v1-0-spec-final-pdf): bit 3 the
        sign, bits 2–1 the exponent e (bias 1), bit 0 the mantissa m; magnitude (1 + m/2) · 2^(e−1) for e ≥ 1, m/2 for
        e == 0: 0, 0.5, 1, 1.5, 2, 3, 4, 6. The code's bits go straight into an FP16's (the sign to bit 15, e and m
        to its exponent's two low bits and its mantissa's top bit), which reads as the value × 2^-14, e == 0 as an FP16
        subnormal; `_block_scale` folds the 2^14 back in. A few integer operations a value: on sm_90 the decode by
        exponent fields and selects took ~26 instructions a value, and bounded the kernel (docs/benchmarks.md,
        "Kernels, ninth round")."""
        bits = ((q & 7) << 9) | ((q & 8) << 12)
        return bits.to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)

    @triton.jit  # type: ignore[misc,untyped-decorator,unused-ignore]
    def _block_scale(s, NVFP4: tl.constexpr):  # type: ignore[no-untyped-def,unused-ignore]
        """Block-scale bytes (int32) as fp32, times 2^14 (the scale of `_e2m1`'s values). MXFP4: E8M0, 2^(s − 127),
        the fp32 whose exponent field is s + 14 (the OCP MX spec's scale type; past 240, the NaN code 255 included,
        it reads as inf, and s = 0 as 2^-113: random weights use none of them).
        NVFP4: FP8 E4M3 (sign, 4 exponent bits of bias 7, 3 mantissa bits: the fp32 with exponent field e + 120
        and the mantissa's top bits, or m · 2^-9 for e == 0; the NaN code reads as 480), decoded from its bits so
        that no FP8 conversion is needed (https://docs.nvidia.com/cuda/cublas/#d-block-scaling-factors-layout)."""
        if NVFP4:  # × 2^14, `_e2m1`'s codes' scale
            e = (s >> 3) & 15
            m = s & 7
            normal = (((e + 134) << 23) | (m << 20)).to(tl.float32, bitcast=True)
            mag = tl.where(e == 0, m.to(tl.float32) * 32.0, normal)  # 2^-9 · 2^14
            return tl.where((s & 128) != 0, -mag, mag)
        return (tl.minimum(s + 14, 255) << 23).to(tl.float32, bitcast=True)  # 2^(s − 127) · 2^14

    @triton.jit  # type: ignore[misc,untyped-decorator,unused-ignore]
    def _fp4_bytes(k0, block_k: tl.constexpr, GROUP: tl.constexpr):  # type: ignore[no-untyped-def,unused-ignore]
        """The step at k0's byte offsets in a row as [block_k / GROUP, GROUP / 2]: row g is scale block g's bytes,
        byte b holding elements 2b (low nibble) and 2b + 1 (high). Built from aranges, not halved element
        indices, so Triton sees each block's GROUP / 2 bytes as contiguous (vector loads)."""
        g = tl.arange(0, block_k // GROUP)[:, None]
        j = tl.arange(0, GROUP // 2)[None, :]
        # k0 is a whole number of steps into a chunk of whole steps (each ≥ 32 values), so its byte is 16-aligned:
        # said to Triton, which cannot see it through the halving (without the hint sm_90 got one-byte loads)
        return tl.multiple_of(k0 // 2, 16) + g * (GROUP // 2) + j

    @triton.jit  # type: ignore[misc,untyped-decorator,unused-ignore]
    def _fp4_load(  # type: ignore[no-untyped-def,unused-ignore]
        w_rows, s_rows, k0, k_end, mask_n, block_k: tl.constexpr, GROUP: tl.constexpr, MASK_K: tl.constexpr
    ):
        """One k-step's packed bytes [block_n, block_k / GROUP, GROUP / 2] and block-scale bytes [block_n,
        block_k / GROUP] of the rows `w_rows` / `s_rows` [block_n, 1], as int32 (MASK_K, the step the reduction
        ends in: zeros past k_end, a zero code is 0.0, a zero scale 0). Whole steps load unmasked along k, so the
        bytes load as vectors: on sm_90 the masked form compiled to one-byte loads, ~10 % of copy bandwidth at
        gpt-oss-120b's TP-2 experts on an H200 (docs/benchmarks.md, "Kernels, ninth round")."""
        kb = _fp4_bytes(k0, block_k, GROUP)
        kg = k0 // GROUP + tl.arange(0, block_k // GROUP)
        if MASK_K:
            q = tl.load(
                w_rows[:, :, None] + kb[None, :, :], mask=mask_n[:, None, None] & (2 * kb < k_end)[None, :, :], other=0
            )
            s = tl.load(s_rows + kg[None, :], mask=mask_n[:, None] & (kg * GROUP < k_end)[None, :], other=0)
        else:
            q = tl.load(w_rows[:, :, None] + kb[None, :, :], mask=mask_n[:, None, None], other=0)
            s = tl.load(s_rows + kg[None, :], mask=mask_n[:, None], other=0)
        return q.to(tl.int32), s.to(tl.int32)

    @triton.jit  # type: ignore[misc,untyped-decorator,unused-ignore]
    def _fp4_part(q, s, xe, xo, NVFP4: tl.constexpr):  # type: ignore[no-untyped-def,unused-ignore]
        """Σ w[n, k] · x[k] per scale block of one loaded k-step (`_fp4_load`), [block_n, block_k / GROUP] (summed
        over the blocks after the loop): the low nibbles times the even elements `xe`, the high times the odd `xo`
        (both [block_k / GROUP, GROUP / 2] fp32), each block's sum times its scale (fp32 throughout)."""
        blocks = tl.sum(_e2m1(q & 15) * xe[None, :, :] + _e2m1(q >> 4) * xo[None, :, :], axis=2)
        return blocks * _block_scale(s, NVFP4)

    @triton.jit  # type: ignore[misc,untyped-decorator,unused-ignore]
    def _expert_scale(gs_ptr, expert, NVFP4: tl.constexpr):  # type: ignore[no-untyped-def,unused-ignore]
        """NVFP4's fp32 scale of the expert (1.0 for MXFP4, which has none)."""
        if NVFP4:
            return tl.load(gs_ptr + expert).to(tl.float32)
        return 1.0

    @triton.jit  # type: ignore[misc,untyped-decorator,unused-ignore]
    def _gate_up_fp4_step(  # type: ignore[no-untyped-def,unused-ignore]
        x_row, w_gate, s_gate, w_up, s_up, k0, k_end, mask_n,
        block_k: tl.constexpr, GROUP: tl.constexpr, NVFP4: tl.constexpr, MASK_K: tl.constexpr,
    ):  # fmt: skip
        """One k-step of the gate and up rows against the token: their per-block sums (`_fp4_part`)."""
        ke = 2 * _fp4_bytes(k0, block_k, GROUP)
        if MASK_K:
            xe = tl.load(x_row + ke, mask=ke < k_end, other=0.0).to(tl.float32)
            xo = tl.load(x_row + ke + 1, mask=ke < k_end, other=0.0).to(tl.float32)
        else:
            xe = tl.load(x_row + ke).to(tl.float32)
            xo = tl.load(x_row + ke + 1).to(tl.float32)
        qg, sg = _fp4_load(w_gate, s_gate, k0, k_end, mask_n, block_k, GROUP, MASK_K)
        qu, su = _fp4_load(w_up, s_up, k0, k_end, mask_n, block_k, GROUP, MASK_K)
        return _fp4_part(qg, sg, xe, xo, NVFP4), _fp4_part(qu, su, xe, xo, NVFP4)

    @triton.jit  # type: ignore[misc,untyped-decorator,unused-ignore]
    def _gate_up_fp4_kernel(  # type: ignore[no-untyped-def,unused-ignore]
        x_ptr,
        w13_ptr,
        s13_ptr,
        gs_ptr,
        ids_ptr,
        h_ptr,
        hidden,
        inter,
        k_chunk,
        stride_we,
        stride_wn,
        stride_se,
        stride_sn,
        top_k: tl.constexpr,
        block_n: tl.constexpr,
        block_k: tl.constexpr,
        split: tl.constexpr,
        GROUP: tl.constexpr,
        NVFP4: tl.constexpr,
        EARLY: tl.constexpr,
        USE_GDC: tl.constexpr,
    ):
        """`_gate_up_kernel` over FP4 weights: packed bytes w13 [E, 2I, H/2], block scales s13 [E, 2I, ⌈H/GROUP⌉],
        NVFP4's expert scales gs [E] (unread for MXFP4), dequantised in registers."""
        slot = tl.program_id(0)  # token · top_k + k
        nb = tl.program_id(1)
        ks = tl.program_id(2)
        token = slot // top_k
        if USE_GDC:  # the expert ids (the router's) address the weights, and x is the layer's input: nothing before
            tl.extra.cuda.gdc_wait()
        expert = tl.load(ids_ptr + slot).to(tl.int64)
        _trigger(USE_GDC, EARLY)
        offs_n = nb * block_n + tl.arange(0, block_n)
        mask_n = offs_n < inter
        rows = offs_n.to(tl.int64)
        w_gate = w13_ptr + expert * stride_we + rows[:, None] * stride_wn
        s_gate = s13_ptr + expert * stride_se + rows[:, None] * stride_sn
        acc_g = tl.zeros([block_n, block_k // GROUP], dtype=tl.float32)
        acc_u = tl.zeros([block_n, block_k // GROUP], dtype=tl.float32)
        k_start = ks * k_chunk
        k_end = tl.minimum(hidden, k_start + k_chunk)
        main_end = k_start + (k_end - k_start) // block_k * block_k  # whole steps: unmasked along k
        x_row = x_ptr + token * hidden
        w_up = w_gate + inter * stride_wn
        s_up = s_gate + inter * stride_sn
        for k0 in range(k_start, main_end, block_k):
            pg, pu = _gate_up_fp4_step(
                x_row, w_gate, s_gate, w_up, s_up, k0, k_end, mask_n, block_k, GROUP, NVFP4, False
            )
            acc_g += pg
            acc_u += pu
        if main_end < k_end:
            pg, pu = _gate_up_fp4_step(
                x_row, w_gate, s_gate, w_up, s_up, main_end, k_end, mask_n, block_k, GROUP, NVFP4, True
            )
            acc_g += pg
            acc_u += pu
        _trigger(USE_GDC, not EARLY)
        gs = _expert_scale(gs_ptr, expert, NVFP4)
        g = tl.sum(acc_g, axis=1) * gs
        u = tl.sum(acc_u, axis=1) * gs
        _store_gate_up(h_ptr + slot * 2 * inter, inter, offs_n, mask_n, g, u, split)

    @triton.jit  # type: ignore[misc,untyped-decorator,unused-ignore]
    def _down_fp4_part(  # type: ignore[no-untyped-def,unused-ignore]
        h_row, inter, k0, k_end, q, s, block_k: tl.constexpr, GROUP: tl.constexpr, NVFP4: tl.constexpr,
        MASK_K: tl.constexpr,
    ):  # fmt: skip
        """`_down_part` over one loaded FP4 k-step: SiLU(gate) · up at its even and odd elements, times the
        nibbles (`_fp4_part`)."""
        ke = 2 * _fp4_bytes(k0, block_k, GROUP)
        mask = ke < k_end if MASK_K else ke >= 0
        ge = tl.load(h_row + ke, mask=mask, other=0.0)
        go = tl.load(h_row + ke + 1, mask=mask, other=0.0)
        ae = ge / (1.0 + tl.exp(-ge)) * tl.load(h_row + inter + ke, mask=mask, other=0.0)
        ao = go / (1.0 + tl.exp(-go)) * tl.load(h_row + inter + ke + 1, mask=mask, other=0.0)
        return _fp4_part(q, s, ae, ao, NVFP4)

    @triton.jit  # type: ignore[misc,untyped-decorator,unused-ignore]
    def _down_fp4_kernel(  # type: ignore[no-untyped-def,unused-ignore]
        h_ptr,
        w2_ptr,
        s2_ptr,
        gs_ptr,
        ids_ptr,
        wts_ptr,
        ys_ptr,
        out_ptr,
        tickets_ptr,
        hidden,
        inter,
        k_chunk,
        stride_we,
        stride_wn,
        stride_se,
        stride_sn,
        top_k: tl.constexpr,
        block_n: tl.constexpr,
        block_k: tl.constexpr,
        split: tl.constexpr,
        GROUP: tl.constexpr,
        NVFP4: tl.constexpr,
        EARLY: tl.constexpr,
        FOLD: tl.constexpr,
        USE_GDC: tl.constexpr,
    ):
        """`_down_kernel` over FP4 weights: packed bytes w2 [E, H, I/2], block scales s2 [E, H, ⌈I/GROUP⌉], NVFP4's
        expert scales gs [E]. EARLY: the first k-step's bytes and scales (and the expert scale) loaded before
        `gdc_wait`, as the bf16 kernel loads its first tile."""
        slot = tl.program_id(0)
        offs_n = tl.program_id(1) * block_n + tl.arange(0, block_n)
        mask_n = offs_n < hidden
        rows = offs_n.to(tl.int64)
        h_row = h_ptr + slot * 2 * inter
        k_start = tl.program_id(2) * k_chunk
        k_end = tl.minimum(inter, k_start + k_chunk)
        if EARLY:
            expert = tl.load(ids_ptr + slot, cache_modifier=".cg").to(tl.int64)
            weight = tl.load(wts_ptr + slot, cache_modifier=".cg").to(tl.float32) * _expert_scale(gs_ptr, expert, NVFP4)
            w_rows = w2_ptr + expert * stride_we + rows[:, None] * stride_wn
            s_rows = s2_ptr + expert * stride_se + rows[:, None] * stride_sn
            q, s = _fp4_load(w_rows, s_rows, k_start, k_end, mask_n, block_k, GROUP, True)
            if USE_GDC:  # h is the gate_up kernel's
                tl.extra.cuda.gdc_wait()
                tl.extra.cuda.gdc_launch_dependents()
            acc = _down_fp4_part(h_row, inter, k_start, k_end, q, s, block_k, GROUP, NVFP4, True)
            k_next = k_start + block_k
        else:
            if USE_GDC:  # h is the gate_up kernel's, the expert ids and weights the router's
                tl.extra.cuda.gdc_wait()
            expert = tl.load(ids_ptr + slot).to(tl.int64)
            weight = tl.load(wts_ptr + slot).to(tl.float32) * _expert_scale(gs_ptr, expert, NVFP4)
            w_rows = w2_ptr + expert * stride_we + rows[:, None] * stride_wn
            s_rows = s2_ptr + expert * stride_se + rows[:, None] * stride_sn
            acc = tl.zeros([block_n, block_k // GROUP], dtype=tl.float32)
            k_next = k_start
        main_end = k_next + tl.maximum(k_end - k_next, 0) // block_k * block_k  # whole steps: unmasked along k
        for k0 in range(k_next, main_end, block_k):
            q, s = _fp4_load(w_rows, s_rows, k0, k_end, mask_n, block_k, GROUP, False)
            acc += _down_fp4_part(h_row, inter, k0, k_end, q, s, block_k, GROUP, NVFP4, False)
        if main_end < k_end:
            q, s = _fp4_load(w_rows, s_rows, main_end, k_end, mask_n, block_k, GROUP, True)
            acc += _down_fp4_part(h_row, inter, main_end, k_end, q, s, block_k, GROUP, NVFP4, True)
        acc = tl.sum(acc, axis=1)
        _trigger(USE_GDC, not EARLY)
        if FOLD:
            _fold_into_out(ys_ptr, out_ptr, tickets_ptr, h_row, hidden, inter, k_start, k_end, offs_n, mask_n,
                           weight * acc, top_k, block_n, block_k)  # fmt: skip
        elif split:
            tl.atomic_add(ys_ptr + slot * hidden + offs_n, weight * acc, mask=mask_n)
        else:
            tl.store(ys_ptr + slot * hidden + offs_n, weight * acc, mask=mask_n)
