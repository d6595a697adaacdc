"""Provides `build_inventory`: the ops of one decode step on the busiest GPU, each with its budget component,
shape, dtype, count, bytes read and written, FLOPs, kernels launched and the measurement key that times it.

Sharding follows SGLang/vLLM for these families (the output states it; `StepInventory.assumptions`):
- attention heads split over TP ranks: q_b/q_proj, kv_b and the GQA q/k/v projections column-parallel, o_proj
  row-parallel; GQA KV heads split too, or replicated (one per rank) when there are fewer KV heads than ranks;
- MLA's q_a and kv_a projections (fused_qkv_a_proj_with_mqa), their norms, and the DSA indexer are replicated
  (ReplicatedLinear): every rank reads them whole; the MLA latent KV cache is replicated on every rank;
- dense and shared-expert MLPs column/row-parallel; routers replicated; routed experts split by width over
  tp/ep ranks and by count over ep ranks (EP keeps the all-reduce, as SGLang's default EP without DeepEP);
- vocab-parallel embedding (one all-reduce after it) and lm_head (logits all-gathered);
- two all-reduces per layer (after attention, after the MLP/MoE), of batch × tokens × hidden × 2 bytes.

Kernel counts per op are estimates of what SGLang/vLLM launch (documented in `_KERNELS`); a profiler trace
(`decodetop trace`) gives the real count.
"""

# ruff: noqa: PLR0917 - the private op makers take a shape row positionally, like the Op they build
from __future__ import annotations

import dataclasses
import math
import threading
from collections import OrderedDict

from decodetop.budget.components import Component
from decodetop.budget.deployment import ACTIVATION_BYTES, Deployment
from decodetop.budget.inventory.attention import gqa_ops, mla_ops
from decodetop.budget.inventory.opbuilder import KERNELS_PER_OP, OpBuilder, low_precision
from decodetop.budget.inventory.step import Op, StepInventory
from decodetop.budget.keys import MoeKey, RoutingKey, SamplingKey
from decodetop.budget.spec import ModelSpec, WeightModule
from decodetop.errors import UserInputError

__all__ = ["Op", "StepInventory", "build_inventory", "expected_distinct_experts"]


def build_inventory(spec: ModelSpec, deployment: Deployment, *, by_layer_kind: bool = True) -> StepInventory:
    """The ops of one decode step of `spec` served as `deployment`, on the busiest GPU. Each kind of decoder layer
    is built once and its ops added again for the other layers of that kind (`by_layer_kind=False` builds every
    layer: the same ops, slower; a what-if composes a new deployment per knob turned)."""
    deployment.validate(spec)
    if deployment.speculative and spec.n_mtp_layers == 0 and not deployment.draft_model:
        raise UserInputError(f"--accept-length: {spec.name} has no MTP layer (num_nextn_predict_layers) to draft with")
    b = OpBuilder(spec, deployment)
    dep = deployment
    m_main = dep.batch * dep.query_len
    d = spec.d_model
    ar_bytes = m_main * d * ACTIVATION_BYTES

    b.norm("embedding lookup", "embedding", Component.NORMS, None, m_main, d)
    b.collective("all-reduce (embedding)", "all_reduce", None, ar_bytes)
    built: dict[tuple[object, ...], list[tuple[tuple[object, ...], Op, int | None]]] = {}
    for i, kind in enumerate(_layer_kinds(b)):  # one build per kind of layer (GLM-5: 3 of 78), the others replayed
        if by_layer_kind and kind in built:
            b.replay(built[kind], i)
            continue
        built[kind] = b.record()
        _layer(b, i, m_main, dep.query_len)
        b.stop_recording()
    b.norm("final norm", "rmsnorm", Component.NORMS, None, m_main, d)
    _lm_head(b, m_main)

    if dep.speculative and not dep.draft_model:  # MTP draft: the MTP layer(s) run once per draft token at one token
        n = dep.n_draft
        m_d = dep.batch
        for j in range(spec.n_mtp_layers):
            i = spec.n_layers + j
            b.norm("mtp embedding lookup", "embedding", Component.NORMS, i, m_d, d, count=n)
            b.collective("mtp all-reduce (embedding)", "all_reduce", i, m_d * d * ACTIVATION_BYTES, count=n)
            b.norm("mtp enorm+hnorm", "rmsnorm", Component.NORMS, i, m_d, d, count=2 * n)
            eh = b.mod(i, "eh_proj")
            b.linear("mtp eh_proj", Component.ATTENTION_PROJ, i, m_d, [eh], 1.0, count=n)
            _layer(b, i, m_d, 1, count=n, prefix="mtp ")
            b.norm("mtp final norm", "rmsnorm", Component.NORMS, i, m_d, d, count=n)
            _lm_head(b, m_d, count=n, prefix="mtp ")

    return StepInventory(
        spec=spec,
        deployment=dep,
        ops=b.ops(),
        kv_dtype=b.kv_dtype,
        resident_weight_bytes=_resident_bytes(spec, dep),
        assumptions=_assumptions(spec, dep, b),
    )


