"""The GQA decode kernel's launch before and now, timed on one GPU: "before" (the "even" split rule, splits rounded
up to fill programs_per_sm × SMs, and the combine in steps of 64 partials), "one step" (the same split, the combine
over every split in one step, its value lanes in blocks) and "one wave" (today's: never a program more on the
busiest SM, the one-step combine), over (sequence, KV head) pairs × context × KV dtype, each beside the cache's
bytes over the copy bandwidth. CUDA graph replay of 20 calls, events; the median of 15. With `--shapes`, the launch
shapes instead (`SHAPES`: today's, the short one before at two programs per SM, and `LONG` at the BF16 cache's
three) over the contexts where the default switches, with each compiled kernel's registers, spills and shared
memory (what decides how many programs an SM holds).

    PYTHONPATH=src python3 benchmarks/kernels/gqa_split_rules.py --json $OUT/gqa_rules.json
    PYTHONPATH=src python3 benchmarks/kernels/gqa_split_rules.py --shapes --json $OUT/gqa_shapes.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from decodetop.probes.worker.kernels import gqa
from decodetop.probes.worker.timing import capture_graph, time_events

PAIRS = (1, 4, 8, 32, 128)
"""(sequence, KV head) pairs: Llama-3.1-70B's TP-8 shard at batch 1, its TP-2 shard, the whole model at batch 1, 4 and
16 (8 query heads per KV head throughout)."""
CONTEXTS = (4096, 16384, 32768, 65536, 131072)
OPS = 20
FORMS = {"before": ("even", 64), "one step": ("even", 0), "one wave": ("one wave", 0)}
"""Each form's split rule and combine step (0: every split in one step)."""
SHAPES = {
    "SHORT, 2 per SM": gqa.SHORT_BEFORE, "SHORT": gqa.SHORT, "LONG": gqa.LONG, "LONG, 3 per SM": gqa.LONG_BF16,
}  # fmt: skip
SHAPE_PAIRS = (1, 2, 4, 8, 16, 32, 64)
SHAPE_CONTEXTS = (1456, 2048, 2896, 4096, 5792, 8192, 11584, 16384, 23168)


def copy_gbps() -> float:
    """Device-to-device copy of 1 GiB, bytes read + written over the median time."""
    src = torch.empty(1 << 29, dtype=torch.float16, device="cuda").normal_()
    dst = torch.empty_like(src)
    us = statistics.median(time_events(lambda: dst.copy_(src), 5, 10, warmup=3))
    return 2 * src.numel() * 2 / us / 1e3


def time_form(pairs: int, context: int, fp8: bool, form: str) -> float:
    """Median µs of one decode over `pairs` pairs of `context` cached tokens launched in `form` (`FORMS`)."""
    rule, step = FORMS[form]
    config = gqa.default_config(context, "fp8" if fp8 else "bf16")
    return time_launch(pairs, context, fp8, replace(config, combine_block=step), rule)


def time_launch(pairs: int, context: int, fp8: bool, config: gqa.GqaConfig, rule: str = gqa.SPLIT_RULE) -> float:
    """Median µs of one decode over `pairs` pairs of `context` cached tokens in launch shape `config`."""
    d = torch.device("cuda")
    kv_heads = min(pairs, 8)
    batch = pairs // kv_heads
    q = torch.randn(batch, 8 * kv_heads, 1, 128, device=d).to(torch.bfloat16)
    k = torch.randn(batch, kv_heads, context, 128, device=d).to(torch.float8_e4m3fn if fp8 else torch.bfloat16)
    v = torch.randn_like(k, dtype=torch.float32).to(k.dtype)
    scales = torch.tensor([1.0, 1.0], device=d) if fp8 else None
    work = gqa.gqa_workspace(batch, 8 * kv_heads, kv_heads, 1, context, 128, d, config=config, fp8=fp8, rule=rule)

    def once() -> None:
        gqa.gqa_decode(q, k, v, sm_scale=128**-0.5, scales=scales, work=work)

    graph = capture_graph(once, OPS)
    samples = time_events(graph.replay, 1, 15, warmup=2)
    return statistics.median(samples) / OPS


def kernel_resources() -> dict[str, str]:
    """Registers, spills and shared memory of each compiled split kernel so far, by its constexprs."""
    found: dict[str, str] = {}
    try:  # Triton's JIT cache: not an API, read for this report only
        for device_cache in gqa._gqa_split_kernel.device_caches.values():
            for key, kernel in device_cache[0].items():
                text = f"regs {kernel.n_regs}, spills {kernel.n_spills}, shared {kernel.metadata.shared}"
                found[str(key)[-160:]] = text
    except (AttributeError, IndexError, TypeError) as exc:
        found["unread"] = f"{type(exc).__name__}: {exc}"
    return found


def shapes_table(stop: float) -> list[dict[str, Any]]:
    """`SHAPES` over `SHAPE_PAIRS` × `SHAPE_CONTEXTS`, FP8 and BF16, each row printed as it is timed."""
    rows: list[dict[str, Any]] = []
    print("| KV | pairs | context | " + " | ".join(f"{name} µs" for name in SHAPES) + " |")
    print("|---|---|---|" + "---|" * len(SHAPES))
    for fp8 in (True, False):
        for pairs in SHAPE_PAIRS:
            for context in SHAPE_CONTEXTS:
                if time.monotonic() > stop:
                    return rows
                us = {name: time_launch(pairs, context, fp8, config) for name, config in SHAPES.items()}
                rows.append({"kv": "fp8" if fp8 else "bf16", "pairs": pairs, "context": context, **us})
                cells = " | ".join(f"{t:.2f}" for t in us.values())
                print(f"| {rows[-1]['kv']} | {pairs} | {context} | {cells} |", flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path, required=True)
    ap.add_argument("--deadline", type=float, default=240.0, help="seconds after which no further row starts")
    ap.add_argument("--shapes", action="store_true", help="time the launch shapes instead of the split rules")
    args = ap.parse_args(argv)
    stop = time.monotonic() + args.deadline
    if args.shapes:
        rows = shapes_table(stop)
        resources = kernel_resources()
        for key, text in resources.items():
            print(f"{text}: {key}")
        out = {"gpu": torch.cuda.get_device_name(0), "rows": rows, "kernels": resources}
        args.json.write_text(json.dumps(out, indent=1), encoding="utf-8")
        return 0
    copy = copy_gbps()
    rows: list[dict[str, Any]] = []
    heads = " | ".join(f"{f} µs (×)" for f in FORMS)
    print(f"copy {copy:.0f} GB/s\n| KV | pairs | context | bytes/copy µs | {heads} |")
    print("|---|---|---|---|" + "---|" * len(FORMS))
    for fp8 in (True, False):
        for pairs in PAIRS:
            for context in CONTEXTS:
                if time.monotonic() > stop:
                    break
                kv_bytes = 2 * pairs * context * 128 * (1 if fp8 else 2)
                if kv_bytes > 1 << 30:
                    continue
                us = {form: time_form(pairs, context, fp8, form) for form in FORMS}
                floor = kv_bytes / copy / 1e3
                row = {"kv": "fp8" if fp8 else "bf16", "pairs": pairs, "context": context, "floor_us": floor, **us}
                rows.append(row)
                cells = " | ".join(f"{t:.1f} ({t / floor:.2f})" for t in us.values())
                print(f"| {row['kv']} | {pairs} | {context} | {floor:.1f} | {cells} |", flush=True)
                torch.cuda.empty_cache()
    out = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "copy_gbps": copy, "rows": rows}
    args.json.write_text(json.dumps(out, indent=1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
