"""The decode-component probes for real: tiny synthetic shapes on a spawned 2-rank gloo group (CPU ranks)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from decodetop.budget.components import Component
from decodetop.budget.compose import ObservedStep
from decodetop.budget.scenario import build_scenario, choose_tp, model_source
from decodetop.pipeline.context import BudgetContext
from decodetop.pipeline.plan_runner import PlanRunner, run_model_plan
from decodetop.probes.controller import ProbeController
from decodetop.probes.hooks import busiest
from decodetop.probes.results import Measurement, MeasurementStatus, ProbeResult, ProbeStatus
from tests.helpers.env import subprocess_env

pytestmark = pytest.mark.slow

FAST = {"cpu_samples": 2}
GQA = (
    "attention:kind=gqa,batch=1,q_len=1,context=64,heads=4,kv_heads=2,head_dim=32,v_head_dim=32,"
    "kv_lora_rank=0,rope_dim=32,index_heads=0,index_head_dim=0,index_topk=0,window=0,kv_dtype=bf16"
)
MLA = (
    "attention:kind=mla,batch=1,q_len=1,context=64,heads=4,kv_heads=1,head_dim=48,v_head_dim=32,"
    "kv_lora_rank=32,rope_dim=16,index_heads=0,index_head_dim=0,index_topk=0,window=0,kv_dtype=bf16"
)
DSA = (
    "attention:kind=mla+dsa,batch=1,q_len=1,context=96,heads=4,kv_heads=1,head_dim=48,v_head_dim=32,"
    "kv_lora_rank=32,rope_dim=16,index_heads=2,index_head_dim=16,index_topk=32,window=0,kv_dtype=bf16"
)
MOE = "moe:tokens=2,top_k=2,experts_local=8,experts_active=3,hidden=64,intermediate=32,dtype=bf16,bias=0"
ROUTING = "routing:tokens=2,hidden=64,n_experts=8,scoring=sigmoid,n_group=4,topk_group=2,top_k=2,dtype=bf16"
TINY_DEEPSEEK = {
    "model_type": "deepseek_v3",
    "architectures": ["DeepseekV3ForCausalLM"],
    "hidden_size": 128,
    "intermediate_size": 256,
    "moe_intermediate_size": 32,
    "num_hidden_layers": 2,
    "first_k_dense_replace": 1,
    "n_routed_experts": 16,
    "num_experts_per_tok": 4,
    "n_group": 4,
    "topk_group": 2,
    "n_shared_experts": 1,
    "q_lora_rank": 64,
    "kv_lora_rank": 32,
    "qk_nope_head_dim": 16,
    "qk_rope_head_dim": 16,
    "v_head_dim": 16,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "vocab_size": 512,
    "scoring_func": "sigmoid",
    "num_nextn_predict_layers": 0,
    "torch_dtype": "bfloat16",
    "max_position_embeddings": 4096,
    "tie_word_embeddings": False,
}


@pytest.fixture(scope="module")
def controller(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProbeController]:
    log = tmp_path_factory.mktemp("ranks") / "ranks.log"
    with ProbeController(device="cpu", cpu_ranks=2, rank_log=log) as pc:
        yield pc


def _run(controller: ProbeController, probe: str, params: dict[str, Any]) -> ProbeResult:
    res = controller.run(probe, {**FAST, **params}, timeout_s=120)
    assert res.status is ProbeStatus.OK, (res.message, res.traceback)
    return res


def _by(res: ProbeResult, **params: Any) -> list[Measurement]:
    return [m for m in res.measurements if all(m.params.get(k) == v for k, v in params.items())]


def _ok(m: Measurement) -> None:
    assert m.status is MeasurementStatus.OK, (m.name, m.note)
    assert [r.rank for r in m.per_rank] == [0, 1]
    assert m.stats is not None and m.stats.median > 0
    assert m.metrics["time_us"] > 0
    assert m.params["method"] == "host"


def test_gemm_sweep_references_and_unsupported_dtypes(controller: ProbeController) -> None:
    keys = [
        "gemm:m=2,n=64,k=128,batch=1,dtype=bf16",
        "gemm:m=1,n=16,k=32,batch=4,dtype=bf16",
        "gemm:m=1,n=64,k=128,batch=1,dtype=fp8",
        "gemm:m=1,n=64,k=128,batch=1,dtype=nvfp4",
        "gemm:m=1,n=64,k=128,batch=1,dtype=mxfp4",
    ]
    res = _run(controller, "gemm", {"keys": keys, "sweep_m": [1, 4, 64], "cpu_sweep_max_m": 8})
    copy = _by(res, what="copy")[0]
    assert copy.status is MeasurementStatus.OK and copy.metrics["bandwidth_gbps"] > 0
    assert _by(res, what="peak")[0].metrics["tflops"] > 0
    bf16 = _by(res, curve="gemm:n=64,k=128,batch=1,dtype=bf16")
    assert [(m.params["m"], m.params["role"]) for m in bf16] == [(1, "sweep"), (2, "budget"), (4, "sweep")]
    for m in bf16:
        _ok(m)
        assert m.metrics["gbps"] > 0 and m.metrics["copy_bw_pct"] > 0
        assert m.metrics["weight_bytes"] == 64 * 128 * 2
        assert "CPU: host timer" in m.note
    bmm = _by(res, curve="gemm:n=16,k=32,batch=4,dtype=bf16", m=1)[0]
    _ok(bmm)
    assert bmm.metrics["weight_bytes"] == 4 * 16 * 32 * 2
    fp8 = _by(res, curve="gemm:n=64,k=128,batch=1,dtype=fp8", m=1)[0]
    assert fp8.status is MeasurementStatus.UNSUPPORTED and "needs a GPU" in fp8.note
    nvfp4 = _by(res, curve="gemm:n=64,k=128,batch=1,dtype=nvfp4", m=1)[0]
    assert nvfp4.status is MeasurementStatus.UNSUPPORTED and "sm_100/sm_120" in nvfp4.note
    mxfp4 = _by(res, curve="gemm:n=64,k=128,batch=1,dtype=mxfp4", m=1)[0]
    assert mxfp4.status is MeasurementStatus.UNSUPPORTED and "MXFP4" in mxfp4.note


def test_moe_grouped_and_loop(controller: ProbeController) -> None:
    res = _run(controller, "moe", {"keys": [MOE]})
    variants = {m.params["variant"]: m for m in _by(res, key=MOE)}
    assert set(variants) == {"grouped", "loop", "fused", "engine"}
    fused = variants.pop("fused")  # the Triton kernel: GPUs only, with the reason
    assert fused.status is MeasurementStatus.UNSUPPORTED and ("Triton" in fused.note or "CUDA" in fused.note)
    engine = variants.pop("engine")  # vLLM's or SGLang's fused_experts: not installed here
    assert engine.status is MeasurementStatus.UNSUPPORTED and "no engine kernel importable" in engine.note
    for m in variants.values():
        _ok(m)
        assert m.kernel is not None and m.kernel.kind == "cpu"
        assert m.metrics["weight_bytes"] == 3 * (2 * 32 * 64 + 64 * 32) * 2  # the 3 active experts only
    fp8 = _run(controller, "moe", {"keys": [MOE.replace("bf16", "fp8")], "variants": ["loop"]})
    assert fp8.measurements[0].status is MeasurementStatus.UNSUPPORTED


def test_routing_with_group_limited_topk_and_permutes(controller: ProbeController) -> None:
    res = _run(controller, "routing", {"keys": [ROUTING]})
    assert [m.params["what"] for m in res.measurements] == ["routing", "permute", "unpermute"]
    for m in res.measurements:
        _ok(m)
    assert res.measurements[0].params["role"] == "budget"


def test_attention_gqa_mla_and_dsa(controller: ProbeController) -> None:
    res = _run(controller, "attention", {"keys": [GQA, MLA, DSA], "context_sweep": [16]})
    assert len(res.measurements) == 3  # the context sweep is GPU-only
    for m in res.measurements:
        _ok(m)
        assert m.metrics["kv_bytes"] > 0 and m.metrics["kv_gbps"] > 0
    gqa, mla, dsa = res.measurements
    assert gqa.metrics["kv_bytes"] == 2 * 2 * 65 * 32 * 2
    assert mla.metrics["kv_bytes"] == 65 * 48 * 2
    assert dsa.metrics["kv_bytes"] == 32 * 48 * 2 + 97 * (16 + 4)  # top-k latents + every FP8 index key


def test_attention_grid_points_are_curve_points_of_the_best_kernel_only(controller: ProbeController) -> None:
    from decodetop.budget.keys import AttentionKey, parse_key_id
    from decodetop.probes.plan_hooks import measured_from_results

    key = parse_key_id(GQA)
    assert isinstance(key, AttentionKey)
    grid = [dataclasses.replace(key, batch=2), dataclasses.replace(key, context=key.context * 4)]
    res = _run(controller, "attention", {"keys": [GQA], "curve_keys": [k.key_id for k in grid]})
    curve = [m for m in res.measurements if m.params["role"] == "curve"]
    assert [m.params["key"] for m in curve] == [k.key_id for k in grid]  # no torch form, no sweep beside them
    for m in curve:
        _ok(m)
    measured = measured_from_results([res])
    assert {p.key.key_id for p in measured.curve_points} >= {GQA, *(k.key_id for k in grid)}
    assert set(measured.times) == {GQA}  # the grid is not a budget key


def test_norms_every_op(controller: ProbeController) -> None:
    ops = ["rmsnorm", "add_rmsnorm", "layernorm", "silu_mul", "rotary", "embedding"]
    keys = [f"norms:op={op},tokens=2,width=64,dtype=bf16" for op in ops]
    res = _run(controller, "norms", {"keys": keys})
    assert [m.params["what"] for m in res.measurements] == ops
    for m in res.measurements:
        _ok(m)


def test_sampling_and_logits_all_gather_across_ranks(controller: ProbeController) -> None:
    res = _run(
        controller,
        "sampling",
        {"keys": ["sampling:tokens=1,vocab_shard=256,hidden=64,dtype=bf16"], "allgather_bytes": [1024]},
    )
    samplers = [m.params.get("sampler") for m in _by(res, what="sampling")]
    assert samplers == ["greedy", "top_p"]
    for m in _by(res, what="sampling"):
        _ok(m)
    gather = _by(res, what="all_gather")[0]
    _ok(gather)
    assert gather.params["key"] == "allreduce:collective=all_gather,bytes=1024,ranks=2,dtype=bf16"
    # decodetop's own all-gather uses torch's current API: the ranks show no warning of ours (a deprecated call
    # warned once per rank: "ranks showed 2 warnings")
    assert res.rank_warnings == 0, Path(res.rank_log).read_text() if res.rank_log else ""


def test_kvcast_writes_and_the_bytes_each_read_mode_moves_with_the_context(controller: ProbeController) -> None:
    keys = [
        "kvcast:layout=dsa_index,tokens=2,width=128,context=64,kv_dtype=fp8",
        "kvcast:layout=gqa,tokens=1,width=64,context=64,kv_dtype=bf16",
    ]
    res = _run(controller, "kvcast", {"keys": keys, "read_contexts": [1024, 65536], "gather_tokens": 1024})
    writes = _by(res, what="write")
    assert [m.params["key"] for m in writes] == keys
    for m in writes:
        _ok(m)

    def moved(mode: str, context: int, width: int = 64) -> float:
        m = _by(res, mode=mode, context=context, width=width)[0]
        _ok(m)
        assert busiest(m) is not None  # a time was measured on every rank
        return m.metrics["moved_bytes"]

    # 64× the context: the whole-cache cast reads (and writes) 64× the bytes, gather-then-cast the same 1024 tokens.
    # The bytes, not the times, are what a unit test can hold (timings: benchmarks/, docs/benchmarks.md "kvcast").
    assert moved("whole_cast", 65536) == 64 * moved("whole_cast", 1024)
    assert moved("gather_cast", 65536) == moved("gather_cast", 1024)
    assert moved("whole_cast", 65536) == 64 * moved("gather_cast", 65536)


def test_layer_parts_whole_and_composition(controller: ProbeController) -> None:
    dense = [
        "norms:op=rmsnorm,tokens=1,width=64,dtype=bf16",
        "gemm:m=1,n=128,k=64,batch=1,dtype=bf16",
        GQA,
        "2*allreduce:collective=all_reduce,bytes=128,ranks=2,dtype=bf16",
        "gemm:m=1,n=64,k=64,batch=1,dtype=bf16",
        "gemm:m=1,n=64,k=64,batch=1,dtype=fp8",
    ]
    moe = ["norms:op=add_rmsnorm,tokens=2,width=64,dtype=bf16", ROUTING, MOE]
    res = _run(controller, "layer", {"dense_ops": dense, "moe_ops": moe})
    parts = _by(res, what="part", layer="dense")
    assert [m.params["count"] for m in parts] == [1, 1, 1, 2, 1]  # the fp8 GEMM cannot run on CPU ranks
    for m in parts:
        _ok(m)
    comp = _by(res, what="composition", layer="dense")[0]
    assert comp.status is MeasurementStatus.OK and "fp8" in comp.note and "left out" in comp.note
    whole = _by(res, what="layer", layer="dense", mode="eager")[0]
    _ok(whole)
    for rank in (0, 1):  # each rank: Σ count × its part medians against its whole-layer median
        got = comp.per_rank[rank].metrics
        parts_us = sum(m.params["count"] * m.per_rank[rank].metrics["time_us"] for m in parts)
        layer_stats = whole.per_rank[rank].stats
        assert layer_stats is not None
        assert got["sum_parts_us"] == pytest.approx(parts_us)
        assert got["layer_us"] == pytest.approx(layer_stats.median)
        assert got["error_pct"] == pytest.approx(100 * (parts_us - layer_stats.median) / layer_stats.median)
    assert _by(res, what="composition", layer="moe")[0].status is MeasurementStatus.OK
    # the layer's experts take the best kernel that runs (engine, fused Triton, torch): CPU ranks' grouped GEMM
    experts = [m for m in _by(res, what="part", layer="moe") if str(m.params["key"]).startswith("moe:")]
    assert len(experts) == 1 and experts[0].kernel is not None
    assert experts[0].kernel.kind == "cpu" and "grouped_mm" in experts[0].kernel.function


def test_plan_run_end_to_end_on_a_tiny_moe_model(controller: ProbeController, tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(TINY_DEEPSEEK))
    scenario = build_scenario(model_source(None, str(path)), choose_tp(2), context_len=128, launch_mode="eager")
    seen: list[str] = []
    run = run_model_plan(
        PlanRunner(lambda: controller),
        BudgetContext(scenario, observed=ObservedStep(50.0, "flag")),
        world_size=controller.world_size,
        device_kind=controller.layout.kind,
        sweeps=False,
        on_progress=lambda p: seen.append(p.line()),
    )
    assert [r.status for r in run.results] == [ProbeStatus.OK] * len(run.results)
    assert any(line.startswith("probe 2/") and "gemm" in line and "key 1/" in line for line in seen)
    b = run.budget
    assert b.complete, (b.missing, [s.reason for s in b.segments])
    assert {s.component for s in b.segments} >= {c.value for c in (Component.ROUTED_EXPERTS, Component.ROUTING)}
    for seg in b.segments:
        assert seg.status == "measured" and seg.ms is not None and seg.ms > 0, seg
    assert b.unexplained_ms == pytest.approx(50.0 - b.total_ms)
    assert {lc.layer for lc in run.measured.layers} == {"dense", "moe"}
    assert all(lc.mode == "eager" and lc.layer_us > 0 for lc in run.measured.layers)


def test_cli_runs_a_plan_and_writes_budget_json(tmp_path: Path) -> None:
    import subprocess
    import sys

    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(TINY_DEEPSEEK))
    out = tmp_path / "plan.json"
    env = subprocess_env()
    args = [sys.executable, "-m", "decodetop", "probe", "--config", str(cfg), "--tp", "2", "--cpu-ranks", "2"]
    args += ["--context", "64", "--budget", "--observed-ms", "40", "--json", str(out), "norms", "launch", "gemm"]
    proc = subprocess.run(args, capture_output=True, text=True, env=env, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "probe 1/3 launch" in proc.stderr and "probe 3/3 norms: key 1/" in proc.stderr
    assert "Budget:" in proc.stdout and "unexplained" in proc.stdout and "missing" in proc.stdout
    doc = json.loads(out.read_text())
    assert [r["probe"] for r in doc["results"]] == ["launch", "gemm", "norms"]
    segs = {s["component"]: s for s in doc["budget"]["segments"]}
    assert segs["norms"]["status"] == "measured" and segs["attention"]["status"] == "missing"
    assert doc["budget"]["observed_ms"] == 40.0 and doc["budget"]["complete"] is False
    bad = subprocess.run(
        [*args[:4], "--model", "no-such-model"], capture_output=True, text=True, env=env, timeout=60, check=False
    )
    assert bad.returncode == 2 and "unknown preset" in bad.stderr and bad.stderr.count("\n") == 1
