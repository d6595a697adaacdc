"""Provides the `ProbeSpec`s of the decode-component probes (issue 4; no torch): gemm, moe, routing, attention,
kvcast, norms, sampling and layer. Their worker modules live in `decodetop.probes.worker.<name>`.

Every component probe takes `keys`: measurement key ids of `decodetop.budget.keys` (`gemm:m=1,n=…`) at the exact
shapes a model needs on this tensor-parallel degree; `decodetop.probes.planrun` fills them from a `ProbePlan`. The
defaults below are small generic shapes so that `decodetop probe gemm` alone runs quickly anywhere. Shared timing
parameters: `budget_ms` (target time per point on GPUs), `samples` (most timed samples per point on GPUs),
`cpu_samples` (repetitions on CPU ranks, where a 70B shard's GEMM takes a fraction of a second each), `rotate`
(rotate input copies above 2× L2 on GPUs; always off on CPU ranks).
"""

from __future__ import annotations

from typing import Any

from decodetop.probes.registry import ProbeSpec

#: GEMM sweep over M (probes.md §4: decode M = 1–64; 128, 256 for batched decode and MTP verification).
SWEEP_M = [1, 2, 4, 8, 16, 32, 64, 128, 256]
#: kvcast read-mode contexts: 1k…64k tokens, enough to show a linear and a flat trend (probes.md §7.8 sweeps to 128k).
READ_CONTEXTS = [1024, 4096, 16384, 65536]
#: Tokens a DSA step attends to (GLM-5 / DeepSeek-V3.2 `index_topk` 2048, models.md §2): what gather-then-cast reads.
DSA_TOPK = 2048

#: Per point on GPUs: ~20 ms of graph replays, up to 50 samples of ≥ 2 ops each (probes.md §7.6: median of ≥ 100
#: repetitions); CPU ranks: 3 repetitions (a 70B shard's GEMM takes ~0.3 s on a CPU).
_TIMING: dict[str, Any] = {"budget_ms": 20.0, "samples": 50, "cpu_samples": 3, "rotate": True}

_GQA = (
    "attention:kind=gqa,batch=1,q_len=1,context=4096,heads=32,kv_heads=8,head_dim=128,v_head_dim=128,"
    "kv_lora_rank=0,rope_dim=128,index_heads=0,index_head_dim=0,index_topk=0,window=0,kv_dtype=bf16"
)
_MOE = "moe:tokens=1,top_k=8,experts_local=64,experts_active=8,hidden=2048,intermediate=768,dtype=bf16,bias=0"

COMPONENT_PROBES: tuple[ProbeSpec, ...] = (
    ProbeSpec(
        name="gemm",
        description="dense GEMMs at the model's shard shapes (M = batch) and a sweep over M: GB/s and TFLOP/s "
        "against the measured copy bandwidth and matrix peak; bf16, fp8 per-tensor and row-wise, nvfp4 on sm_100/120",
        module="decodetop.probes.worker.gemm",
        default_timeout_s=600.0,
        default_params={
            "keys": ["gemm:m=1,n=4096,k=4096,batch=1,dtype=bf16"],
            "sweep": True,
            "sweep_m": list(SWEEP_M),
            "cpu_sweep_max_m": 16,  # CPU ranks: M above this is skipped (a 70B shard at M=256 takes seconds)
            "fp8_variants": ["tensor", "row"],
            "reference": True,
            **_TIMING,
        },
    ),
    ProbeSpec(
        name="moe",
        description="routed experts of one MoE layer (sort, gate_up, SiLU-and-mul, down, combine) for the active "
        "experts: grouped GEMM and a per-expert loop",
        module="decodetop.probes.worker.moe",
        default_timeout_s=300.0,
        default_params={"keys": [_MOE], "variants": ["grouped", "loop"], **_TIMING},
    ),
    ProbeSpec(
        name="routing",
        description="router GEMM, softmax/sigmoid scoring, group-limited top-k; permute and unpermute",
        module="decodetop.probes.worker.routing",
        default_timeout_s=300.0,
        default_params={
            "keys": [
                "routing:tokens=1,hidden=4096,n_experts=128,scoring=softmax,n_group=1,topk_group=1,top_k=8,dtype=bf16"
            ],
            "permute": True,
            **_TIMING,
        },
    ),
    ProbeSpec(
        name="attention",
        description="decode attention against the KV cache: GQA (SDPA), absorbed MLA, DSA indexer + sparse MLA; "
        "KV GB/s",
        module="decodetop.probes.worker.attention",
        default_timeout_s=300.0,
        default_params={"keys": [_GQA], "context_sweep": [], **_TIMING},
    ),
    ProbeSpec(
        name="kvcast",
        description="KV-cache write of one layer's new entries; FP8 cache read as BF16: whole-cache cast vs "
        "gather-then-cast over context",
        module="decodetop.probes.worker.kvcast",
        default_timeout_s=300.0,
        default_params={
            "keys": ["kvcast:layout=mla,tokens=1,width=576,context=4096,kv_dtype=fp8"],
            "read_modes": True,
            "read_contexts": list(READ_CONTEXTS),
            "gather_tokens": DSA_TOPK,
            **_TIMING,
        },
    ),
    ProbeSpec(
        name="norms",
        description="RMSNorm, residual add + RMSNorm, LayerNorm, SiLU-and-mul, rotary, embedding at the model's sizes",
        module="decodetop.probes.worker.norms",
        default_timeout_s=300.0,
        default_params={
            "keys": [
                "norms:op=rmsnorm,tokens=1,width=4096,dtype=bf16",
                "norms:op=silu_mul,tokens=1,width=14336,dtype=bf16",
            ],
            **_TIMING,
        },
    ),
    ProbeSpec(
        name="sampling",
        description="vocab-parallel lm_head + greedy and top-p sampling; all-gather of the logits",
        module="decodetop.probes.worker.sampling",
        default_timeout_s=300.0,
        collective=True,
        default_params={
            "keys": ["sampling:tokens=1,vocab_shard=32000,hidden=4096,dtype=bf16"],
            "allgather_bytes": [],  # logits bytes per rank to all-gather (planrun: the plan's all_gather keys)
            **_TIMING,
        },
    ),
    ProbeSpec(
        name="layer",
        description="one whole decoder layer (dense / MoE) from the component kernels, graph and eager, against "
        "the sum of its parts: the composition error",
        module="decodetop.probes.worker.layer",
        default_timeout_s=600.0,
        collective=True,
        default_params={
            "dense_ops": [
                "norms:op=rmsnorm,tokens=1,width=4096,dtype=bf16",
                "gemm:m=1,n=6144,k=4096,batch=1,dtype=bf16",
                _GQA,
                "gemm:m=1,n=4096,k=4096,batch=1,dtype=bf16",
                "norms:op=add_rmsnorm,tokens=1,width=4096,dtype=bf16",
                "gemm:m=1,n=28672,k=4096,batch=1,dtype=bf16",
                "norms:op=silu_mul,tokens=1,width=14336,dtype=bf16",
                "gemm:m=1,n=4096,k=14336,batch=1,dtype=bf16",
            ],
            "moe_ops": [
                "norms:op=add_rmsnorm,tokens=1,width=2048,dtype=bf16",
                "routing:tokens=1,hidden=2048,n_experts=64,scoring=softmax,n_group=1,topk_group=1,top_k=8,dtype=bf16",
                _MOE,
            ],
            **_TIMING,
        },
    ),
)
