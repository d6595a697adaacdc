"""The curve engine on the H200 plans the repo recorded (benchmarks/results/plans/): its own leave-one-out errors,
its ranges against held-out points, and results written before the curve plan used as inputs for other scenarios
(fewer curves: more extrapolation and transfer, wider ranges, said)."""

from __future__ import annotations

from functools import cache
from pathlib import Path

import pytest

from decodetop.budget.compose import Budget
from decodetop.budget.curves import CurveEngine, Prediction
from decodetop.budget.deployment import Deployment
from decodetop.budget.gpus import GPUS
from decodetop.budget.roofline import hardware_for
from decodetop.budget.scenario import Scenario, model_source
from decodetop.budget.spec import load_preset
from decodetop.pipeline.composition import compose
from decodetop.pipeline.context import UNMEASURED_ROOFLINE, BudgetContext
from decodetop.probes.plan_hooks import measured_from_results
from decodetop.probes.results import ProbeResult, load_results

PLANS = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "plans"
RECORDED = (
    "plan_llama-3.1-70b-tp1-h200x1.json",
    "plan_llama-3.1-70b-tp2-h200x2.json",
    "plan_glm-5-tp2-h200x1.json",
    "plan_deepseek-v3-tp2-h200x1.json",
    "plan_qwen3-235b-a22b-tp2-h200x1.json",
)
H200 = hardware_for(GPUS["h200"])


@cache
def results(name: str) -> tuple[ProbeResult, ...]:
    return tuple(load_results(PLANS / name))


@cache
def engine(name: str) -> CurveEngine:
    return measured_from_results(results(name)).engine(H200)


@pytest.mark.parametrize("name", RECORDED)
def test_gemm_leave_one_out_meets_its_target_on_recorded_h200_plans(name: str) -> None:
    """docs/reference/whatif.md §5: per-curve interpolation on own data; GEMM ≤ 5 % median / ≤ 15 % p90."""
    gemm = engine(name).self_check().family("gemm")
    assert gemm is not None and gemm.interior is not None and gemm.interior.n >= 14
    assert gemm.interior.median_pct <= 5.0
    assert gemm.interior.p90_pct <= 15.0
    assert gemm.transfer is not None and gemm.transfer.n >= 18  # a shape left out is predicted from the others


def test_held_out_gemm_points_fall_in_their_predicted_range() -> None:
    """The 80 % range of a point predicted without it holds it about 80 % of the time (interior GEMM points of
    every recorded plan)."""
    inside = total = 0
    for name in RECORDED:
        full = engine(name)
        check = full.self_check()
        gemm = [p for p in full.points if p.key.PROBE == "gemm"]
        for p in gemm:
            rest = CurveEngine([q for q in full.points if q is not p], H200, self_check=check)
            got = rest.predict(p.key)
            if isinstance(got, Prediction) and got.status == "interpolated":
                total += 1
                inside += got.p10_ms <= p.median_ms <= got.p90_ms
    assert total >= 150
    assert 0.7 <= inside / total <= 0.97, (inside, total)


def _budget(name: str, model: str, unmeasured: str = "curves", **deployment: object) -> Budget:
    dep = Deployment(**deployment)  # type: ignore[arg-type]
    scenario = Scenario(model_source(model, None), load_preset(model), dep, "test")
    return compose(BudgetContext(scenario, results(name), unmeasured=unmeasured)).budget


def test_older_results_answer_other_scenarios_with_labels_and_wider_ranges() -> None:
    """A plan measured at TP 1, batch 1, context 4K before the curve plan existed: batch 8, context 32K, FP8 KV and
    the TP-2 shard are predicted from its curves, each figure labelled, none silently from the spec sheet."""
    name = "plan_llama-3.1-70b-tp1-h200x1.json"
    base = _budget(name, "llama-3.1-70b", tp=1)
    assert all(s.status == "measured" for s in base.segments) and base.weakest == ""
    swept = _budget(name, "llama-3.1-70b", tp=1, context_len=32768).segment("attention")
    assert swept is not None and swept.status == "measured"  # the context sweep measured 32K: no estimate there
    for deployment in ({"batch": 8}, {"context_len": 24576}, {"kv_dtype": "fp8"}, {"tp": 2}):
        b = _budget(name, "llama-3.1-70b", **{"tp": 1, **deployment})
        compute = [s for s in b.segments if s.component != "communication"]
        assert all(s.ms is not None and s.status != "missing" for s in compute), deployment
        assert not any(s.status == "estimated" for s in compute), [(s.component, s.reason) for s in compute]
        predicted = [s for s in compute if s.status in ("interpolated", "extrapolated", "transferred")]
        assert predicted and all(s.curve_label for s in predicted), deployment
        assert b.weakest and b.dominant and b.self_check is not None
        assert b.range_p10_ms is not None and b.range_p90_ms is not None
        assert b.range_p10_ms < b.total_ms < b.range_p90_ms
        assert base.range_p90_ms is not None and base.range_p10_ms is not None
        assert b.range_p90_ms / b.range_p10_ms > base.range_p90_ms / base.range_p10_ms  # fewer curves, wider
    fp8 = _budget(name, "llama-3.1-70b", tp=1, kv_dtype="fp8").segment("attention")
    assert fp8 is not None and fp8.status == "transferred" and "bf16 efficiency: no fp8 curve here" in fp8.curve_label
    roofline = _budget(name, "llama-3.1-70b", UNMEASURED_ROOFLINE, tp=1, batch=8)  # the spec-sheet view, asked for
    assert {s.status for s in roofline.segments} <= {"measured", "estimated"} and roofline.self_check is None
    norms = _budget(name, "llama-3.1-70b", tp=1, batch=8).segment("norms")
    assert norms is not None and norms.ms is not None and norms.ms >= 0.5 * (base.segment("norms").ms or 0)  # type: ignore[union-attr]


def test_budget_json_carries_ranges_labels_and_the_self_check() -> None:
    doc = _budget("plan_llama-3.1-70b-tp1-h200x1.json", "llama-3.1-70b", tp=1, batch=8).to_dict()
    assert doc["range_ms"][0] < doc["total_ms"] < doc["range_ms"][1]
    assert doc["weakest"] and doc["dominant_uncertainty"] and "Fenton" in doc["range_method"]
    families = {f["probe"]: f for f in doc["self_check"]["families"]}
    assert families["gemm"]["interior"]["median_pct"] <= 5.0
    seg = next(s for s in doc["segments"] if s["component"] == "attention")
    assert seg["range_p10_ms"] < seg["ms"] < seg["range_p90_ms"] and seg["curve_label"]


def test_the_table_of_docs_benchmarks_comes_from_a_script(capsys: pytest.CaptureFixture[str]) -> None:
    import importlib
    import sys

    sys.path.insert(0, str(PLANS.parents[1] / "whatif"))
    loo = importlib.import_module("loo_recorded")
    assert loo.main([]) == 0  # not pytest's own arguments
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("| plan | GEMM inside |") and len(lines) >= 2 + len(RECORDED)
