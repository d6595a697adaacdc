"""The one composition (`decodetop.pipeline.composition.compose`) over a tiny model's results, without processes:
count × time per component, curves interpolated, missing probes marked, and a plan run as JSON and text."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from decodetop.budget.components import Component
from decodetop.budget.compose import ObservedStep
from decodetop.budget.inventory import StepInventory
from decodetop.budget.keys import AllreduceKey, GemmKey
from decodetop.budget.plan import build_plan
from decodetop.budget.scenario import Scenario
from decodetop.pipeline.composition import Composition, compose
from decodetop.pipeline.context import BudgetContext
from decodetop.pipeline.plan_report import format_budget, plan_run_to_dict
from decodetop.pipeline.plan_runner import PlanRun
from decodetop.probes.results import ProbeResult, ProbeStatus, results_from_json
from tests.probes.test_plan_hooks import meas, result, tiny_scenario


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


def _compose(scenario: Scenario, results: Sequence[ProbeResult], **kw: Any) -> Composition:
    return compose(BudgetContext(scenario, tuple(results), **kw))


def test_every_component_is_count_times_time(tmp_path: Path) -> None:
    scenario = tiny_scenario(tmp_path)
    inv = scenario.inventory()
    results = _results_for_every_key(inv, 2.0)
    budget = _compose(scenario, results, observed=ObservedStep(10.0, "flag"), target_tps=100.0).budget
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


def test_gemm_between_measured_m_is_interpolated(tmp_path: Path) -> None:
    scenario = tiny_scenario(tmp_path, batch=3)  # GEMM keys at M = 3
    inv = scenario.inventory()
    results = _results_for_every_key(inv, 2.0, skip=("gemm",))
    curve_pts = []
    for key in build_plan(inv).by_probe("gemm"):
        assert isinstance(key, GemmKey) and key.m == 3
        for m, us in ((2, 10.0), (4, 40.0)):
            params = {"what": "gemm", "key": GemmKey(m, key.n, key.k, 1, key.dtype).key_id, "curve": key.curve_id}
            curve_pts.append(meas(f"{key.key_id}@{m}", {**params, "m": m, "role": "sweep"}, [[us]]))
    composed = _compose(scenario, [*results, result("gemm", *curve_pts)])
    budget, measured = composed.budget, composed.measured
    seg = budget.segment(Component.DENSE_MLP)
    assert seg is not None and seg.status == "interpolated" and seg.curve_label == "interpolated"
    gemm_ops = [op for op in inv.by_component()[Component.DENSE_MLP] if op.key.PROBE == "gemm"]
    other = sum(op.count for op in inv.by_component()[Component.DENSE_MLP] if op.key.PROBE != "gemm") * 0.002
    count = sum(op.count for op in gemm_ops)
    assert other + count * 0.010 < seg.ms < other + count * 0.040  # each GEMM between its M = 2 and M = 4 points
    assert len(measured.gemm_curves) == len(build_plan(inv).by_probe("gemm"))
    want = {GemmKey(m, k.n, k.k, 1, k.dtype).key_id for k in build_plan(inv).by_probe("gemm") if isinstance(k, GemmKey)
            for m in (2, 4)}  # fmt: skip
    assert {p.key.key_id for p in measured.curve_points if p.key.PROBE == "gemm"} >= want


def test_missing_probe_marks_its_components_and_the_total(tmp_path: Path) -> None:
    scenario = tiny_scenario(tmp_path)
    inv = scenario.inventory()
    results = _results_for_every_key(inv, 2.0, skip=("attention", "allreduce"))
    failed = ProbeResult("attention", ProbeStatus.FAILED, {}, (), world_size=2, message="boom", error="boom")
    budget = _compose(scenario, [*results, failed], group_kind="cpu").budget  # CPU ranks: no GPU estimates
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
    scenario = tiny_scenario(tmp_path)
    inv = scenario.inventory()
    results = _results_for_every_key(inv, 2.0, skip=("attention",))
    plan = build_plan(inv)
    composed = _compose(scenario, results, observed=ObservedStep(0.2, "flag"), plan=plan, group_kind="cpu")
    run = PlanRun(plan, (), tuple(results), composed, ("a note",))
    doc = plan_run_to_dict(run)
    text = json.dumps(doc, allow_nan=False)
    back = results_from_json(text)
    assert [r.probe for r in back] == [r.probe for r in results]
    assert doc["budget"]["complete"] is False
    assert doc["measured"][next(iter(plan.by_probe("norms"))).key_id]["median_ms"] == pytest.approx(0.002)
    out = format_budget(run)
    assert "█" in out and "missing" in out and "unexplained" in out and "note: a note" in out
