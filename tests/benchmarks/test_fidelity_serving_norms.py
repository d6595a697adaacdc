"""CPU tests of the fidelity reference's fused residual-add + RMSNorm form (benchmarks/fidelity/serving_norms.py) at
tiny sizes: the re-routed model gives the stock model's logits (torch path here, the Triton kernel under Triton's CPU
interpreter), the model is restored on exit, and a model not of the Llama form is refused with the reason. No timing
assertions."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.benchmarks.tiny_stock import tiny_stock_model
from tests.helpers.interpreter import interpreted_call

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH / "fidelity"))

fidelity: Any = importlib.import_module("fidelity")
serving_norms: Any = importlib.import_module("serving_norms")


def logits_against_stock(preset: str, layers: int = 3) -> dict[str, Any]:
    """A tiny `layers`-layer `preset` (fp32, random weights) on a 4-token prompt: the largest relative difference of
    the fused form's logits from the stock model's, whether the form applied, and whether the model was restored."""
    import torch

    model, ids = tiny_stock_model(preset, layers)
    with torch.no_grad():
        stock = model(ids).logits
        fused = serving_norms.ServingNorms(model)
        if fused.reason:
            return {"reason": fused.reason, "describe": fused.describe()}
        with fused:
            patched = all("forward" in layer.__dict__ for layer in fused.layers)
            served = model(ids).logits
            again = model(ids).logits  # the carried residual is reset between forwards
        restored = model(ids).logits
    return {
        "reason": "",
        "describe": fused.describe(),
        "patched": patched,
        "rel": float((served - stock).abs().max() / stock.abs().max()),
        "again_rel": float((again - stock).abs().max() / stock.abs().max()),
        "restored": all("forward" not in layer.__dict__ for layer in fused.layers) and torch.equal(restored, stock),
    }


@pytest.mark.parametrize("preset", ["llama-3.1-70b", "mixtral-8x7b"])
def test_the_fused_form_gives_the_stock_logits(preset: str) -> None:
    pytest.importorskip("transformers")
    got = logits_against_stock(preset)
    assert got["reason"] == "", got
    assert got["patched"] and got["restored"], got
    assert got["rel"] < 1e-5 and got["again_rel"] < 1e-5, got
    assert got["describe"] == "6 residual adds fused into the following RMSNorm (one kernel each)"


def test_the_triton_kernel_under_the_cpu_interpreter() -> None:
    """The form's own Triton kernel (TRITON_INTERPRET=1, read when the kernel is defined: a fresh process) gives the
    stock logits."""
    pytest.importorskip("transformers")
    if importlib.util.find_spec("triton") is None:
        pytest.fail("the test extra installs Triton; its interpreter runs the kernel on the CPU")
    got = interpreted_call(Path(__file__), "logits_against_stock('llama-3.1-70b', 2)")
    assert got["reason"] == "" and got["patched"] and got["restored"], got
    assert got["rel"] < 1e-5 and got["again_rel"] < 1e-5, got


def test_a_model_not_of_the_llama_form_is_refused_with_the_reason() -> None:
    """A layer with a third norm (Gemma's pre-feedforward norm, here planted in a tiny Llama) keeps transformers'
    norms, and entering the form says why."""
    pytest.importorskip("transformers")
    import copy

    import torch
    from transformers import AutoModelForCausalLM

    cfg = fidelity.reduced_config("llama-3.1-70b", 2, fidelity.model_overrides("llama-3.1-70b", tiny=True))
    model = AutoModelForCausalLM.from_config(fidelity._hf_config(cfg), dtype=torch.float32)
    assert serving_norms.ServingNorms(model).reason == ""
    layer = model.model.layers[1]
    layer.pre_feedforward_layernorm = copy.deepcopy(layer.post_attention_layernorm)
    fused = serving_norms.ServingNorms(model)
    assert "is not of the Llama form" in fused.reason
    assert fused.describe().startswith("norms: transformers' own (")
    with pytest.raises(ValueError, match="does not apply"):
        fused.__enter__()
    assert all("forward" not in m.__dict__ for m in model.model.layers)
