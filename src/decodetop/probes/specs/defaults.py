"""Provides the defaults the decode-component probes share (no torch): timing parameters and small example keys.

`budget_ms` (target time per point on GPUs), `samples` (most timed samples per point on GPUs), `cpu_samples`
(repetitions on CPU ranks, where a 70B shard's GEMM takes a fraction of a second each), `rotate` (rotate input
copies above 2× L2 on GPUs; always off on CPU ranks).
"""

from __future__ import annotations

#: Per point on GPUs: ~20 ms of graph replays, up to 50 samples of ≥ 2 ops each (docs/reference/probes.md §7.6:
#: median of ≥ 100 repetitions); CPU ranks: 3 repetitions (a 70B shard's GEMM takes ~0.3 s on a CPU).
COMPONENT_TIMING: dict[str, float | int | bool] = {"budget_ms": 20.0, "samples": 50, "cpu_samples": 3, "rotate": True}

#: A small GQA attention key and a small MoE key: the defaults of `decodetop probe attention|moe|layer` alone.
SMALL_GQA = (
    "attention:kind=gqa,batch=1,q_len=1,context=4096,heads=32,kv_heads=8,head_dim=128,v_head_dim=128,"
    "kv_lora_rank=0,rope_dim=128,index_heads=0,index_head_dim=0,index_topk=0,window=0,kv_dtype=bf16"
)
SMALL_MOE = "moe:tokens=1,top_k=8,experts_local=64,experts_active=8,hidden=2048,intermediate=768,dtype=bf16,bias=0"
