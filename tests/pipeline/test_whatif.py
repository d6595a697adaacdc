"""What-ifs: variants of a deployment predicted through the one composition from the curves of recorded H200 plans
(benchmarks/results/plans/), with their ranges, tok/s, limiting component, the target and calibration."""

from __future__ import annotations

import dataclasses
import json
from functools import cache
from pathlib import Path

import pytest

from decodetop.budget.compose import ObservedStep
from decodetop.budget.deployment import Deployment
from decodetop.budget.scenario import Scenario, model_source
from decodetop.budget.spec import load_config, load_preset
from decodetop.errors import UserInputError
from decodetop.pipeline.context import BudgetContext
from decodetop.pipeline.whatif import compare, parse_vary, predict, vary_grid
from decodetop.probes.results import ProbeResult, load_results
from tests.helpers.model_configs import small_llama

PLANS = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "plans"
LLAMA = PLANS / "plan_llama-3.1-70b-tp1-h200x1.json"
GLM5 = PLANS / "plan_glm-5-tp2-h200x2.json"


@cache
def results(path: Path) -> tuple[ProbeResult, ...]:
    return tuple(load_results(path))


def ctx_for(model: str, path: Path, observed: ObservedStep | None = None, **deployment: object) -> BudgetContext:
    dep = Deployment(**deployment)  # type: ignore[arg-type]
    scenario = Scenario(model_source(model, None), load_preset(model), dep, "test")
    kw = {"observed": observed} if observed is not None else {}
    return BudgetContext(scenario, results(path), **kw)  # type: ignore[arg-type]


def test_the_current_deployment_and_its_variants_come_from_the_one_composition() -> None:
    ctx = ctx_for("llama-3.1-70b", LLAMA, tp=1)
    now = predict(ctx, {})
    assert now.label == "now" and now.budget is not None and now.step_ms == pytest.approx(now.budget.total_ms)
    tp2 = predict(ctx, {"tp": "2", "batch": "8"})
    assert tp2.scenario is not None and tp2.scenario.deployment.tp == 2 and tp2.scenario.tp_source == "--vary tp"
    assert tp2.budget is not None and tp2.budget.weakest  # predicted, labelled
    assert tp2.range_ms is not None and tp2.range_ms[0] <= tp2.budget.total_ms <= tp2.range_ms[1]
    assert tp2.tokens_per_s_total == pytest.approx(8 * (tp2.tokens_per_s or 0))
    assert tp2.limiting == "dense MLP"
    bad = predict(ctx, {"tp": "3"})
    assert bad.budget is None and "--tp: 3 does not split the 64 attention heads" in bad.refused


def test_vary_parses_one_axis_or_a_grid_and_says_what_is_wrong() -> None:
    axes = parse_vary(["tp=1,2", "KV=bf16,fp8"])
    assert axes == [("tp", ("1", "2")), ("kv", ("bf16", "fp8"))]
    assert vary_grid(axes) == [
        {"tp": "1", "kv": "bf16"},
        {"tp": "1", "kv": "fp8"},
        {"tp": "2", "kv": "bf16"},
        {"tp": "2", "kv": "fp8"},
    ]
    for items, message in (
        (["speed=2"], "unknown knob 'speed'"),
        (["tp"], "give KNOB=V1,V2"),
        (["tp=1", "tp=2"], "tp given twice"),
    ):
        with pytest.raises(UserInputError, match=message):
            parse_vary(items)
    ctx = ctx_for("llama-3.1-70b", LLAMA, tp=1)
    assert "not a whole number" in predict(ctx, {"batch": "many"}).refused


def test_the_target_names_the_variants_that_reach_it_best_first_and_why_the_others_do_not() -> None:
    ctx = ctx_for("llama-3.1-70b", LLAMA, tp=1)
    tp2 = predict(ctx, {"tp": "2"}).tokens_per_s
    assert tp2 is not None
    report = compare(dataclasses.replace(ctx, target_tps=tp2 * 0.99), [{"tp": v} for v in ("1", "2", "4", "8")])
    ok, not_ok = report.reaching()
    assert [v.label for v in ok] == ["tp=8", "tp=4", "tp=2"]  # best first
    assert [(v.label, why.split(":")[0]) for v, why in not_ok] == [("tp=1", "weights do not fit")]
    far = compare(dataclasses.replace(ctx, target_tps=20_000.0), [{"tp": "8"}])
    assert far.short_of_target(far.variants[0]).startswith("roofline above target")
    tp8 = far.variants[0]
    assert tp8.budget is not None and tp8.tokens_per_s is not None and tp8.budget.roofline_ms is not None
    roof_tps = tp8.budget.tokens_per_step * 1000 / tp8.budget.roofline_ms
    near = compare(dataclasses.replace(ctx, target_tps=(tp8.tokens_per_s + roof_tps) / 2), [{"tp": "8"}])
    assert near.short_of_target(near.variants[0]).startswith("predicted ")  # the roofline allows it, the curves not


