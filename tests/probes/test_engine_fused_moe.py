"""The fused-MoE decode kernel: its torch reference against a dense formulation (CPU), its launch shapes, where it
says it cannot run, the Triton kernels under Triton's CPU interpreter (where Triton is installed), and on a GPU."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F  # noqa: N812 - the conventional name

from decodetop.budget.keys import MoeKey
from decodetop.probes.worker.context import ProbeContext, UnsupportedError
from decodetop.probes.worker.fused_moe import (
    HAVE_TRITON,
    _candidate_pairs,
    candidates_for,
    engine_moe_runner,
    fused_moe_runner,
    grid_for,
    pick_block_n,
    reference_moe,
    routed_ids,
    triton_unavailable,
)
from decodetop.probes.worker.kernels.tiles import (
    FORM_FOLD,
    FP4_CANDIDATES,
    TILE_CANDIDATES,
    TileChoice,
    lookup,
    remember,
    shape_id,
)
from decodetop.probes.worker.moe import moe_runner
from tests.conftest import require_module
from tests.helpers.env import subprocess_env

SRC = Path(__file__).resolve().parents[2] / "src"


def _dense_moe(
    x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor
) -> torch.Tensor:
    """Every expert on every token, masked by the routing: an independent formulation of the same layer."""
    inter = w13.shape[1] // 2
    n_exp = w13.shape[0]
    gate_up = torch.einsum("th,enh->ten", x.float(), w13.float())  # [T, E, 2I]
    act = (F.silu(gate_up[..., :inter]) * gate_up[..., inter:]).to(x.dtype).float()
    y = torch.einsum("tei,ehi->teh", act, w2.float())  # [T, E, H]
    mix = torch.zeros(x.shape[0], n_exp)
    mix.scatter_add_(1, ids.long(), weights.float())
    return torch.einsum("te,teh->th", mix, y).to(x.dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_reference_equals_every_expert_masked_by_routing(dtype: torch.dtype) -> None:
    torch.manual_seed(1)
    tokens, hidden, inter, n_exp, top_k = 3, 64, 24, 6, 2
    x = torch.randn(tokens, hidden).to(dtype)
    w13 = (torch.randn(n_exp, 2 * inter, hidden) * 0.1).to(dtype)
    w2 = (torch.randn(n_exp, hidden, inter) * 0.1).to(dtype)
    ids = routed_ids(tokens, top_k, n_exp, torch.device("cpu"))
    weights = torch.rand(tokens, top_k) + 0.1
    got = reference_moe(x, w13, w2, ids, weights).float()
    want = _dense_moe(x, w13, w2, ids, weights).float()
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    assert torch.allclose(got, want, rtol=tol, atol=tol * float(want.abs().max()))


def test_reference_reads_only_the_routed_experts() -> None:
    torch.manual_seed(2)
    x = torch.randn(1, 32)
    w13 = torch.randn(4, 16, 32)
    w2 = torch.randn(4, 32, 8)
    ids = torch.tensor([[1, 3]], dtype=torch.int32)
    weights = torch.tensor([[0.6, 0.4]])
    before = reference_moe(x, w13, w2, ids, weights)
    w13[0].fill_(float("nan"))  # experts 0 and 2 are not routed: poisoning them changes nothing
    w2[2].fill_(float("nan"))
    assert torch.equal(reference_moe(x, w13, w2, ids, weights), before)


def test_routed_ids_give_distinct_experts_per_token() -> None:
    ids = routed_ids(3, 4, 8, torch.device("cpu"))
    assert ids.dtype == torch.int32 and ids.shape == (3, 4)
    for row in ids.tolist():
        assert len(set(row)) == 4
    assert set(ids.flatten().tolist()) == set(range(8))


def test_grid_covers_every_output_row() -> None:
    # Qwen3-MoE at TP 2 on an H200 (132 SMs): 8 slots × 768 intermediate rows, 8 slots × 4096 hidden rows.
    grid = grid_for(tokens=1, top_k=8, hidden=4096, inter=768, sms=132)
    assert (grid.gate_up_block_n, grid.down_block_n) == (8, 32)
    assert grid.gate_up == (8, 96) and grid.down == (8, 128) and grid.combine == (1, 4)
    # Mixtral at TP 2: 2 slots × 7168 rows leave room for larger blocks.
    mixtral = grid_for(tokens=1, top_k=2, hidden=4096, inter=7168, sms=132)
    assert mixtral.gate_up_block_n == 16 and mixtral.gate_up == (2, 448)
    tail = grid_for(2, 2, 100, 17)  # one SM: the largest block, tails masked
    assert tail.gate_up == (4, 1) and tail.down == (4, 4) and tail.combine == (2, 1)
    with pytest.raises(ValueError):
        grid_for(0, 8, 4096, 768)


def test_block_rows_shrink_until_every_sm_has_work() -> None:
    assert pick_block_n(rows=65536, outer=8, sms=132) == 32
    assert pick_block_n(rows=4096, outer=1, sms=132) == 8  # never below the smallest block
    with pytest.raises(ValueError):
        pick_block_n(rows=0, outer=1, sms=1)


def _cpu_ctx() -> ProbeContext:
    return ProbeContext(rank=0, world_size=1, device=torch.device("cpu"), backend="gloo")


def test_cpu_rank_says_why_the_fused_variant_cannot_run() -> None:
    reason = triton_unavailable(torch.device("cpu"))
    if os.environ.get("TRITON_INTERPRET") != "1":
        assert reason
        assert ("Triton is not installed" in reason) if not HAVE_TRITON else ("CUDA GPU" in reason)
    key = MoeKey(tokens=1, top_k=2, experts_local=8, experts_active=2, hidden=64, intermediate=32, dtype="bf16", bias=0)
    if reason:
        with pytest.raises(UnsupportedError, match=r"Triton|CUDA"):
            fused_moe_runner(key, _cpu_ctx(), rotate=False)


def test_experts_of_a_format_the_kernels_do_not_read_are_unsupported_with_the_formats_named() -> None:
    key = MoeKey(tokens=1, top_k=2, experts_local=8, experts_active=2, hidden=64, intermediate=32, dtype="int4", bias=0)
    with pytest.raises(UnsupportedError, match="bf16, fp16, fp32, fp8, mxfp4, nvfp4"):
        fused_moe_runner(key, _cpu_ctx(), rotate=False)


@pytest.mark.parametrize("fmt", ["mxfp4", "nvfp4"])
def test_fp4_experts_on_a_cpu_rank_say_why_no_variant_runs(fmt: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    key = MoeKey(tokens=1, top_k=2, experts_local=8, experts_active=2, hidden=64, intermediate=32, dtype=fmt, bias=0)
    with pytest.raises(UnsupportedError, match=r"CUDA GPU|Triton is not installed"):
        fused_moe_runner(key, _cpu_ctx(), rotate=False)
    for variant in ("grouped", "loop"):
        with pytest.raises(UnsupportedError, match=f"{fmt} expert GEMMs have no torch kernel on cpu"):
            moe_runner(key, _cpu_ctx(), rotate=False, variant=variant)
    with pytest.raises(UnsupportedError, match="bf16/fp16"):
        engine_moe_runner(key, _cpu_ctx(), rotate=False)


def test_fp4_tiles_are_whole_scale_blocks_in_the_reduction_form() -> None:
    assert FP4_CANDIDATES and all(t.block_k % 32 == 0 and not t.mma for t in FP4_CANDIDATES)
    assert candidates_for("mxfp4") == candidates_for("nvfp4") == FP4_CANDIDATES
    assert candidates_for("bf16") == TILE_CANDIDATES
    assert all(not up.mma and not down.mma for up, down in _candidate_pairs(FP4_CANDIDATES))


def test_the_tile_store_keeps_fp4_shapes_apart(tmp_path: Path) -> None:
    store = tmp_path / "kernel_tiles.json"
    choice = TileChoice(FP4_CANDIDATES[-1], FP4_CANDIDATES[0], 2.0, 1.0, len(FP4_CANDIDATES), False, FORM_FOLD, 3.0)
    remember("H200", shape_id(1, 4, 2880, 1440, "mxfp4"), choice, store)
    assert lookup("H200", shape_id(1, 4, 2880, 1440, "mxfp4"), store) == replace(choice, cached=True)
    assert lookup("H200", shape_id(1, 4, 2880, 1440, "nvfp4"), store) is None


INTERPRETED = textwrap.dedent(
    """
    import torch
    from decodetop.probes.worker import fused_moe as fm
    torch.manual_seed(0)
    for tokens, hidden, inter, n_exp, top_k, dtype, sms in [
        (1, 300, 80, 6, 2, torch.bfloat16, 1),  # tails: 300 % 256 and 80 % 32
        (2, 512, 256, 8, 4, torch.float32, 1),
        (1, 300, 84, 6, 2, torch.bfloat16, 1000),  # many SMs: 8-row blocks, 84 % 8 and 300 % 8 masked
    ]:
        x = torch.randn(tokens, hidden).to(dtype)
        w13 = (torch.randn(n_exp, 2 * inter, hidden) * 0.05).to(dtype)
        w2 = (torch.randn(n_exp, hidden, inter) * 0.05).to(dtype)
        ids = fm.routed_ids(tokens, top_k, n_exp, torch.device("cpu"))
        wts = torch.rand(tokens, top_k) + 0.1
        got = fm.fused_moe(x, w13, w2, ids, wts, sms=sms).float()
        want = fm.reference_moe(x, w13, w2, ids, wts).float()
        err = (got - want).abs().max().item()
        assert err <= 0.02 * want.abs().max().item(), (dtype, err)
    # The probe's runner end to end (its own check against the reference included), on CPU tensors.
    from decodetop.budget.keys import MoeKey
    from decodetop.probes.worker.context import ProbeContext
    ctx = ProbeContext(rank=0, world_size=1, device=torch.device("cpu"), backend="gloo")
    key = MoeKey(tokens=1, top_k=4, experts_local=16, experts_active=4, hidden=256, intermediate=96, dtype="bf16",
                 bias=0)
    runner = fm.fused_moe_runner(key, ctx, rotate=False)
    assert runner.fn().shape == (1, 256) and runner.weight_bytes == 4 * 3 * 96 * 256 * 2
    print("ok")
    """
)


def test_triton_kernels_match_the_reference_under_the_interpreter() -> None:
    _interpreted(INTERPRETED)


def _interpreted(script: str) -> None:
    """`script` in a fresh Python under Triton's interpreter (set before Triton is imported); it prints 'ok'."""
    require_module("triton", "the test extra installs Triton; its interpreter runs the fused-MoE kernels on the CPU")
    env = subprocess_env(pythonpath=tuple(Path(p) for p in sys.path if p), TRITON_INTERPRET="1")
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().endswith("ok")


