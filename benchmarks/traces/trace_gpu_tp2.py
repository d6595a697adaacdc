"""Trace a real eager and a real CUDA-graph decode step of a small transformers Llama on 2 GPUs (TP 2, one trace per
rank, torch.profiler), the way a serving engine's profiler writes them, for `decodetop trace DIR` and `--trace DIR`.

No network there: the model is built from a config with random weights (seed 0, identical on both ranks), then
tensor-parallel by hand the way engines shard a Llama layer: q/k/v and gate/up split by columns (each rank owns half
the heads and half the MLP), o_proj and down_proj by rows with an NCCL all-reduce of their output (a forward hook),
embeddings, norms and lm_head replicated. Eager decode uses the dynamic cache; graph mode captures one decode step
(transformers forward, StaticCache, the all-reduces inside the graph) and replays it. Neither syncs inside a step,
so a ProfilerStep host range ends when the launch returns, as in a server.

    torchrun --nproc-per-node 2 benchmarks/traces/trace_gpu_tp2.py --out DIR [--steps 6] [--modes eager,graph]
    python3 benchmarks/traces/trace_gpu_tp2.py --out DIR --device cpu --modes eager   # 2 gloo ranks on a CPU (smoke)

Writes DIR/<mode>/decode-TP-<rank>.trace.json.gz and DIR/<mode>/summary.json.
"""

from __future__ import annotations

import argparse
import gzip
import importlib.util
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile, schedule

ROOT = Path(__file__).resolve().parents[2]


def log(msg: str) -> None:
    """Progress on stderr (the GPU run's log comes back under $OUT)."""
    print(f"[{time.strftime('%H:%M:%S')}] rank {os.environ.get('RANK', '?')}: {msg}", file=sys.stderr, flush=True)


def _rows(weight: torch.Tensor, rank: int, world: int) -> torch.Tensor:
    """Output features `rank` owns (a column-parallel Linear's weight is [out, in])."""
    return weight.chunk(world, dim=0)[rank].contiguous()


def _cols(weight: torch.Tensor, rank: int, world: int) -> torch.Tensor:
    """Input features `rank` owns (a row-parallel Linear)."""
    return weight.chunk(world, dim=1)[rank].contiguous()


def build_tp_model(rank: int, world: int, on_cuda: bool) -> Any:
    """The random-weight model, sharded for TP `world` on this rank (see the module docstring)."""
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    cfg = _recorder().model_config(on_cuda)  # the same few-layer Llama the trace fixtures were recorded with
    cfg._attn_implementation = "sdpa"
    model = LlamaForCausalLM(cfg).eval()
    device = torch.device("cuda", rank) if on_cuda else torch.device("cpu")
    model = model.to(device=device, dtype=torch.bfloat16 if on_cuda else torch.float32)

    def all_reduce(_module: Any, _args: Any, output: torch.Tensor) -> torch.Tensor:
        dist.all_reduce(output)
        return output

    with torch.no_grad():
        for layer in model.model.layers:
            att, mlp = layer.self_attn, layer.mlp
            for lin in (att.q_proj, att.k_proj, att.v_proj, mlp.gate_proj, mlp.up_proj):
                lin.weight = torch.nn.Parameter(_rows(lin.weight, rank, world), requires_grad=False)
                lin.out_features //= world
            for lin in (att.o_proj, mlp.down_proj):
                lin.weight = torch.nn.Parameter(_cols(lin.weight, rank, world), requires_grad=False)
                lin.in_features //= world
                lin.register_forward_hook(all_reduce)
    # The attention reshapes by head_dim (-1 heads) and keeps its GQA ratio; the cache needs this rank's KV heads.
    model.config.num_attention_heads //= world
    model.config.num_key_value_heads //= world
    model.config.head_dim = model.model.layers[0].self_attn.head_dim  # else hidden / (heads / world): twice as wide
    return model


def profiler(on_cuda: bool, steps: int, out_json: Path) -> profile:
    """torch.profiler, one ProfilerStep per decode step, as SGLang and vLLM run it (shapes and modules on)."""
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_cuda else [])
    return profile(
        activities=activities,
        record_shapes=True,
        with_stack=True,  # the nn.Module frames (python_function events); SGLang's profiler has it on by default
        with_modules=True,
        schedule=schedule(wait=1, warmup=1, active=steps, repeat=1),
        on_trace_ready=lambda p: p.export_chrome_trace(str(out_json)),
    )


