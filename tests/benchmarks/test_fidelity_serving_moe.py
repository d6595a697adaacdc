"""CPU tests of the fidelity reference's serving-MoE form (benchmarks/fidelity/serving_moe.py) at tiny sizes.

The form swaps every MoE block's routed experts for the independent grouped kernel of
benchmarks/engine/moe_routed.py. These tests check that the swapped block computes what the stock transformers block
computes: through the kernel's torch reference path here, and through the Triton kernels themselves under Triton's CPU
interpreter where Triton is installed. No timing assertions.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.env import subprocess_env

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH / "fidelity"))

fidelity: Any = importlib.import_module("fidelity")
serving_moe: Any = importlib.import_module("serving_moe")

MOE_PRESETS = ["mixtral-8x7b", "qwen3-235b-a22b", "deepseek-v3", "glm-4.5"]


def block_outputs(preset: str, backend: str) -> dict[str, Any]:
    """Each MoE block of a tiny 2-layer `preset` (fp32, random weights) on one decode token, stock and swapped: the
    largest relative difference of the block outputs and of the experts modules' outputs, whether the router gave the
    experts the same inputs both times, and the routed experts' share of the block output (so that a wrong routed
    path could not hide under the shared experts)."""
    import torch
    from transformers import AutoModelForCausalLM

    overrides = fidelity.model_overrides(preset, tiny=True)
    if "first_k_dense_replace" in fidelity.preset_document(preset)["config"]:  # every layer MoE
        overrides["first_k_dense_replace"] = 0
    cfg = fidelity.reduced_config(preset, 2, overrides)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(fidelity._hf_config(cfg), dtype=torch.float32).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.05)
    blocks = [m for m in model.modules() if serving_moe.is_swappable_experts(getattr(m, "experts", None))]
    seen: list[tuple[Any, Any]] = []

    def capture(_module: Any, args: tuple[Any, ...], output: Any) -> None:
        seen.append((tuple(a.clone() for a in args), output.clone()))

    hooks = [b.experts.register_forward_hook(capture) for b in blocks]
    x = torch.randn(1, 1, int(cfg["hidden_size"]), generator=torch.Generator().manual_seed(1))

    def run() -> list[Any]:
        with torch.no_grad():
            outs = [b(x) for b in blocks]
        return [o[0] if isinstance(o, tuple) else o for o in outs]

    stock = run()
    stock_seen = list(seen)
    seen.clear()
    with serving_moe.ServingMoE(model, backend=backend) as swap:
        assert all("forward" in b.experts.__dict__ for b in blocks)
        served = run()
        used = swap.backend
    served_seen = list(seen)
    for h in hooks:
        h.remove()

    def rel(a: Any, b: Any) -> float:
        return float((a - b).abs().max() / b.abs().max())

    return {
        "blocks": len(blocks),
        "backend": used,
        "block_rel": max(rel(s, t) for s, t in zip(served, stock, strict=True)),
        "experts_rel": max(rel(s[1], t[1]) for s, t in zip(served_seen, stock_seen, strict=True)),
        "same_routing": all(
            all(torch.equal(a, b) for a, b in zip(s[0], t[0], strict=True))
            for s, t in zip(served_seen, stock_seen, strict=True)
        ),
        "routed_share": min(float(t[1].norm() / o.norm()) for t, o in zip(stock_seen, stock, strict=True)),
        "restored": all("forward" not in b.experts.__dict__ for b in blocks),
    }


@pytest.mark.parametrize("preset", MOE_PRESETS)
def test_the_swapped_moe_block_computes_what_the_stock_block_computes(preset: str) -> None:
    """Through the grouped kernel's torch reference path (routed experts gathered by the device ids, fp32)."""
    pytest.importorskip("transformers")
    got = block_outputs(preset, "torch")
    assert got["blocks"] == 2 and got["backend"] == "torch"
    assert got["same_routing"] and got["restored"]
    assert got["routed_share"] > 0.1, got
    assert got["experts_rel"] < 1e-5 and got["block_rel"] < 1e-5, got


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="Triton is not installed")
@pytest.mark.parametrize("preset", ["mixtral-8x7b", "deepseek-v3"])
def test_the_grouped_triton_kernels_under_the_cpu_interpreter(preset: str) -> None:
    """moe_routed.py's own Triton kernels (TRITON_INTERPRET=1 runs them on CPU tensors; it is read when the kernels
    are defined, so in a fresh process) give the stock block's output."""
    pytest.importorskip("transformers")
    code = (
        "import importlib.util, json, sys\n"
        f"spec = importlib.util.spec_from_file_location('t', {str(Path(__file__))!r})\n"
        "t = importlib.util.module_from_spec(spec); spec.loader.exec_module(t)\n"
        f"print(json.dumps(t.block_outputs({preset!r}, 'auto')))\n"
    )
    env = subprocess_env(pythonpath=tuple(Path(p) for p in sys.path if p), TRITON_INTERPRET="1")
    done = subprocess.run(
        [sys.executable, "-c", code], check=False, env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-2000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["backend"] == "triton" and got["blocks"] == 2
    assert got["same_routing"] and got["restored"] and got["routed_share"] > 0.1
    assert got["experts_rel"] < 1e-5 and got["block_rel"] < 1e-5, got


def test_the_fidelity_run_records_the_serving_moe_form_on_cpu() -> None:
    """time_model adds the form for an MoE model (torch path on CPU, said so), with its logits check against the
    form before it; a dense model records why it has none; the summary table shows the form."""
    pytest.importorskip("transformers")
    import torch

    if torch.cuda.is_available():
        pytest.skip("time_model runs on the GPU here (the GPU run is the campaign's, not a test's)")
    cfg = fidelity.reduced_config("qwen3-235b-a22b", 2, fidelity.model_overrides("qwen3-235b-a22b", tiny=True))
    got = fidelity.time_model(cfg, context=16, steps=1, samples=1, trace_steps=0)
    form = got["serving_moe"]
    assert form["backend"] == "torch" and "torch reference path" in form["what"]
    assert form["eager_ms"] > 0 and form["graph_ms"] is None
    assert form["check"]["same_argmax"] and form["check"]["logits_max_abs_diff_rel"] < 1e-5
    dense = fidelity.reduced_config("llama-3.1-70b", 1, fidelity.model_overrides("llama-3.1-70b", tiny=True))
    assert "skipped" in fidelity.time_model(dense, context=16, steps=1, samples=1, trace_steps=0)["serving_moe"]
    doc = {
        "models": {
            "qwen3": {"budget": {"graph_ms": 1.8, "eager_ms": 2.0}, "measured": {**got, "graph_ms": 2.5}},
            "mixtral": {
                "budget": {"graph_ms": 1.4, "eager_ms": 1.8},
                "measured": {"graph_ms": 2.5, "serving_moe": {"error": "RuntimeError: Triton is not installed"}},
            },
        }
    }
    doc["models"]["qwen3"]["measured"]["serving_moe"] = {**form, "graph_ms": 2.0}
    table = fidelity.summary_table(doc)
    form_label = fidelity.SERVING_FORMS[-1][1]
    assert form_label.startswith("… and serving MoE (")
    assert f"| qwen3 | graph, {form_label} | 1.8 | 2 | -10.0 % | ≤ 15 % ✓ |" in table
    assert f"| mixtral | {form_label} | 1.4 | - | unavailable: RuntimeError" in table


def test_the_backend_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    """CPU without Triton falls back to the torch path; a CUDA device without Triton says the form is unavailable;
    with Triton, CUDA runs the kernels, and CPU only under Triton's interpreter."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(serving_moe, "routed_kernels", lambda: None)
    assert serving_moe.choose_backend("cpu") == "torch"
    with pytest.raises(RuntimeError, match="Triton is not installed"):
        serving_moe.choose_backend("cuda")
    with pytest.raises(ValueError, match="backend"):
        serving_moe.choose_backend("cpu", "cutlass")
    monkeypatch.setattr(serving_moe, "routed_kernels", lambda: serving_moe)  # any module: "Triton is installed"
    assert serving_moe.choose_backend("cuda") == "triton"
    assert serving_moe.choose_backend("cpu") == "torch"
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert serving_moe.choose_backend("cpu") == "triton"
