"""CPU smoke tests of the proof scripts (benchmarks/{accuracy,fidelity,diagnosis,cost}/*.py) at tiny sizes.

No timing assertions: the scripts' figures only mean something on the GPU machine. These tests check that the
scripts build the right configs, really plant what they say, compare the right rows and never crash on CPU.
"""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
for _topic in ("accuracy", "fidelity", "diagnosis", "cost"):
    sys.path.insert(0, str(BENCH / _topic))

fidelity: Any = importlib.import_module("fidelity")
diagnosis: Any = importlib.import_module("diagnosis")
accuracy: Any = importlib.import_module("accuracy")
cost: Any = importlib.import_module("cost")


def test_reduced_config_keeps_the_architecture_and_cuts_the_depth() -> None:
    cfg = fidelity.reduced_config("deepseek-v3", 4, fidelity.model_overrides("deepseek-v3", tiny=False))
    assert cfg["num_hidden_layers"] == 4
    assert cfg["first_k_dense_replace"] == 1
    assert "quantization_config" not in cfg
    assert cfg["hidden_size"] == 7168 and cfg["n_routed_experts"] == 256
    spec = fidelity.reduced_spec("deepseek-v3", 4, fidelity.model_overrides("deepseek-v3", tiny=False))
    assert spec.n_layers == 4
    assert spec.moe_layers == (1, 2, 3)
    assert spec.attention_kind == "mla"
    inv = fidelity.inventory_for(spec, context=4096)
    assert inv.deployment.tp == 1 and inv.deployment.context_len == 4096
    assert not inv.collectives  # TP 1: nothing to all-reduce


def test_llama_reduced_spec_is_bf16_and_four_layers() -> None:
    spec = fidelity.reduced_spec("llama-3.1-70b", 4)
    assert (spec.n_layers, spec.d_model, spec.n_heads, spec.n_kv_heads) == (4, 8192, 64, 8)
    inv = fidelity.inventory_for(spec)
    assert inv.kv_dtype == "bf16"
    # weights of one step: 4 layers + lm_head, about 9 GB in BF16
    assert 8e9 < inv.weight_bytes < 10e9


def test_planted_attention_runs_in_the_rank_and_marks_its_results() -> None:
    """The kv_whole_cast plant goes through the real controller and the real attention probe, on one CPU rank."""
    spec = fidelity.reduced_spec("llama-3.1-70b", 1, fidelity.model_overrides("llama-3.1-70b", tiny=True))
    inv = fidelity.inventory_for(spec, context=64)
    got = fidelity.run_plans(
        {"m": inv}, device="cpu", only=("attention",), registry=diagnosis.planted_registry(), progress=False
    )["m"]
    results = got["plan_run"]["results"]
    notes = [m["note"] for r in results for m in r["measurements"]]
    assert notes and all(diagnosis.PLANT_NOTE in n for n in notes)
    assert got["graph_rows"]["attention"] is not None


def test_moves_and_judgement_pick_the_largest_increase() -> None:
    clean = {"attention": 1.0, "launch": 0.5, "norms": 0.2, "communication": None}
    planted = {"attention": 1.1, "launch": 2.0, "norms": 0.1, "communication": None}
    rows = diagnosis.moves(clean, planted)
    assert rows[0]["component"] == "launch" and rows[0]["delta_ms"] == pytest.approx(1.5)
    res = {"moves_eager": rows, "clean_eager_ms": 1.7, "planted_eager_ms": 3.2}
    j = diagnosis.judge("launch_blocking", res)
    assert j["ok"] and j["top"] == "launch"
    j2 = diagnosis.judge("kv_whole_cast", {"moves_graph": rows, "clean_graph_ms": 1, "planted_graph_ms": 2})
    assert not j2["ok"]
    text = diagnosis.table([j, j2], {"nccl_simple_ring": "one GPU"})
    assert "| launch_blocking | eager | launch | launch |" in text and "not run: one GPU" in text


