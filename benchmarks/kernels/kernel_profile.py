"""Where a component's time goes inside decodetop's own kernels: each kernel's device time and the gaps between
them, per call under CUDA-graph replay, read from the profiler's kernel records.

A timed component (h200_kernels.py) is one figure per call; this script splits it. It builds the probe's own runner
(the Triton kernels, checked against their torch forms by the runner), captures a graph of `--calls` calls with the
inputs rotated (as the probe times them), replays it under `torch.profiler` and groups the kernel records by call:
per kernel (in launch order within a call) its median (and longest) device time and its start and end within the
call, then per call the sum of the kernels' times ("busy"), the span from the first kernel's start to the last
one's end, and span − busy ("gaps": launch latency and dependency waits a kernel cannot hide; negative where kernels
overlap under programmatic dependent launch). Kernels that overlap under PDL count their waiting in `gdc_wait` as
device time, so a kernel's time is its own work plus the wait for the one before; the span is what the step pays,
and the starts and ends show the critical path.

    NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 \
        PYTHONPATH=src python3 benchmarks/kernels/kernel_profile.py --json $OUT/profile.json

`--only` keeps the components whose label holds one of its comma-separated parts; `--smoke` runs the script's
paths on CPU tensors under Triton's interpreter (no profile: the CPU has no kernel records).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

if "--smoke" in sys.argv:  # before triton is imported: the interpreter is chosen at import
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch

from decodetop.budget.keys import AttentionKey, MoeKey
from decodetop.probes.worker import attention
from decodetop.probes.worker import fused_moe as fm
from decodetop.probes.worker.attention import AttentionVariant
from decodetop.probes.worker.context import ProbeContext
from decodetop.probes.worker.kernels import mla
from decodetop.probes.worker.ops import OpRunner
from decodetop.probes.worker.timing import capture_graph

#: Calls of the component in the profiled graph (each a rotation of the inputs, as the probe times it).
CALLS = 24

GLM5 = {"heads": 8, "index_heads": 32, "index_head_dim": 128, "index_topk": 2048}
LLAMA70 = {"heads": 64, "kv_heads": 8, "head_dim": 128, "v_head_dim": 128, "kv_dtype": "fp8"}


@dataclass(frozen=True)
class Component:
    """One profiled component: a label and the runner that builds it."""

    label: str
    build: Callable[[ProbeContext], OpRunner]


def att_key(kind: str, context: int, **kw: Any) -> AttentionKey:
    """An attention key at batch 1, one new token; MLA's latent widths unless `kw` says otherwise."""
    base: dict[str, Any] = {
        "kind": kind, "batch": 1, "q_len": 1, "context": context, "heads": 8, "kv_heads": 1, "head_dim": 576,
        "v_head_dim": 512, "kv_lora_rank": 512, "rope_dim": 64, "index_heads": 0, "index_head_dim": 0,
        "index_topk": 0, "window": 0, "kv_dtype": "bf16",
    }  # fmt: skip
    base.update(kw)
    return AttentionKey(**base)


def attention_component(label: str, key: AttentionKey, variant: AttentionVariant | None = None) -> Component:
    def build(ctx: ProbeContext) -> OpRunner:
        return attention.triton_attention_runner(key, ctx, key.context + 1, rotate=True, variant=variant)

    return Component(label, build)


#: The DSA schemes profiled at long contexts: the compaction's and the selecting MLA's.
FUSED = ("radix8-carry", "radix8-fused")


def components(smoke: bool, sweep: bool = False) -> list[Component]:
    """The components whose figures miss or sit at their acceptance lines, and a dense one beside them (`sweep`:
    and the sparse MLA's launch shapes)."""
    if smoke:
        glm = {**GLM5, "index_topk": 128}
        return [
            attention_component("GLM-5 TP8 MLA+DSA 300", att_key("mla+dsa", 300, **glm)),
            attention_component(
                "GLM-5 TP8 MLA+DSA 300 radix8-fused",
                att_key("mla+dsa", 300, **glm),
                AttentionVariant(dsa_scheme="radix8-fused"),
            ),
            attention_component("Llama-70B GQA fp8 300", att_key("gqa", 300, **LLAMA70)),
            Component("MoE tiny", partial(fm.fused_moe_runner, MoeKey(1, 2, 8, 2, 256, 128, "bf16", 0), rotate=True)),
        ]
    out = []
    for context, schemes in ((4096, ("radix8-carry", "half16-ticket")), (65536, FUSED), (131072, FUSED)):
        for scheme in schemes:
            key = att_key("mla+dsa", context, **GLM5)
            variant = AttentionVariant(dsa_scheme=scheme)
            out.append(attention_component(f"GLM-5 TP8 MLA+DSA {context} {scheme}", key, variant))
    for chunks in (0.5, 2.0):  # the selecting split's chunks per SM beside the default (1)
        variant = AttentionVariant(dsa_scheme="radix8-fused", dsa_chunks_per_sm=chunks)
        out.append(
            attention_component(
                f"GLM-5 TP8 MLA+DSA 131072 radix8-fused {chunks:g} chunks per SM",
                att_key("mla+dsa", 131072, **GLM5),
                variant,
            )
        )
    if sweep:
        for config in mla.SWEEP[1:]:  # the sparse MLA's launch shapes after the top-k (the default is SWEEP[0])
            variant = AttentionVariant(dsa_scheme="radix8-carry", dsa_mla=config)
            label = f"GLM-5 TP8 MLA+DSA 131072 radix8-carry sparse {config.label}"
            out.append(attention_component(label, att_key("mla+dsa", 131072, **GLM5), variant))
    for context in (32768, 131072):
        out.append(attention_component(f"Llama-70B GQA fp8 {context}", att_key("gqa", context, **LLAMA70)))
    out.append(attention_component("DeepSeek-V3 TP8 MLA 131072", att_key("mla", 131072, heads=16)))
    moe = {
        "MoE DeepSeek-V3 TP8": MoeKey(1, 8, 256, 8, 7168, 256, "bf16", 0),
        "MoE Mixtral-8x7B TP2": MoeKey(1, 2, 8, 2, 4096, 7168, "bf16", 0),
        "MoE Qwen3-235B-A22B TP1": MoeKey(1, 8, 128, 8, 4096, 1536, "bf16", 0),
    }
    out += [Component(label, partial(fm.fused_moe_runner, key, rotate=True)) for label, key in moe.items()]
    return out


