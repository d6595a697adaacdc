"""Quantization: formats, bits per weight, and each producer's exclusion-list style (docs/reference/models.md §5)."""

from __future__ import annotations

import pytest

from decodetop.budget.components import Component
from decodetop.budget.quant import (
    ConfigError,
    Exclusions,
    WeightFormat,
    bits_per_weight,
    read_hf_quant_config,
    read_quantization_config,
)
from decodetop.budget.spec import load_preset, spec_from_config

from .test_spec import TINY_LLAMA


def test_bits_per_weight_table() -> None:
    assert bits_per_weight(WeightFormat.BF16) == 16
    assert bits_per_weight(WeightFormat.FP8_BLOCK) == pytest.approx(8 + 32 / 16384)
    assert bits_per_weight(WeightFormat.FP8_TENSOR) == 8
    assert bits_per_weight(WeightFormat.NVFP4) == 4.5
    assert bits_per_weight(WeightFormat.MXFP4) == 4.25


def test_glm5_nvfp4_follows_its_exclusions_not_a_flat_rate() -> None:
    """Acceptance: attention and lm_head stay BF16; only MLPs are NVFP4 (docs/reference/models.md §0.4: ~44 GB per
    token)."""
    spec = load_preset("glm-5-nvfp4")
    for m in spec.modules:
        if m.component is Component.ATTENTION_PROJ or m.kind == "lm_head" or m.kind in ("router", "embedding"):
            assert m.fmt is WeightFormat.BF16, m.name
        else:
            assert m.fmt is WeightFormat.NVFP4, m.name
    per_token = spec.active_weight_bytes()
    flat = spec.params_active * 4.5 / 8
    assert per_token / 1e9 == pytest.approx(44.1, abs=0.05)
    assert per_token > 1.9 * flat


@pytest.mark.parametrize(
    ("name", "gb"),
    [  # docs/reference/models.md §5, per-token active weight bytes at native precision
        ("glm-5", 81.7),
        ("glm-5-fp8", 41.9),
        ("deepseek-v3", 37.7),
        ("deepseek-v3.1-nvfp4", 28.2),
        ("kimi-k2", 33.0),
        ("qwen3-235b-a22b", 43.1),
        ("qwen3-235b-a22b-fp8", 22.2),
        ("qwen3-235b-a22b-nvfp4", 13.1),
        ("llama-3.1-70b", 139.0),
        ("llama-3.1-70b-fp8", 70.6),
        ("llama-3.1-405b", 807.5),
        ("gpt-oss-120b", 5.0),
        ("mixtral-8x7b", 25.5),
    ],
)
def test_per_token_bytes_match_reference_table(name: str, gb: float) -> None:
    assert load_preset(name).active_weight_bytes() / 1e9 == pytest.approx(gb, abs=0.06)


def test_glm5_fp8_keeps_indexer_weights_proj_and_router_bf16() -> None:
    spec = load_preset("glm-5-fp8")
    fmts = {m.kind: m.fmt for m in spec.modules if m.layer == 10}
    assert fmts["indexer_weights_proj"] is WeightFormat.BF16
    assert fmts["indexer_wq_b"] is WeightFormat.FP8_BLOCK
    assert fmts["router"] is WeightFormat.BF16
    assert fmts["expert_gate_proj"] is WeightFormat.FP8_BLOCK


def test_gpt_oss_mxfp4_only_experts() -> None:
    spec = load_preset("gpt-oss-120b")
    for m in spec.modules:
        expected = WeightFormat.MXFP4 if m.kind.startswith("expert_") else WeightFormat.BF16
        assert m.fmt is expected, m.name


def test_glob_style_modelopt() -> None:
    ex = Exclusions("glob", ("model.layers.0*", "*self_attn*", "lm_head"))
    assert ex.matches("model.layers.0.mlp.gate_proj")
    assert ex.matches("model.layers.03.mlp.gate_proj")  # a glob is a glob: layers.0* covers 03 too
    assert not ex.matches("model.layers.10.mlp.gate_proj")
    assert ex.matches("model.layers.7.self_attn.o_proj")
    assert ex.matches("lm_head")


def test_prefix_style_modules_to_not_convert() -> None:
    ex = Exclusions("prefix", ("model.layers.*.self_attn", "model.layers.3.mlp.gate", "lm_head"))
    assert ex.matches("model.layers.9.self_attn.q_proj")  # parent covers children
    assert ex.matches("model.layers.3.mlp.gate")
    assert not ex.matches("model.layers.3.mlp.gate_proj")  # a prefix is a module path, not a string prefix
    assert not ex.matches("model.layers.4.mlp.gate")


