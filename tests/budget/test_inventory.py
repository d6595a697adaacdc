"""StepInventory: the ops of one decode step on the busiest GPU."""

from __future__ import annotations

import pytest

from decodetop.budget.components import Component
from decodetop.budget.deployment import Deployment
from decodetop.budget.inventory import build_inventory, expected_distinct_experts
from decodetop.budget.keys import AttentionKey, GemmKey, MoeKey
from decodetop.budget.spec import load_preset, preset_names, spec_from_config
from decodetop.errors import UserInputError

from .test_spec import TINY_LLAMA


def test_glm5_tp8_all_reduces() -> None:
    """Acceptance: 2 × 78 all-reduces in the layers (+1 after the vocab-parallel embedding), 12 KiB each."""
    inv = build_inventory(load_preset("glm-5"), Deployment(tp=8))
    in_layers = sum(op.count for op in inv.ops if op.kind == "all_reduce" and op.layers != "-")
    assert in_layers == 2 * 78
    assert inv.collective_count("all_reduce") == 2 * 78 + 1
    assert inv.collective_sizes("all_reduce") == {6144 * 2: 157}
    assert inv.collective_sizes("all_gather") == {154880 // 8 * 2: 1}


def test_glm5_nvfp4_resident_weights_match_reference() -> None:
    """docs/reference/models.md §5: 58.8 GB per GPU at TP8 once replicated tensors are counted."""
    inv = build_inventory(load_preset("glm-5-nvfp4"), Deployment(tp=8))
    assert inv.resident_weight_bytes / 1e9 == pytest.approx(58.8, abs=0.1)


@pytest.mark.parametrize("name", preset_names())
def test_tp1_batch1_reads_exactly_the_active_weights(name: str) -> None:
    """At TP 1 and batch 1 the inventory's weight bytes are the model's per-token active bytes (docs/reference/models.md
    §5)."""
    spec = load_preset(name)
    inv = build_inventory(spec, Deployment(tp=1, context_len=0))
    assert inv.weight_bytes == pytest.approx(spec.active_weight_bytes(), rel=1e-9)
    assert inv.collective_count("all_reduce") == 0
    assert inv.kernels > spec.n_layers


def test_tp_splits_weights_but_replicated_parts_stay_whole() -> None:
    spec = load_preset("deepseek-v3")
    one = build_inventory(spec, Deployment(tp=1))
    eight = build_inventory(spec, Deployment(tp=8))
    replicated = sum(op.total_weight_bytes for op in eight.ops if "replicated" in op.name or op.kind == "routing")
    sharded_one = one.weight_bytes - replicated
    assert eight.weight_bytes == pytest.approx(replicated + sharded_one / 8, rel=1e-6)
    assert replicated > 0


def test_ops_carry_component_shape_and_key() -> None:
    inv = build_inventory(load_preset("glm-5-nvfp4"), Deployment(tp=8))
    comps = {op.component for op in inv.ops}
    assert comps >= {
        Component.ATTENTION,
        Component.ATTENTION_PROJ,
        Component.DENSE_MLP,
        Component.ROUTED_EXPERTS,
        Component.SHARED_EXPERTS,
        Component.ROUTING,
        Component.COMMUNICATION,
        Component.NORMS,
        Component.LM_HEAD,
    }
    qb = next(op for op in inv.ops if op.name == "q_b_proj")
    assert qb.key == GemmKey(1, 8 * 256, 2048, 1, "bf16")
    assert qb.count == 78
    assert qb.weight_bytes == 2048 * 2048 * 2
    moe = next(op for op in inv.ops if op.kind == "moe")
    assert isinstance(moe.key, MoeKey)
    assert (moe.key.experts_active, moe.key.intermediate, moe.key.dtype) == (8, 256, "nvfp4")
    assert moe.count == 75
    attn = next(op for op in inv.ops if op.kind == "attention")
    assert isinstance(attn.key, AttentionKey)
    assert attn.key.kind == "mla+dsa"
    assert attn.key.heads == 8


def test_dsa_reads_topk_latents_plus_every_index_key() -> None:
    spec = load_preset("glm-5")
    short = build_inventory(spec, Deployment(tp=8, context_len=1000, kv_dtype="bf16"))
    long = build_inventory(spec, Deployment(tp=8, context_len=100_000, kv_dtype="bf16"))
    per_layer_short = next(op for op in short.ops if op.kind == "attention").kv_bytes
    per_layer_long = next(op for op in long.ops if op.kind == "attention").kv_bytes
    index_per_token = 128 + 4
    assert per_layer_short == (1001 * 576 * 2) + 1001 * index_per_token
    assert per_layer_long == (2048 * 576 * 2) + 100_001 * index_per_token


def test_gqa_kv_heads_replicated_when_fewer_than_ranks() -> None:
    spec = load_preset("qwen3-235b-a22b")  # 4 KV heads
    inv = build_inventory(spec, Deployment(tp=8, context_len=1023, kv_dtype="bf16"))
    qkv = next(op for op in inv.ops if op.name == "qkv_proj")
    assert isinstance(qkv.key, GemmKey)
    assert qkv.key.n == (64 // 8 + 2 * 1) * 128
    attn = next(op for op in inv.ops if op.kind == "attention")
    assert attn.kv_bytes == 1024 * 2 * 1 * 128 * 2
    assert any("replicated" in a for a in inv.assumptions)


def test_gpt_oss_sliding_layers_read_a_window() -> None:
    inv = build_inventory(load_preset("gpt-oss-120b"), Deployment(tp=8, context_len=8191, kv_dtype="bf16"))
    sliding = next(op for op in inv.ops if op.name == "attention (gqa, sliding)")
    full = next(op for op in inv.ops if op.name == "attention (gqa)")
    assert sliding.count == full.count == 18
    assert sliding.kv_bytes == 128 * 2 * 1 * 64 * 2
    assert full.kv_bytes == 8192 * 2 * 1 * 64 * 2


def test_batch_touches_more_experts() -> None:
    spec = load_preset("deepseek-v3")
    b1 = build_inventory(spec, Deployment(tp=8, batch=1))
    b64 = build_inventory(spec, Deployment(tp=8, batch=64))
    e1 = next(op for op in b1.ops if op.kind == "moe")
    e64 = next(op for op in b64.ops if op.kind == "moe")
    assert e64.weight_bytes / e1.weight_bytes == pytest.approx(expected_distinct_experts(256, 8, 64) / 8)
    assert expected_distinct_experts(256, 8, 1) == pytest.approx(8)


def test_expert_parallel_splits_experts() -> None:
    spec = load_preset("deepseek-v3")
    ep = build_inventory(spec, Deployment(tp=8, ep=8))
    moe = next(op for op in ep.ops if op.kind == "moe")
    assert isinstance(moe.key, MoeKey)
    assert (moe.key.experts_local, moe.key.intermediate, moe.key.experts_active) == (32, 2048, 1)
    with pytest.raises(UserInputError, match="--ep"):
        build_inventory(spec, Deployment(tp=8, ep=3))


def test_speculative_decoding_runs_mtp_and_verifies_more_tokens() -> None:
    spec = load_preset("glm-5-nvfp4")
    inv = build_inventory(spec, Deployment(tp=8, accept_length=2.5))
    assert inv.deployment.n_draft == 2
    assert inv.tokens_per_step == 2.5
    qb = next(op for op in inv.ops if op.name == "q_b_proj")
    assert isinstance(qb.key, GemmKey) and qb.key.m == 3
    mtp = [op for op in inv.ops if op.name.startswith("mtp ")]
    assert mtp and all(op.layers in ("mtp", "-") for op in mtp)
    assert next(op for op in mtp if op.name == "mtp routed experts").count == 2
    with pytest.raises(UserInputError, match="MTP"):
        build_inventory(load_preset("kimi-k2"), Deployment(tp=8, accept_length=2.0))


@pytest.mark.parametrize(
    ("dep", "flag"),
    [
        (Deployment(tp=0), "--tp"),
        (Deployment(tp=3), "--tp"),
        (Deployment(tp=8, batch=0), "--batch"),
        (Deployment(tp=8, context_len=-1), "--context"),
        (Deployment(tp=8, kv_dtype="int4"), "--kv-dtype"),
        (Deployment(tp=8, accept_length=0.5), "--accept-length"),
        (Deployment(tp=8, accept_length=4.0, draft_tokens=1), "--accept-length"),
    ],
)
def test_bad_deployments_name_the_flag(dep: Deployment, flag: str) -> None:
    with pytest.raises(UserInputError, match=flag):
        build_inventory(load_preset("glm-5"), dep)


def test_dense_model_has_no_moe_ops() -> None:
    inv = build_inventory(spec_from_config(TINY_LLAMA), Deployment(tp=2))
    kinds = {op.kind for op in inv.ops}
    assert "moe" not in kinds and "routing" not in kinds
    assert inv.collective_count("all_reduce") == 2 * 2 + 1


@pytest.mark.parametrize("name", preset_names())
def test_each_kind_of_layer_built_once_gives_the_same_inventory_as_every_layer_built(name: str) -> None:
    """A what-if builds a new inventory per knob turned: one build per kind of layer, replayed for the others, must
    give exactly the ops (counts, layer ranges, bytes) of building all of them, and so the same budget."""
    spec = load_preset(name)
    deployments = [Deployment(tp=1), Deployment(tp=8, batch=8, kv_dtype="fp8")]
    if spec.is_moe and spec.n_experts % 2 == 0:
        deployments.append(Deployment(tp=2, ep=2, batch=4))
    if spec.n_mtp_layers:
        deployments.append(Deployment(tp=4, accept_length=2.5, draft_tokens=3))
    for dep in deployments:
        try:
            fast = build_inventory(spec, dep)
        except UserInputError:
            continue
        assert fast == build_inventory(spec, dep, by_layer_kind=False), (name, dep)