def run_eager(model: Any, steps: int, out_json: Path, on_cuda: bool) -> dict[str, Any]:
    """Prefill, warm up, then profiled greedy decode steps with the dynamic cache, no sync inside a step."""
    device = model.device
    torch.manual_seed(1)  # the same prompt on both ranks
    prompt = torch.randint(0, model.config.vocab_size, (1, 64), device=device)
    with torch.inference_mode():
        out = model(prompt, use_cache=True)
        past, tok = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)
        for _ in range(3):
            out = model(tok, past_key_values=past, use_cache=True)
            past, tok = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)
        if on_cuda:
            torch.cuda.synchronize()
        with profiler(on_cuda, steps, out_json) as prof:
            for i in range(steps + 2):
                out = model(tok, past_key_values=past, use_cache=True)
                past, tok = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)
                if on_cuda and i == steps + 1:  # the last step stops the profiler: let its kernels finish first
                    torch.cuda.synchronize()
                prof.step()
        if on_cuda:
            torch.cuda.synchronize()
    return {"mode": "eager, transformers forward, dynamic cache, TP by hand with NCCL all-reduce"}


def _recorder() -> Any:
    """benchmarks/recorders/record_traces.py, for its graph-safe StaticCache decode step."""
    path = ROOT / "benchmarks" / "recorders" / "record_traces.py"
    spec = importlib.util.spec_from_file_location("record_traces", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_graph(model: Any, steps: int, out_json: Path) -> dict[str, Any]:
    """Capture one decode step (all-reduces included) in a CUDA graph, replay it under the profiler, no sync."""
    rec = _recorder()
    torch.manual_seed(1)  # the same prompt on both ranks
    with torch.inference_mode():
        step, advance = rec._static_transformers_step(model, 1024, device=str(model.device))
        graph = rec.capture_step_graph(step)
        with profiler(True, steps, out_json) as prof:
            for i in range(steps + 2):
                graph.replay()
                advance(i)
                if i == steps + 1:  # the last step stops the profiler: let the replays finish first
                    torch.cuda.synchronize()
                prof.step()
        torch.cuda.synchronize()
    return {"mode": "cuda graph replay, transformers forward, StaticCache, all-reduces in the graph"}


def gzip_to(src: Path, dst: Path) -> int:
    """Gzip the exported trace; its size in bytes (uncompressed)."""
    raw = src.read_bytes()
    dst.write_bytes(gzip.compress(raw, 6))
    src.unlink()
    return len(raw)


def worker(rank: int, world: int, args: argparse.Namespace) -> None:
    """One rank: build, then each mode in turn; files under args.out/<mode>/."""
    on_cuda = args.device == "cuda"
    if on_cuda:
        torch.cuda.set_device(rank)
        dist.init_process_group("nccl", rank=rank, world_size=world, device_id=torch.device("cuda", rank))
    else:
        dist.init_process_group("gloo", rank=rank, world_size=world)
    model = build_tp_model(rank, world, on_cuda)
    if rank == 0:  # the model's config, so `decodetop trace --config` composes this very model's budget
        Path(args.out).mkdir(parents=True, exist_ok=True)
        cfg = _recorder().model_config(on_cuda)
        cfg.architectures = ["LlamaForCausalLM"]
        cfg.torch_dtype = "bfloat16" if on_cuda else "float32"
        cfg.to_json_file(str(Path(args.out) / "config.json"))
    for mode in args.modes.split(","):
        out_dir = Path(args.out) / mode
        out_dir.mkdir(parents=True, exist_ok=True)
        raw = out_dir / f"decode-TP-{rank}.json"
        t0 = time.time()
        try:
            if mode == "graph":
                if not on_cuda:
                    log("graph mode needs CUDA: skipped")
                    continue
                info = run_graph(model, args.steps, raw)
            else:
                info = run_eager(model, args.steps, raw, on_cuda)
            size = gzip_to(raw, out_dir / f"decode-TP-{rank}.trace.json.gz")
            info.update(raw_bytes=size, seconds=round(time.time() - t0, 1), rank=rank, world=world)
        except Exception as exc:
            info = {"error": f"{type(exc).__name__}: {exc}"[:500], "rank": rank}
            log(f"{mode}: {info['error']}")
        if rank == 0:
            info["torch"] = torch.__version__
            info["device"] = torch.cuda.get_device_name(rank) if on_cuda else "cpu"
            (out_dir / "summary.json").write_text(json.dumps(info, indent=1))
        log(f"{mode}: {info}")
        dist.barrier()
    # No destroy_process_group: it was seen to hang on the GPU machine; the launcher reaps the ranks.
    sys.stdout.flush()
    os._exit(0)


def main() -> int:
    """Under torchrun: this rank. Without: spawn 2 ranks."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--modes", default="eager,graph")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    args = ap.parse_args()
    if "RANK" in os.environ:
        worker(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), args)
        return 0
    import torch.multiprocessing as mp

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_spawned, args=(r, 2, args)) for r in (0, 1)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=600)
        if p.is_alive():
            p.kill()
    return 0 if all(p.exitcode == 0 for p in procs) else 1


def _spawned(rank: int, world: int, args: argparse.Namespace) -> None:
    os.environ["RANK"] = str(rank)
    worker(rank, world, args)


if __name__ == "__main__":
    raise SystemExit(main())
