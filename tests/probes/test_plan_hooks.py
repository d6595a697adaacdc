"""A model plan through the probe specs' hooks, without processes: plan → probe requests, probe results →
MeasuredTime/Curves (the budget's inputs)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from decodetop.budget.deployment import Deployment
from decodetop.budget.inventory import StepInventory, build_inventory
from decodetop.budget.keys import GemmKey, LaunchKey, parse_key_id
from decodetop.budget.plan import build_curve_plan, build_plan
from decodetop.budget.scenario import Scenario, build_scenario, choose_tp, model_source
from decodetop.budget.spec import load_preset
from decodetop.errors import UserInputError
from decodetop.probes.hooks import busiest
from decodetop.probes.plan_hooks import measured_from_results, plan_requests
from decodetop.probes.results import (
    Measurement,
    MeasurementStatus,
    ProbeResult,
    ProbeStatus,
    RankSeries,
    Stats,
)
from decodetop.probes.specs.layer import layer_ops, representative_layers

TINY_LLAMA = {
    "model_type": "llama",
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 1024,
    "torch_dtype": "bfloat16",
    "max_position_embeddings": 4096,
    "tie_word_embeddings": False,
}


def tiny_scenario(tmp_path: Path, batch: int = 1, tp: int = 2) -> Scenario:
    """A 2-layer Llama on TP `tp` at batch `batch`, 256 tokens of context: the one path's scenario."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps(TINY_LLAMA))
    return build_scenario(model_source(None, str(path)), choose_tp(tp), batch=batch, context_len=256)


def tiny_inventory(tmp_path: Path, batch: int = 1, tp: int = 2) -> StepInventory:
    return tiny_scenario(tmp_path, batch, tp).inventory()


def meas(
    name: str, params: dict[str, Any], per_rank_us: Sequence[Sequence[float]], status: str = "ok", **metrics: float
) -> Measurement:
    series = tuple(
        RankSeries(rank, tuple(s), Stats.from_samples(s, "us") if s else None) for rank, s in enumerate(per_rank_us)
    )
    pooled = [v for s in per_rank_us for v in s]
    return Measurement(
        name,
        params,
        "us",
        status=MeasurementStatus(status),
        per_rank=series,
        stats=Stats.from_samples(pooled, "us") if pooled else None,
        metrics=dict(metrics),
    )


def result(probe: str, *ms: Measurement, world: int = 2) -> ProbeResult:
    return ProbeResult(probe, ProbeStatus.OK, {}, tuple(ms), world_size=world)


# --------------------------------------------------------------------------------------------- requests


def test_requests_cover_every_plan_key_on_a_full_group(tmp_path: Path) -> None:
    inv = tiny_inventory(tmp_path)
    plan = build_plan(inv)
    reqs, notes = plan_requests(plan, inv, world_size=2, device_kind="cpu")
    probes = [r.probe for r in reqs]
    assert probes == ["launch", "gemm", "attention", "kvcast", "norms", "sampling", "allreduce", "layer"]
    covered = {k for r in reqs for k in r.keys}
    assert covered == set(plan.key_ids())
    gemm = next(r for r in reqs if r.probe == "gemm")
    own = [k.key_id for k in plan.by_probe("gemm")]
    curves = build_curve_plan(inv, device_kind="cpu")
    assert gemm.params["keys"] == own + [k for k in (c.key_id for c in curves.by_probe("gemm")) if k not in own]
    assert len(gemm.params["keys"]) > len(own)  # the other TP shards' shapes, for what-ifs
    assert gemm.params["sweep_m"] == [1, 2, 4, 8, 16, 32, 64, 128, 256]
    ar = next(r for r in reqs if r.probe == "allreduce")
    assert ar.params["extra_sizes"] == [256 * 2]  # hidden 256 × bf16 × 1 token
    assert max(ar.params["sizes"]) <= 1024 * 1024  # capped on CPU ranks
    sampling = next(r for r in reqs if r.probe == "sampling")
    assert sampling.params["allgather_bytes"] == [512 * 2]  # vocab shard 512 × bf16
    assert any("CPU ranks" in n for n in notes)
    assert any("launch mode graph" in n for n in notes)


