"""The committed presets are exactly what scripts/gen_presets.py generates from docs/reference/model_configs.json."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = ROOT / "docs" / "reference" / "model_configs.json"


def _script():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("gen_presets", ROOT / "scripts" / "gen_presets.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_presets_are_up_to_date() -> None:
    assert _script().main(["--reference", str(REFERENCE), "--check"]) == 0


def test_expand_patterns_by_count() -> None:
    config = {"num_hidden_layers": 4, "num_nextn_predict_layers": 1, "first_k_dense_replace": 1}
    expand = _script().expand
    assert expand({"model.layers.N.self_attn.o_proj": 5}, config)[-1] == "model.layers.4.self_attn.o_proj"
    assert expand({"model.layers.N.mlp.gate": 4}, config) == [f"model.layers.{i}.mlp.gate" for i in range(4)]
    assert expand({"lm_head": 1}, config) == ["lm_head"]
    with pytest.raises(SystemExit):
        expand({"model.layers.N.x": 17}, config)
