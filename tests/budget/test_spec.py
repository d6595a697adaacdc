"""ModelSpec: presets against published parameter counts, the config.json reader across families, and its errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from decodetop.budget.quant import ConfigError, WeightFormat
from decodetop.budget.spec import PRESET_DIR, load_config, load_preset, preset_names, spec_from_config

# docs/reference/models.md §2, "published" row. Publishers count "active" differently; each row names the convention the
# publisher's figure matches (docs/reference/models.md §2-§3):
#   "no_embedding": active = everything a token reads except the input embedding (lm_head included)
#   "no_embedding_no_head": also without lm_head (Z.ai's GLM figures: 40B for GLM-5, 32B for GLM-4.5)
#   "all": embedding and lm_head included (Qwen3's 22B, Mixtral's 12.9B, dense Llama)
PUBLISHED = {
    "glm-5": (744.0, 40.0, "no_embedding_no_head"),
    "glm-5-fp8": (744.0, 40.0, "no_embedding_no_head"),
    "glm-5-nvfp4": (744.0, 40.0, "no_embedding_no_head"),
    "glm-4.5": (355.0, 32.0, "no_embedding_no_head"),
    "deepseek-v3": (671.0, 36.6, "no_embedding"),  # "37B (36.6B incl. 0.9B head)"
    "deepseek-r1": (671.0, 36.6, "no_embedding"),
    "deepseek-v3.1-nvfp4": (671.0, 36.6, "no_embedding"),
    "kimi-k2": (1000.0, 32.0, "no_embedding"),
    "qwen3-235b-a22b": (235.0, 22.0, "all"),
    "qwen3-235b-a22b-fp8": (235.0, 22.0, "all"),
    "qwen3-235b-a22b-nvfp4": (235.0, 22.0, "all"),
    "llama-3.1-70b": (70.0, 70.0, "all"),
    "llama-3.1-70b-fp8": (70.0, 70.0, "all"),
    "llama-3.1-405b": (405.0, 405.0, "all"),
    "gpt-oss-120b": (117.0, 5.1, "no_embedding"),
    "mixtral-8x7b": (46.7, 12.9, "all"),
}
TOLERANCE = 0.015
# Kimi-K2's "1T" is a one-significant-figure headline; its config gives 1026.4B (docs/reference/models.md §2 lists
# 1026.4B as the
# computed figure). 1.5% of a rounded "1T" cannot hold; the headline's own rounding (±5%) is used for that one.
TOTAL_TOLERANCE = {"kimi-k2": 0.05}

REQUIRED = {
    "glm-5",
    "glm-5-fp8",
    "glm-5-nvfp4",
    "deepseek-v3",
    "kimi-k2",
    "qwen3-235b-a22b",
    "llama-3.1-70b",
    "llama-3.1-405b",
    "gpt-oss-120b",
    "mixtral-8x7b",
}


def test_required_presets_exist() -> None:
    assert set(preset_names()) >= REQUIRED
    assert set(preset_names()) == set(PUBLISHED)


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_preset_params_match_published(name: str) -> None:
    spec = load_preset(name)
    total_b, active_b, convention = PUBLISHED[name]
    active = spec.params_active
    if convention == "no_embedding_no_head":
        active -= spec.params_lm_head
    elif convention == "all":
        active += spec.params_embedding
    total_tol = TOTAL_TOLERANCE.get(name, TOLERANCE)
    assert spec.params_total / 1e9 == pytest.approx(total_b, rel=total_tol)
    assert active / 1e9 == pytest.approx(active_b, rel=TOLERANCE)


def test_glm5_fields_avoid_the_traps() -> None:
    """docs/reference/models.md §0.2: head_dim 64 is the rope slice; MLA caches 576 values, not 64 KV heads."""
    spec = load_preset("glm-5")
    assert spec.attention_kind == "mla"
    assert spec.head_dim == 256
    assert spec.v_head_dim == 256
    assert spec.n_kv_heads == 1
    assert spec.kv_cache_dims == 576
    assert spec.index_topk == 2048
    assert len(spec.moe_layers) == 75
    assert spec.dense_layers == (0, 1, 2)
    assert spec.n_mtp_layers == 1
    by_kind = {m.kind: m for m in spec.modules if m.layer == 5}
    assert by_kind["q_b_proj"].params == 2048 * 64 * 256
    attention = sum(m.params for m in spec.modules if m.component.value == "attention_proj")
    assert attention / 1e9 == pytest.approx(13.603, rel=1e-3)  # docs/reference/models.md §3


def test_family_field_names() -> None:
    """Expert width and count come from different keys per family (docs/reference/models.md §4)."""
    mixtral = load_preset("mixtral-8x7b")
    assert (mixtral.n_experts, mixtral.top_k, mixtral.ffn_expert, mixtral.ffn_dense) == (8, 2, 14336, 0)
    qwen = load_preset("qwen3-235b-a22b")
    assert (qwen.n_experts, qwen.ffn_expert, qwen.head_dim, qwen.n_kv_heads) == (128, 1536, 128, 4)
    assert qwen.qk_norm
    gpt = load_preset("gpt-oss-120b")
    assert (gpt.n_experts, gpt.top_k, gpt.ffn_expert, gpt.sliding_window) == (128, 4, 2880, 128)
    assert len(gpt.sliding_layers) == 18
    assert gpt.expert_bias and gpt.attention_bias
    kimi = load_preset("kimi-k2")
    assert (kimi.n_experts, kimi.moe_layers[0], kimi.n_mtp_layers) == (384, 1, 0)


TINY_LLAMA = {
    "model_type": "llama",
    "num_hidden_layers": 2,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 100,
    "torch_dtype": "bfloat16",
}


def test_dense_llama_by_hand() -> None:
    spec = spec_from_config(TINY_LLAMA)
    per_layer = 64 * 64 + 2 * 64 * 32 + 64 * 64 + 3 * 64 * 128
    assert spec.params_total == 100 * 64 * 2 + 2 * per_layer
    assert spec.params_active == spec.params_total - 100 * 64
    assert spec.head_dim == 16
    assert spec.kv_cache_dims == 2 * 2 * 16


@pytest.mark.parametrize("family", ["mistral", "qwen2", "qwen3", "phi3", "granite", "olmo2"])
def test_common_dense_families_read_by_standard_keys(family: str) -> None:
    spec = spec_from_config({**TINY_LLAMA, "model_type": family})
    assert spec.n_layers == 2
    assert spec.ffn_dense == 128
    assert spec.attention_kind == "gqa"


def test_qwen2_bias_and_tied_embeddings() -> None:
    spec = spec_from_config({**TINY_LLAMA, "model_type": "qwen2", "tie_word_embeddings": True})
    per_layer = 64 * 64 + 2 * 64 * 32 + 64 * 64 + 3 * 64 * 128 + (64 + 32 + 32)  # q/k/v biases
    assert spec.params_total == 100 * 64 + 2 * per_layer
    assert spec.params_active == 2 * per_layer + 100 * 64  # the tied matrix is read as lm_head


def test_text_config_nesting() -> None:
    wrapper = {
        "model_type": "llava_like_vlm",
        "text_config": dict(TINY_LLAMA),
        "vision_config": {"hidden_size": 32},
        "quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]},
    }
    spec = spec_from_config(wrapper)
    assert spec.model_type == "llama"
    assert spec.quant.weight_format is WeightFormat.FP8_BLOCK


def test_text_config_errors_name_the_nested_key() -> None:
    bad = {"model_type": "vlm", "text_config": {**TINY_LLAMA, "hidden_size": -1}}
    with pytest.raises(ConfigError, match=r"text_config\.hidden_size"):
        spec_from_config(bad, file="x/config.json")


def test_load_config_reads_directory_with_hf_quant_config(tmp_path: Path) -> None:
    preset = json.loads((PRESET_DIR / "glm-5-nvfp4.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(preset["config"]))
    (tmp_path / "hf_quant_config.json").write_text(json.dumps(preset["hf_quant_config"]))
    (tmp_path / "model-00001-of-00002.safetensors").write_bytes(b"\x00not read")
    spec = load_config(tmp_path)
    assert spec.quant.weight_format is WeightFormat.NVFP4
    assert spec.active_weight_bytes() == pytest.approx(load_preset("glm-5-nvfp4").active_weight_bytes())
    assert load_config(tmp_path / "config.json").params_total == spec.params_total


@pytest.mark.parametrize(
    ("config", "key"),
    [
        ({**TINY_LLAMA, "hidden_size": -5}, "hidden_size"),
        ({**TINY_LLAMA, "num_hidden_layers": 10**9}, "num_hidden_layers"),
        ({**TINY_LLAMA, "vocab_size": "lots"}, "vocab_size"),
        ({**TINY_LLAMA, "num_key_value_heads": 3}, "num_key_value_heads"),
        ({k: v for k, v in TINY_LLAMA.items() if k != "intermediate_size"}, "intermediate_size"),
        ({**TINY_LLAMA, "model_type": "bert"}, "model_type"),
        ({**TINY_LLAMA, "torch_dtype": "int3"}, "torch_dtype"),
        ({**TINY_LLAMA, "quantization_config": {"quant_method": "gptq", "bits": 4}}, "quant_method"),
        ({**TINY_LLAMA, "hidden_size": 1e300}, "hidden_size"),
        ({**TINY_LLAMA, "hidden_size": True}, "hidden_size"),
    ],
)
def test_bad_values_name_file_and_key(config: dict[str, object], key: str) -> None:
    with pytest.raises(ConfigError) as info:
        spec_from_config(config, file="/ckpt/config.json")
    message = str(info.value)
    assert message.startswith("/ckpt/config.json: ")
    assert key in message
    assert "\n" not in message


def test_moe_without_top_k_is_an_error() -> None:
    bad = {**TINY_LLAMA, "model_type": "mixtral", "num_local_experts": 8}
    with pytest.raises(ConfigError, match="num_experts_per_tok"):
        spec_from_config(bad)


def test_unknown_preset_lists_known() -> None:
    with pytest.raises(ConfigError, match="glm-5-nvfp4"):
        load_preset("glm-6")


def test_deepseek_v32_and_v2_lite_variants() -> None:
    glm5 = json.loads((PRESET_DIR / "glm-5.json").read_text())["config"]
    v32 = spec_from_config({**glm5, "model_type": "deepseek_v32"})
    names = {m.name for m in v32.modules if m.layer == 0}
    assert "model.layers.0.self_attn.indexer.weights_proj" in names  # GLM-5 calls it indexers_proj instead
    assert v32.params_total == load_preset("glm-5").params_total
    lite = {
        "model_type": "deepseek_v2",
        "num_hidden_layers": 4,
        "hidden_size": 256,
        "intermediate_size": 512,
        "moe_intermediate_size": 64,
        "n_routed_experts": 8,
        "num_experts_per_tok": 2,
        "n_shared_experts": 2,
        "first_k_dense_replace": 1,
        "num_attention_heads": 4,
        "q_lora_rank": None,
        "kv_lora_rank": 32,
        "qk_nope_head_dim": 16,
        "qk_rope_head_dim": 8,
        "v_head_dim": 16,
        "vocab_size": 1000,
    }
    spec = spec_from_config(lite)
    assert spec.q_lora_rank == 0 and spec.scoring_func == "softmax"
    layer = {m.kind: m.params for m in spec.modules if m.layer == 1}
    assert layer["q_proj"] == 256 * 4 * 24
    assert "q_a_proj" not in layer
    assert layer["shared_gate_proj"] == 256 * 2 * 64
    assert spec.moe_layers == (1, 2, 3)


def test_glm45_attention_bias_and_partial_rotary() -> None:
    spec = load_preset("glm-4.5")
    assert spec.attention_bias and not spec.o_bias
    assert spec.rotary_dim == 64  # partial_rotary_factor 0.5 of head_dim 128
    q = next(m for m in spec.modules if m.kind == "q_proj")
    assert q.params == 5120 * 96 * 128 + 96 * 128


def test_mla_without_q_lora_builds_an_inventory() -> None:
    from decodetop.budget.deployment import Deployment
    from decodetop.budget.inventory import build_inventory

    glm45 = load_preset("glm-4.5")
    inv = build_inventory(glm45, Deployment(tp=8))
    assert inv.collective_count("all_reduce") == 2 * 92 + 1
    v2 = dict(json.loads((PRESET_DIR / "deepseek-v3.json").read_text())["config"])
    v2.update(model_type="deepseek_v2", q_lora_rank=None, quantization_config=None)
    inv = build_inventory(spec_from_config(v2), Deployment(tp=8))
    assert any(op.name == "q_proj" for op in inv.ops)
    assert inv.weight_bytes > 0