def test_group_smaller_than_tp_leaves_collectives_out_and_says_so(tmp_path: Path) -> None:
    inv = tiny_inventory(tmp_path)
    reqs, notes = plan_requests(build_plan(inv), inv, world_size=1, device_kind="cuda")
    assert "allreduce" not in [r.probe for r in reqs]
    sampling = next(r for r in reqs if r.probe == "sampling")
    assert sampling.params["allgather_bytes"] == []
    assert any("TP 2" in n and "1 rank" in n for n in notes)
    attention = next(r for r in reqs if r.probe == "attention")
    assert len(attention.params["curve_keys"]) > 20  # GPUs measure the batch × context × KV dtype grid
    assert attention.params["keys"] == list(attention.keys) and attention.params["context_sweep"] == []
    no_sweeps, _ = plan_requests(build_plan(inv), inv, world_size=1, device_kind="cuda", sweeps=False)
    attention = next(r for r in no_sweeps if r.probe == "attention")
    assert attention.params["curve_keys"] == []  # only the budget's own keys


def test_a_tp1_plan_on_several_ranks_sweeps_the_all_reduce_for_the_curves(tmp_path: Path) -> None:
    """TP 1 has no collectives, but a what-if at TP 2 on this host needs the all-reduce curve: swept on the group."""
    inv = tiny_inventory(tmp_path, tp=1)
    plan = build_plan(inv)
    assert plan.by_probe("allreduce") == ()
    reqs, notes = plan_requests(plan, inv, world_size=2, device_kind="cpu")
    ar = next(r for r in reqs if r.probe == "allreduce")
    assert ar.keys == () and ar.params["extra_sizes"] == []
    assert 256 * 2 in ar.params["sizes"] and max(ar.params["sizes"]) <= 1024 * 1024  # a row of hidden 256, capped
    assert any("TP 1 (no collectives) on a group of 2 ranks" in n for n in notes)
    alone, _ = plan_requests(plan, inv, world_size=1, device_kind="cuda")
    no_sweeps, _ = plan_requests(plan, inv, world_size=2, device_kind="cpu", sweeps=False)
    assert "allreduce" not in [r.probe for r in (*alone, *no_sweeps)]


def test_only_restricts_and_rejects_unknown_probes(tmp_path: Path) -> None:
    inv = tiny_inventory(tmp_path)
    reqs, _ = plan_requests(build_plan(inv), inv, world_size=2, device_kind="cpu", only=("norms", "gemm"))
    assert [r.probe for r in reqs] == ["gemm", "norms"]
    with pytest.raises(UserInputError, match="membw"):
        plan_requests(build_plan(inv), inv, world_size=2, device_kind="cpu", only=("membw",))


def test_layer_ops_are_one_layers_share_of_the_inventory() -> None:
    inv = build_inventory(load_preset("deepseek-v3"), Deployment(tp=2))
    dense, moe = representative_layers(inv)
    assert (dense, moe) == (2, 60)
    ops = layer_ops(inv, moe)
    kinds = [parse_key_id(item.partition("*")[2]).PROBE for item in ops]
    assert kinds.count("allreduce") == 2 and "moe" in kinds and "routing" in kinds and "attention" in kinds
    assert all(item.startswith("1*") for item in ops)  # each op once per layer
    # Σ over layers of the per-layer counts gives back the inventory count for a layer-wide op.
    attn = next(op for op in inv.ops if op.key.PROBE == "attention")
    assert attn.count == inv.spec.n_layers


# --------------------------------------------------------------------------------------------- results → inputs


def test_busiest_rank_is_taken_for_a_key() -> None:
    m = meas("x", {"key": "k"}, [[10.0, 12.0, 14.0], [20.0, 22.0, 24.0]])
    t = busiest(m)
    assert t is not None
    assert t.median_ms == pytest.approx(0.022)
    assert t.p10_ms == pytest.approx(Stats.from_samples([20.0, 22.0, 24.0], "us").p10 / 1e3)


