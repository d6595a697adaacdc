"""The fused-MoE kernels' result with each kernel's trigger placement (`EARLY`), PDL on and off, and the combine's
zeroing of ys on and off, against `reference_moe` at DeepSeek-V3's TP-8 slice and Qwen3-235B's shape, each
launch of the three by hand; with the zeroing off, the down kernel's ys rows summed in torch too. On an H200 it
showed the combine's zeros overtaking its loads of ys wherever no instruction sat between them (PDL off, or the
trigger moved before the loads: 42–93 % off, right with the zeroing off), which a CTA barrier before the zeros fixed
(docs/benchmarks.md, "Kernels, eighth round").

    PYTHONPATH=src python3 benchmarks/kernels/moe_early_probe.py
"""

from __future__ import annotations

import argparse
import itertools

import torch

from decodetop.probes.worker import fused_moe as fm
from decodetop.probes.worker.kernels.common import launch, pdl_disabled
from decodetop.probes.worker.kernels.moe_gemv import _combine_kernel
from decodetop.probes.worker.kernels.tiles import Tiles


def one(
    shape: tuple[int, int, int, int], up: Tiles, down: Tiles, flags: tuple[bool, bool, bool], zero: bool = True
) -> tuple[float, float]:
    tokens, hidden, inter, top_k = shape
    d = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    x = torch.randn(tokens, hidden, device=d).to(torch.bfloat16)
    w13 = (torch.randn(16, 2 * inter, hidden, device=d) * 0.05).to(torch.bfloat16)
    w2 = (torch.randn(16, hidden, inter, device=d) * 0.05).to(torch.bfloat16)
    ids = fm.routed_ids(tokens, top_k, 16, d)
    wts = torch.rand(tokens, top_k, device=d) + 0.1
    h = torch.zeros(tokens * top_k, 2 * inter, device=d)
    ys = torch.zeros(tokens * top_k, hidden, device=d)
    out = torch.full((tokens, hidden), float("nan"), device=d, dtype=torch.bfloat16)
    grid = fm.grid_for(tokens, top_k, hidden, inter, 132 if d.type == "cuda" else 1, gate_up=up, down=down)
    fm.launch_gate_up(x, w13, ids, h, grid, early=flags[0])
    fm.launch_down(h, w2, ids, wts, ys, grid, early=flags[1])
    launch(_combine_kernel, grid.combine, ys, out, h, hidden, top_k * 2 * inter, top_k=top_k,
           block=fm.COMBINE_BLOCK, zero=zero, EARLY=flags[2], pdl=True)  # fmt: skip
    torch.cuda.synchronize() if d.type == "cuda" else None
    want = fm.reference_moe(x, w13, w2, ids, wts).float()
    scale = float(want.abs().max())
    err = float((out.float() - want).abs().max()) / scale
    ys_err = float((ys.view(tokens, top_k, hidden).sum(1) - want).abs().max()) / scale if not zero else -1.0
    return err, ys_err


def main(argv: list[str] | None = None) -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)
    shapes = {"DeepSeek": ((1, 7168, 256, 8), Tiles(8, 512, 4, 0, 2), Tiles(16, 256)),
              "Qwen3": ((1, 4096, 1536, 8), Tiles(8, 256), Tiles(16, 256))}  # fmt: skip
    for name, (shape, up, down) in shapes.items():
        for flags in [(False, False, False), (False, False, True), (True, True, True)]:
            for pdl, zero in itertools.product((True, False), (True, False)):
                if pdl:
                    err = one(shape, up, down, flags, zero)
                else:
                    with pdl_disabled():
                        err = one(shape, up, down, flags, zero)
                print(
                    f"{name} early {flags} pdl {pdl} zero {zero}: rel err out {err[0]:.3g}, ys {err[1]:.3g}", flush=True
                )


if __name__ == "__main__":
    main()