def test_calibration_scales_predictions_beside_the_uncalibrated_figures_within_its_bounds() -> None:
    plain = compare(ctx_for("llama-3.1-70b", LLAMA, tp=1), [{"tp": "2"}])
    assert plain.calibration is None and "assumed, not observed" in plain.calibration_note
    assert plain.variants[0].calibrated_ms is None
    now_ms = plain.now.step_ms
    assert now_ms is not None
    observed = ObservedStep(now_ms * 1.25, "flag", "--observed-ms")
    report = compare(ctx_for("llama-3.1-70b", LLAMA, observed=observed, tp=1), [{"tp": "2"}])
    cal = report.calibration
    assert cal is not None and cal.factor == pytest.approx(1.25) and not cal.bounded
    tp2 = report.variants[0]
    assert tp2.step_ms is not None and tp2.calibrated_ms == pytest.approx(tp2.step_ms * 1.25)  # both kept
    far = compare(ctx_for("llama-3.1-70b", LLAMA, observed=ObservedStep(now_ms * 5, "flag", ""), tp=1), [])
    assert far.calibration is not None and far.calibration.factor == 2.0 and far.calibration.bounded
    assert "held at ×2.00" in far.calibration.text


def test_weight_precision_a_gpu_cannot_run_is_carried_from_a_measured_one_with_a_wide_range() -> None:
    ctx = ctx_for("llama-3.1-70b", LLAMA, tp=1)
    bf16, fp8, nvfp4 = (predict(ctx, {"weights": w}) for w in ("bf16", "fp8", "nvfp4"))
    assert bf16.scenario is not None and bf16.scenario.model_variant == ""
    assert fp8.scenario is not None and "variant=weights=fp8" in fp8.scenario.fingerprint_id
    assert (bf16.step_ms or 0) > (fp8.step_ms or 0) > (nvfp4.step_ms or 0)  # fewer weight bytes each
    seg = nvfp4.budget.segment("dense_mlp") if nvfp4.budget else None
    assert seg is not None and seg.status == "transferred" and "no nvfp4 curve here" in seg.curve_label
    assert seg.range_p10_ms is not None and seg.range_p90_ms is not None
    assert seg.range_p90_ms / seg.range_p10_ms > 1.35**2  # at least ±35 %


def test_another_gpu_model_is_predicted_from_this_hosts_curves_and_says_so() -> None:
    ctx = ctx_for("glm-5", GLM5, tp=2)
    rtx = predict(ctx, {"gpu": "rtx-pro-6000"})
    b = rtx.budget
    assert b is not None and b.header.startswith("predicted for NVIDIA RTX PRO 6000 Blackwell from the curves")
    assert {s.status for s in b.segments} <= {"transferred", "estimated"}
    assert all("transferred from NVIDIA H200" in s.curve_label for s in b.segments if s.status == "transferred")
    assert b.range_p10_ms is not None and b.range_p90_ms is not None and b.range_p90_ms / b.range_p10_ms > 1.3
    assert not rtx.fits and "RTX PRO 6000" in rtx.fit_text  # 746 GB of BF16 weights at TP 2
    here = predict(ctx, {})
    assert (here.budget.total_ms if here.budget else 0) < b.total_ms  # less bandwidth on the RTX PRO 6000


def test_speculative_decoding_with_mtp_layers_or_a_draft_model(tmp_path: Path) -> None:
    mtp = predict(ctx_for("deepseek-v3", PLANS / "plan_deepseek-v3-tp2-h200x1.json", tp=2), {"accept": "2"})
    assert mtp.budget is not None and mtp.budget.tokens_per_step == 2.0 and mtp.scenario is not None
    assert any(op.name.startswith("mtp ") for op in mtp.scenario.inventory().ops)
    ctx = ctx_for("llama-3.1-70b", LLAMA, tp=1)
    refused = predict(ctx, {"accept": "2"})
    assert "no MTP layer" in refused.refused and "--draft-config" in refused.refused
    (tmp_path / "config.json").write_text(json.dumps(small_llama()))
    draft = load_config(tmp_path / "config.json")
    ctx = dataclasses.replace(ctx, scenario=dataclasses.replace(ctx.scenario, draft_spec=draft, model_variant="d"))
    drafted = predict(ctx, {"accept": "3"})
    assert drafted.scenario is not None and drafted.scenario.deployment.draft_model
    ops = drafted.scenario.inventory().ops
    assert any(op.name.startswith("draft model ") and op.layers == "draft" for op in ops)
    assert not any(op.name.startswith("mtp ") for op in ops)
    one = predict(ctx, {"accept": "1"})
    assert drafted.budget is not None and one.budget is not None
    assert drafted.budget.total_ms > one.budget.total_ms  # verify 3 tokens + 2 draft steps
    assert (drafted.tokens_per_s or 0) > (one.tokens_per_s or 0)  # but 3 tokens per step