_KINDS_HELD = 8
_kinds: OrderedDict[int, tuple[ModelSpec, list[tuple[object, ...]]]] = OrderedDict()
_kinds_lock = threading.Lock()


def _layer_kinds(b: OpBuilder) -> list[tuple[object, ...]]:
    """What the ops of each decoder layer depend on (`_layer`): whether it is the first, an MoE and a sliding-window
    layer, and its weight modules but for their names and index. Two layers of one kind add the same ops. Kept per
    model (the last few): they do not depend on the deployment."""
    spec = b.spec
    with _kinds_lock:
        hit = _kinds.get(id(spec))
        if hit is not None and hit[0] is spec:
            return hit[1]
    mods: dict[int, list[tuple[str, WeightModule]]] = {}
    for (layer, kind), md in b.mods.items():
        if 0 <= layer < spec.n_layers:
            mods.setdefault(layer, []).append((kind, dataclasses.replace(md, name="", layer=0)))
    kinds: list[tuple[object, ...]] = [
        (i == 0, i in b.moe_layers, i in b.sliding_layers, tuple(sorted(mods.get(i, []), key=lambda kv: kv[0])))
        for i in range(spec.n_layers)
    ]
    with _kinds_lock:
        _kinds[id(spec)] = (spec, kinds)
        while len(_kinds) > _KINDS_HELD:
            _kinds.popitem(last=False)
    return kinds


def _layer(b: OpBuilder, i: int, m: int, q_len: int, count: int = 1, prefix: str = "") -> None:
    spec, dep = b.spec, b.dep
    d = spec.d_model
    first = i == 0
    b.norm(prefix + "input norm", "rmsnorm" if first else "add_rmsnorm", Component.NORMS, i, m, d, count)
    if spec.attention_kind == "mla":
        mla_ops(b, i, m, q_len, count, prefix)
    else:
        gqa_ops(b, i, m, q_len, count, prefix)
    b.collective(prefix + "all-reduce (attention out)", "all_reduce", i, m * d * ACTIVATION_BYTES, count)
    b.norm(prefix + "post-attention norm", "add_rmsnorm", Component.NORMS, i, m, d, count)
    if i in b.moe_layers or (i >= spec.n_layers and spec.is_moe):
        _moe(b, i, m, count, prefix)
    else:
        tp = dep.tp
        gate, up, down = b.mod(i, "gate_proj"), b.mod(i, "up_proj"), b.mod(i, "down_proj")
        _mlp(b, i, m, gate, up, down, tp, Component.DENSE_MLP, count, prefix + "")
    b.collective(prefix + "all-reduce (mlp out)", "all_reduce", i, m * d * ACTIVATION_BYTES, count)