def test_accuracy_rows_pair_probe_and_independent_figures() -> None:
    from decodetop.probes.results import Measurement, ProbeResult, ProbeStatus

    ar = ProbeResult(
        probe="allreduce",
        status=ProbeStatus.OK,
        params={},
        measurements=(
            Measurement("a", {"size_bytes": 8, "mode": "pipelined"}, "us", metrics={"time_us": 20.0}),
            Measurement("b", {"size_bytes": 8, "mode": "graph"}, "us", metrics={"time_us": 5.0}),
        ),
    )
    gm = ProbeResult(
        probe="gemm",
        status=ProbeStatus.OK,
        params={},
        measurements=(
            Measurement(
                "g",
                {"role": "budget", "key": "gemm:m=1,n=8192,k=8192,batch=1,dtype=bf16", "method": "graph"},
                "us",
                metrics={"time_us": 36.0, "weight_bytes": 2 * 8192 * 8192.0, "rotation": 1.0},
            ),
        ),
    )
    rows = accuracy.compare(
        [ar, gm],
        {"8": {"pipelined_us": 25.0, "graph_us": 5.0}},
        {"8192x8192": {"time_us": 40.0, "method": "do_bench"}},
        {},
        world=1,
    )
    by = {r["what"]: r for r in rows}
    assert by["all-reduce 8 B pipelined, 1 rank(s)"]["ratio"] == pytest.approx(0.8)
    assert not by["all-reduce 8 B pipelined, 1 rank(s)"]["within_10pct"]
    assert by["all-reduce 8 B graph, 1 rank(s)"]["within_10pct"]
    gemm_row = next(r for r in rows if r["what"].startswith("GEMM"))
    assert gemm_row["ratio"] == pytest.approx(0.9) and gemm_row["within_10pct"]
    assert "| NO |" in accuracy.table(rows)


def test_independent_allreduce_on_one_cpu_rank() -> None:
    got = accuracy.independent_allreduce(1, [8], timeout_s=60)
    assert got["8"]["pipelined_us"] > 0


def test_cost_tick_and_tables_without_a_gpu(tmp_path: Path) -> None:
    tick = cost.tick_cost(2)
    assert tick["ticks"] == 2
    doc = {
        "tick": tick,
        "plans": [
            {
                "model": "glm-5",
                "tp": 2,
                "world_size": 1,
                "device_kind": "cuda",
                "wall_s": 42.0,
                "per_probe_s": {"gemm": 10.0},
            },
            {"model": "glm-5", "tp": 1, "error": "boom"},
        ],
        "effect": {
            "medians": {"off": {"x": 10.0}, "1 s tick": {"x": 11.0}, "0.1 s tick": {"x": 12.0}},
            "change_vs_off": {"1 s tick": {"x": 0.1}, "0.1 s tick": {"x": 0.2}},
        },
    }
    text = cost.tables(doc)
    assert "| glm-5 TP 2 | 1 cuda | 42.0 | ≤ 60 s ✓ |" in text
    assert "+10.0 % | +20.0 %" in text
    assert "failed: boom" in text
    json.dumps(doc)


