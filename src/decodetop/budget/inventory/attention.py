"""Provides the attention ops of one layer: MLA (its projections, the DSA indexer, absorbed attention over the
latent cache) and GQA (q/k/v/o projections, attention over the sharded or replicated KV heads)."""

# ruff: noqa: PLR0917 - the op makers take a shape row positionally, like the Op they build
from __future__ import annotations

import math

from decodetop.budget.components import Component
from decodetop.budget.deployment import ACTIVATION_BYTES
from decodetop.budget.inventory.opbuilder import KERNELS_PER_OP, OpBuilder
from decodetop.budget.inventory.step import Op
from decodetop.budget.keys import AttentionKey

DSA_INDEX_SCALE_GROUP = 128
"""DeepSeek-V3.2's indexer caches FP8 keys with one FP32 scale per 128 values (assumed for GLM-5;
docs/reference/models.md §7)."""


def mla_ops(b: OpBuilder, i: int, m: int, q_len: int, count: int, prefix: str) -> None:
    """Absorbed MLA decode: the latent projections, q·W_kc, the latent attention (with DSA's indexer) and o·W_vc."""
    spec, tp = b.spec, b.dep.tp
    proj = Component.ATTENTION_PROJ
    mla_projections_ops(b, i, m, count, prefix)
    # Absorbed MLA decode: kv_b's K half (W_kc) folds into q, its V half (W_vc) into the output (DeepSeek-V2 §2.1).
    kv_b = b.mod(i, "kv_b_proj")
    nope, v, lora = spec.qk_nope_head_dim, spec.v_head_dim, spec.kv_lora_rank
    k_frac = nope / (nope + v)
    b.gemm(
        prefix + "q·W_kc (absorb)",
        proj,
        i,
        m,
        lora,
        nope,
        kv_b.fmt,
        kv_b.bytes_for(1, k_frac / tp),
        batch=b.h_rank,
        count=count,
    )
    mla_attention_ops(b, i, m, q_len, count, prefix)
    b.gemm(
        prefix + "o·W_vc (absorb)",
        proj,
        i,
        m,
        v,
        lora,
        kv_b.fmt,
        kv_b.bytes_for(1, (1 - k_frac) / tp),
        batch=b.h_rank,
        count=count,
    )
    b.row_linear(prefix + "o_proj", proj, i, m, b.mod(i, "o_proj"), count)


def mla_projections_ops(b: OpBuilder, i: int, m: int, count: int, prefix: str) -> None:
    """The query and latent-KV projections up to rotary: q_a/kv_a (fused where one format), q_b or q, the norms
    (rotary is fused with the latent cache write: `mla_attention_ops`)."""
    spec, tp = b.spec, b.dep.tp
    proj = Component.ATTENTION_PROJ
    kv_a = b.mod(i, "kv_a_proj")
    if spec.q_lora_rank:
        q_a = b.mod(i, "q_a_proj")
        if q_a.fmt is kv_a.fmt:  # SGLang fuses them into one replicated GEMM (fused_qkv_a_proj_with_mqa)
            b.linear(prefix + "q_a+kv_a_proj (replicated)", proj, i, m, [q_a, kv_a], 1.0, count=count)
        else:
            b.linear(prefix + "q_a_proj (replicated)", proj, i, m, [q_a], 1.0, count=count)
            b.linear(prefix + "kv_a_proj (replicated)", proj, i, m, [kv_a], 1.0, count=count)
        b.norm(prefix + "q_a_layernorm", "rmsnorm", Component.NORMS, i, m, spec.q_lora_rank, count)
        b.linear(prefix + "q_b_proj", proj, i, m, [b.mod(i, "q_b_proj")], 1 / tp, count=count)
    else:
        b.linear(prefix + "kv_a_proj (replicated)", proj, i, m, [kv_a], 1.0, count=count)
        b.linear(prefix + "q_proj", proj, i, m, [b.mod(i, "q_proj")], 1 / tp, count=count)
    b.norm(prefix + "kv_a_layernorm", "rmsnorm", Component.NORMS, i, m, spec.kv_lora_rank, count)


def dsa_indexer_ops(b: OpBuilder, i: int, m: int, ctx: int, count: int, prefix: str) -> tuple[float, float]:
    """DSA's lightning indexer ops (its projections, k_norm, index-key cache write); returns its (bytes, flops)."""
    spec = b.spec
    for kind_name, label in (
        ("indexer_wq_b", "indexer wq_b"),
        ("indexer_wk", "indexer wk"),
        ("indexer_weights_proj", "indexer weights_proj"),
    ):
        md = b.mod(i, kind_name)
        b.linear(f"{prefix}{label} (replicated)", Component.ATTENTION_PROJ, i, m, [md], 1.0, count=count)
    b.norm(prefix + "indexer k_norm", "layernorm", Component.NORMS, i, m, spec.index_head_dim, count)
    index_per_token = spec.index_head_dim + 4 * math.ceil(spec.index_head_dim / DSA_INDEX_SCALE_GROUP)
    b.kv_write(prefix + "indexer key cache write", i, "dsa_index", m, spec.index_head_dim, 1.0, "fp8", count)
    index_bytes = b.dep.batch * ctx * index_per_token
    index_flops = 2.0 * m * spec.index_n_heads * ctx * spec.index_head_dim
    return index_bytes, index_flops


