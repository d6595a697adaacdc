"""The DSA indexer's scoring kernel (`kernels.dsa._score_kernel`, with its first radix histogram) over launch shapes,
timed on one GPU at GLM-5's shapes (32 index heads of 128 dims, FP8 keys, one query row) in each of its product's
forms (`FORMS`: FP16 or FP8 × FP8, q · keysᵀ or keys · qᵀ) over tokens per tile (`BLOCK`), programs per SM, warps and
pipeline stages, each checked against its torch form first (FP8: q quantized per head the kernel's way).
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
from gqa_split_rules import copy_gbps  # this directory's: the same copy the GQA sweeps measure

from decodetop.probes.worker.kernels import common, dsa, dsa_keys
from decodetop.probes.worker.timing import capture_graph, time_events

HEADS, DIM = 32, 128
"""GLM-5's and DeepSeek-V3.2's indexer: 32 heads of 128 dims (their config.json: index_n_heads, index_head_dim)."""
CONTEXTS = (32768, 131072)
BLOCKS = (64, 128, 256)
PROGRAMS_PER_SM = (2, 4)
WARPS = (4, 8)
STAGES = (2, 3)
FORMS = {"fp16": (False, False), "fp16 k·qT": (True, False), "fp8": (False, True), "fp8 k·qT": (True, True)}
"""The product's forms: (TRANS, Q8) of the kernel."""
OPS = 12
ROTATE = 6
"""Key buffers the graph's calls cycle over: 6 × 16.5 MB at 128K, past the H200's 50 MB L2."""


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

    def reference(self, i: int, q8: bool) -> torch.Tensor:
        """The torch form's scores over key buffer `i` (`q8`: q quantized per head to FP8 as the kernel does)."""
        q, w = self.q[0].float(), self.w[0]
        if q8:
            scale = q.abs().amax(1).clamp_min(1e-12) / 448.0  # E4M3's largest finite value (OCP FP8)
            q, w = (q / scale[:, None]).to(torch.float8_e4m3fn).float(), w * scale
        logits = torch.einsum("hd,ld->hl", q, self.keys[i][0].float()) * self.scales[i][0]
        return (logits.clamp_min(0) * w[:, None]).sum(0)


def launch(x: Inputs, i: int, shape: tuple[int, int, int, int], sms: int, form: str) -> None:
    """The scoring kernel over key buffer `i` in one launch shape (BLOCK, programs per SM, warps, stages) and product
    form (`FORMS`), as `dsa.dsa_scores` launches it."""
    trans, q8 = FORMS[form]
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
        BINS1=dsa_keys.DIGIT_BINS,
        SHIFT1=32 - dsa_keys.DIGIT_BITS,
        F32_DOT=False,
        F16=True,
        HIST=True,
        TRANS=trans,
        Q8=q8,
        num_warps=warps,
        num_stages=stages,
        pdl=True,
    )


def time_shape(x: Inputs, shape: tuple[int, int, int, int], sms: int, form: str) -> dict[str, Any]:
    """The shape's scores against the torch form's (relative error), then its median µs per call."""
    block, per_sm, warps, stages = shape
    row: dict[str, Any] = {"context": x.context, "form": form, "block": block, "per_sm": per_sm, "warps": warps}
    row["stages"] = stages
    try:
        launch(x, 0, shape, sms, form)
        want = x.reference(0, FORMS[form][1])
        row["rel_err"] = float((x.scores[0] - want).norm() / want.norm())
        turn = itertools.cycle(range(ROTATE))
        graph = capture_graph(lambda: launch(x, next(turn), shape, sms, form), OPS)
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
        for form, *shape in itertools.product(FORMS, BLOCKS, PROGRAMS_PER_SM, WARPS, STAGES):
            if time.monotonic() > stop:
                break
            block, per_sm, warps, stages = shape
            row = {**time_shape(x, (block, per_sm, warps, stages), sms, form), "bytes_us": bytes_us}
            rows.append(row)
            print(json.dumps(row), flush=True)
        del x
        torch.cuda.empty_cache()
    args.json.write_text(json.dumps({"copy_gbps": copy, "sms": sms, "rows": rows}, indent=1))
    print(
        f"copy {copy:.0f} GB/s; default BLOCK {dsa.SCORE_BLOCK}, {dsa.SCORE_PROGRAMS_PER_SM} per SM, 4 warps, "
        f"{dsa.SCORE_STAGES} stages"
    )
    print("| context | form | block | per SM | warps | stages | µs | bytes µs | rel err |")
    print("|---|---|---|---|---|---|---|---|---|")
    for context in CONTEXTS:
        done = sorted((r for r in rows if r["context"] == context and "us" in r), key=lambda r: r["us"])
        default = [
            r
            for r in done
            if (r["form"], r["block"], r["per_sm"], r["warps"], r["stages"])
            == ("fp16", dsa.SCORE_BLOCK, dsa.SCORE_PROGRAMS_PER_SM, 4, dsa.SCORE_STAGES)
        ]
        best = [min((r for r in done if r["form"] == form), key=lambda r: r["us"], default=None) for form in FORMS]
        for r in [*done[:4], *(b for b in best if b is not None), *default[:1]]:
            print(
                f"| {context} | {r['form']} | {r['block']} | {r['per_sm']} | {r['warps']} | {r['stages']} | "
                f"{r['us']:.2f} | {r['bytes_us']:.2f} | {r['rel_err']:.1e} |"
            )
    for r in [r for r in rows if "error" in r][:6]:
        if "error" in r:
            print(f"error: {r['form']} {r['block']}/{r['per_sm']}/{r['warps']}/{r['stages']}: {r['error']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
