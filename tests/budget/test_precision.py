"""A model served at another weight precision: its linear layers restored, what a checkpoint keeps in its base
dtype kept so."""

from __future__ import annotations

import pytest

from decodetop.budget.precision import with_weights
from decodetop.budget.quant import WeightFormat
from decodetop.budget.spec import load_preset
from decodetop.errors import UserInputError


def test_linear_layers_take_the_format_and_routers_norms_and_lm_head_keep_theirs() -> None:
    spec = load_preset("deepseek-v3")  # an FP8 checkpoint
    assert with_weights(spec, "fp8") is spec  # what it already declares
    nvfp4 = with_weights(spec, "nvfp4")
    kinds = {m.kind: m.fmt for m in nvfp4.modules}
    assert kinds["expert_gate_proj"] is WeightFormat.NVFP4 and kinds["q_b_proj"] is WeightFormat.NVFP4
    assert kinds["router"] is WeightFormat.BF16 and kinds["lm_head"] is WeightFormat.BF16
    assert nvfp4.name == "DeepSeek-V3 (NVFP4 weights)"
    bf16 = with_weights(spec, "bf16")
    assert {m.fmt for m in bf16.modules} == {WeightFormat.BF16} and not bf16.quant.quantized
    assert sum(m.bytes for m in nvfp4.modules) < sum(m.bytes for m in spec.modules) < sum(m.bytes for m in bf16.modules)


def test_an_unknown_precision_is_one_line() -> None:
    with pytest.raises(UserInputError, match="weights='int3' is not one of bf16, fp8, nvfp4, mxfp4"):
        with_weights(load_preset("llama-3.1-70b"), "int3")