def _mlp(
    b: OpBuilder,
    i: int,
    m: int,
    gate: WeightModule,
    up: WeightModule,
    down: WeightModule,
    tp: int,
    comp: Component,
    count: int,
    prefix: str,
) -> None:
    label = "shared " if comp is Component.SHARED_EXPERTS else ""
    if gate.fmt is up.fmt:
        b.linear(f"{prefix}{label}gate_up_proj", comp, i, m, [gate, up], 1 / tp, count=count)
    else:
        b.linear(f"{prefix}{label}gate_proj", comp, i, m, [gate], 1 / tp, count=count)
        b.linear(f"{prefix}{label}up_proj", comp, i, m, [up], 1 / tp, count=count)
    b.norm(f"{prefix}{label}silu_and_mul", "silu_mul", comp, i, m, max(1, gate.out_features // tp), count)
    b.row_linear(f"{prefix}{label}down_proj", comp, i, m, down, count)


def expected_distinct_experts(n_experts: int, top_k: int, tokens: int) -> float:
    """Expected number of distinct experts `tokens` tokens touch with uniform top-k routing: E(1 − (1 − k/E)^T)."""
    return n_experts * (1 - (1 - top_k / n_experts) ** tokens)


def _moe(b: OpBuilder, i: int, m: int, count: int, prefix: str) -> None:
    spec, dep = b.spec, b.dep
    d = spec.d_model
    router = b.mod(i, "router")
    rdtype = router.fmt.probe_dtype
    rkey = RoutingKey(m, d, spec.n_experts, spec.scoring_func, spec.n_group, spec.topk_group, spec.top_k, rdtype)
    rbytes = router.bytes_for(1)
    b.add(
        Op(
            prefix + "router + top-k",
            Component.ROUTING,
            "routing",
            f"[{m}×{d}]·[{d}×{spec.n_experts}]",
            rdtype,
            count,
            rbytes,
            0.0,
            rbytes + m * d * ACTIVATION_BYTES,
            m * spec.n_experts * 4.0,
            2.0 * m * d * spec.n_experts,
            KERNELS_PER_OP["routing"],
            rkey,
            "-",
        ),
        i,
    )
    gate, up, down = b.mod(i, "expert_gate_proj"), b.mod(i, "expert_up_proj"), b.mod(i, "expert_down_proj")
    moe_tp = dep.moe_tp
    local = spec.n_experts // dep.ep
    touched = expected_distinct_experts(spec.n_experts, spec.top_k, m) / dep.ep
    per_expert = sum(md.bytes_for(1, 1 / moe_tp) for md in (gate, up)) + down.bytes_for(1, 1.0, 1 / moe_tp)
    wbytes = touched * per_expert
    width = max(1, spec.ffn_expert // moe_tp)
    routed_tokens = m * spec.top_k / dep.ep
    dtype = gate.fmt.probe_dtype
    mkey = MoeKey(m, spec.top_k, local, math.ceil(touched - 1e-9), d, width, dtype, int(spec.expert_bias))
    kernels = KERNELS_PER_OP["moe"] + (2 * KERNELS_PER_OP["act_quant"] if low_precision(dtype) else 0)
    shape = f"{touched:.3g} of {local} experts × [{d}→2×{width}→{d}]"
    b.add(
        Op(
            prefix + "routed experts",
            Component.ROUTED_EXPERTS,
            "moe",
            shape,
            dtype,
            count,
            wbytes,
            0.0,
            wbytes + m * d * ACTIVATION_BYTES,
            m * d * ACTIVATION_BYTES,
            2.0 * routed_tokens * 3 * d * width,
            kernels,
            mkey,
            "-",
        ),
        i,
    )
    if spec.n_shared_experts:
        sg, su, sd = b.mod(i, "shared_gate_proj"), b.mod(i, "shared_up_proj"), b.mod(i, "shared_down_proj")
        _mlp(b, i, m, sg, su, sd, dep.tp, Component.SHARED_EXPERTS, count, prefix)


def _lm_head(b: OpBuilder, m: int, count: int = 1, prefix: str = "") -> None:
    spec, dep = b.spec, b.dep
    head = b.mod(-1, "lm_head")
    shard = math.ceil(spec.vocab_size / dep.tp)
    dtype = head.fmt.probe_dtype
    wbytes = head.bytes_for(1, shard / spec.vocab_size)
    key = SamplingKey(m, shard, spec.d_model, dtype)
    shape = f"[{m}×{spec.d_model}]·[{spec.d_model}×{shard}]"
    b.add(
        Op(
            prefix + "lm_head + sampling",
            Component.LM_HEAD,
            "sampling",
            shape,
            dtype,
            count,
            wbytes,
            0.0,
            wbytes + m * spec.d_model * ACTIVATION_BYTES,
            m * shard * ACTIVATION_BYTES,
            2.0 * m * spec.d_model * shard,
            KERNELS_PER_OP["sampling"],
            key,
            "-",
        ),
        None,
    )
    b.collective(prefix + "all-gather (logits)", "all_gather", None, m * shard * ACTIVATION_BYTES, count)


_REPLICATED = {"q_a_proj", "kv_a_proj", "indexer_wq_b", "indexer_wk", "indexer_weights_proj", "router", "eh_proj"}


def _resident_bytes(spec: ModelSpec, dep: Deployment) -> float:
    """Weights one GPU holds (main model; MTP layers too when speculative decoding uses them)."""
    total = 0.0
    mods = spec.modules + (spec.mtp_modules if dep.speculative and not dep.draft_model else ())
    for md in mods:
        if md.kind in _REPLICATED:
            total += md.bytes
        elif md.kind.startswith("expert_"):
            total += md.bytes_for(md.copies / dep.ep, 1 / dep.moe_tp)
        elif md.kind in ("k_proj", "v_proj"):
            kv_rank = max(1, spec.n_kv_heads // dep.tp)
            total += md.bytes_for(1, kv_rank / spec.n_kv_heads)
        else:
            total += md.bytes / dep.tp
    return total


def _assumptions(spec: ModelSpec, dep: Deployment, b: OpBuilder) -> tuple[str, ...]:
    tp = dep.tp
    out = [
        f"TP {tp}: {spec.n_heads} attention heads split {b.h_rank} per rank; dense MLP and shared experts "
        "column/row-parallel (1/tp of each weight per rank)."
    ]
    if spec.attention_kind == "mla":
        extra = " and the DSA indexer" if spec.index_topk else ""
        out.append(
            f"MLA: q_a/kv_a projections, their norms{extra} replicated (every rank reads them whole, as "
            "SGLang/vLLM ReplicatedLinear); q_b, kv_b split by heads, o_proj row-parallel; the latent KV "
            "cache is replicated on every rank; decode uses the absorbed form (W_kc, W_vc bmm)."
        )
    elif spec.n_kv_heads < tp:
        out.append(f"GQA: {spec.n_kv_heads} KV heads < TP {tp}: each rank holds (and caches) 1 KV head, replicated.")
    else:
        out.append(f"GQA: {spec.n_kv_heads} KV heads split {b.kv_rank} per rank.")
    if spec.is_moe:
        m = dep.batch * dep.query_len
        touched = expected_distinct_experts(spec.n_experts, spec.top_k, m)
        ep_text = (
            f"EP {dep.ep}: {spec.n_experts // dep.ep} experts per rank, each split over {dep.moe_tp} rank(s), "
            "routing balanced across ranks, all-reduce kept (no DeepEP all-to-all)"
            if dep.ep > 1
            else f"each routed expert split by width over all {tp} ranks (MoE TP)"
        )
        out.append(
            f"MoE: routers replicated; {ep_text}; {m} token(s) touch {touched:.3g} distinct experts (uniform routing)."
        )
    out.append(
        f"Vocab-parallel embedding (+1 all-reduce) and lm_head ({math.ceil(spec.vocab_size / tp)} rows per "
        "rank, logits all-gathered)."
    )
    out.append(f"Activations and collectives BF16; KV cache {b.kv_dtype}; weights {spec.quant.describe()}.")
    if spec.index_topk:
        out.append(
            f"DSA: attention reads min(context, {spec.index_topk}) latents; the indexer reads every cached "
            "FP8 index key (+FP32 scale per 128) — layout assumed from DeepSeek-V3.2 (docs/reference/models.md §7)."
        )
    if dep.speculative and dep.draft_model:
        out.append(
            f"Speculative (draft model): the model verifies {dep.query_len} tokens per sequence; "
            f"{dep.tokens_per_step:g} tokens accepted per step; the draft model's steps are added to it."
        )
    elif dep.speculative:
        out.append(
            f"Speculative (MTP): main model verifies {dep.query_len} tokens per sequence; the MTP layer runs "
            f"{dep.n_draft}× per step; {dep.tokens_per_step:g} tokens accepted per step."
        )
    out.append(
        "Kernel counts are estimates (GEMM 1, +1 activation quantize for FP8/NVFP4; fused MoE 5; "
        "MLA+DSA attention 3); a profiler trace gives the real count."
    )
    return tuple(out)
