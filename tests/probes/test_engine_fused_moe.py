"""The fused-MoE decode kernel: its torch reference against a dense formulation (CPU), its launch shapes, where it
says it cannot run, the Triton kernels under Triton's CPU interpreter (where Triton is installed), and on a GPU."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F  # noqa: N812 - the conventional name

from decodetop.budget.keys import MoeKey
from decodetop.probes.worker.context import ProbeContext, UnsupportedError
from decodetop.probes.worker.fused_moe import (
    HAVE_TRITON,
    fused_moe_runner,
    grid_for,
    pick_block_n,
    reference_moe,
    routed_ids,
    triton_unavailable,
)
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


def test_nvfp4_experts_are_unsupported_with_the_formats_named() -> None:
    key = MoeKey(
        tokens=1, top_k=2, experts_local=8, experts_active=2, hidden=64, intermediate=32, dtype="nvfp4", bias=0
    )
    with pytest.raises(UnsupportedError, match="bf16, fp16, fp32, fp8"):
        fused_moe_runner(key, _cpu_ctx(), rotate=False)


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
