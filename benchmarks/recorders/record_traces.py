"""Record real decode-step profiler traces of a small random-weight transformers model (the trace fixtures).

Runs on the GPU machine (python3.12, torch 2.11, transformers 5.x, no network) and on a CPU (CPU traces). Each
variant runs a few unprofiled warm-up decode steps, then `--steps` decode steps under torch.profiler with one
`ProfilerStep#N` range per step, and writes a trimmed, gzipped Chrome trace:

- `eager`: plain eager decode with the default dynamic KV cache (host-bound on a small model: GPU idle in the step).
- `eager_planted`: the same plus a planted fault: every step, each attention layer casts a whole FP8 copy of a
  KV cache to BF16 inside `record_function("attention")`, the way a misconfigured engine dequantises its cache.
- `graph`, `graph_planted`: the decode step captured once in a CUDA graph (static KV cache) and replayed
  (CUDA only). If capturing the transformers forward fails, a hand-written decode over the same weights is captured
  instead and the summary says so.
- `tp2_allreduce` (with 2+ GPUs): two ranks run a toy tensor-parallel layer stack with NCCL all-reduces, eager.

Trimming keeps the profiled steps only, drops python_function events other than `nn.Module: ...` frames, and drops
bulky args (strides, concrete inputs); every kept event is as the profiler wrote it otherwise.

    python3 benchmarks/recorders/record_traces.py --out DIR [--steps 4] \
        [--variants eager,eager_planted,graph,graph_planted]
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile, record_function, schedule

# Args kept by the trimmer: correlation/external ids link launches to kernels; dims give GEMM shapes.
KEEP_ARGS = {
    "External id",
    "correlation",
    "device",
    "stream",
    "Input Dims",
    "Input type",
    "grid",
    "block",
    "bytes",
    "memory bandwidth (GB/s)",
    "context",
    "cbid",
}


def log(msg: str) -> None:
    """Progress line on stderr with a timestamp (the GPU run's log comes back under $OUT)."""
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def model_config(on_cuda: bool) -> Any:
    """A few-layer Llama config: big enough on a GPU for real GEMM kernels, tiny on a CPU."""
    from transformers import LlamaConfig

    if on_cuda:
        return LlamaConfig(
            vocab_size=32000,
            hidden_size=2048,
            intermediate_size=5632,
            num_hidden_layers=4,
            num_attention_heads=16,
            num_key_value_heads=8,
            max_position_embeddings=4096,
        )
    return LlamaConfig(
        vocab_size=1024,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
    )


def capture_step_graph(step: Callable[[], Any]) -> Any:
    """A CUDA graph of one decode step: warmed up on a side stream (as torch's graph docs ask), captured, replayed
    once and synchronised. Call inside `torch.inference_mode()`."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    graph.replay()
    torch.cuda.synchronize()
    return graph


def build_model(on_cuda: bool) -> Any:
    """Random weights from the config (no download): bf16 on a GPU, float32 on a CPU."""
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    cfg = model_config(on_cuda)
    cfg._attn_implementation = "sdpa"
    model = LlamaForCausalLM(cfg).eval()
    if on_cuda:
        model = model.to(device="cuda", dtype=torch.bfloat16)
    return model


def plant_cast(model: Any, on_cuda: bool) -> list[Any]:
    """Forward pre-hooks that cast a whole FP8 KV cache copy to BF16 in each attention layer, every step."""
    cfg = model.config
    head_dim = cfg.hidden_size // cfg.num_attention_heads
    # 32k tokens of FP8 K and V per layer on a GPU (64 MiB read, 128 MiB written per layer and step): the size of
    # a long-context cache, so the cast dominates the step the way a real one does. 4k tokens on a CPU.
    tokens = 32768 if on_cuda else 4096
    device = "cuda" if on_cuda else "cpu"
    caches = [
        torch.randn(2, 1, cfg.num_key_value_heads, tokens, head_dim, device=device).to(torch.float8_e4m3fn)
        for _ in range(cfg.num_hidden_layers)
    ]
    hooks = []
    for idx, layer in enumerate(model.model.layers):
        cache = caches[idx]

        def hook(_module: Any, _args: Any, cache: torch.Tensor = cache) -> None:
            with record_function("attention"):
                cache.to(torch.bfloat16)

        hooks.append(layer.self_attn.register_forward_pre_hook(hook))
    return hooks


def profiler(on_cuda: bool, steps: int, out_json: Path) -> profile:
    """torch.profiler with one ProfilerStep per decode step; exports the Chrome trace when the steps are done."""
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_cuda else [])
    return profile(
        activities=activities,
        record_shapes=True,
        with_stack=True,
        with_modules=True,
        schedule=schedule(wait=1, warmup=1, active=steps, repeat=1),
        on_trace_ready=lambda p: p.export_chrome_trace(str(out_json)),
    )


def run_eager(model: Any, steps: int, out_json: Path, on_cuda: bool) -> dict[str, Any]:
    """Prefill a prompt, then greedy decode with the dynamic cache: 2 steps to warm up, then profiled steps."""
    device = "cuda" if on_cuda else "cpu"
    prompt = torch.randint(0, model.config.vocab_size, (1, 64 if on_cuda else 16), device=device)
    with torch.inference_mode():
        out = model(prompt, use_cache=True)
        past = out.past_key_values
        tok = out.logits[:, -1].argmax(-1, keepdim=True)
        for _ in range(2):
            out = model(tok, past_key_values=past, use_cache=True)
            past, tok = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)
        if on_cuda:
            torch.cuda.synchronize()
        with profiler(on_cuda, steps, out_json) as prof:
            for _ in range(steps + 2):
                out = model(tok, past_key_values=past, use_cache=True)
                past, tok = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)
                if on_cuda:
                    torch.cuda.synchronize()
                prof.step()
    return {"mode": "eager, transformers forward, dynamic cache"}


def _static_transformers_step(
    model: Any, max_len: int, device: str = "cuda"
) -> tuple[Callable[[], torch.Tensor], Callable[[int], None]]:
    """A graph-safe decode step through the transformers forward with a StaticCache and static inputs."""
    from transformers import StaticCache

    cfg = model.config
    cache = StaticCache(config=cfg, max_cache_len=max_len)
    prompt_len = 64
    prompt = torch.randint(0, cfg.vocab_size, (1, prompt_len), device=device)
    with torch.inference_mode():
        model(prompt, past_key_values=cache, use_cache=True, position_ids=torch.arange(prompt_len, device=device)[None])
    tok = torch.zeros(1, 1, dtype=torch.long, device=device)
    pos = torch.full((1, 1), prompt_len, dtype=torch.long, device=device)
    cache_pos = torch.full((1,), prompt_len, dtype=torch.long, device=device)

    def step() -> torch.Tensor:
        kwargs: dict[str, Any] = {"past_key_values": cache, "use_cache": True, "position_ids": pos}
        if "cache_position" in _forward_params(model):
            kwargs["cache_position"] = cache_pos
        out = model(tok, **kwargs)
        nxt = out.logits[:, -1].argmax(-1, keepdim=True)
        tok.copy_(nxt)
        return nxt

    def advance(_i: int) -> None:
        pos.add_(1)
        cache_pos.add_(1)

    return step, advance


def _forward_params(model: Any) -> set[str]:
    import inspect

    return set(inspect.signature(model.forward).parameters)


def _static_manual_step(
    model: Any, max_len: int, device: str = "cuda"
) -> tuple[Callable[[], torch.Tensor], Callable[[int], None]]:
    """Fallback: a hand-written decode step over the same model's weights with a static KV cache (graph-safe)."""
    import torch.nn.functional as F  # noqa: N812

    cfg = model.config
    layers = model.model.layers
    n_kv, n_q = cfg.num_key_value_heads, cfg.num_attention_heads
    hd = cfg.hidden_size // n_q
    kcache = [torch.zeros(1, n_kv, max_len, hd, device=device, dtype=model.dtype) for _ in layers]
    vcache = [torch.zeros_like(k) for k in kcache]
    tok = torch.zeros(1, 1, dtype=torch.long, device=device)
    pos = torch.full((1,), 64, dtype=torch.long, device=device)
    mask = torch.zeros(1, 1, 1, max_len, dtype=torch.bool, device=device)
    mask[..., :65] = True
    rotary = model.model.rotary_emb

    def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        half = x.shape[-1] // 2
        rot = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
        return x * cos + rot * sin

    def step() -> torch.Tensor:
        h = model.model.embed_tokens(tok)
        cos, sin = rotary(h, pos[None])
        cos, sin = cos[:, None], sin[:, None]
        for i, layer in enumerate(layers):
            a = layer.self_attn
            for pre_hook in a._forward_pre_hooks.values():  # the planted cast, when present
                pre_hook(a, ())
            x = layer.input_layernorm(h)
            with record_function("attention"):
                q = a.q_proj(x).view(1, 1, n_q, hd).transpose(1, 2)
                k = a.k_proj(x).view(1, 1, n_kv, hd).transpose(1, 2)
                v = a.v_proj(x).view(1, 1, n_kv, hd).transpose(1, 2)
                q, k = rope(q, cos, sin), rope(k, cos, sin)
                kcache[i].index_copy_(2, pos, k)
                vcache[i].index_copy_(2, pos, v)
                o = F.scaled_dot_product_attention(q, kcache[i], vcache[i], attn_mask=mask, enable_gqa=True)
                h = h + a.o_proj(o.transpose(1, 2).reshape(1, 1, -1))
            h = h + layer.mlp(layer.post_attention_layernorm(h))
        logits = model.lm_head(model.model.norm(h))
        nxt = logits[:, -1].argmax(-1, keepdim=True)
        tok.copy_(nxt)
        return nxt

    def advance(i: int) -> None:
        pos.add_(1)
        mask[..., 65 + i] = True

    return step, advance


def run_graph(model: Any, steps: int, out_json: Path) -> dict[str, Any]:
    """Capture one decode step in a CUDA graph and replay it under the profiler; fall back as the docstring says."""
    max_len = 1024
    info: dict[str, Any] = {}
    graph = None
    advance: Callable[[int], None] = lambda _i: None  # noqa: E731
    for name, make in (
        ("transformers forward, StaticCache", _static_transformers_step),
        ("manual", _static_manual_step),
    ):
        try:
            with torch.inference_mode():
                step, advance = make(model, max_len)
                graph = capture_step_graph(step)
            info["mode"] = f"cuda graph replay, {name}"
            break
        except Exception as exc:
            info[f"capture failed ({name})"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
            log(f"graph capture with {name} failed: {exc!r}"[:500])
            graph = None
            torch.cuda.synchronize()
    if graph is None:
        raise RuntimeError(f"no graph could be captured: {info}")
    with torch.inference_mode(), profiler(True, steps, out_json) as prof:
        for i in range(steps + 2):
            graph.replay()
            advance(i)
            torch.cuda.synchronize()
            prof.step()
    return info


def trim(src: Path, dst: Path) -> dict[str, Any]:
    """Keep the profiled steps and the events the reader needs; gzip with compact separators."""
    data = json.loads(src.read_text())
    events = data.get("traceEvents", [])
    steps = [e for e in events if str(e.get("name", "")).startswith("ProfilerStep#") and e.get("ph") == "X"]
    kept = []
    for e in events:
        cat = e.get("cat")
        if cat == "python_function" and not str(e.get("name", "")).startswith("nn.Module:"):
            continue
        if isinstance(e.get("args"), dict):
            e["args"] = {k: v for k, v in e["args"].items() if k in KEEP_ARGS}
            if not e["args"]:
                del e["args"]
        kept.append(e)
    data["traceEvents"] = kept
    raw = json.dumps(data, separators=(",", ":")).encode()
    dst.write_bytes(gzip.compress(raw, 9))
    return {"events": len(kept), "steps": len(steps), "raw_bytes": len(raw), "gz_bytes": dst.stat().st_size}


def tp2_worker(rank: int, out_dir: str, steps: int) -> None:
    """One rank of a toy TP=2 decode: per layer a column GEMM, a row GEMM and an NCCL all-reduce, eager."""
    import torch.distributed as dist

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29531")
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=2, device_id=torch.device("cuda", rank))
    hidden, inter, layers = 4096, 14336 // 2, 4  # Llama-3-8B-like widths split over 2 ranks
    w_up = [torch.randn(hidden, inter, device="cuda", dtype=torch.bfloat16) * 0.01 for _ in range(layers)]
    w_down = [torch.randn(inter, hidden, device="cuda", dtype=torch.bfloat16) * 0.01 for _ in range(layers)]
    x = torch.randn(1, hidden, device="cuda", dtype=torch.bfloat16)

    def step() -> None:
        h = x
        for i in range(layers):
            with record_function("mlp"):
                h = torch.nn.functional.silu(h @ w_up[i]) @ w_down[i]
            dist.all_reduce(h)

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    out_json = Path(out_dir) / f"tp2_rank{rank}.json"
    with profiler(True, steps, out_json) as prof:
        for _ in range(steps + 2):
            step()
            torch.cuda.synchronize()
            prof.step()
    dist.barrier()
    # No destroy_process_group: docs/reference/h200-machine.md saw it hang; the parent joins with a deadline.
    os._exit(0)


def main() -> int:
    """Record each requested variant; write trimmed traces and summary.json to --out."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--variants", default="eager,eager_planted,graph,graph_planted,tp2_allreduce")
    ap.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    args = ap.parse_args()
    on_cuda = torch.cuda.is_available() if args.device == "auto" else args.device == "cuda"
    args.out.mkdir(parents=True, exist_ok=True)
    tag = "h200" if on_cuda else "cpu"
    summary: dict[str, Any] = {
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(0) if on_cuda else "cpu",
        "steps": args.steps,
        "variants": {},
    }
    with contextlib.suppress(Exception):
        import transformers

        summary["transformers"] = transformers.__version__
    for variant in args.variants.split(","):
        t0 = time.time()
        raw = args.out / f"raw_{variant}.json"
        entry: dict[str, Any] = {}
        try:
            if variant == "tp2_allreduce":
                if not on_cuda or torch.cuda.device_count() < 2:
                    entry["skipped"] = "needs 2 GPUs"
                    summary["variants"][variant] = entry
                    continue
                import torch.multiprocessing as mp

                ctx = mp.get_context("spawn")
                procs = [ctx.Process(target=tp2_worker, args=(r, str(args.out), args.steps)) for r in (0, 1)]
                for p in procs:
                    p.start()
                for p in procs:
                    p.join(timeout=90)
                    if p.is_alive():
                        p.kill()
                raw = args.out / "tp2_rank0.json"
                entry["mode"] = "eager, 2 ranks, NCCL all-reduce per layer"
            else:
                if variant.startswith("graph") and not on_cuda:
                    entry["skipped"] = "CUDA graphs need a GPU"
                    summary["variants"][variant] = entry
                    continue
                model = build_model(on_cuda)
                hooks = plant_cast(model, on_cuda) if variant.endswith("_planted") else []
                if variant.startswith("graph"):
                    entry.update(run_graph(model, args.steps, raw))
                else:
                    entry.update(run_eager(model, args.steps, raw, on_cuda))
                for h in hooks:
                    h.remove()
                del model
                if on_cuda:
                    torch.cuda.empty_cache()
            dst = args.out / f"{tag}_{variant}.trace.json.gz"
            entry.update(trim(raw, dst))
            entry["file"] = dst.name
        except Exception as exc:
            entry["error"] = f"{type(exc).__name__}: {exc}"[:500]
            log(traceback.format_exc())
        finally:
            for leftover in args.out.glob("*.json"):
                if leftover.name != "summary.json":
                    leftover.unlink()
        entry["seconds"] = round(time.time() - t0, 1)
        summary["variants"][variant] = entry
        log(f"{variant}: {entry}")
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