def test_fastest_variant_curves_modes_and_launch() -> None:
    g1 = GemmKey(1, 1024, 512, 1, "fp8")
    g4 = GemmKey(4, 1024, 512, 1, "fp8")
    gemm = result(
        "gemm",
        meas("copy", {"what": "copy"}, [[100.0]], bandwidth_gbps=4000.0),
        meas(
            "a",
            {"what": "gemm", "key": g1.key_id, "curve": g1.curve_id, "m": 1, "variant": "tensor", "role": "budget"},
            [[30.0]],
        ),
        meas(
            "b",
            {"what": "gemm", "key": g1.key_id, "curve": g1.curve_id, "m": 1, "variant": "row", "role": "budget"},
            [[20.0]],
        ),
        meas(
            "c",
            {"what": "gemm", "key": g4.key_id, "curve": g4.curve_id, "m": 4, "variant": "row", "role": "sweep"},
            [[40.0]],
        ),
        meas(
            "d",
            {"what": "gemm", "key": g4.key_id, "curve": g4.curve_id, "m": 4, "variant": "tensor", "role": "sweep"},
            [],
            status="unsupported",
        ),
    )
    ar = result(
        "allreduce",
        meas("p8", {"size_bytes": 8, "mode": "pipelined", "world_size": 2}, [[50.0], [60.0]]),
        meas("g8", {"size_bytes": 8, "mode": "graph", "world_size": 2}, [[10.0], [12.0]]),
        meas("g1k", {"size_bytes": 1024, "mode": "graph", "world_size": 2}, [[20.0], [18.0]]),
    )
    launch = result(
        "launch",
        meas("fit", {"what": "graph_fit"}, [], graph_fixed_us=10.0, graph_per_node_us=0.5),
        meas("eager", {"what": "eager_op"}, [[8.0, 9.0, 10.0], [9.0, 10.0, 11.0]]),
    )
    graph = measured_from_results([gemm, ar, launch], launch_mode="graph")
    assert graph.times[g1.key_id].median_ms == pytest.approx(0.020)
    assert graph.times[g1.key_id].source == "gemm probe (row)"
    assert g4.key_id not in graph.times  # a sweep point is a curve point, not a budget key
    assert graph.gemm_curves[g1.curve_id].points == ((1.0, 0.020), (4.0, 0.040))
    assert graph.allreduce_curves["all_reduce"].points == ((8.0, 0.012), (1024.0, 0.020))
    assert graph.times[LaunchKey("graph", 1).key_id].median_ms == pytest.approx(0.0005)
    assert graph.times[LaunchKey("eager", 1).key_id].median_ms == pytest.approx(0.010)
    assert graph.copy_gbps == 4000.0
    eager = measured_from_results([ar], launch_mode="eager")
    assert eager.allreduce_curves["all_reduce"].points == ((8.0, 0.060),)


def test_allreduce_at_another_rank_count_is_not_used(tmp_path: Path) -> None:
    plan = build_plan(tiny_inventory(tmp_path))
    ar = result("allreduce", meas("g", {"size_bytes": 512, "mode": "graph", "world_size": 4}, [[10.0]]), world=4)
    assert measured_from_results([ar], plan=plan).allreduce_curves == {}


def test_a_key_timed_with_two_kernel_classes_joins_its_curve_at_the_grids_class() -> None:
    """SDPA beats decodetop's split-K kernel at the plan's own attention key, but the grid around it was timed with
    the split-K kernel only: the budget takes SDPA's figure, the curve the split-K one (one kernel per curve)."""
    import dataclasses

    from decodetop.budget.curve_points import CurvePoint
    from decodetop.budget.kernels import KernelClass
    from decodetop.budget.keys import AttentionKey

    own = AttentionKey("gqa", 1, 1, 4096, 64, 8, 128, 128, 0, 128, 0, 0, 0, 0, "bf16")
    triton, torch_sdpa = KernelClass("triton", "GQA decode split-K"), KernelClass("torch", "SDPA (enable_gqa)")
    budget = {"what": "attention", "key": own.key_id, "context": 4096, "role": "budget"}
    alternative = {**budget, "role": "alternative", "variant": "torch"}
    points = [
        dataclasses.replace(meas("own", budget, [[15.0, 15.2]]), kernel=triton),
        dataclasses.replace(meas("own [torch]", alternative, [[12.0, 12.1]]), kernel=torch_sdpa),
    ]
    for context, us in ((2048, 11.0), (8192, 21.0)):
        grid = {"what": "attention", "key": own.key_id, "context": context, "role": "curve"}
        points.append(dataclasses.replace(meas(f"grid {context}", grid, [[us, us]]), kernel=triton))
    measured = measured_from_results([result("attention", *points, world=1)])
    assert measured.times[own.key_id].median_ms == pytest.approx(0.01205)  # the budget: the fastest class
    curve = {p.key.context: p for p in measured.curve_points if isinstance(p, CurvePoint)}
    assert curve[4096].median_ms == pytest.approx(0.0151) and "grid's kernel" in curve[4096].source
    assert curve[2048].median_ms == pytest.approx(0.011)