#: Shared by the two scripts below: one layer's inputs and its reference.
LAYER = textwrap.dedent(
    """
    import torch
    from decodetop.probes.worker import fused_moe as fm
    from decodetop.probes.worker.kernels.tiles import MMA_CANDIDATES, Tiles
    torch.manual_seed(0)

    def layer(tokens, hidden, inter, n_exp, top_k, dtype):
        x = torch.randn(tokens, hidden).to(dtype)
        w13 = (torch.randn(n_exp, 2 * inter, hidden) * 0.05).to(dtype)
        w2 = (torch.randn(n_exp, hidden, inter) * 0.05).to(dtype)
        ids = fm.routed_ids(tokens, top_k, n_exp, torch.device("cpu"))
        wts = torch.rand(tokens, top_k) + 0.1
        return (x, w13, w2, ids, wts), fm.reference_moe(x, w13, w2, ids, wts).float()

    def close(got, want):
        err = (got.float() - want).abs().max().item()
        return err <= 0.02 * want.abs().max().item()
    """
)

MEMSET_FREE = LAYER + textwrap.dedent(
    """
    SPLIT_UP, SPLIT_DOWN = Tiles(16, 128, 4, 0, 2), Tiles(16, 32, 4, 0, 2)  # both reductions split: atomics
    # tails (300 % 128, 80 % 16); top-k 1 over 3 tokens; top-k 8; fp32
    SHAPES = [((1, 300, 80, 6, 2), torch.bfloat16), ((3, 300, 48, 8, 1), torch.bfloat16),
              ((1, 200, 48, 8, 8), torch.bfloat16), ((2, 256, 48, 4, 2), torch.float32)]
    PREFETCH = Tiles(128, 32, 8)  # the early form's larger down programs, over several k-steps
    for shape, dtype in SHAPES:
        args, want = layer(*shape, dtype)
        tokens, hidden, inter, _, top_k = shape
        for tiles in (None, (SPLIT_UP, SPLIT_DOWN), (Tiles(16, 128, 4, 2, 2, mma=True), SPLIT_DOWN),
                      (SPLIT_UP, PREFETCH)):
            for form in fm.FORMS:
                h = torch.zeros(tokens * top_k, 2 * inter)
                ys = torch.zeros(tokens * top_k, hidden)
                tickets = torch.zeros(fm.ticket_count(tokens, top_k, hidden), dtype=torch.int32)
                outs = []
                for step in range(2):  # the second step's split reductions add onto what the first left
                    out = torch.full((tokens, hidden), float("nan"), dtype=dtype)
                    outs.append(fm.fused_moe(*args, h=h, ys=ys, out=out, tiles=tiles, form=form, tickets=tickets))
                    assert close(outs[-1], want), (shape, tiles, form, step)
                    what = (shape, tiles, form, step)
                    assert not h.any() and not ys.any() and not tickets.any(), what  # zero again, no memset
                assert torch.equal(outs[0], outs[1]), (shape, tiles, form)
        # The earlier form: memsets before the split kernels, so any workspace contents do; it leaves them dirty.
        h = torch.full((tokens * top_k, 2 * inter), 3.0)
        ys = torch.full((tokens * top_k, hidden), 3.0)
        got = fm.fused_moe(*args, h=h, ys=ys, tiles=(SPLIT_UP, SPLIT_DOWN), memsets=True)
        assert close(got, want) and ys.any()
    few = torch.zeros(1, dtype=torch.int32)  # the fold form's counters must cover its launch
    for bad, words in [({"form": "sideways"}, "sideways"), ({"form": fm.FORM_FOLD, "tickets": few}, "too few"),
                       ({"form": fm.FORM_FOLD, "memsets": True}, "three-kernel")]:
        try:
            fm.fused_moe(*args, **bad)
        except ValueError as exc:
            assert words in str(exc), exc
        else:
            raise AssertionError(f"{bad} ran")
    print("ok")
    """
)


