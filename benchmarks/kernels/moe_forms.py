"""The fused-MoE kernels' forms timed on one GPU (`tiles.FORMS`): `late` (the triggers after each loop, as measured
through the fourth round), `early` (the triggers right after each wait, the down kernel's ids, router weight and
first weight tile loaded before its wait) and `fold` (early, with the combine folded into the down kernel by
tickets: two launches), each at its best over a small tile list per shape, for DeepSeek-V3 TP-8, Qwen3-235B-A22B
TP-1, Mixtral-8x7B TP-2 and TP-1 and gpt-oss-120b TP-2 (MXFP4 and NVFP4 experts) at one token (`--forms`: only
some). Each (form, tiles) is checked once against `reference_moe`, then timed: a CUDA graph of `OPS` calls (all
launches of each step; experts rotated above 2× L2 by `copies_for`), events, the median of `SAMPLES` replays; beside
the routed weights' bytes over the copy bandwidth (`gqa_split_rules.copy_gbps`). Prints each row as it is timed and
a short table last; `--json` gets everything. `--no-pdl` times every form without programmatic dependent launch
(where the forms should not differ). `--smoke`: CPU tensors under Triton's interpreter, tiny shapes, one call each
(the script's paths, no timings).

    PYTHONPATH=src python3 benchmarks/kernels/moe_forms.py --json $OUT/moe_forms.json
    TRITON_INTERPRET=1 PYTHONPATH=src python3 benchmarks/kernels/moe_forms.py --smoke --json /tmp/moe_forms.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from gqa_split_rules import copy_gbps

from decodetop.budget.keys import MoeKey
from decodetop.probes.worker import fused_moe as fm
from decodetop.probes.worker.context import ProbeContext
from decodetop.probes.worker.kernels import common
from decodetop.probes.worker.kernels import tiles as tile_store
from decodetop.probes.worker.kernels.tiles import Tiles
from decodetop.probes.worker.timing import capture_graph, time_graph_replay

OPS = 20
SAMPLES = 10
#: (key, gate_up tiles, down tiles): last round's tuned tiles first (h200_kernels.LAST_ROUND_TILES), then the
#: `tl.dot` gate_up and the early form's larger down programs (`tiles.PREFETCH_CANDIDATES`).
SHAPES: dict[str, tuple[MoeKey, tuple[Tiles, ...], tuple[Tiles, ...]]] = {
    "DeepSeek-V3 TP8": (
        MoeKey(1, 8, 256, 8, 7168, 256, "bf16", 0),
        (Tiles(8, 512, 4, 0, 2), Tiles(16, 256, 4, 4, 2, True), Tiles(32, 256, 4, 3, 1, True)),
        (Tiles(16, 256), Tiles(32, 256), Tiles(64, 256, 8), Tiles(128, 256, 8)),
    ),
    "Qwen3-235B-A22B TP1": (
        MoeKey(1, 8, 128, 8, 4096, 1536, "bf16", 0),
        (Tiles(8, 256), Tiles(16, 512)),
        (Tiles(16, 256), Tiles(32, 256), Tiles(128, 256, 8)),
    ),
    "Mixtral-8x7B TP2": (
        MoeKey(1, 2, 8, 2, 4096, 7168, "bf16", 0),
        (Tiles(16, 512), Tiles(32, 256, 4, 3, 1, True)),
        (Tiles(16, 1024), Tiles(16, 512), Tiles(128, 256, 8)),
    ),
    "Mixtral-8x7B TP1": (
        MoeKey(1, 2, 8, 2, 4096, 14336, "bf16", 0),
        (Tiles(16, 512),),
        (Tiles(16, 1024), Tiles(128, 256, 8)),
    ),
    # FP4 experts (weight-only): gpt-oss-120b's TP-2 slice, the tuner's pick of the first FP4 kernels first
    "gpt-oss-120b TP2 mxfp4": (
        MoeKey(1, 4, 128, 4, 2880, 1440, "mxfp4", 0),
        (Tiles(8, 256), Tiles(16, 512), Tiles(8, 1024), Tiles(8, 2048), Tiles(16, 2048, 8)),
        (Tiles(8, 512, 4, 0, 2), Tiles(16, 512), Tiles(16, 1024)),
    ),
    "gpt-oss-120b TP2 nvfp4": (
        MoeKey(1, 4, 128, 4, 2880, 1440, "nvfp4", 0),
        (Tiles(8, 256), Tiles(8, 1024), Tiles(16, 2048, 8)),
        (Tiles(8, 512, 4, 0, 2), Tiles(16, 1024)),
    ),
}
SMOKE_SHAPES = {
    "tiny top-2": (MoeKey(1, 2, 8, 2, 300, 80, "bf16", 0), (Tiles(16, 128, 4, 0, 2),),
                   (Tiles(16, 128), Tiles(128, 32, 8))),
    "tiny top-8 split": (MoeKey(1, 8, 8, 8, 200, 48, "bf16", 0), (Tiles(8, 64),), (Tiles(16, 32, 4, 0, 2),)),
    "tiny mxfp4": (MoeKey(1, 2, 4, 2, 200, 48, "mxfp4", 0), (Tiles(8, 64),), (Tiles(16, 32, 4, 0, 2),)),
}  # fmt: skip


def time_form(
    key: MoeKey, ctx: ProbeContext, pairs: list[tuple[Tiles, Tiles]], form: str, smoke: bool
) -> dict[str, Any]:
    """The best of `pairs` in `form` at `key`: each checked once against the reference, then timed (µs a step)."""
    experts, bufs, w_bytes = fm._moe_tensors(key, ctx, rotate=not smoke)
    w13_0, w2_0 = experts.items[0]
    want = fm.reference_moe(bufs.x, w13_0, w2_0, bufs.ids, bufs.wts).float()
    timed: list[dict[str, Any]] = []
    for up, down in pairs:
        call = {"h": bufs.h, "ys": bufs.ys, "out": bufs.out, "tiles": (up, down), "form": form, "tickets": bufs.tickets}
        label = f"{up.text} / {down.text}"
        try:
            bufs.out.fill_(float("nan"))
            got = fm.fused_moe(bufs.x, w13_0, w2_0, bufs.ids, bufs.wts, **call).float()
            err = float((got - want).abs().max())
            if not err <= fm.CHECK_RTOL * float(want.abs().max()):
                raise RuntimeError(f"differs from the reference: max |Δ| {err:.3g}")
            if bufs.h.any() or bufs.ys.any() or bufs.tickets.any():
                raise RuntimeError("workspaces not zero after the call")
            if smoke:
                start = time.perf_counter()
                fm.fused_moe(bufs.x, w13_0, w2_0, bufs.ids, bufs.wts, **call)
                us = (time.perf_counter() - start) * 1e6
            else:

                def step(call: dict[str, Any] = call) -> None:
                    w13, w2 = experts.next()
                    fm.fused_moe(bufs.x, w13, w2, bufs.ids, bufs.wts, **call)

                ops = len(experts) * -(-OPS // len(experts))  # every rotated copy as often
                graph = capture_graph(step, ops)
                try:
                    us = statistics.median(time_graph_replay(graph, ops, SAMPLES))
                finally:
                    graph.reset()
            timed.append({"tiles": label, "us": us})
        except Exception as exc:
            timed.append({"tiles": label, "error": f"{type(exc).__name__}: {str(exc)[:200]}"})
            if not smoke:
                torch.cuda.synchronize()
    ran = [t for t in timed if "us" in t]
    best = min(ran, key=lambda t: t["us"]) if ran else {"tiles": "-", "us": float("nan")}
    return {"form": form, "best_tiles": best["tiles"], "us": best["us"], "weight_bytes": w_bytes, "timed": timed}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path, required=True)
    ap.add_argument("--deadline", type=float, default=80.0, help="seconds after which no further shape starts")
    ap.add_argument("--smoke", action="store_true", help="CPU tensors under Triton's interpreter, tiny shapes")
    ap.add_argument("--no-pdl", action="store_true", help="every form without programmatic dependent launch")
    ap.add_argument("--only", default="", help="comma-separated parts of the shape labels to keep")
    ap.add_argument("--forms", default=",".join(tile_store.FORMS), help="comma-separated forms to time")
    args = ap.parse_args(argv)
    stop = time.monotonic() + args.deadline
    device = torch.device("cpu" if args.smoke else "cuda")
    ctx = ProbeContext(rank=0, world_size=1, device=device, backend="gloo" if args.smoke else "nccl")
    copy = 0.0 if args.smoke else copy_gbps()
    pdl = common.pdl_enabled(device) and not args.no_pdl
    print(f"copy {copy:.0f} GB/s, PDL {'on' if pdl else 'off'}", flush=True)
    rows: list[dict[str, Any]] = []
    shapes = SMOKE_SHAPES if args.smoke else SHAPES
    wanted = [w for w in args.only.split(",") if w]
    out: dict[str, Any] = {"copy_gbps": copy, "pdl": pdl, "rows": rows}
    if not args.smoke:
        out |= {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__}
    with common.pdl_disabled() if args.no_pdl else contextlib.nullcontext():
        for label, (key, ups, downs) in shapes.items():
            if wanted and not any(w in label for w in wanted):
                continue
            if time.monotonic() > stop:
                rows.append({"shape": label, "error": "skipped: the run's deadline"})
                continue
            pairs = [(u, d) for u in ups for d in downs]
            for form in [f for f in tile_store.FORMS if f in args.forms.split(",")]:
                try:
                    row = {"shape": label, **time_form(key, ctx, pairs, form, args.smoke)}
                except Exception as exc:
                    traceback.print_exc()
                    row = {"shape": label, "form": form, "error": f"{type(exc).__name__}: {str(exc)[:300]}"}
                if copy and "us" in row:
                    row["floor_us"] = row["weight_bytes"] / copy / 1e3
                    row["copy_pct"] = 100 * row["floor_us"] / row["us"]
                rows.append(row)
                print(json.dumps(row), flush=True)
                if not args.smoke:
                    torch.cuda.empty_cache()
                args.json.write_text(json.dumps(out, indent=1), encoding="utf-8")
    print(f"\n| shape | form | best tiles | µs | copy µs | % of copy |  (PDL {'on' if pdl else 'off'})")
    print("|---|---|---|---|---|---|")
    for r in rows:
        if "us" not in r:
            print(f"| {r['shape']} | {r.get('form', '-')} | {r['error'][:60]} | | | |")
            continue
        floor = f"{r['floor_us']:.1f}" if "floor_us" in r else "-"
        pct = f"{r['copy_pct']:.0f} %" if "copy_pct" in r else "-"
        print(f"| {r['shape']} | {r['form']} | {r['best_tiles']} | {r['us']:.1f} | {floor} | {pct} |")
    args.json.write_text(json.dumps(out, indent=1), encoding="utf-8")
    failed = [r for r in rows if "error" in r or any("error" in t for t in r.get("timed", []))]
    return 1 if args.smoke and failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
