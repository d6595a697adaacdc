"""CPU tests of the fidelity reference's fused projections (benchmarks/fidelity/serving_linears.py) at tiny sizes:
with them the model gives the stock model's logits with fewer GEMMs (q/k/v, gate/up, MLA's q_a/kv_a each one), every
member's forward is restored on exit with its weight's values unchanged, and a model without such siblings is
refused with the reason. No timing assertions."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.benchmarks.tiny_stock import tiny_stock_model

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks" / "fidelity"))
serving_linears: Any = importlib.import_module("serving_linears")


def linear_calls(model: Any, ids: Any) -> tuple[Any, int]:
    """(logits, how many `F.linear` calls one forward made)."""
    import torch
    import torch.nn.functional as F  # noqa: N812

    real = F.linear
    calls: list[int] = []

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return real(*args, **kwargs)

    F.linear = counted
    try:
        with torch.no_grad():
            logits = model(ids).logits
    finally:
        F.linear = real
    return logits, len(calls)


@pytest.mark.parametrize(
    ("preset", "saved", "describe"),
    [
        ("llama-3.1-70b", 6, "sibling projections as one GEMM each (q/k/v ×2, gate/up ×2)"),
        ("qwen3-235b-a22b", 4, "sibling projections as one GEMM each (q/k/v ×2)"),
        ("deepseek-v3", 4, "sibling projections as one GEMM each (q_a/kv_a ×2, gate/up ×2)"),
    ],
)
def test_the_fused_projections_give_the_stock_logits(preset: str, saved: int, describe: str) -> None:
    """`saved`: the GEMMs one forward of the 2-layer model no longer runs (a group of n shares one GEMM: n − 1)."""
    pytest.importorskip("transformers")
    import torch

    model, ids = tiny_stock_model(preset, 2)
    stock, stock_calls = linear_calls(model, ids)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    fused = serving_linears.ServingLinears(model)
    assert fused.reason == "", fused.reason
    assert fused.describe() == describe
    with fused:
        served, served_calls = linear_calls(model, ids)
        again, _ = linear_calls(model, ids)  # a second forward: nothing left over from the first
    assert float((served - stock).abs().max() / stock.abs().max()) < 1e-5
    assert torch.equal(served, again)
    assert stock_calls - served_calls == saved, (stock_calls, served_calls)
    for m in model.modules():
        assert "forward" not in m.__dict__ and "_decodetop_group" not in m.__dict__
    after = dict(model.named_parameters())
    assert all(torch.equal(before[n], after[n]) for n in before)
    restored, restored_calls = linear_calls(model, ids)
    assert restored_calls == stock_calls and torch.equal(restored, stock)


def test_a_sibling_called_with_another_input_computes_its_own() -> None:
    """The shared GEMM is taken only for the very tensor the group's last GEMM read; any other input computes anew."""
    import torch

    parent = torch.nn.Module()
    parent.gate_proj = torch.nn.Linear(8, 6, bias=False)
    parent.up_proj = torch.nn.Linear(8, 6, bias=False)
    x, y = torch.randn(2, 8), torch.randn(2, 8)
    want_gate, want_up = parent.gate_proj(x), parent.up_proj(y)
    with torch.no_grad(), serving_linears.ServingLinears(parent):
        got_gate, got_up = parent.gate_proj(x), parent.up_proj(y)
    assert torch.allclose(got_gate, want_gate) and torch.allclose(got_up, want_up)


def test_a_model_without_siblings_is_refused_with_the_reason() -> None:
    import torch

    lone = torch.nn.Sequential(torch.nn.Linear(4, 4))
    fused = serving_linears.ServingLinears(lone)
    assert fused.reason.startswith("no sibling linears over one input")
    assert fused.describe().startswith("projections: transformers' own (")
    with pytest.raises(ValueError, match="do not apply"):
        fused.__enter__()