def test_every_form_gives_the_reference_twice_and_leaves_the_workspaces_zero() -> None:
    _interpreted(MEMSET_FREE)


MMA = LAYER + textwrap.dedent(
    """
    plain = Tiles(16, 256)
    for shape, dtype, tried in [
        ((1, 300, 80, 6, 2), torch.bfloat16, MMA_CANDIDATES),  # tails: 300 % 128 and 80 % 32 masked
        ((2, 256, 48, 4, 3), torch.float32, MMA_CANDIDATES[:2]),  # whole steps (no mask along k); two tokens
    ]:
        args, want = layer(*shape, dtype)
        for tiles in tried:
            assert tiles.mma
            assert close(fm.fused_moe(*args, tiles=(tiles, plain)), want), tiles
    try:
        fm.fused_moe(*args, tiles=(plain, MMA_CANDIDATES[0]))
    except ValueError as exc:
        assert "no tl.dot form" in str(exc)
    else:
        raise AssertionError("the down kernel took mma tiles")
    print("ok")
    """
)


def test_the_gate_up_dot_form_matches_the_reference() -> None:
    _interpreted(MMA)


FP4 = textwrap.dedent(
    """
    import torch
    from decodetop.probes.worker import fused_moe as fm
    from decodetop.probes.worker.fp4 import fp4_nbytes, random_fp4
    from decodetop.probes.worker.kernels.tiles import MMA_CANDIDATES, Tiles
    torch.manual_seed(0)
    cpu = torch.device("cpu")

    def layer(tokens, hidden, inter, n_exp, top_k, fmt):
        x = torch.randn(tokens, hidden).to(torch.bfloat16)
        w13 = random_fp4((n_exp, 2 * inter, hidden), fmt, cpu)
        w2 = random_fp4((n_exp, hidden, inter), fmt, cpu)
        ids = fm.routed_ids(tokens, top_k, n_exp, cpu)
        wts = torch.rand(tokens, top_k) + 0.1
        return (x, w13, w2, ids, wts), fm.reference_moe(x, w13, w2, ids, wts).float()

    ONE = (Tiles(32, 256), Tiles(32, 64))  # each reduction one step (hidden 256, intermediate 64)
    SPLIT = (Tiles(32, 64, 4, 0, 2), Tiles(32, 32, 4, 0, 2))  # several steps, in two parts added with atomics
    # (shape, tiles, steps): 200 = 6·32 + 8 and 48 = 32 + 16 are no whole number of steps (nor of MXFP4 blocks)
    CASES = [((1, 256, 64, 4, 2), ONE, 1), ((2, 200, 48, 6, 4), SPLIT, 2)]
    for fmt in ("mxfp4", "nvfp4"):
        for shape, tiles, steps in CASES:
            args, want = layer(*shape, fmt)
            tokens, hidden, inter, _, top_k = shape
            for form in fm.FORMS:
                h = torch.zeros(tokens * top_k, 2 * inter)
                ys = torch.zeros(tokens * top_k, hidden)
                tickets = torch.zeros(fm.ticket_count(tokens, top_k, hidden), dtype=torch.int32)
                for step in range(steps):  # a second step adds onto what the first left: zeros
                    out = torch.full((tokens, hidden), float("nan"), dtype=torch.bfloat16)
                    got = fm.fused_moe(*args, h=h, ys=ys, out=out, tiles=tiles, form=form, tickets=tickets).float()
                    err = (got - want).abs().max().item()
                    what = (fmt, shape, form, step, err)
                    assert err <= fm.CHECK_RTOL * want.abs().max().item() and want.abs().max() > 0, what
                    assert not h.any() and not ys.any() and not tickets.any(), what
    (x, w13, w2, ids, wts), _ = layer(1, 256, 64, 4, 2, "mxfp4")
    plain = torch.zeros(4, 256, 64, dtype=torch.bfloat16)
    for bad, words in [({"tiles": (MMA_CANDIDATES[0], ONE[1])}, "no tl.dot form"),
                       ({"tiles": (Tiles(32, 16), ONE[1])}, "not whole 32-value scale blocks"),
                       ({"w2": plain}, "w13 mxfp4, w2 plain")]:
        try:
            fm.fused_moe(x, bad.get("w13", w13), bad.get("w2", w2), ids, wts, tiles=bad.get("tiles"))
        except ValueError as exc:
            assert words in str(exc), exc
        else:
            raise AssertionError(f"{words}: ran")
    # The probe's runner end to end (its own check against the reference included), on CPU tensors.
    from decodetop.budget.keys import MoeKey
    from decodetop.probes.worker.context import ProbeContext
    ctx = ProbeContext(rank=0, world_size=1, device=torch.device("cpu"), backend="gloo")
    for fmt, words in [("mxfp4", "MXFP4: E2M1 + E8M0 scale per 32"), ("nvfp4", "NVFP4: E2M1 + E4M3 scale per 16")]:
        key = MoeKey(tokens=1, top_k=2, experts_local=8, experts_active=2, hidden=128, intermediate=64, dtype=fmt,
                     bias=0)
        runner = fm.fused_moe_runner(key, ctx, rotate=False)
        assert runner.fn().shape == (1, 128) and words in runner.note and "w4a16" in runner.note
        assert runner.weight_bytes == fp4_nbytes((2, 128, 128), fmt) + fp4_nbytes((2, 128, 64), fmt)
    print("ok")
    """
)


def test_fp4_experts_match_the_reference_on_their_dequantised_weights_in_every_form() -> None:
    _interpreted(FP4)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_fused_runner_on_a_gpu_checks_itself_and_replays_in_a_graph() -> None:
    from decodetop.probes.worker.timing import time_graph

    ctx = ProbeContext(rank=0, world_size=1, device=torch.device("cuda", 0), backend="nccl")
    key = MoeKey(
        tokens=1,
        top_k=8,
        experts_local=128,
        experts_active=8,
        hidden=4096,
        intermediate=768,
        dtype="bf16",
        bias=0,
    )
    runner = fused_moe_runner(key, ctx, rotate=True)  # raises if the kernel disagrees with the reference
    samples = time_graph(runner.fn, runner.rotation * 4, 5)
    assert min(samples) > 0
