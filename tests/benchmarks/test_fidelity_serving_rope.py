"""CPU tests of the fidelity reference's fused rotary form (benchmarks/fidelity/serving_rope.py) at tiny sizes: with
it the model gives the stock model's logits (torch path here, the Triton kernel under Triton's CPU interpreter), the
modeling module is restored on exit, and a model whose attention has no standard rotary is refused with the reason.
No timing assertions."""

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
serving_rope: Any = importlib.import_module("serving_rope")


def logits_against_stock(preset: str, layers: int = 2) -> dict[str, Any]:
    """A tiny `preset` (fp32, random weights) on a 4-token prompt: the largest relative difference of the fused form's
    logits from the stock model's, how many attention modules it covered, whether the rotary function was swapped
    and restored, and whether the fused kernel ran."""
    import torch

    model, ids = tiny_stock_model(preset, layers)
    calls: list[int] = []
    real = serving_rope.rope_qk

    def counted(*args: Any) -> Any:
        calls.append(1)
        return real(*args)

    serving_rope.rope_qk = counted
    try:
        with torch.no_grad():
            stock = model(ids).logits
            fused = serving_rope.ServingRope(model)
            if fused.reason:
                return {"reason": fused.reason, "describe": fused.describe()}
            originals = {n: m.apply_rotary_pos_emb for n, m in fused.modules.items()}
            with fused:
                swapped = all(m.apply_rotary_pos_emb is not originals[n] for n, m in fused.modules.items())
                served = model(ids).logits
    finally:
        serving_rope.rope_qk = real
    return {
        "reason": "",
        "describe": fused.describe(),
        "swapped": swapped,
        "restored": all(m.apply_rotary_pos_emb is originals[n] for n, m in fused.modules.items()),
        "calls": len(calls),
        "rel": float((served - stock).abs().max() / stock.abs().max()),
    }


@pytest.mark.parametrize("preset", ["llama-3.1-70b", "qwen3-235b-a22b"])
def test_the_fused_rotary_gives_the_stock_logits(preset: str) -> None:
    pytest.importorskip("transformers")
    got = logits_against_stock(preset)
    assert got["reason"] == "" and got["swapped"] and got["restored"], got
    assert got["calls"] == 2, got  # one fused call per layer
    assert got["rel"] < 1e-5, got
    assert got["describe"] == "rotary of q and k in one kernel in 2 attention modules"


def test_the_triton_kernel_under_the_cpu_interpreter() -> None:
    """The form's own Triton kernel (TRITON_INTERPRET=1, read when the kernel is defined: a fresh process) gives the
    stock logits, q and k of different head counts (GQA) in one launch."""
    pytest.importorskip("transformers")
    if importlib.util.find_spec("triton") is None:
        pytest.fail("the test extra installs Triton; its interpreter runs the kernel on the CPU")
    got = interpreted_call(Path(__file__), "logits_against_stock('llama-3.1-70b')")
    assert got["reason"] == "" and got["swapped"] and got["restored"] and got["calls"] == 2, got
    assert got["rel"] < 1e-5, got


def test_a_model_without_the_standard_rotary_is_refused_with_the_reason() -> None:
    """DeepSeek-V3's MLA attention rotates its own way (interleaved, a rope slice of the head): left alone."""
    pytest.importorskip("transformers")
    import torch
    from transformers import AutoModelForCausalLM

    cfg = fidelity.reduced_config("deepseek-v3", 1, fidelity.model_overrides("deepseek-v3", tiny=True))
    model = AutoModelForCausalLM.from_config(fidelity._hf_config(cfg), dtype=torch.float32)
    fused = serving_rope.ServingRope(model)
    assert fused.reason == "no attention module of the Llama rotary form", fused.modules
    assert fused.describe().startswith("rotary: transformers' own (")
    with pytest.raises(ValueError, match="does not apply"):
        fused.__enter__()
