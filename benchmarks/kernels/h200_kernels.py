"""decodetop's kernels on one GPU, in one call: every Triton kernel checked against its torch form at real shapes,
then each component timed under CUDA-graph replay (the probe's own runners and timer: `time_runner`, inputs
rotated above 2× L2) beside the torch form, with the bytes each must move and the roofline (bytes / measured copy
bandwidth). Prints a short table last and writes everything to --json as each section finishes.

Sections: copy bandwidth; MLA + DSA attention at GLM-5's TP-8 shard (8 heads, index top-k 2048) over contexts
0–128K; dense MLA at DeepSeek-V3's TP-8 (16 heads) and TP-1 (128 heads) shards; GQA at Llama-3.1-70B's shard with
BF16 and FP8 KV; fused residual-add + RMSNorm and RMSNorm at hidden 4096–8192; fused rope + KV write; the fused-MoE
kernel with its tiles tuned per shape (Mixtral-8x7B, Qwen3-235B-A22B, Qwen3-30B-A3B, DeepSeek-V3 TP 8) against the
default tiles.

    NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 \
        PYTHONPATH=src python3 benchmarks/kernels/h200_kernels.py --json $OUT/kernels.json
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "probes"))

from decodetop.budget.keys import AttentionKey, MoeKey  # noqa: E402
from decodetop.probes.worker import attention  # noqa: E402
from decodetop.probes.worker import fused_moe as fm  # noqa: E402
from decodetop.probes.worker.context import ProbeContext  # noqa: E402
from decodetop.probes.worker.kernels import norms as fnorms  # noqa: E402
from decodetop.probes.worker.kernels import rope as frope  # noqa: E402
from decodetop.probes.worker.ops import OpRunner, time_runner  # noqa: E402
from decodetop.probes.worker.timing import time_events  # noqa: E402

CONTEXTS = (0, 4096, 16384, 32768, 65536, 131072)
BUDGET_MS = 60.0
SAMPLES = 40
#: --smoke: CPU tensors under Triton's interpreter, tiny contexts and experts (the script's own paths, not timings).
SMOKE = False


def dev() -> torch.device:
    return torch.device("cpu") if SMOKE else torch.device("cuda", 0)


def ctx() -> ProbeContext:
    return ProbeContext(rank=0, world_size=1, device=dev(), backend="gloo" if SMOKE else "nccl")


def contexts(full: tuple[int, ...]) -> tuple[int, ...]:
    return (0, 300) if SMOKE else full


def copy_gbps() -> float:
    """Device-to-device copy of 1 GiB, bytes read + written over the median time."""
    if SMOKE:
        return 1.0
    src = torch.empty(1 << 29, dtype=torch.float16, device="cuda").normal_()
    dst = torch.empty_like(src)
    us = statistics.median(time_events(lambda: dst.copy_(src), 5, 10, warmup=3))
    return 2 * src.numel() * 2 / us / 1e3


def timed(runner: OpRunner) -> dict[str, Any]:
    t = time_runner(ctx(), runner, budget_ms=BUDGET_MS, max_samples=SAMPLES)
    med = t.median_us
    return {
        "us": med,
        "p10_us": sorted(t.samples)[len(t.samples) // 10],
        "p90_us": sorted(t.samples)[len(t.samples) * 9 // 10],
        "method": t.method,
        "moved_bytes": runner.moved_bytes,
        "kv_bytes": runner.kv_bytes,
        "weight_bytes": runner.weight_bytes,
        "gbps": runner.moved_bytes / med / 1e3 if med else 0.0,
        "kernel": runner.kernel.text if runner.kernel else "",
        "note": runner.note,
    }


def free() -> None:
    if not SMOKE:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def att_key(kind: str, context: int, **kw: Any) -> AttentionKey:
    base: dict[str, Any] = {
        "kind": kind,
        "batch": 1,
        "q_len": 1,
        "context": context,
        "heads": 8,
        "kv_heads": 1,
        "head_dim": 576,
        "v_head_dim": 512,
        "kv_lora_rank": 512,
        "rope_dim": 64,
        "index_heads": 0,
        "index_head_dim": 0,
        "index_topk": 0,
        "window": 0,
        "kv_dtype": "bf16",
    }
    base.update(kw)
    return AttentionKey(**base)


def attention_rows(copy: float, out: dict[str, Any]) -> list[dict[str, Any]]:
    """Each attention shape at each context: the best kernel (Triton here) and the torch form."""
    rows: list[dict[str, Any]] = []
    glm = {"index_heads": 32, "index_head_dim": 128, "index_topk": 2048}
    shapes: list[tuple[str, str, dict[str, Any], tuple[int, ...]]] = [
        ("GLM-5 TP8 MLA+DSA", "mla+dsa", {"heads": 8, **glm}, contexts(CONTEXTS)),
        ("DeepSeek-V3 TP8 MLA", "mla", {"heads": 16}, contexts(CONTEXTS)),
        ("DeepSeek-V3 TP1 MLA", "mla", {"heads": 128}, contexts((4096, 32768, 131072))),
        (
            "Llama-70B GQA bf16",
            "gqa",
            {"heads": 64, "kv_heads": 8, "head_dim": 128, "v_head_dim": 128},
            contexts(CONTEXTS),
        ),
        (
            "Llama-70B GQA fp8",
            "gqa",
            {"heads": 64, "kv_heads": 8, "head_dim": 128, "v_head_dim": 128, "kv_dtype": "fp8"},
            contexts(CONTEXTS),
        ),
        (
            "Llama-70B GQA fp8 b8",
            "gqa",
            {"batch": 8, "heads": 64, "kv_heads": 8, "head_dim": 128, "v_head_dim": 128, "kv_dtype": "fp8"},
            contexts((4096, 32768)),
        ),
    ]
    torch_at = {0, 300, 4096, 32768, 131072}
    for label, kind, kw, ctxs in shapes:
        for context in ctxs:
            key = att_key(kind, context, **kw)
            row: dict[str, Any] = {"component": label, "context": context}
            try:
                best = attention.attention_runner(key, ctx(), rotate=True)
                row.update(timed(best))
                del best
                free()
                if context in torch_at and not (kind == "mla" and kw["heads"] == 128):
                    length = context + 1
                    slow = attention.torch_attention_runner(key, ctx(), length, rotate=True)
                    row["torch_us"] = timed(slow)["us"]
                    del slow
            except Exception as exc:
                row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
                traceback.print_exc()
            free()
            if "us" in row:
                row["roofline_us"] = row["moved_bytes"] / copy / 1e3
                row["copy_pct"] = 100 * row["gbps"] / copy
            rows.append(row)
            print(json.dumps(row), flush=True)
            out["attention"] = rows
    return rows


def norm_rows(out: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for width in (4096, 5120, 6144, 7168, 8192):
        for add in (True, False):
            x = torch.randn(1, width, device=dev()).to(torch.bfloat16)
            r = torch.randn(1, width, device=dev()).to(torch.bfloat16)
            w = torch.randn(width, device=dev()).to(torch.bfloat16)
            o, ro = torch.empty_like(x), torch.empty_like(x)
            res = r if add else None
            fused = OpRunner(
                lambda x=x, w=w, res=res, o=o, ro=ro: fnorms.rmsnorm(x, w, 1e-6, residual=res, out=o, residual_out=ro),
                4 * width * 2,
                0.0,
            )
            slow = OpRunner(
                lambda x=x, w=w, res=res: fnorms.reference_rmsnorm(x, w, 1e-6, residual=res), 4 * width * 2, 0.0
            )
            row: dict[str, Any] = {"component": "add_rmsnorm" if add else "rmsnorm", "width": width}
            try:
                row["us"] = timed(fused)["us"]
                row["torch_us"] = timed(slow)["us"]
            except Exception as exc:
                row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
                traceback.print_exc()
            rows.append(row)
            print(json.dumps(row), flush=True)
    out["norms"] = rows
    return rows


def rope_rows(out: dict[str, Any]) -> list[dict[str, Any]]:
    """Fused rope + KV write, one token: Llama-70B TP1 (64 q / 8 kv heads × 128, BF16 and FP8 cache), GLM-5 TP8
    MLA (8 q_pe heads × 64, one latent row of 576 with rope on its last 64)."""
    rows = []
    d = dev()
    shapes = [
        ("rope+KV write Llama-70B bf16", 64, 128, 8, 128, 128, 128, 0, 0, torch.bfloat16),
        ("rope+KV write Llama-70B fp8", 64, 128, 8, 128, 128, 128, 0, 0, torch.float8_e4m3fn),
        ("rope+KV write GLM-5 TP8 MLA", 8, 64, 1, 576, 0, 64, 0, 512, torch.bfloat16),
    ]
    for label, hq, qd, hkv, kd, vd, rot, offq, offk, dtype in shapes:
        slots_n = 65536
        q = torch.randn(1, hq, qd, device=d).to(torch.bfloat16)
        k = torch.randn(1, hkv, kd, device=d).to(torch.bfloat16)
        v = torch.randn(1, hkv, vd, device=d).to(torch.bfloat16) if vd else None
        cos, sin = torch.rand(8192, rot // 2, device=d), torch.rand(8192, rot // 2, device=d)
        pos = torch.tensor([4000], device=d)
        slots = torch.tensor([12345], device=d)
        kc = torch.zeros(slots_n, hkv, kd, device=d).to(dtype)
        vc = torch.zeros(slots_n, hkv, vd, device=d).to(dtype) if vd else None
        sc = torch.tensor([0.05, 0.05], device=d) if dtype == torch.float8_e4m3fn else None
        spec = frope.RopeSpec(rot, offq, offk)

        def fused(q=q, k=k, v=v, cos=cos, sin=sin, pos=pos, slots=slots, kc=kc, vc=vc, sc=sc, spec=spec) -> None:  # noqa: PLR0917
            frope.rope_kv_write(
                q, k, v, rope=spec, cos=cos, sin=sin, positions=pos, slots=slots, k_cache=kc, v_cache=vc, scales=sc
            )

        def slow(q=q, k=k, v=v, cos=cos, sin=sin, pos=pos, slots=slots, kc=kc, vc=vc, sc=sc, spec=spec) -> None:  # noqa: PLR0917
            frope.reference_rope_kv_write(q, k, v, spec, cos, sin, pos, slots, kc, vc, sc)

        moved = q.numel() * 4 + k.numel() * 3 + (v.numel() * 3 if v is not None else 0)
        row: dict[str, Any] = {"component": label}
        try:
            row["us"] = timed(OpRunner(fused, moved, 0.0))["us"]
            row["torch_us"] = timed(OpRunner(slow, moved, 0.0))["us"]
        except Exception as exc:
            row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
            traceback.print_exc()
        rows.append(row)
        print(json.dumps(row), flush=True)
    out["rope"] = rows
    return rows


def moe_rows(copy: float, out: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    shapes = [
        ("Mixtral-8x7B TP1", MoeKey(1, 2, 8, 2, 4096, 14336, "bf16", 0)),
        ("Qwen3-235B-A22B TP1", MoeKey(1, 8, 128, 8, 4096, 1536, "bf16", 0)),
        ("Qwen3-30B-A3B TP1", MoeKey(1, 8, 128, 8, 2048, 768, "bf16", 0)),
        ("DeepSeek-V3 TP8", MoeKey(1, 8, 256, 8, 7168, 256, "bf16", 0)),
        ("DeepSeek-V3 TP8 fp8", MoeKey(1, 8, 256, 8, 7168, 256, "fp8", 0)),
        ("Mixtral-8x7B TP2", MoeKey(1, 2, 8, 2, 4096, 7168, "bf16", 0)),
    ]
    if SMOKE:
        shapes = [("tiny", MoeKey(1, 2, 8, 2, 256, 128, "bf16", 0))]
    for label, key in shapes:
        row: dict[str, Any] = {"component": label, "weight_mib": 0.0}
        try:
            t0 = time.time()
            tuned = fm.fused_moe_runner(key, ctx(), rotate=True)
            row["tune_s"] = time.time() - t0
            row.update(timed(tuned))
            del tuned
            free()
            default_tiles = fm._moe_tensors
            experts, bufs, w_bytes = default_tiles(key, ctx(), rotate=True)

            def dflt(experts=experts, bufs=bufs) -> torch.Tensor:
                w13, w2 = experts.next()
                return fm.fused_moe(bufs.x, w13, w2, bufs.ids, bufs.wts, act=bufs.act, ys=bufs.ys, out=bufs.out)

            row["default_tiles_us"] = timed(OpRunner(dflt, w_bytes, 0.0, len(experts)))["us"]
            row["weight_mib"] = w_bytes / 2**20
            row["copy_pct"] = 100 * (w_bytes / row["us"] / 1e3) / copy
            del experts, bufs
        except Exception as exc:
            row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
            traceback.print_exc()
        free()
        rows.append(row)
        print(json.dumps(row), flush=True)
        out["moe"] = rows
    return rows


def checks(out: dict[str, Any], *, big: bool) -> None:
    import kernel_checks

    results = {}
    for name, fn in kernel_checks.CHECKS.items():
        try:
            torch.manual_seed(sum(map(ord, name)))
            fn(big)
            results[name] = "ok"
        except Exception as exc:
            results[name] = f"FAILED {type(exc).__name__}: {str(exc)[:300]}"
            traceback.print_exc()
        print(f"check {name}: {results[name]}", flush=True)
        free()
    out["checks"] = results


def table(out: dict[str, Any], copy: float) -> str:
    lines = [f"copy bandwidth {copy:.0f} GB/s; checks: {out.get('checks')}"]

    def f(v: Any, nd: int = 1) -> str:
        return "-" if v is None else (f"{v:.{nd}f}" if isinstance(v, float) else str(v))

    lines.append("component                      ctx      µs   torch µs  roofline µs  %copy  kernel")
    for r in out.get("attention", []):
        lines.append(
            f"{r['component']:<28} {r['context']:>7} {f(r.get('us')):>7} {f(r.get('torch_us')):>9} "
            f"{f(r.get('roofline_us')):>11} {f(r.get('copy_pct'), 0):>5}  {r.get('error', r.get('kernel', ''))[:60]}"
        )
    for r in out.get("norms", []) + out.get("rope", []):
        lines.append(
            f"{r['component']:<28} {r.get('width', ''):>7} {f(r.get('us'), 2):>7} {f(r.get('torch_us'), 2):>9} "
            f"{r.get('error', '')[:60]}"
        )
    for r in out.get("moe", []):
        lines.append(
            f"{r['component']:<28} {f(r.get('weight_mib'), 0):>5}MiB {f(r.get('us')):>7} "
            f"default {f(r.get('default_tiles_us'))} {f(r.get('copy_pct'), 0)}% "
            f"{r.get('error', r.get('note', ''))[-80:]}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path, required=True)
    ap.add_argument("--skip", default="", help="comma-separated sections to skip: checks,attention,norms,rope,moe")
    ap.add_argument("--smoke", action="store_true", help="CPU tensors under TRITON_INTERPRET=1, tiny shapes")
    args = ap.parse_args(argv)
    global SMOKE
    SMOKE = args.smoke
    skip = set(filter(None, args.skip.split(",")))
    out: dict[str, Any] = {
        "gpu": "CPU (smoke)" if SMOKE else torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "triton": __import__("triton").__version__,
    }
    copy = copy_gbps()
    out["copy_gbps"] = copy
    print(f"copy {copy:.0f} GB/s", flush=True)
    sections: list[tuple[str, Callable[[], object]]] = [
        ("checks", lambda: checks(out, big=not SMOKE)),
        ("norms", lambda: norm_rows(out)),
        ("rope", lambda: rope_rows(out)),
        ("attention", lambda: attention_rows(copy, out)),
        ("moe", lambda: moe_rows(copy, out)),
    ]
    for name, run in sections:
        if name in skip:
            continue
        t0 = time.time()
        try:
            run()
        except Exception as exc:
            out[f"{name}_error"] = f"{type(exc).__name__}: {exc}"
            traceback.print_exc()
        out[f"{name}_s"] = time.time() - t0
        args.json.write_text(json.dumps(out, indent=1, default=str))
    print(table(out, copy))
    return 0 if math.isfinite(copy) else 1


if __name__ == "__main__":
    sys.exit(main())
