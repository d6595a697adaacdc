"""GQA decode over an FP8 KV cache with q · kᵀ in FP8 × FP8 (each q row quantized to E4M3, `gqa_decode(q8=True)`,
as FlashAttention-3's FP8 path multiplies) beside today's FP16 product (every key converted), timed on one GPU at
Llama-3.1-70B's shard (8 query heads per KV head, head dim 128) under the default launch shape, each checked against
its torch form first (SDPA over the cache cast to BF16; for q8 with q quantized the kernel's way). CUDA graph replay
of `OPS` calls cycling over `ROTATE` caches (past the 50 MB L2), events; the median of 15, beside the cache's bytes
over the measured copy bandwidth.

    PYTHONPATH=src python3 benchmarks/kernels/gqa_fp8_query.py --json $OUT/gqa_q8.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
from pathlib import Path
from typing import Any

import torch
from gqa_split_rules import copy_gbps  # this directory's: the same copy the GQA sweeps measure

from decodetop.probes.worker.kernels import gqa
from decodetop.probes.worker.kernels.common import e4m3_rows_torch
from decodetop.probes.worker.timing import capture_graph, time_events

PAIRS = (1, 8, 32)
"""(sequence, KV head) pairs: Llama-3.1-70B's TP-8 shard, the whole model at batch 1 and at batch 4."""
CONTEXTS = (32768, 65536, 131072)
OPS = 12
ROTATE = 3
DIM = 128
GROUP = 8


def quantized(q: torch.Tensor) -> torch.Tensor:
    """q with each row rounded to E4M3 under its own scale (`e4m3_rows_torch`), back in BF16: what the kernel's FP8
    product multiplies."""
    rounded, scale = e4m3_rows_torch(q)
    return (rounded * scale.unsqueeze(-1)).to(q.dtype)


def time_case(pairs: int, context: int, q8: bool) -> dict[str, Any]:
    """One shape: the relative error against the torch form, then the median µs per decode."""
    d = torch.device("cuda")
    kv_heads = min(pairs, 8)
    batch = pairs // kv_heads
    q = torch.randn(batch, GROUP * kv_heads, 1, DIM, device=d).to(torch.bfloat16)
    caches = [
        (
            torch.randn(batch, kv_heads, context, DIM, device=d).to(torch.float8_e4m3fn),
            torch.randn(batch, kv_heads, context, DIM, device=d).to(torch.float8_e4m3fn),
        )
        for _ in range(ROTATE)
    ]
    scales = torch.tensor([1.0, 1.0], device=d)
    work = gqa.gqa_workspace(batch, GROUP * kv_heads, kv_heads, 1, context, DIM, d, fp8=True)
    row: dict[str, Any] = {"pairs": pairs, "context": context, "q8": q8, "config": work.launch.config.label}
    k0, v0 = caches[0]
    got = gqa.gqa_decode(q, k0, v0, sm_scale=DIM**-0.5, scales=scales, work=work, q8=q8).float()
    want = gqa.reference_gqa(quantized(q) if q8 else q, k0, v0, sm_scale=DIM**-0.5, scales=scales).float()
    row["rel_err"] = float((got - want).norm() / want.norm())
    turn = itertools.cycle(caches)

    def once() -> None:
        k, v = next(turn)
        gqa.gqa_decode(q, k, v, sm_scale=DIM**-0.5, scales=scales, work=work, q8=q8)

    graph = capture_graph(once, OPS)
    row["us"] = statistics.median(time_events(graph.replay, 1, 15, warmup=2)) / OPS
    del caches, graph
    torch.cuda.empty_cache()
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path, required=True)
    args = ap.parse_args(argv)
    copy = copy_gbps()
    rows = []
    for pairs, context in itertools.product(PAIRS, CONTEXTS):
        bytes_us = 2 * pairs * context * DIM / copy / 1e3
        for q8 in (False, True):
            try:
                row = {**time_case(pairs, context, q8), "bytes_us": bytes_us}
            except Exception as exc:  # a form that does not compile is a row, not the end
                row = {"pairs": pairs, "context": context, "q8": q8, "error": f"{type(exc).__name__}: {exc}"[:300]}
            rows.append(row)
            print(json.dumps(row), flush=True)
    args.json.write_text(json.dumps({"copy_gbps": copy, "rows": rows}, indent=1))
    print(f"copy {copy:.0f} GB/s")
    print("| pairs | context | FP16 q · kᵀ µs (× bytes) | FP8 × FP8 q · kᵀ µs (× bytes) | rel err FP16 / FP8 |")
    print("|---|---|---|---|---|")
    for pairs, context in itertools.product(PAIRS, CONTEXTS):
        two = [r for r in rows if r["pairs"] == pairs and r["context"] == context and "us" in r]
        if len(two) != 2:
            continue
        a, b = sorted(two, key=lambda r: r["q8"])
        cells = " | ".join(f"{r['us']:.1f} ({r['us'] / r['bytes_us']:.2f}×)" for r in (a, b))
        print(f"| {pairs} | {context} | {cells} | {a['rel_err']:.1e} / {b['rel_err']:.1e} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