def test_fidelity_model_timing_tiny_on_cpu(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    cfg = fidelity.reduced_config("llama-3.1-70b", 1, fidelity.model_overrides("llama-3.1-70b", tiny=True))
    got = fidelity.time_model(cfg, context=32, steps=2, samples=1, trace_steps=0)
    assert got["eager_ms"] > 0
    assert got["graph_ms"] is None and "no CUDA" in got["graph_error"]


@pytest.mark.parametrize("norms", [False, True], ids=["attention", "attention+norms"])
@pytest.mark.parametrize("preset", ["deepseek-v3", "llama-3.1-70b", "qwen3-235b-a22b"])
def test_serving_attention_computes_what_the_stock_model_computes(preset: str, norms: bool) -> None:
    """The serving-form attention (absorbed MLA; GQA in the kernel) gives the stock model's logits at a decode step,
    so the fidelity reference changes how attention is computed, never what."""
    pytest.importorskip("transformers")
    import torch
    from transformers import AutoModelForCausalLM, StaticCache

    cfg = fidelity.reduced_config(preset, 2, fidelity.model_overrides(preset, tiny=True))
    hf = fidelity._hf_config(cfg)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(hf, dtype=torch.float32, attn_implementation="sdpa").eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.05)
    context = 24
    prompt = torch.randint(0, int(cfg["vocab_size"]), (1, context))
    nxt = torch.randint(0, int(cfg["vocab_size"]), (1, 1))

    def decode_logits(serving: bool) -> torch.Tensor:
        cache = StaticCache(config=model.config, max_cache_len=context + 1)  # every slot filled: no mask needed
        with torch.no_grad():
            model(input_ids=prompt, past_key_values=cache, use_cache=True)
            pos = torch.full((1, 1), context)
            if not serving:
                return model(input_ids=nxt, position_ids=pos, past_key_values=cache, use_cache=True).logits
            with fidelity.ServingAttention(model, norms=norms) as sa:
                assert bool(sa.mla) == (preset == "deepseek-v3")
                assert bool(sa.norms) == norms
                return model(input_ids=nxt, position_ids=pos, past_key_values=cache, use_cache=True).logits

    stock = decode_logits(False)
    served = decode_logits(True)
    assert torch.allclose(stock, served, rtol=1e-4, atol=1e-4), (stock - served).abs().max()
    # and the model is back to stock afterwards
    assert all("forward" not in m.__dict__ for m in model.modules())
    assert model.config._attn_implementation == "sdpa"


def test_diagnosis_baseline_diff_verdict_on_the_h200_plan_runs() -> None:
    """The recorded 2 × H200 diagnosis plans (clean and NCCL Simple/Ring): decodetop's baseline diff names
    communication, and nothing else beyond its noise but one component that got faster."""
    import json

    plans = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "diagnosis" / "plans_h200x2"
    clean = json.loads((plans / "diagnosis_clean.plan.json").read_text())
    nccl = json.loads((plans / "diagnosis_nccl_simple_ring.plan.json").read_text())
    v = diagnosis.diff_verdict("nccl_simple_ring", clean["budget"], nccl["budget"])
    assert v["diff_ok"] and v["diff_moved_most"] == "communication" and v["diff_delta_ms"] > 0.05
    same = diagnosis.diff_verdict("nccl_simple_ring", clean["budget"], clean["budget"])
    assert not same["diff_ok"] and same["diff_moved"] == []
    j = {**diagnosis.judge("nccl_simple_ring", {"moves_graph": [], "clean_graph_ms": 1, "planted_graph_ms": 1}), **v}
    assert "communication ✓" in diagnosis.table([j], {})


@pytest.mark.parametrize(
    "preset",
    ["qwen3-235b-a22b", "mixtral-8x7b", "gpt-oss-120b", "kimi-k2", "glm-5", "glm-4.5"],
)
def test_fidelity_builds_every_architecture_tiny_on_cpu(preset: str) -> None:
    """Other architectures than the two of the H200 run build, step and say what their serving form is (or why
    there is none), so the fidelity check can be re-run on any preset."""
    pytest.importorskip("transformers")
    cfg = fidelity.reduced_config(preset, 2, fidelity.model_overrides(preset, tiny=True))
    got = fidelity.time_model(cfg, context=16, steps=1, samples=1, trace_steps=0)
    assert got["eager_ms"] > 0
    serving = got["serving_attention"]
    assert serving.get("eager_ms", 0) > 0 or "error" in serving
    if "error" not in serving:
        assert serving["what"]


def test_only_llama_form_rmsnorms_are_swapped() -> None:
    """Gemma's RMSNorm scales by (1 + weight): same class-name suffix, another formula, never swapped."""
    pytest.importorskip("transformers")
    from transformers.models.gemma.modeling_gemma import GemmaRMSNorm
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    assert fidelity.is_plain_rmsnorm(LlamaRMSNorm(8))
    assert not fidelity.is_plain_rmsnorm(GemmaRMSNorm(8))