def mla_attention_ops(b: OpBuilder, i: int, m: int, q_len: int, count: int, prefix: str) -> None:
    """Rotary on q_pe and k_pe fused with the latent KV-cache write, and the latent attention over the context (top-k
    of it under DSA)."""
    spec, dep = b.spec, b.dep
    h, lora = b.h_rank, spec.kv_lora_rank
    latent = lora + spec.qk_rope_head_dim
    rope = (h + 1) * spec.qk_rope_head_dim
    b.kv_write(prefix + "rotary + kv cache write", i, "mla", m, latent, b.kvb, b.kv_dtype, count, rope)
    ctx = dep.context_len + q_len
    kind = "mla"
    attended = ctx
    index_bytes = 0.0
    index_flops = 0.0
    if spec.index_topk:
        kind = "mla+dsa"
        attended = min(ctx, spec.index_topk)
        index_bytes, index_flops = dsa_indexer_ops(b, i, m, ctx, count, prefix)
    kv = dep.batch * attended * latent * b.kvb
    reads = kv + index_bytes + m * h * latent * ACTIVATION_BYTES
    flops = 2.0 * m * h * attended * (latent + lora) + index_flops
    key = AttentionKey(
        kind,
        dep.batch,
        q_len,
        dep.context_len,
        h,
        1,
        latent,
        lora,
        lora,
        spec.qk_rope_head_dim,
        spec.index_n_heads,
        spec.index_head_dim,
        spec.index_topk,
        0,
        b.kv_dtype,
    )
    kernels = KERNELS_PER_OP["attention_mla_dsa" if spec.index_topk else "attention_mla"]
    shape = f"{h} heads × {attended} of {ctx} tokens × {latent}"
    b.add(
        Op(
            prefix + f"attention ({kind})",
            Component.ATTENTION,
            "attention",
            shape,
            b.kv_dtype,
            count,
            0.0,
            kv + index_bytes,
            reads,
            m * h * lora * ACTIVATION_BYTES,
            flops,
            kernels,
            key,
            "-",
        ),
        i,
    )


def gqa_ops(b: OpBuilder, i: int, m: int, q_len: int, count: int, prefix: str) -> None:
    spec, dep = b.spec, b.dep
    proj = Component.ATTENTION_PROJ
    tp = dep.tp
    q, k, v = b.mod(i, "q_proj"), b.mod(i, "k_proj"), b.mod(i, "v_proj")
    hd = spec.head_dim
    kv_share = b.kv_rank / spec.n_kv_heads
    n = (b.h_rank + 2 * b.kv_rank) * hd
    wbytes = q.bytes_for(1, 1 / tp) + k.bytes_for(1, kv_share) + v.bytes_for(1, kv_share)
    if q.fmt is k.fmt is v.fmt:
        b.gemm(prefix + "qkv_proj", proj, i, m, n, spec.d_model, q.fmt, wbytes, count=count)
    else:
        b.linear(prefix + "q_proj", proj, i, m, [q], 1 / tp, count=count)
        b.linear(prefix + "k_proj", proj, i, m, [k], kv_share, count=count)
        b.linear(prefix + "v_proj", proj, i, m, [v], kv_share, count=count)
    if spec.qk_norm:
        b.norm(prefix + "q/k norm", "rmsnorm", Component.NORMS, i, m * (b.h_rank + b.kv_rank), hd, count)
    width = 2 * b.kv_rank * hd
    rope = (b.h_rank + b.kv_rank) * spec.rotary_dim
    b.kv_write(prefix + "rotary + kv cache write", i, "gqa", m, width, b.kvb, b.kv_dtype, count, rope)
    ctx = dep.context_len + q_len
    sliding = i in b.sliding_layers
    attended = min(ctx, spec.sliding_window) if sliding else ctx
    window = spec.sliding_window if sliding else 0
    kv = dep.batch * attended * width * b.kvb
    reads = kv + m * b.h_rank * hd * ACTIVATION_BYTES
    flops = 2.0 * m * b.h_rank * attended * 2 * hd
    key = AttentionKey(
        "gqa",
        dep.batch,
        q_len,
        dep.context_len,
        b.h_rank,
        b.kv_rank,
        hd,
        hd,
        0,
        spec.rotary_dim,
        0,
        0,
        0,
        window,
        b.kv_dtype,
    )
    name = prefix + ("attention (gqa, sliding)" if sliding else "attention (gqa)")
    shape = f"{b.h_rank} q / {b.kv_rank} kv heads × {attended} tokens × {hd}"
    b.add(
        Op(
            name,
            Component.ATTENTION,
            "attention",
            shape,
            b.kv_dtype,
            count,
            0.0,
            kv,
            reads,
            m * b.h_rank * hd * ACTIVATION_BYTES,
            flops,
            KERNELS_PER_OP["attention_gqa"],
            key,
            "-",
        ),
        i,
    )
    b.row_linear(prefix + "o_proj", proj, i, m, b.mod(i, "o_proj"), count)
