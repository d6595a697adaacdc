"""The model-family registry: every `model_type` the reader knows has one family, a type claimed twice is refused,
and a new family is one `Family` record in the registry (a toy family reads a config with nothing else changed)."""

from __future__ import annotations

import pytest

from decodetop.budget import families
from decodetop.budget.families import FAMILIES
from decodetop.budget.families.base import Family
from decodetop.budget.families.mixtral import add_block_sparse_moe, read_every_layer_moe
from decodetop.budget.quant import ConfigError
from decodetop.budget.spec import load_preset, preset_names, spec_from_config
from tests.budget.test_spec import TINY_LLAMA


def test_every_preset_family_is_registered_and_no_type_twice() -> None:
    assert {load_preset(name).model_type for name in preset_names()} <= set(FAMILIES)
    claimed = [t for family in set(FAMILIES.values()) for t in family.model_types]
    assert sorted(claimed) == sorted(FAMILIES)
    with pytest.raises(ValueError, match="'llama' is claimed by two families"):
        families._registry((Family(("llama",)), Family(("mistral", "llama"))))


@pytest.mark.parametrize(
    ("model_type", "extra", "expected"),
    [
        # (bias on q/k/v, on o_proj, q/k norm, sliding window, sliding layers)
        ("llama", {"attention_bias": True}, (True, True, False, 0, ())),
        ("phi3", {"attention_bias": True}, (True, False, False, 0, ())),
        ("qwen2", {}, (True, False, False, 0, ())),
        ("qwen2", {"use_sliding_window": True, "sliding_window": 32}, (True, False, False, 32, (0, 1))),
        ("qwen3", {"sliding_window": 32}, (False, False, True, 0, ())),
        ("mistral", {"sliding_window": 32}, (False, False, False, 32, (0, 1))),
    ],
)
def test_each_family_reads_its_own_traits(
    model_type: str, extra: dict[str, object], expected: tuple[object, ...]
) -> None:
    spec = spec_from_config({**TINY_LLAMA, "model_type": model_type, **extra})
    assert (spec.attention_bias, spec.o_bias, spec.qk_norm, spec.sliding_window, spec.sliding_layers) == expected


def test_a_new_family_is_one_record_in_the_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    config = {**TINY_LLAMA, "model_type": "toy_moe", "num_local_experts": 4, "num_experts_per_tok": 2}
    with pytest.raises(ConfigError, match="'toy_moe' is not a family decodetop knows"):
        spec_from_config(config)
    toy = Family(("toy_moe",), read_ffn=read_every_layer_moe, add_experts=add_block_sparse_moe)
    monkeypatch.setitem(FAMILIES, "toy_moe", toy)  # the registry is a dict underneath
    spec = spec_from_config(config)
    assert (spec.n_experts, spec.top_k, spec.moe_layers, spec.ffn_dense) == (4, 2, (0, 1), 0)
    experts = [m for m in spec.modules if m.kind.startswith("expert_")]
    assert [m.name for m in experts[:3]] == [f"model.layers.0.block_sparse_moe.experts.0.w{n}" for n in (1, 3, 2)]
    assert {m.copies for m in experts} == {4}
