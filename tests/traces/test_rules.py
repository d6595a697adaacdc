"""The classification table: every rule is tested by its own examples, and the table maps onto real components."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from decodetop.budget.components import Component
from decodetop.errors import UserInputError
from decodetop.traces.classify import UNCLASSIFIED, bucket_key, bucket_label, load_rules, parse_rules

RULES = load_rules()


def _examples(kind: str) -> list[tuple[str, str]]:
    table = RULES.kernels if kind == "kernels" else RULES.contexts
    return [(rule.id, example) for rule in table for example in rule.examples]


def test_every_rule_has_an_example() -> None:
    assert all(rule.examples for rule in RULES.kernels)
    assert all(rule.examples for rule in RULES.contexts)


@pytest.mark.parametrize(("rule_id", "name"), _examples("kernels"), ids=lambda v: str(v)[:60])
def test_kernel_rule_matches_its_examples_first(rule_id: str, name: str) -> None:
    """First match wins, so each example must land on its own rule, not an earlier one."""
    rule = RULES.classify(name)
    assert rule is not None and rule.id == rule_id


@pytest.mark.parametrize(("rule_id", "frame"), _examples("contexts"), ids=lambda v: str(v)[:60])
def test_context_rule_matches_its_examples(rule_id: str, frame: str) -> None:
    rule, matched = RULES.context_of([frame])
    assert rule is not None and rule.id == rule_id and matched == frame


@pytest.mark.parametrize(
    ("name", "family"),
    [
        ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "communication"),
        ("void vllm::cross_device_reduce_2stage<__nv_bfloat16, 8>(vllm::RankData*)", "communication"),
        ("void flash::flash_fwd_splitkv_combine_kernel<Flash_fwd_kernel_traits<128>>(Flash_fwd_params)", "attention"),
        ("sm90_xmma_gemm_e4m3bf16_e4m3f32_f32_tn_n_tilesize128x128x128_cublas", "gemm"),
        ("void vllm::moe::moe_align_block_size_kernel<int>(int const*)", "routing"),
        ("void sgl_kernel::topk_kernel<float>(float const*)", "routing"),
        ("triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_0", "norm"),
        ("void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<float, float, false>()", "norm"),
        ("void at::native::vectorized_elementwise_kernel<4, at::native::broadcast_add<float>>", "elementwise"),
        ("Memcpy HtoD (Pageable -> Device)", "memcpy"),
        ("aten::_to_copy", "copy"),
    ],
)
def test_representative_names(name: str, family: str) -> None:
    rule = RULES.classify(name)
    assert rule is not None and rule.family == family


def test_unknown_name_is_unclassified_not_hidden() -> None:
    assert RULES.classify("my_new_fused_thing_v7") is None
    assert bucket_key(None, None) == UNCLASSIFIED
    assert bucket_label(UNCLASSIFIED, RULES) == "unclassified kernels"


def test_family_mapping_uses_context() -> None:
    assert RULES.component("gemm", None) is None
    assert RULES.component("gemm", "attn_module") is Component.ATTENTION_PROJ
    assert RULES.component("gemm", "lm_head") is Component.LM_HEAD
    assert RULES.component("copy", "attn_core") is Component.ATTENTION
    assert RULES.component("copy", None) is None
    assert RULES.component("attention", "mlp") is Component.ATTENTION
    assert bucket_label(bucket_key(None, "gemm"), RULES) == "GEMM (unattributed)"


def test_innermost_telling_frame_decides_and_body_stops() -> None:
    frames = ["aten::mm", "aten::linear", "nn.Module: Linear_3", "nn.Module: LlamaAttention_0", "nn.Module: X_0"]
    rule, frame = RULES.context_of(frames)
    assert rule is not None and rule.id == "attn_module" and frame == "nn.Module: LlamaAttention_0"
    # inside the model body, nothing above it (ForCausalLM) leaks in
    rule, _ = RULES.context_of(["aten::add", "nn.Module: LlamaModel_0", "nn.Module: LlamaForCausalLM_0"])
    assert rule is not None and rule.id == "body"


def test_families_are_consistent() -> None:
    assert {r.family for r in RULES.kernels} <= set(RULES.families)
    contexts = {c.id for c in RULES.contexts}
    for fam in RULES.families.values():
        assert set(fam.by_context) <= contexts, fam.id


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ([], "must hold a JSON object"),
        ({"families": {}, "kernels": []}, "no kernel rules"),
        ({"families": {"a": {"default": "nope"}}, "kernels": []}, "not a budget component"),
        (
            {"families": {"a": {}}, "kernels": [{"id": "x", "family": "b", "pattern": "x"}]},
            "needs an 'id' and a 'family'",
        ),
        ({"families": {"a": {}}, "kernels": [{"id": "x", "family": "a", "pattern": "("}]}, "bad regex"),
    ],
)
def test_bad_rules_documents(doc: object, message: str) -> None:
    with pytest.raises(UserInputError, match=message):
        parse_rules(doc, "rules.json")


def test_user_rules_file(tmp_path: Path) -> None:
    path = tmp_path / "rules.json"
    path.write_text(
        json.dumps(
            {
                "families": {"gemm": {"default": "dense_mlp"}},
                "kernels": [{"id": "g", "family": "gemm", "pattern": "nvjet"}],
            }
        )
    )
    rules = load_rules(str(path))
    assert rules.component("gemm", None) is Component.DENSE_MLP
    path.write_text("{broken")
    load_rules.cache_clear()
    with pytest.raises(UserInputError, match="malformed JSON at line 1"):
        load_rules(str(path))


@pytest.mark.parametrize(
    ("outer", "expected"),
    [
        # DeepSeek (transformers and vLLM): the shared expert is an MLP class inside the MoE block
        (["nn.Module: DeepseekV3MoE_0", "nn.Module: DeepseekV3DecoderLayer_1"], "shared_experts"),
        (["nn.Module: DeepseekV2MoE_3", "nn.Module: DeepseekV2DecoderLayer_3"], "shared_experts"),
        # the same class directly under a decoder layer is the dense MLP (DeepSeek's first dense layers)
        (["nn.Module: DeepseekV3DecoderLayer_0", "nn.Module: DeepseekV3Model_0"], "mlp"),
    ],
)
def test_mlp_inside_an_moe_block_is_its_shared_expert(outer: list[str], expected: str) -> None:
    rules = load_rules()
    frames = ["aten::mm", "aten::linear", "nn.Module: Linear_7", "nn.Module: DeepseekV3MLP_0", *outer]
    rule, frame = rules.context_of(frames)
    assert rule is not None and rule.id == expected
    assert frame == "nn.Module: DeepseekV3MLP_0"
    gemm = rules.classify("nvjet_sm90_tst_192x8_64x8_4x1_v_bz_TNT")
    assert gemm is not None
    comp = rules.component(gemm.family, rule.id)
    assert comp is (Component.SHARED_EXPERTS if expected == "shared_experts" else Component.DENSE_MLP)


def test_within_must_name_known_contexts() -> None:
    import decodetop.traces.classify as classify

    data = json.loads((Path(classify.__file__).parent / classify.RULES_FILE).read_text(encoding="utf-8"))
    data["contexts"][0]["within"] = {"nowhere": "mlp"}
    with pytest.raises(UserInputError, match="within"):
        parse_rules(data, "rules.json")


@pytest.mark.parametrize(
    ("frame", "expected"),
    [
        ("nn.Module: Qwen3MoeAttention_0", "attn_module"),
        ("nn.Module: Glm4MoeAttention_3", "attn_module"),
        ("nn.Module: Qwen3MoeForCausalLM_0", "lm_head"),
        ("nn.Module: Qwen3MoeExperts_0", "experts"),
        ("nn.Module: MixtralSparseMoeBlock_1", "experts"),
        ("nn.Module: Glm4MoeMoE_1", "experts"),
    ],
)
def test_moe_in_a_model_name_is_not_an_moe_block(frame: str, expected: str) -> None:
    """Every module of Qwen3-MoE, GLM-4.5 (Glm4Moe…) and Mixtral carries the model's name; only experts modules
    and MoE blocks are the routed-experts context."""
    rule, _ = RULES.context_of([frame])
    assert rule is not None and rule.id == expected
