"""The curve plan: what a plan measures beside its own keys so what-ifs on this host rest on curves."""

from __future__ import annotations

import dataclasses

from decodetop.budget.deployment import Deployment
from decodetop.budget.inventory import build_inventory
from decodetop.budget.keys import AttentionKey, GemmKey, MoeKey, NormKey, SamplingKey
from decodetop.budget.keywork import attention_cache_bytes, key_work
from decodetop.budget.plan import (
    CPU_POINT_BYTES,
    GPU_POINT_BYTES,
    CurvePlan,
    build_curve_plan,
    build_plan,
    curve_sweep_m,
)
from decodetop.budget.spec import load_preset


def _plan(model: str, device_kind: str = "cuda", **deployment: object) -> CurvePlan:
    inv = build_inventory(load_preset(model), Deployment(**deployment))  # type: ignore[arg-type]
    return build_curve_plan(inv, device_kind=device_kind)


def test_gemms_of_every_tp_shard_the_model_divides() -> None:
    plan = _plan("llama-3.1-70b", tp=1)
    shapes = {(k.n, k.k) for k in plan.by_probe("gemm") if isinstance(k, GemmKey)}
    for tp in (2, 4, 8):  # qkv (column), o_proj (row), gate_up (column), down (row) of each shard
        assert {(10240 // tp, 8192), (8192, 8192 // tp), (57344 // tp, 8192), (8192, 28672 // tp)} <= shapes
    own = {k.key_id for k in build_plan(build_inventory(load_preset("llama-3.1-70b"), Deployment(tp=1))).all_keys()}
    assert not own & set(plan.key_ids())  # only what the plan does not hold already


def test_gemms_are_swept_to_the_batch_times_the_tokens_verified() -> None:
    assert max(curve_sweep_m(Deployment(batch=1))) == 256
    assert max(curve_sweep_m(Deployment(batch=64, accept_length=3.0))) == 256  # 64 × (1 + 2 drafts) = 192
    assert max(curve_sweep_m(Deployment(batch=128, accept_length=3.0))) == 512
    plan = _plan("deepseek-v3", tp=8, batch=128, accept_length=3.0)
    assert plan.sweep_m[-1] == 512 and plan.sweep_m[0] == 1


def test_attention_over_batch_context_and_kv_dtype_at_every_shard() -> None:
    plan = _plan("llama-3.1-70b", tp=1)
    keys = [k for k in plan.by_probe("attention") if isinstance(k, AttentionKey)]
    own = {(k.batch, k.context, k.kv_dtype) for k in keys if k.heads == 64 and k.q_len == 1}
    assert {(1, c, kv) for c in (1024, 2048, 8192, 16384, 32768, 65536, 131072) for kv in ("bf16", "fp8")} <= own
    assert {(b, 1024, kv) for b in (1, 2, 4, 8, 16, 32, 64) for kv in ("bf16", "fp8")} <= own
    assert {(1, 1456), (1, 92688), (8, 2048), (8, 8192)} <= {(b, c) for b, c, _kv in own}  # GQA's finer grid
    assert (64, 131072, "bf16") not in own  # 64 × 128K × 4 KiB of KV is more than one point may read
    assert all(key_work(k).moved_bytes <= GPU_POINT_BYTES for k in keys)
    assert {k.heads for k in keys} == {64, 32, 16, 8}  # the TP-2, -4 and -8 shards' heads
    assert {k.q_len for k in keys} == {1, 2, 4}  # verification steps of speculative decoding


def test_other_gqa_shards_add_the_pair_counts_below_the_scenarios_own() -> None:
    """A GQA kernel's time is a function of (sequence, KV head) pairs × context: the TP-1 grid holds 8 pairs and
    up, so the TP-2/4/8 shards (4, 2, 1 KV heads) add batch 1 only, at every × √2 context."""
    keys = [k for k in _plan("llama-3.1-70b", tp=1).by_probe("attention") if isinstance(k, AttentionKey)]
    shards = {(k.kv_heads, k.batch, k.context) for k in keys if k.heads != 64}
    contexts = (1024, 1456, 2048, 2896, 4096, 5792, 8192, 11584, 16384, 23168, 32768, 46336, 65536, 92688, 131072)
    assert shards == {(kvh, 1, c) for kvh in (4, 2, 1) for c in contexts}
    tp2 = [k for k in _plan("llama-3.1-70b", tp=2).by_probe("attention") if isinstance(k, AttentionKey)]
    assert {(k.kv_heads, k.batch) for k in tp2 if k.heads != 32} == {(2, 1), (1, 1)}  # TP 1's 8 are covered


def test_other_mla_shards_get_a_coarse_batch_context_grid() -> None:
    keys = [k for k in _plan("glm-5", tp=2).by_probe("attention") if isinstance(k, AttentionKey)]
    shards = {(k.heads, k.batch) for k in keys if k.heads != 32}
    assert shards == {(h, b) for h in (64, 16, 8) for b in (1, 32)}


def test_routed_experts_at_the_local_experts_of_each_ep_degree() -> None:
    plan = _plan("mixtral-8x7b", tp=1)
    keys = [k for k in plan.by_probe("moe") if isinstance(k, MoeKey)]
    assert {k.experts_local for k in keys} == {8, 4, 2, 1}  # EP 1, 2, 4, 8 of 8 experts
    own = sorted(k.tokens for k in keys if k.experts_local == 8 and k.intermediate == 14336)
    assert own == [2, 4, 8, 16, 32, 64]  # tokens 1 is the plan's own key
    assert all(1 <= k.experts_active <= k.experts_local for k in keys)
    assert max(k.experts_active for k in keys if k.experts_local == 8 and k.intermediate == 14336) == 8


def test_norms_routing_and_lm_head_over_tokens() -> None:
    plan = _plan("llama-3.1-70b", tp=1)
    norms = {(k.op, k.tokens) for k in plan.by_probe("norms") if isinstance(k, NormKey)}
    assert {("rmsnorm", t) for t in (4, 16, 64, 256)} <= norms
    shards = {k.vocab_shard for k in plan.by_probe("sampling") if isinstance(k, SamplingKey)}
    assert shards >= {128256 // 2, 128256 // 4, 128256 // 8}


def test_cpu_ranks_get_a_small_plan() -> None:
    gpu = _plan("llama-3.1-70b", tp=2)
    cpu = _plan("llama-3.1-70b", "cpu", tp=2)
    assert len(cpu.key_ids()) < len(gpu.key_ids()) / 4
    assert all(key_work(k).moved_bytes <= CPU_POINT_BYTES for _p, keys in cpu.groups for k in keys)
    assert any("CPU ranks" in n for n in cpu.notes)


def test_the_plan_of_the_largest_preset_stays_bounded() -> None:
    """GLM-5 at TP 2: the count of extra points bounds the plan's cost (docs/benchmarks.md, "Curves")."""
    plan = _plan("glm-5", tp=2)
    gemm = len(plan.by_probe("gemm")) * len(plan.sweep_m)
    others = sum(len(keys) for probe, keys in plan.groups if probe != "gemm")
    assert gemm <= 400 and others <= 300, (gemm, others)
    assert plan.to_dict()["sweep_m"] == list(plan.sweep_m)


def test_a_sparse_attention_point_holds_its_whole_cache_under_the_cap() -> None:
    plan = _plan("glm-5", tp=2)  # DSA: reads its top-k 2048 tokens, holds (and indexes) every token
    points = [k for k in plan.by_probe("attention") if isinstance(k, AttentionKey)]
    assert points and all(attention_cache_bytes(k) <= GPU_POINT_BYTES for k in points)
    assert max(k.batch * k.context for k in points if k.kv_dtype == "fp8") < 64 * 65536  # 2.4 GB of latents
    big = dataclasses.replace(points[0], batch=64, context=65536, kv_dtype="fp8")
    assert key_work(big).moved_bytes <= GPU_POINT_BYTES < attention_cache_bytes(big)  # what the cap now catches
