"""The plan runner's glue, without processes: plan → probe requests, probe results → MeasuredTime/Curves → Budget."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from decodetop.budget.components import Component
from decodetop.budget.deployment import Deployment
from decodetop.budget.inventory import StepInventory, build_inventory
from decodetop.budget.keys import AllreduceKey, GemmKey, LaunchKey, parse_key_id
from decodetop.budget.plan import build_plan
from decodetop.budget.spec import load_config, load_preset
from decodetop.errors import UserInputError
from decodetop.probes.hooks import busiest
from decodetop.probes.planrun import (
    PlanRun,
    PlanRunOptions,
    compose_from_results,
    format_budget,
    measured_from_results,
    plan_requests,
    plan_run_to_dict,
)
from decodetop.probes.results import (
    Measurement,
    MeasurementStatus,
    ProbeResult,
    ProbeStatus,
    RankSeries,
    Stats,
    results_from_json,
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


def tiny_inventory(tmp_path: Path, batch: int = 1, tp: int = 2) -> StepInventory:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(TINY_LLAMA))
    return build_inventory(load_config(path), Deployment(tp=tp, batch=batch, context_len=256))


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
    assert gemm.params["keys"] == [k.key_id for k in plan.by_probe("gemm")]
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
    assert attention.params["context_sweep"]  # GPUs sweep the context


def test_only_restricts_and_rejects_unknown_probes(tmp_path: Path) -> None:
    inv = tiny_inventory(tmp_path)
    reqs, _ = plan_requests(
        build_plan(inv), inv, world_size=2, device_kind="cpu", options=PlanRunOptions(only=("norms", "gemm"))
    )
    assert [r.probe for r in reqs] == ["gemm", "norms"]
    with pytest.raises(UserInputError, match="membw"):
        plan_requests(build_plan(inv), inv, world_size=2, device_kind="cpu", options=PlanRunOptions(only=("membw",)))


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


# --------------------------------------------------------------------------------------------- composition


def _results_for_every_key(inv: StepInventory, time_us: float, skip: Sequence[str] = ()) -> list[ProbeResult]:
    """A synthetic result per plan key: every op instance takes `time_us` on rank 0, `time_us`/2 on rank 1."""
    plan = build_plan(inv)
    out = []
    for probe, keys in plan.groups:
        if probe in skip:
            continue
        if probe == "launch":
            out.append(result("launch", meas("fit", {"what": "graph_fit"}, [], graph_per_node_us=time_us)))
            continue
        if probe == "allreduce":
            ms = [
                meas(
                    k.key_id,
                    {"size_bytes": k.bytes, "mode": "graph", "world_size": k.ranks},
                    [[time_us], [time_us / 2]],
                )
                for k in keys
                if isinstance(k, AllreduceKey) and k.collective == "all_reduce"
            ]
            gathers = [
                meas(k.key_id, {"what": "all_gather", "key": k.key_id, "mode": "graph", "role": "budget"}, [[time_us]])
                for k in keys
                if isinstance(k, AllreduceKey) and k.collective == "all_gather"
            ]
            out.append(result("allreduce", *ms))
            out.append(result("sampling", *gathers))
            continue
        out.append(
            result(
                probe,
                *[meas(k.key_id, {"key": k.key_id, "role": "budget"}, [[time_us], [time_us / 2]]) for k in keys],
            )
        )
    return out


def test_every_component_is_count_times_time(tmp_path: Path) -> None:
    inv = tiny_inventory(tmp_path)
    results = _results_for_every_key(inv, 2.0)
    budget, _ = compose_from_results(inv, results, PlanRunOptions(observed_ms=10.0, target_tps=100.0))
    assert budget.complete
    for comp, ops in inv.by_component().items():
        seg = budget.segment(comp)
        assert seg is not None and seg.status == "measured"
        assert seg.ms == pytest.approx(sum(op.count for op in ops) * 0.002), comp
    launch = budget.segment(Component.LAUNCH)
    assert launch is not None and launch.ms == pytest.approx(inv.kernels * 0.002)
    total = sum(op.count for op in inv.ops) * 0.002 + inv.kernels * 0.002
    assert budget.total_ms == pytest.approx(total)
    assert budget.unexplained_ms == pytest.approx(10.0 - total)
    assert budget.target_ms == pytest.approx(1000.0 / 100.0)


def test_gemm_between_measured_m_is_interpolated_log_log(tmp_path: Path) -> None:
    inv = tiny_inventory(tmp_path, batch=3)  # GEMM keys at M = 3
    results = _results_for_every_key(inv, 2.0, skip=("gemm",))
    curve_pts = []
    for key in build_plan(inv).by_probe("gemm"):
        assert isinstance(key, GemmKey) and key.m == 3
        for m, us in ((2, 10.0), (4, 40.0)):
            params = {"what": "gemm", "key": GemmKey(m, key.n, key.k, 1, key.dtype).key_id, "curve": key.curve_id}
            curve_pts.append(meas(f"{key.key_id}@{m}", {**params, "m": m, "role": "sweep"}, [[us]]))
    budget, measured = compose_from_results(inv, [*results, result("gemm", *curve_pts)])
    t3 = math.exp(math.log(0.010) + (math.log(3) - math.log(2)) / (math.log(4) - math.log(2)) * math.log(4.0))
    assert t3 == pytest.approx(0.010 * 3**2 / 2**2)  # 10 µs ∝ M² between the points
    seg = budget.segment(Component.DENSE_MLP)
    assert seg is not None and seg.status == "interpolated"
    gemm_ops = [op for op in inv.by_component()[Component.DENSE_MLP] if op.key.PROBE == "gemm"]
    other = [op for op in inv.by_component()[Component.DENSE_MLP] if op.key.PROBE != "gemm"]
    want = sum(op.count for op in gemm_ops) * t3 + sum(op.count for op in other) * 0.002
    assert seg.ms == pytest.approx(want)
    assert len(measured.gemm_curves) == len(build_plan(inv).by_probe("gemm"))


def test_missing_probe_marks_its_components_and_the_total(tmp_path: Path) -> None:
    inv = tiny_inventory(tmp_path)
    results = _results_for_every_key(inv, 2.0, skip=("attention", "allreduce"))
    failed = ProbeResult("attention", ProbeStatus.FAILED, {}, (), world_size=2, message="boom", error="boom")
    budget, _ = compose_from_results(inv, [*results, failed], group_kind="cpu")  # CPU ranks: no GPU estimates
    assert not budget.complete
    assert set(budget.missing) == {Component.ATTENTION.value, Component.COMMUNICATION.value}
    comm = budget.segment(Component.COMMUNICATION)
    assert comm is not None and comm.status == "missing" and comm.ms is None
    attn = budget.segment(Component.ATTENTION)
    assert attn is not None and attn.status == "missing"
    assert any(k.startswith("attention:") for k in attn.missing_keys)
    assert attn.ms == pytest.approx(
        sum(op.count for op in inv.by_component()[Component.ATTENTION] if op.key.PROBE != "attention") * 0.002
    )


def test_json_reads_back_as_results_and_text_shows_bars(tmp_path: Path) -> None:
    inv = tiny_inventory(tmp_path)
    results = _results_for_every_key(inv, 2.0, skip=("attention",))
    plan = build_plan(inv)
    opts = PlanRunOptions(observed_ms=0.2)
    budget, measured = compose_from_results(inv, results, opts, plan=plan, group_kind="cpu")
    run = PlanRun(plan, (), tuple(results), measured, budget, ("a note",))
    doc = plan_run_to_dict(run)
    text = json.dumps(doc, allow_nan=False)
    back = results_from_json(text)
    assert [r.probe for r in back] == [r.probe for r in results]
    assert doc["budget"]["complete"] is False
    assert doc["measured"][next(iter(plan.by_probe("norms"))).key_id]["median_ms"] == pytest.approx(0.002)
    out = format_budget(run)
    assert "█" in out and "missing" in out and "unexplained" in out and "note: a note" in out


class _FakeLayout:
    kind = "cpu"


class _FakeController:
    """Answers every probe at once (no processes); `cancel_at` names a probe that comes back cancelled."""

    world_size = 2
    layout = _FakeLayout()

    def __init__(self, cancel_at: str = "") -> None:
        self.cancel_at = cancel_at
        self.calls: list[tuple[str, dict[str, Any]]] = []

    def run(self, probe: str, params: Any = None, *, timeout_s: Any = None, on_progress: Any = None) -> ProbeResult:
        self.calls.append((probe, dict(params or {})))
        if on_progress is not None:
            on_progress(type("P", (), {"text": "key 1/1 x", "done": 0, "total": 1})())
        status = ProbeStatus.CANCELLED if probe == self.cancel_at else ProbeStatus.OK
        return ProbeResult(probe, status, dict(params or {}), (), world_size=2, message=status.value)


def test_run_plan_relays_progress_and_stops_on_cancel(tmp_path: Path) -> None:
    from decodetop.probes.planrun import run_plan

    inv = tiny_inventory(tmp_path)
    seen: list[str] = []
    fake = _FakeController(cancel_at="attention")
    run = run_plan(fake, inv, on_progress=lambda p: seen.append(p.line()))
    assert [c[0] for c in fake.calls] == ["launch", "gemm", "attention"]
    assert "probe 2/8 gemm: key 1/1 x" in seen and "probe 1/8 launch: starting" in seen
    assert any("cancelled during attention (probe 3/8)" in n for n in run.notes)
    assert not run.budget.complete  # nothing was measured: every component is missing, none is 0
    assert all(s.status == "missing" and s.ms is None for s in run.budget.segments)


def test_run_plan_should_stop_between_probes(tmp_path: Path) -> None:
    from decodetop.probes.planrun import run_plan

    inv = tiny_inventory(tmp_path)
    fake = _FakeController()
    run = run_plan(fake, inv, should_stop=lambda: len(fake.calls) >= 2)
    assert [r.probe for r in run.results] == ["launch", "gemm"]
    assert any("stopped before attention" in n for n in run.notes)
    gemm_params = fake.calls[1][1]
    assert gemm_params["keys"] == [k.key_id for k in build_plan(inv).by_probe("gemm")]
