"""The DSA indexer's scoring kernel (`kernels.dsa._score_kernel`, with its first radix histogram) over launch shapes,
timed on one GPU at GLM-5's shapes (32 index heads of 128 dims, FP8 keys, one query row): tokens per tile
(`BLOCK`), programs per SM, warps and pipeline stages, each shape's scores checked against the torch form first.
Beside each, the keys' and scales' bytes over the measured copy bandwidth. CUDA graph replay of `OPS` calls over
`ROTATE` key buffers (above the 50 MB L2), events; the median of 15. Prints each row as it is timed and a table of the
fastest last.

    PYTHONPATH=src python3 benchmarks/kernels/dsa_scores_sweep.py --json $OUT/dsa_scores.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from decodetop.probes.worker.kernels import common, dsa
from decodetop.probes.worker.timing import capture_graph, time_events

HEADS, DIM = 32, 128
"""GLM-5's and DeepSeek-V3.2's indexer: 32 heads of 128 dims (their config.json: index_n_heads, index_head_dim)."""
CONTEXTS = (32768, 131072)
BLOCKS = (64, 128, 256)
PROGRAMS_PER_SM = (1, 2, 4, 8)
WARPS = (4, 8)
STAGES = (2, 3, 4)
OPS = 12
ROTATE = 6
"""Key buffers the graph's calls cycle over: 6 × 16.5 MB at 128K, past the H200's 50 MB L2."""


def copy_gbps() -> float:
    """Device-to-device copy of 1 GiB, bytes read + written over the median time."""
    src = torch.empty(1 << 29, dtype=torch.float16, device="cuda").normal_()
    dst = torch.empty_like(src)
    us = statistics.median(time_events(lambda: dst.copy_(src), 5, 10, warmup=3))
    return 2 * src.numel() * 2 / us / 1e3


class Inputs:
    """One query row and `ROTATE` caches of index keys and their scales at `context` tokens."""

    def __init__(self, context: int) -> None:
        d = torch.device("cuda")
        self.context = context
        self.q = torch.randn(1, HEADS, DIM, device=d).to(torch.bfloat16)
        self.w = torch.rand(1, HEADS, device=d)
        self.keys = [(torch.randn(1, context, DIM, device=d) * 2).to(torch.float8_e4m3fn) for _ in range(ROTATE)]
        self.scales = [torch.rand(1, context, device=d) + 0.5 for _ in range(ROTATE)]
        self.scores = torch.empty(1, context, device=d)
        self.work = torch.zeros(1, dsa.SCHEME_INTS[dsa.SCHEMES[0]], device=d, dtype=torch.int32)

    def reference(self, i: int) -> torch.Tensor:
        logits = torch.einsum("hd,ld->hl", self.q[0].float(), self.keys[i][0].float()) * self.scales[i][0]
        return (logits.clamp_min(0) * self.w[0][:, None]).sum(0)


def launch(x: Inputs, i: int, shape: tuple[int, int, int, int], sms: int) -> None:
    """The scoring kernel over key buffer `i` in one launch shape (BLOCK, programs per SM, warps, stages), as
    `dsa.dsa_scores` launches it."""
    block, per_sm, warps, stages = shape
    tiles = -(-x.context // block)
    per = max(1, -(-tiles // (per_sm * sms)))
    common.launch(
        dsa._score_kernel,
        (-(-tiles // per), 1),
        x.q,
        x.w,
        x.keys[i],
        x.scales[i],
        x.scores,
        x.work,
        HEADS,
        x.context,
        1,
        per,
        x.keys[i].stride(0),
        x.scales[i].stride(0),
        WORK=x.work.shape[1],
        HP=HEADS,
        D=DIM,
        BLOCK=block,
        BINS1=dsa.DIGIT_BINS,
        SHIFT1=32 - dsa.DIGIT_BITS,
        F32_DOT=False,
        F16=True,
        HIST=True,
        num_warps=warps,
        num_stages=stages,
        pdl=True,
    )


def time_shape(x: Inputs, shape: tuple[int, int, int, int], sms: int) -> dict[str, Any]:
    """The shape's scores against the torch form's (relative error), then its median µs per call."""
    block, per_sm, warps, stages = shape
    row: dict[str, Any] = {"context": x.context, "block": block, "per_sm": per_sm, "warps": warps, "stages": stages}
    try:
        launch(x, 0, shape, sms)
        want = x.reference(0)
        row["rel_err"] = float((x.scores[0] - want).norm() / want.norm())
        turn = itertools.cycle(range(ROTATE))
        graph = capture_graph(lambda: launch(x, next(turn), shape, sms), OPS)
        row["us"] = statistics.median(time_events(graph.replay, 1, 15, warmup=2)) / OPS
    except Exception as exc:  # a shape that does not compile (shared memory) is a row, not the end
        row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path, required=True)
    ap.add_argument("--deadline", type=float, default=150.0, help="seconds after which no further row starts")
    args = ap.parse_args(argv)
    stop = time.monotonic() + args.deadline
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    copy = copy_gbps()
    rows: list[dict[str, Any]] = []
    for context in CONTEXTS:
        x = Inputs(context)
        bytes_us = context * (DIM + 4) / copy / 1e3
        for shape in itertools.product(BLOCKS, PROGRAMS_PER_SM, WARPS, STAGES):
            if time.monotonic() > stop:
                break
            row = {**time_shape(x, shape, sms), "bytes_us": bytes_us}
            rows.append(row)
            print(json.dumps(row), flush=True)
        del x
        torch.cuda.empty_cache()
    args.json.write_text(json.dumps({"copy_gbps": copy, "sms": sms, "rows": rows}, indent=1))
    print(
        f"copy {copy:.0f} GB/s; default BLOCK {dsa.SCORE_BLOCK}, {dsa.SCORE_PROGRAMS_PER_SM} per SM, 4 warps, "
        f"{dsa.SCORE_STAGES} stages"
    )
    print("| context | block | per SM | warps | stages | µs | bytes µs | rel err |")
    print("|---|---|---|---|---|---|---|---|")
    for context in CONTEXTS:
        done = sorted((r for r in rows if r["context"] == context and "us" in r), key=lambda r: r["us"])
        default = [
            r
            for r in done
            if (r["block"], r["per_sm"], r["warps"], r["stages"])
            == (dsa.SCORE_BLOCK, dsa.SCORE_PROGRAMS_PER_SM, 4, dsa.SCORE_STAGES)
        ]
        for r in [*done[:6], *default[:2]]:
            print(
                f"| {context} | {r['block']} | {r['per_sm']} | {r['warps']} | {r['stages']} | {r['us']:.2f} | "
                f"{r['bytes_us']:.2f} | {r['rel_err']:.1e} |"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