def test_the_draft_knob_sets_the_drafts_verified_per_step_or_leaves_them_to_the_accept_length() -> None:
    """`draft=4` verifies 1 + 4 tokens a step; `draft=auto` as many as the accept length needs (⌈accept − 1⌉); an
    accept length above drafts + 1 is refused with the flag named."""
    ctx = ctx_for("deepseek-v3", PLANS / "plan_deepseek-v3-tp2-h200x1.json", tp=2)
    four = predict(ctx, {"accept": "3", "draft": "4"})
    auto = predict(ctx, {"accept": "3", "draft": "auto"})
    assert four.scenario is not None and four.scenario.deployment.query_len == 5
    assert auto.scenario is not None and auto.scenario.deployment.query_len == 3
    assert four.budget is not None and auto.budget is not None and four.budget.total_ms > auto.budget.total_ms
    assert "--accept-length" in predict(ctx, {"accept": "3", "draft": "1"}).refused


def test_a_variant_carries_the_drift_between_runs_and_the_measured_scenario_does_not() -> None:
    import math

    from decodetop.budget.curves import RUN_TO_RUN_SIGMA
    from decodetop.budget.selfcheck import Z80

    ctx = ctx_for("llama-3.1-70b", LLAMA, tp=1)
    now, longer = predict(ctx, {}).budget, predict(ctx, {"context": "32768"}).budget
    assert now is not None and longer is not None
    assert all(s.shared_sigma_log == 0.0 for s in now.segments)  # every op of its scenario measured in that run
    shared = [s for s in longer.segments if s.ms is not None and s.status not in ("estimated", "missing")]
    assert shared and all(s.shared_sigma_log == pytest.approx(RUN_TO_RUN_SIGMA) for s in shared)
    assert longer.range_p10_ms is not None and longer.range_p90_ms is not None
    drift_band = math.exp(2 * Z80 * RUN_TO_RUN_SIGMA)  # one factor for every figure: the total keeps it whole
    assert longer.range_p90_ms / longer.range_p10_ms >= drift_band * 0.999


def test_check_vary_refuses_a_value_its_knob_cannot_take_and_leaves_combinations_to_the_rows() -> None:
    from decodetop.pipeline.whatif import check_vary

    llama = ctx_for("llama-3.1-70b", LLAMA, tp=1).scenario
    check_vary(llama, [("tp", ("1", "2", "4", "8")), ("batch", ("1", "64")), ("kv", ("bf16", "fp8"))])
    for axes, message in (
        ([("tp", ("1", "[red]2"))], "--vary tp='[red]2': not a whole number"),
        ([("tp", ("6",))], "--vary tp='6': 6 does not split the 64 attention heads"),
        ([("context", ("-1",))], "--vary context='-1': -1 is out of range"),
        ([("speed", ("2",))], "--vary speed='2': unknown knob 'speed'"),
    ):
        with pytest.raises(UserInputError) as err:
            check_vary(llama, axes)
        assert str(err.value).startswith(message)
    mixtral = Scenario(model_source("mixtral-8x7b", None), load_preset("mixtral-8x7b"), Deployment(tp=1), "test")
    check_vary(mixtral, [("tp", ("1", "2")), ("ep", ("1", "2"))])  # ep=2 beside tp=1 is a row's refusal
    with pytest.raises(UserInputError, match="--vary ep='3': 3 does not split the 8 experts"):
        check_vary(mixtral, [("ep", ("3",))])


def test_a_variant_composed_from_each_kind_of_layer_built_once_has_the_budget_of_every_layer_built(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from functools import partial

    from decodetop.budget import scenario as scenario_module
    from decodetop.budget.inventory import build_inventory

    ctx = ctx_for("glm-5", GLM5, tp=2)
    knobs = {"tp": "4", "batch": "8", "kv": "fp8"}
    fast = predict(ctx, knobs).budget
    scenario_module._inventory.cache_clear()
    monkeypatch.setattr(scenario_module, "build_inventory", partial(build_inventory, by_layer_kind=False))
    slow = predict(ctx, knobs).budget
    scenario_module._inventory.cache_clear()
    assert fast is not None and fast == slow
