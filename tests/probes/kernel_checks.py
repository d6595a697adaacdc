"""Checks of decodetop's Triton kernels against their torch forms, run in a subprocess under Triton's interpreter
(`TRITON_INTERPRET=1`, set before Triton is imported) by tests/probes/test_kernels.py, and on a GPU by
benchmarks/kernels/h200_kernels.py. Every check draws fresh random inputs, poisons the outputs (NaN) so an unwritten
element fails, and compares with ‖Δ‖/‖ref‖ at bf16 tolerances (FP8 outputs: one unit in the last place). Shapes are
small on CPU (the interpreter runs each program in Python). On an sm_90+ GPU the kernels launch with PDL, as the
probe's do (`kernels.common.pdl_enabled`); `--no-pdl` checks them without.

    TRITON_INTERPRET=1 PYTHONPATH=src python3 tests/probes/kernel_checks.py mla dsa
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
from collections.abc import Callable

import torch

from decodetop.probes.worker import fp4, fused_moe
from decodetop.probes.worker.kernels import (
    dsa,
    dsa_keys,
    dsa_ticket,
    gqa,
    mla,
    mla_select,
    moe_gemv,
    norms,
    rope,
    tiles,
)
from decodetop.probes.worker.kernels.common import check_close, check_fp8_close, pdl_disabled, pdl_enabled, tl, triton
from decodetop.probes.worker.kernels.mla import LOG2E

BF16 = torch.bfloat16
FP8 = torch.float8_e4m3fn


def _dev() -> torch.device:
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


def _fp8(x: torch.Tensor, scale: float) -> torch.Tensor:
    return (x / scale).clamp(-448, 448).to(FP8)


def check_mla(big: bool = False) -> None:
    """Dense and sparse, BF16 and FP8, one and two new tokens, heads within one block and across two; every launch
    shape of the sweep (`mla.SWEEP`) on the dense BF16 cases, the first and the default on all."""
    d = _dev()
    lora, rope_dim = (512, 64) if big else (64, 16)
    cases = [(1, 1, 8, 300, False, False), (2, 1, 20, 130, False, False), (1, 2, 8, 257, True, False)]
    cases += [(1, 1, 8, 500, False, True), (2, 2, 16, 400, True, True)]
    if big:
        cases = [(b, q, h, n * 40, f, s) for b, q, h, n, f, s in cases]
    for config in dict.fromkeys([mla.DEFAULT, *mla.SWEEP]):
        for batch, q_len, heads, length, fp8, sparse in cases:
            if (fp8 or sparse) and config not in (mla.FIRST, mla.DEFAULT):
                continue
            q = torch.randn(batch * q_len, heads, lora + rope_dim, device=d).to(BF16)
            raw = torch.randn(batch, length, lora + rope_dim, device=d)
            scale = torch.tensor([0.25], device=d) if fp8 else None
            cache = _fp8(raw, 0.25) if fp8 else raw.to(BF16)
            idx = None
            if sparse:
                k = length // 3
                idx = torch.stack([torch.randperm(length, device=d)[:k] for _ in range(batch * q_len)]).int()
                idx[:, -5:] = -1  # fewer selected than slots: the padding is skipped
            total = idx.shape[1] if idx is not None else length
            work = mla.mla_workspace(batch * q_len, heads, total, d, lora=lora, config=config)
            work.out.fill_(float("nan"))
            got = mla.mla_decode(
                q, cache, lora=lora, sm_scale=0.1, q_len=q_len, indices=idx, cache_scale=scale, work=work
            )
            want = mla.reference_mla(q, cache, lora=lora, sm_scale=0.1, q_len=q_len, indices=idx, cache_scale=scale)
            what = f"mla [{config.label}] {batch=} {q_len=} {heads=} {length=} {fp8=} {sparse=}"
            check_close(got, want, what)


def check_dsa(big: bool = False) -> None:
    """Scores against the torch form; the selection exactly a top-k set (values equal to torch.topk's), every
    index distinct and in range, ties at the threshold included (many scores exactly 0 after the ReLU), under
    each radix digit scheme, with the selection in one program per row and spread over many (atomics between them),
    the indexer's product in FP16 (the default) and in BF16; negative weights give negative scores (the key's sign
    flip). A scheme with no memset (`dsa.SELF_ZEROING`) runs twice on one workspace, which each step must leave
    zero; `half8-ticket`'s and `half16-ticket`'s finishing programs on each of their paths (`check_half_paths`)."""
    d = _dev()
    dim = 128 if big else 64
    cases = [(1, 1, 32, 5000, 2048), (2, 1, 20, 3000, 700), (1, 2, 32, 300, 512), (1, 1, 16, 4096, 2048)]
    if big:
        cases += [(1, 1, 32, 131072, 2048), (4, 1, 32, 32768, 2048)]
    products = [(dsa.SCHEMES[0], 0, True, False), (dsa.SCHEMES[0], 0, False, False)]  # FP16, BF16 products
    schemes = [s for s in dsa.SCHEMES if s != dsa.FUSED_SCHEME]  # it selects inside the MLA: check_mla_select
    for scheme, block, f16, q8 in [*((s, b, True, True) for s in schemes for b in (0, 256)), *products]:
        for batch, q_len, heads, length, topk in [*cases, (1, 1, 16, 3000, 1500)]:
            tie = length == 3000 and topk == 1500
            work = dsa.dsa_workspace(batch * q_len, length, topk, d, scheme=scheme, select_block=block, f16=f16, q8=q8)
            for step in range(2 if scheme in dsa.SELF_ZEROING else 1):  # the second on the workspace the first left
                q = torch.randn(batch * q_len, heads, dim, device=d).to(BF16)
                w = torch.rand(batch * q_len, heads, device=d) - (0.3 if length == 5000 else 0.0)
                keys = torch.randn(batch, length, dim, device=d) * 2
                if tie:  # most keys point away from every query: their scores are exactly 0, tied at the threshold
                    q = q.abs()
                    keys[:, 200:] = -keys[:, 200:].abs()
                keys8 = keys.clamp(-448, 448).to(FP8)
                ks = torch.rand(batch, length, device=d) + 0.5
                if work.selects:
                    work.indices.fill_(-7)  # poisoned: every slot must be written
                idx = dsa.dsa_topk(q, w, keys8, ks, topk, q_len=q_len, work=work)
                product = "fp8" if q8 else ("fp16" if f16 else "bf16")
                what = f"dsa {scheme} select {work.select_block} {product} {length=} {topk=} {step=}"
                ref = dsa.reference_scores(q, w, keys8, ks, q_len=q_len, q8=q8)
                check_close(work.scores, ref, what + " scores", rel=1e-2)
                k = min(length, topk)
                assert idx.shape == (batch * q_len, k), what
                assert int(idx.min()) >= 0 and int(idx.max()) < length, f"{what}: an index out of range (or unwritten)"
                for row in idx:
                    assert row.unique().numel() == k, f"{what}: an index selected twice"
                chosen = torch.gather(work.scores, 1, idx.long()).sort(dim=-1).values
                best = work.scores.topk(k, dim=-1).values.sort(dim=-1).values
                assert torch.equal(chosen, best), f"{what}: not a top-{k} set (ties={tie})"
                if scheme in dsa.SELF_ZEROING:
                    assert not work.work.any(), f"{what}: the workspace is not left zero"
        # fewer tokens than top-k: every token
        small = dsa.dsa_workspace(1, 100, 2048, d, scheme=scheme, select_block=block)
        idx = dsa.dsa_topk(
            torch.randn(1, 16, dim, device=d).to(BF16),
            torch.rand(1, 16, device=d),
            torch.randn(1, 100, dim, device=d).to(FP8),
            torch.ones(1, 100, device=d),
            2048,
            work=small,
        )
        assert idx.tolist() == [list(range(100))]
        assert not small.work.any(), f"dsa {scheme}: a histogram taken with no selection to read it"
    check_half_paths(d)


def check_mla_select(big: bool = False) -> None:
    """`radix8-fused`: the split kernel's own selection exactly a top-k set of the kernel's scores (ties at the
    threshold: the earliest, the same in every head block), every chunk's count written, the attention over that set
    against the torch form, BF16 and FP8 latent caches, one and two head blocks, one and two new tokens, twice on
    one workspace, which each step must leave zero; the chunks as for 132 SMs (one a chunk of the context)."""
    d = _dev()
    lora, rope_dim, dim = (512, 64, 128) if big else (64, 16, 64)
    cases = [(1, 1, 8, 3000, 1000, "random", False), (2, 1, 20, 2000, 700, "random", True)]
    cases += [(1, 2, 8, 2100, 500, "random", False), (1, 1, 8, 2000, 1000, "relu zeros", True)]
    cases += [(1, 1, 20, 1500, 600, "all equal", False)]
    if big:
        cases = [(b, q, h, n * 20, k, kind, f) for b, q, h, n, k, kind, f in cases]
        cases += [(1, 1, 8, 131072, 2048, "random", f) for f in (False, True)]
    for i, (batch, q_len, heads, length, topk, kind, fp8) in enumerate(cases):
        rows = batch * q_len
        dwork = dsa.dsa_workspace(rows, length, topk, d, scheme=dsa.FUSED_SCHEME)
        # chunks of one key block (132 SMs) and of several (few SMs: the positions' round trip)
        sms = (132 if i % 2 == 0 else 1) if not big else (None if i % 2 == 0 else 16)
        swork = mla_select.select_workspace(rows, heads, length, d, lora=lora, sms=sms)
        assert (swork.chunk <= swork.sel_block) == (i % 2 == 0), (i, swork.chunk, swork.sel_block)
        for step in range(2):
            qi = torch.randn(rows, 16, dim, device=d).to(BF16)
            w = torch.rand(rows, 16, device=d)
            keys = torch.randn(batch, length, dim, device=d) * 2
            if kind == "relu zeros":  # most scores exactly 0: tied at the threshold, all of them needed or not
                qi = qi.abs()
                keys[:, 200:] = -keys[:, 200:].abs()
            if kind == "all equal":
                keys = torch.zeros_like(keys)
            keys8 = keys.clamp(-448, 448).to(FP8)
            ks = torch.rand(batch, length, device=d) + 0.5
            q = torch.randn(rows, heads, lora + rope_dim, device=d).to(BF16)
            raw = torch.randn(batch, length, lora + rope_dim, device=d)
            scale = torch.tensor([0.25], device=d) if fp8 else None
            cache = _fp8(raw, 0.25) if fp8 else raw.to(BF16)
            swork.mla.out.fill_(float("nan"))
            swork.counts.fill_(-1)
            dsa.dsa_prepare(dwork)
            dsa.dsa_scores(qi, w, keys8, ks, dwork, q_len=q_len)
            dsa.dsa_passes(dwork, topk)
            got = mla_select.mla_decode_selected(
                q, cache, dwork, swork, lora=lora, sm_scale=0.1, topk=topk, q_len=q_len, cache_scale=scale
            )
            what = f"mla_select {kind} {rows=} {heads=} {length=} {topk=} {fp8=} {step=}"
            assert int(swork.counts.min()) >= 0, f"{what}: a chunk's count unwritten"
            idx = mla_select.selected_indices(swork)
            assert idx.shape == (rows, topk), f"{what}: {tuple(idx.shape)} selected"
            for row in idx:
                assert row.unique().numel() == topk and int(row.min()) >= 0, f"{what}: an index twice or unset"
            chosen = torch.gather(dwork.scores, 1, idx.long()).sort(dim=-1).values
            best = dwork.scores.topk(topk, dim=-1).values.sort(dim=-1).values
            assert torch.equal(chosen, best), f"{what}: not a top-{topk} set"
            if kind == "all equal":  # the earliest tied positions
                assert idx.sort(dim=-1).values.tolist() == [list(range(topk))] * rows, f"{what}: not the earliest"
            want = mla.reference_mla(q, cache, lora=lora, sm_scale=0.1, q_len=q_len, indices=idx, cache_scale=scale)
            check_close(got, want, what)
            assert not dwork.work.any(), f"{what}: the DSA workspace is not left zero"


def check_half_paths(d: torch.device) -> None:
    """`half8-ticket`'s and `half16-ticket`'s finishing programs past their fast paths: scores all equal (every one
    a candidate), 6000 of them (half8-ticket: looped over the candidate buffer; half16-ticket: past its buffer),
    9000 past both buffers over the score row, 500 of 700 (half16-ticket: past its rank select, radix over the
    buffer); then random scores (half8-ticket: in registers; half16-ticket: ranked). Their histograms from the torch
    forms (`dsa_ticket.half_histogram`, `dsa_ticket.half16_histogram`), as the scoring kernel would leave them."""
    for scheme in dsa.HALF_SCHEMES:
        for length, value in ((6000, 2.5), (9000, 0.0), (3000, -1.0), (9000, None)):
            scores = torch.full((2, length), value, device=d) if value is not None else torch.randn(2, length, device=d)
            topk = 500 if length == 3000 else 2048
            if length == 3000:
                scores[:, 700:] = torch.randn(2, length - 700, device=d) - 10.0  # 700 equal at the top, 500 taken
            work = dsa.dsa_workspace(2, length, topk, d, scheme=scheme)
            for step in range(2):
                work.scores.copy_(scores)
                work.work[:, : dsa_keys.DIGIT_BINS] = dsa_ticket.half_histogram(scores)
                if scheme == "half16-ticket":
                    work.work[:, dsa_ticket.HALF16_AT : dsa_ticket.HALF16_AT + dsa_ticket.HALF16_BINS] = (
                        dsa_ticket.half16_histogram(scores)
                    )
                work.indices.fill_(-7)
                idx = dsa.dsa_select(work, topk).long()
                what = f"dsa {scheme} {length=} {value=} {step=}"
                assert int(idx.min()) >= 0 and all(row.unique().numel() == topk for row in idx), what
                chosen = torch.gather(scores, 1, idx).sort(dim=-1).values
                assert torch.equal(chosen, scores.topk(topk, dim=-1).values.sort(dim=-1).values), what
                assert not work.work.any(), f"{what}: the workspace is not left zero"


def check_gqa(big: bool = False) -> None:
    """BF16 and FP8 caches, one and two new tokens, groups of 1, 4, 7 and 8 query heads, tails of a tile, head dims
    that are not powers of two (96: Phi-3's, 80); every launch shape of the sweep on FP8 caches (`gqa.SWEEP`), the
    first and the defaults of both dtypes on BF16 ones."""
    d = _dev()
    cases = [(1, 8, 2, 1, 300, 64, False), (2, 8, 8, 1, 100, 32, False), (1, 8, 2, 2, 500, 64, True)]
    cases += [(1, 16, 2, 1, 1000, 128, True), (1, 14, 2, 1, 300, 96, True), (1, 8, 8, 1, 200, 80, False)]
    if big:
        cases = [(1, 64, 8, 1, 32768, 128, True), (8, 64, 8, 1, 4096, 128, False), (1, 32, 8, 2, 65536, 128, True)]
        cases += [
            (1, 32, 32, 1, 32768, 96, True),
            (8, 32, 32, 1, 4096, 96, False),
            (1, 32, 8, 1, 16384 + 100, 80, True),
        ]
    for config in dict.fromkeys([gqa.SHORT, gqa.LONG, gqa.LONG_BF16, *gqa.SWEEP]):
        for batch, heads, kv_heads, q_len, length, dim, fp8 in cases:
            if not fp8 and config not in (gqa.FIRST, gqa.SHORT, gqa.LONG, gqa.LONG_BF16):
                continue
            q = torch.randn(batch, heads, q_len, dim, device=d).to(BF16)
            k = torch.randn(batch, kv_heads, length, dim, device=d)
            v = torch.randn(batch, kv_heads, length, dim, device=d)
            scales = torch.tensor([0.5, 0.25], device=d) if fp8 else None
            k, v = (_fp8(k, 0.5), _fp8(v, 0.25)) if fp8 else (k.to(BF16), v.to(BF16))
            work = gqa.gqa_workspace(batch, heads, kv_heads, q_len, length, dim, d, config=config, fp8=fp8)
            work.out.fill_(float("nan"))
            got = gqa.gqa_decode(q, k, v, sm_scale=dim**-0.5, scales=scales, work=work)
            want = gqa.reference_gqa(q, k, v, sm_scale=dim**-0.5, scales=scales)
            what = f"gqa [{config.label}] {batch=} {heads=} {kv_heads=} {q_len=} {length=} {fp8=}"
            check_close(got, want, what)
    # split as for 132 SMs: 79 splits of one tile, the combine's lanes in two blocks of 64
    q = torch.randn(1, 8, 1, 128, device=d).to(BF16)
    k, v = (torch.randn(1, 1, 5000, 128, device=d).to(BF16) for _ in range(2))
    work = gqa.gqa_workspace(1, 8, 1, 1, 5000, 128, d, sms=132, config=gqa.FIRST)
    assert work.splits == 79 and work.launch.combine_grid == (8, 2), work.launch
    got = gqa.gqa_decode(q, k, v, sm_scale=128**-0.5, work=work)
    check_close(got, gqa.reference_gqa(q, k, v, sm_scale=128**-0.5), "gqa split for 132 SMs, lanes in blocks")
    _check_gqa_loop_forms(d, big)


def _gqa_case(
    d: torch.device, batch: int, heads: int, kv_heads: int, q_len: int, length: int, dim: int, fp8: bool, kind: str
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(q, k, v, scales) of one GQA case: random, or with scores that grow along the context ("growing": every
    row's max rises tile by tile, slowly and then fast, or fast and then slowly: "saturating"), so that the lazy
    rescale fires and skips inside a split) or peak in the first tile ("first": it never fires after it)."""
    q = torch.randn(batch, heads, q_len, dim, device=d)
    k = torch.randn(batch, kv_heads, length, dim, device=d)
    v = torch.randn(batch, kv_heads, length, dim, device=d)
    if kind != "random":  # the keys along the mean query direction: scores ∝ the ramp (log2 units: ~0 → 40)
        u = q.mean((0, 1, 2))
        u = u / u.norm()
        q = q * 0.3 + 3.0 * u
        ramp = torch.linspace(0.0, 1.0, length, device=d) ** 2  # slow first (rescales skipped), then fast (fired)
        if kind == "saturating":  # fast first, then slow: the last tiles' rescales skipped
            ramp = torch.sin(torch.linspace(0.0, torch.pi / 2, length, device=d))
        if kind == "first":
            ramp = torch.zeros(length, device=d)
            ramp[:8] = 1.0
        k = k * 0.3 + (ramp * 28.0 * dim**0.5 / 3.0)[None, None, :, None] * u
    scales = torch.tensor([0.5, 0.25], device=d) if fp8 else None
    k, v = (_fp8(k, 0.5), _fp8(v, 0.25)) if fp8 else (k.to(BF16), v.to(BF16))
    return q.to(BF16), k, v, scales


def _check_gqa_loop_forms(d: torch.device, big: bool) -> None:
    """Each loop form (`gqa.LOOP_FORMS`) and their combination over `LONG` and 256-token tiles: BF16 and FP8,
    contexts of whole tiles and splits and not, groups of 1, 4 and 8 (and two new tokens), scores that grow along
    the context and that peak in the first tile. The lazy rescale's recorded max must lag the exact one (skipped
    rescales) by at most its threshold and pass the split's first tile's (it fired)."""
    cases = [(1, 8, 8, 1, 300, 64, True), (1, 8, 2, 2, 512, 64, False), (1, 16, 2, 1, 1000, 128, True)]
    cases += [(1, 8, 1, 1, 1024, 64, False), (2, 8, 2, 1, 384, 32, True)]
    cases += [(1, 14, 2, 1, 256, 96, True)]  # a padded d axis: masked lanes in every form, TMA's padded block
    if big:
        cases = [(1, 64, 8, 1, 32768, 128, True), (1, 64, 8, 1, 4096 + 100, 128, False)]
        cases += [(1, 32, 32, 1, 32768, 96, True)]
    forms = [dataclasses.replace(gqa.LONG, **form) for form in gqa.LOOP_FORMS.values()]
    forms += [dataclasses.replace(gqa.LONG, block_n=256, num_warps=4, programs_per_sm=1, **gqa.LOOP_FORMS["all"])]
    for config in forms:
        lags: list[tuple[float, float]] = []
        for batch, heads, kv_heads, q_len, length, dim, fp8 in cases:
            for kind in ("random", "growing", "first", *(["saturating"] if config.lazy_rescale else [])):
                q, k, v, scales = _gqa_case(d, batch, heads, kv_heads, q_len, length, dim, fp8, kind)
                work = gqa.gqa_workspace(batch, heads, kv_heads, q_len, length, dim, d, config=config, fp8=fp8)
                work.out.fill_(float("nan"))
                got = gqa.gqa_decode(q, k, v, sm_scale=dim**-0.5, scales=scales, work=work)
                want = gqa.reference_gqa(q, k, v, sm_scale=dim**-0.5, scales=scales)
                what = f"gqa [{config.label}] {kind} {batch=} {heads=} {kv_heads=} {q_len=} {length=} {fp8=}"
                check_close(got, want, what)
                if config.lazy_rescale and kind in ("growing", "saturating") and not big:
                    lags.append(_check_lazy_max(q, k, scales, work, dim**-0.5, what))
        if lags:  # over the growing cases: a rescale skipped somewhere, and one fired past a first tile
            assert max(a for a, _ in lags) > 1.0, f"gqa [{config.label}]: the lazy rescale never skipped a rescale"
            assert max(b for _, b in lags) > 1.0, f"gqa [{config.label}]: the lazy rescale never fired after a tile"


def _check_lazy_max(
    q: torch.Tensor, k: torch.Tensor, scales: torch.Tensor | None, work: gqa.GqaWorkspace, sm_scale: float, what: str
) -> tuple[float, float]:
    """The lazy rescale's recorded maxima (`work.ml`) against the exact ones of each split, never above nor more
    than the threshold below; (the largest lag: a rescale skipped; the most past a split's first tile: one
    fired)."""
    batch, _heads, _q_len, dim = q.shape
    kv_heads, length = k.shape[1], k.shape[2]
    geo = work.launch
    kf = k.float() * (scales[0] if scales is not None else 1.0)
    rows = q.float().reshape(batch, kv_heads, geo.group_rows, dim)
    s = torch.einsum("bhgd,bhnd->bhgn", rows, kf).reshape(geo.pairs, geo.group_rows, length) * sm_scale * LOG2E
    m = work.ml.reshape(geo.pairs, geo.splits, geo.group_pad_rows, 2)[:, :, : geo.group_rows, 0]
    chunk, tile = geo.tokens_per_split, geo.config.block_n
    exact = torch.stack([s[:, :, j * chunk : (j + 1) * chunk].amax(-1) for j in range(geo.splits)], 1)
    first = torch.stack([s[:, :, j * chunk : j * chunk + tile].amax(-1) for j in range(geo.splits)], 1)
    lag = exact - m
    tol = 0.05 * exact.abs().amax()  # bf16/fp16 products against the fp32 einsum
    assert bool((lag > -tol).all()) and bool((lag <= gqa.LAZY_RESCALE_LOG2 + tol).all()), f"{what}: lag {lag}"
    return float(lag.max()), float((m - first).max())


def check_norms(big: bool = False) -> None:
    """RMSNorm and residual-add + RMSNorm, widths with and without a tail, one and several tokens; then
    SiLU-and-mul."""
    _check_silu_mul(big)
    d = _dev()
    widths = [4096, 6144, 7168, 8192] if big else [64, 1000, 4096]
    for width in widths:
        for tokens in (1, 3):
            x = torch.randn(tokens, width, device=d).to(BF16)
            r = torch.randn(tokens, width, device=d).to(BF16)
            w = torch.randn(width, device=d).to(BF16)
            out = torch.full_like(x, float("nan"))
            res_out = torch.full_like(x, float("nan"))
            norms.rmsnorm(x, w, 1e-6, residual=r, out=out, residual_out=res_out)
            want, want_res = norms.reference_rmsnorm(x, w, 1e-6, residual=r)
            assert want_res is not None
            check_close(out, want, f"add_rmsnorm {width=}")
            check_close(res_out, want_res, f"add_rmsnorm residual {width=}")
            out.fill_(float("nan"))
            norms.rmsnorm(x, w, 1e-6, out=out)
            check_close(out, norms.reference_rmsnorm(x, w, 1e-6)[0], f"rmsnorm {width=}")


def _check_silu_mul(big: bool) -> None:
    """SiLU-and-mul against its torch form in BF16 and FP16: Llama-3.1-8B's I = 14336 (whole column blocks), 300 (a
    masked tail), on a GPU also Llama-3.1-405B TP-1's 53248; one and several tokens (on a GPU a batch that needs no
    narrower blocks), the column block the launch picks and, at 14336, the narrowest (many blocks a row)."""
    d = _dev()
    widths = [300, 14336, 53248] if big else [300, 14336]
    for dtype in (BF16, torch.float16):
        for width in widths:
            for tokens in (1, 7, 512) if big else (1, 7):
                x = torch.randn(tokens, 2 * width, device=d).to(dtype)
                want = norms.reference_silu_mul(x)
                blocks = [None, norms.SILU_MIN_BLOCK] if width == 14336 else [None]
                for block in blocks:
                    out = torch.full((tokens, width), float("nan"), device=d, dtype=dtype)
                    norms.silu_and_mul(x, out=out, block=block)
                    check_close(out, want, f"silu_mul {dtype} {width=} {tokens=} {block=}")


def check_rope(big: bool = False) -> None:
    """Rope on queries in place and keys, then the cache write: GQA BF16 and FP8 (K and V), partial rotary, MLA's
    latent row (rope on its last 64 dims, no V), DSA index keys (FP8, a dynamic scale per row), and rows that are not
    powers of two (Phi-3's 96 of 96, partial 48 of 96 into FP8, heads of 80). The caches are NaN: every slot not
    written must stay so."""
    d = _dev()
    heads = 64 if big else 8
    cases = [
        (2, heads, 128, 8, 128, 128, 64, 0, 0, BF16, False),
        (1, heads, 128, 8, 128, 128, 128, 0, 0, FP8, False),
        (1, heads // 4, 64, 1, 576, 0, 64, 0, 512, BF16, False),
        (1, 0, 1, 1, 128, 0, 0, 0, 0, FP8, True),
        (3, heads // 2, 96, 8, 96, 96, 96, 0, 0, BF16, False),
        (2, heads // 2, 96, 8, 96, 96, 48, 0, 0, FP8, False),
        (3, heads // 2, 80, 8, 80, 80, 80, 0, 0, BF16, False),
    ]
    for tokens, q_heads, qd, kv_heads, kd, vd, rot, off_q, off_k, dtype, dyn in cases:
        slots_n, positions = 64, 128
        q = torch.randn(tokens, q_heads, qd, device=d).to(BF16) if q_heads else None
        k = torch.randn(tokens, kv_heads, kd, device=d).to(BF16)
        v = torch.randn(tokens, kv_heads, vd, device=d).to(BF16) if vd else None
        half = max(1, rot // 2)
        cos, sin = torch.rand(positions, half, device=d), torch.rand(positions, half, device=d)
        pos = torch.randint(0, positions, (tokens,), device=d)
        slots = torch.randperm(slots_n, device=d)[:tokens]
        k_cache = torch.full((slots_n, kv_heads, kd), float("nan"), device=d).to(dtype)
        v_cache = torch.full((slots_n, kv_heads, vd), float("nan"), device=d).to(dtype) if vd else None
        scales: torch.Tensor | None = None
        if dtype == FP8:
            scales = torch.rand(slots_n, kv_heads, device=d) if dyn else torch.tensor([0.05, 0.04], device=d)
        ref = [t.clone() if t is not None else None for t in (q, k_cache, v_cache, scales)]
        spec = rope.RopeSpec(rot, off_q, off_k)
        rope.rope_kv_write(
            q, k, v, rope=spec, cos=cos, sin=sin, positions=pos, slots=slots,
            k_cache=k_cache, v_cache=v_cache, scales=scales, dynamic_scale=dyn,
        )  # fmt: skip
        rope.reference_rope_kv_write(ref[0], k, v, spec, cos, sin, pos, slots, ref[1], ref[2], ref[3], dyn)
        what = f"rope+kv {kd=} {rot=} {dtype} {dyn=}"
        if q is not None and ref[0] is not None:
            check_close(q, ref[0], what + " q")
        assert ref[1] is not None
        same = check_fp8_close if dtype == FP8 else check_close
        same(k_cache[slots], ref[1][slots], what + " k")
        if v_cache is not None and ref[2] is not None:
            same(v_cache[slots], ref[2][slots], what + " v")
        if dyn and scales is not None and ref[3] is not None:
            check_close(scales[slots], ref[3][slots], what + " scales", rel=1e-5)
        others = torch.ones(slots_n, dtype=torch.bool, device=d)
        others[slots] = False
        for cache in (k_cache, v_cache):
            if cache is not None and not cache[others].float().isnan().all():
                raise AssertionError(f"{what}: a slot that was not written to changed")


def check_moe(big: bool = False) -> None:
    """The fused-MoE kernels with every tile the tuner tries (split reductions, tails and gate_up's `tl.dot` form
    included; `fused_moe._candidate_pairs`) in every form (`tiles.FORMS`), BF16 and FP8 experts, against the torch
    reference: two steps on the same workspaces, zero after each (no memsets), then the earlier form with memsets.
    Then FP4 experts (MXFP4, NVFP4: `check_moe_fp4`)."""
    d = _dev()
    shapes = [(1, 300, 80, 6, 2)]
    if big:
        shapes = [(1, 4096, 1536, 16, 8), (1, 7168, 256, 16, 8)]
    for tokens, hidden, inter, n_exp, top_k in shapes:
        for dtype in (BF16, FP8) if big else (BF16,):
            x = torch.randn(tokens, hidden, device=d).to(BF16)
            w13 = (torch.randn(n_exp, 2 * inter, hidden, device=d) * 0.05).to(dtype)
            w2 = (torch.randn(n_exp, hidden, inter, device=d) * 0.05).to(dtype)
            ids = fused_moe.routed_ids(tokens, top_k, n_exp, d)
            wts = torch.rand(tokens, top_k, device=d) + 0.1
            _check_moe_layer((x, w13, w2, ids, wts), fused_moe._candidate_pairs(), f"{dtype} {hidden=} {inter=}")
    check_moe_fp4(big)


@triton.jit  # type: ignore[misc,untyped-decorator,unused-ignore]
def _decode_kernel(code_ptr, scale_ptr, out_ptr, nvfp4: tl.constexpr):  # type: ignore[no-untyped-def,unused-ignore]
    """Each of the 16 E2M1 codes times each of 16 block-scale bytes, through the FP4 kernels' own decoders."""
    i = tl.arange(0, 16)
    q = tl.load(code_ptr + i).to(tl.int32)
    s = tl.load(scale_ptr + i).to(tl.int32)
    got = moe_gemv._e2m1(q)[:, None] * moe_gemv._block_scale(s, nvfp4)[None, :]
    tl.store(out_ptr + i[:, None] * 16 + i[None, :], got)


def check_fp4_decode(d: torch.device) -> None:
    """The FP4 kernels' decoders against the formats' tables: every E2M1 code (0, ±0.5, …, ±6) times E8M0 scales
    2^-7 … 2^8 and times E4M3 scales (normal and subnormal, both signs), exactly."""
    codes = torch.arange(16, device=d, dtype=torch.uint8)
    e2m1 = torch.tensor([0, 0.5, 1, 1.5, 2, 3, 4, 6], device=d)
    want_codes = torch.cat([e2m1, -e2m1])
    for nvfp4 in (False, True):
        if nvfp4:
            scales = torch.tensor([1, 5, 7, 8, 0x38, 0x3F, 0x40, 0x50, 0x6E, 0x77, 0x81, 0x88, 0xB8, 0xC0, 0x30, 0x00],
                                  device=d, dtype=torch.uint8)  # fmt: skip
            want_scales = scales.view(FP8).float()
        else:
            scales = torch.arange(120, 136, device=d, dtype=torch.uint8)
            want_scales = torch.exp2(scales.float() - 127)
        out = torch.full((16, 16), float("nan"), device=d)
        _decode_kernel[(1,)](codes, scales, out, nvfp4=nvfp4)
        want = want_codes[:, None] * want_scales[None, :]
        assert torch.equal(out, want), f"FP4 decode ({'NVFP4' if nvfp4 else 'MXFP4'}): {(out - want).abs().max()}"


def check_moe_fp4(big: bool = False) -> None:
    """FP4 experts (random packed bytes and scales, `fp4.random_fp4`) through the FP4 kernels against the
    reference on the dequantised experts: on a GPU (`big`) gpt-oss-120b's TP-2 slice (hidden 2880, intermediate
    2880 / 2, 128 experts, top-4; 2880 is no whole number of most steps: tails masked) with every FP4 candidate
    tile in every form; on the CPU a small layer with two tile pairs."""
    d = _dev()
    check_fp4_decode(d)
    shapes = [(1, 2880, 1440, 128, 4), (4, 2880, 1440, 128, 4)] if big else [(1, 200, 48, 4, 2)]
    pairs = fused_moe._candidate_pairs(tiles.FP4_CANDIDATES)
    if not big:  # the interpreter runs each program in Python: one step, and several split in two
        pairs = [
            (tiles.Tiles(32, 256), tiles.Tiles(32, 256)),
            (tiles.Tiles(32, 64, 4, 0, 2), tiles.Tiles(32, 32, 4, 0, 2)),
        ]
    for tokens, hidden, inter, n_exp, top_k in shapes:
        for fmt in fp4.GROUP:
            x = torch.randn(tokens, hidden, device=d).to(BF16)
            w13 = fp4.random_fp4((n_exp, 2 * inter, hidden), fmt, d)
            w2 = fp4.random_fp4((n_exp, hidden, inter), fmt, d)
            ids = fused_moe.routed_ids(tokens, top_k, n_exp, d)
            wts = torch.rand(tokens, top_k, device=d) + 0.1
            _check_moe_layer((x, w13, w2, ids, wts), pairs, f"{fmt} {tokens=} {hidden=} {inter=}")


def _check_moe_layer(
    args: tuple[torch.Tensor, fused_moe.Experts, fused_moe.Experts, torch.Tensor, torch.Tensor],
    pairs: list[tuple[tiles.Tiles, tiles.Tiles]],
    what: str,
) -> None:
    """One layer with each (gate_up, down) tile pair in every form, two steps each on the same workspaces (zero
    after each), then the memsets form of a split pair."""
    x, w13, w2, ids, wts = args
    d, (tokens, hidden), top_k = x.device, x.shape, ids.shape[1]
    inter = w2.shape[2]
    want = fused_moe.reference_moe(x, w13, w2, ids, wts).float()
    h = torch.zeros(tokens * top_k, 2 * inter, device=d)
    ys = torch.zeros(tokens * top_k, hidden, device=d)
    for (up, down), form in [(p, f) for f in tiles.FORMS for p in pairs]:
        for step in range(2):
            out = torch.full((tokens, hidden), float("nan"), device=d, dtype=BF16)
            got = fused_moe.fused_moe(x, w13, w2, ids, wts, h=h, ys=ys, out=out, tiles=(up, down), form=form).float()
            err = float((got - want).abs().max())
            where = f"moe {up.text} / {down.text} {form} {what} step {step}"
            assert err <= 0.02 * float(want.abs().max()), f"{where}: {err:.3g}"
            assert not h.any() and not ys.any(), f"{where}: workspaces not zero after the step"
    split = tiles.Tiles(16, 256, 4, 0, 2)
    got = fused_moe.fused_moe(x, w13, w2, ids, wts, tiles=(split, split), memsets=True).float()
    err = float((got - want).abs().max())
    assert err <= 0.02 * float(want.abs().max()), f"moe with memsets {what}: {err:.3g}"


CHECKS: dict[str, Callable[[bool], None]] = {
    "mla": check_mla,
    "dsa": check_dsa,
    "gqa": check_gqa,
    "norms": check_norms,
    "rope": check_rope,
    "moe": check_moe,
    "mla_select": check_mla_select,
    "moe_fp4": check_moe_fp4,
}


def main(argv: list[str]) -> int:
    big = "--big" in argv
    names = [a for a in argv if not a.startswith("--")] or list(CHECKS)
    with pdl_disabled() if "--no-pdl" in argv else contextlib.nullcontext():
        print(f"PDL {'on' if pdl_enabled(_dev()) else 'off'} on {_dev()}", flush=True)
        for name in names:
            torch.manual_seed(sum(map(ord, name)))
            CHECKS[name](big)
            print(f"ok {name}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