def kernel_records(prof: Any) -> list[tuple[str, float, float]]:
    """(name, start µs, duration µs) of every GPU kernel the profiler saw, in start order."""
    recs = []
    for ev in prof.events():
        kind = str(getattr(ev, "device_type", ""))
        if "CUDA" not in kind or ev.name.startswith(("Memcpy", "Memset", "cudaGraph")):
            continue
        start = float(ev.time_range.start)
        recs.append((ev.name, start, float(ev.time_range.end) - start))
    return sorted(recs, key=lambda r: r[1])


def split_calls(recs: list[tuple[str, float, float]], calls: int) -> list[list[tuple[str, float, float]]]:
    """The records cut into calls: each call launches the same number of kernels."""
    per = len(recs) // calls if calls else 0
    if per == 0 or per * calls != len(recs):
        raise RuntimeError(f"{len(recs)} kernel records do not split into {calls} calls of one count")
    return [recs[i * per : (i + 1) * per] for i in range(calls)]


def profile(runner: OpRunner, calls: int) -> dict[str, Any]:
    """The kernels of one call (launch order): mean device µs each; busy, span and gaps µs per call."""
    ops = max(runner.rotation, calls // max(1, runner.rotation) * max(1, runner.rotation))
    graph = capture_graph(runner.fn, ops, warmup=2)
    graph.replay()
    torch.cuda.synchronize()
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts) as prof:
        graph.replay()
        torch.cuda.synchronize()
    graph.reset()
    per_call = split_calls(kernel_records(prof), ops)[1:]  # the first call waits on the replay's launch
    names = [name for name, _, _ in per_call[0]]
    kernels = [
        {
            "kernel": name[:90],
            "us": statistics.median(call[i][2] for call in per_call),
            "max_us": max(call[i][2] for call in per_call),
            "start_us": statistics.median(call[i][1] - call[0][1] for call in per_call),
            "end_us": statistics.median(call[i][1] + call[i][2] - call[0][1] for call in per_call),
        }
        for i, name in enumerate(names)
    ]
    busy = [sum(d for _, _, d in call) for call in per_call]
    span = [call[-1][1] + call[-1][2] - call[0][1] for call in per_call]
    starts = [call[0][1] for call in per_call]
    period = statistics.median(b - a for a, b in itertools.pairwise(starts)) if len(starts) > 1 else 0.0
    return {
        "kernels": kernels,
        "busy_us": statistics.median(busy),
        "span_us": statistics.median(span),
        "period_us": period,
        "periods_us": [round(b - a, 2) for a, b in itertools.pairwise(starts)],
        "gaps_us": statistics.median(s - b for s, b in zip(span, busy, strict=True)),
        "calls": len(per_call),
    }


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| component | kernel | µs (max) | from → to µs in the call |", "|---|---|---|---|"]
    for row in rows:
        if "error" in row:
            lines.append(f"| {row['component']} | error: {row['error'][:80]} | | |")
            continue
        for k in row["kernels"]:
            when = f"{k['start_us']:.1f} → {k['end_us']:.1f}"
            lines.append(f"| {row['component']} | {k['kernel'][:60]} | {k['us']:.2f} ({k['max_us']:.1f}) | {when} |")
        lines.append(
            f"| {row['component']} | busy / span / period a call (gaps) | {row['busy_us']:.1f} / {row['span_us']:.1f}"
            f" / {row['period_us']:.1f} ({row['gaps_us']:+.1f}) | |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path, required=True, help="write the rows here as each component finishes")
    ap.add_argument("--only", default="", help="comma-separated parts of component labels: only those")
    ap.add_argument("--calls", type=int, default=CALLS, help=f"calls in the profiled graph (default {CALLS})")
    ap.add_argument("--sweep", action="store_true", help="also the sparse MLA's launch shapes at 128K")
    ap.add_argument("--smoke", action="store_true", help="CPU tensors under TRITON_INTERPRET=1: the paths only")
    args = ap.parse_args(argv)
    only = tuple(filter(None, args.only.split(",")))
    device = torch.device("cpu") if args.smoke else torch.device("cuda", 0)
    ctx = ProbeContext(rank=0, world_size=1, device=device, backend="gloo" if args.smoke else "nccl")
    rows: list[dict[str, Any]] = []
    for comp in components(args.smoke, args.sweep):
        if only and not any(part in comp.label for part in only):
            continue
        row: dict[str, Any] = {"component": comp.label}
        try:
            runner = comp.build(ctx)
            row["kernel_class"] = runner.kernel.text if runner.kernel else ""
            row["note"] = runner.note
            if args.smoke:
                runner.fn()
                row.update(kernels=[], busy_us=0.0, span_us=0.0, period_us=0.0, gaps_us=0.0, calls=0)
            else:
                row.update(profile(runner, args.calls))
        except Exception as exc:
            row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
            traceback.print_exc()
        if device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
        rows.append(row)
        print(json.dumps(row), flush=True)
        args.json.write_text(json.dumps({"rows": rows}, indent=1))
    print(table(rows))
    return 0 if all("error" not in r for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