def test_compressed_tensors_style() -> None:
    ex = Exclusions("ct", ("lm_head", r"re:.*self_attn.*", "re:model\\.layers\\.[0-2]\\.mlp.*"))
    assert ex.matches("lm_head")
    assert ex.matches("model.layers.40.self_attn.o_proj")
    assert ex.matches("model.layers.2.mlp.down_proj")
    assert not ex.matches("model.layers.20.mlp.down_proj")
    # globs are not compressed-tensors syntax: "model.layers.*" is an exact name there
    assert not Exclusions("ct", ("model.layers.*",)).matches("model.layers.1.mlp")


def test_wrapper_prefixes_are_normalised() -> None:
    ex = Exclusions("glob", ("language_model.model.layers.*.self_attn*", "language_model.lm_head"))
    assert ex.matches("model.layers.4.self_attn.kv_b_proj")
    assert ex.matches("lm_head")


def test_compressed_tensors_nvfp4_in_config() -> None:
    qc = {
        "quant_method": "compressed-tensors",
        "format": "nvfp4-pack-quantized",
        "config_groups": {
            "group_0": {
                "weights": {"num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 16},
                "targets": ["Linear", "lm_head"],
            }
        },
        "ignore": ["re:.*k_proj$"],
    }
    spec = spec_from_config({**TINY_LLAMA, "quantization_config": qc})
    fmts = {m.kind: m.fmt for m in spec.modules if m.layer in (0, -1)}
    assert fmts["k_proj"] is WeightFormat.BF16
    assert fmts["q_proj"] is WeightFormat.NVFP4
    assert fmts["lm_head"] is WeightFormat.NVFP4  # targeted explicitly
    assert fmts["embedding"] is WeightFormat.BF16


def test_modelopt_in_config_json() -> None:
    qc = {
        "quant_method": "modelopt",
        "quant_algo": "NVFP4",
        "config_groups": {
            "group_0": {"weights": {"num_bits": 4, "type": "float", "group_size": 16}, "targets": ["Linear"]}
        },
        "ignore": ["language_model.lm_head", "language_model.model.layers.*.self_attn*"],
        "kv_cache_scheme": {"num_bits": 8, "type": "float"},
    }
    scheme = read_quantization_config(qc, "c.json", WeightFormat.BF16)
    assert scheme.weight_format is WeightFormat.NVFP4
    assert scheme.kv_cache_dtype == "fp8"
    assert scheme.format_for("model.layers.1.self_attn.o_proj", "linear") is WeightFormat.BF16
    assert scheme.format_for("model.layers.1.mlp.experts.0.up_proj", "linear") is WeightFormat.NVFP4


def test_fp8_per_tensor_hf_quant_config() -> None:
    hq = {"producer": {"name": "modelopt"}, "quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": "FP8"}}
    scheme = read_hf_quant_config(hq, "hf_quant_config.json", WeightFormat.BF16)
    assert scheme.weight_format is WeightFormat.FP8_TENSOR
    assert scheme.weight_bits == 8
    assert scheme.kv_cache_dtype == "fp8"


@pytest.mark.parametrize(
    ("qc", "key"),
    [
        ({"quant_method": "awq", "bits": 4}, "quant_method"),
        ({"quant_method": "fp8", "weight_block_size": [128]}, "weight_block_size"),
        ({"quant_method": "fp8", "modules_to_not_convert": "lm_head"}, "modules_to_not_convert"),
        ({"quant_method": "modelopt", "quant_algo": "W4A8_AWQ"}, "quant_algo"),
        (
            {"quant_method": "compressed-tensors", "config_groups": {"g": {"weights": {"num_bits": 4, "type": "int"}}}},
            "config_groups.g.weights",
        ),
        ("fp8", "quantization_config"),
    ],
)
def test_unknown_quantization_is_a_clear_error(qc: object, key: str) -> None:
    with pytest.raises(ConfigError) as info:
        read_quantization_config(qc, "/m/config.json", WeightFormat.BF16)
    assert str(info.value).startswith("/m/config.json: ")
    assert key in str(info.value)


def test_unknown_hf_quant_algo() -> None:
    with pytest.raises(ConfigError, match=r"hf_quant_config.json: quantization.quant_algo"):
        read_hf_quant_config({"quantization": {"quant_algo": "INT4_AWQ"}}, "hf_quant_config.json", WeightFormat.BF16)
