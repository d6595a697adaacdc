"""Budget composition: arithmetic on a hand-computed case, interpolation on measured curves, missing data."""

from __future__ import annotations

import math

import pytest

from decodetop.budget.compose import Curve, MeasuredTime, compose_budget
from decodetop.budget.deployment import Deployment
from decodetop.budget.gpus import GPUS
from decodetop.budget.inventory import StepInventory, build_inventory
from decodetop.budget.keys import AllreduceKey, GemmKey
from decodetop.budget.plan import build_plan
from decodetop.budget.roofline import Hardware, hardware_for, roofline
from decodetop.budget.spec import load_preset, spec_from_config
from decodetop.errors import UserInputError

from .test_spec import TINY_LLAMA

# One time per probe (ms per instance), so each component's sum can be worked out by hand below.
PER_PROBE_MS = {
    "gemm": 0.01,
    "attention": 0.1,
    "kvcast": 0.001,
    "norms": 0.0001,
    "allreduce": 0.02,
    "sampling": 0.05,
    "launch": 0.0005,
}


def _tiny(batch: int = 1) -> StepInventory:
    return build_inventory(spec_from_config(TINY_LLAMA), Deployment(tp=2, batch=batch, context_len=100))


def _measure_all(inv: StepInventory, skip: str = "") -> dict[str, MeasuredTime]:
    out = {}
    for key in build_plan(inv).all_keys():
        if skip != key.PROBE:
            ms = PER_PROBE_MS[key.PROBE]
            out[key.key_id] = MeasuredTime(ms, ms * 0.9, ms * 1.2, "test")
    return out


def test_composition_by_hand() -> None:
    """2-layer llama at TP 2, every op measured (op counts worked out from the model by hand):

    attention: 2 rotary + kv writes × 0.001 + 2 attention × 0.1 = 0.202
    attention projections: (2 qkv + 2 o_proj) × 0.01 = 0.04
    dense MLP: (2 gate_up + 2 down) × 0.01 + 2 silu_and_mul × 0.0001 = 0.0402
    communication: (1 + 2 + 2 all-reduces + 1 all-gather) × 0.02 = 0.12
    norms: (embedding + 2 input norms + 2 post-attention + final) × 0.0001 = 0.0006
    lm_head: 1 × 0.05
    launch: 29 kernels × 0.0005 = 0.0145
    """
    inv = _tiny()
    assert inv.kernels == 29
    budget = compose_budget(inv, _measure_all(inv), observed_ms=1.0, target_tps=2000.0)
    expected = {
        "attention": 0.202,
        "attention_proj": 0.04,
        "dense_mlp": 0.0402,
        "communication": 0.12,
        "norms": 0.0006,
        "lm_head": 0.05,
        "launch": 0.0145,
    }
    got = {s.component: s.ms for s in budget.segments}
    assert got == pytest.approx(expected)
    assert all(s.status == "measured" for s in budget.segments)
    assert budget.total_ms == pytest.approx(0.4673)
    assert budget.unexplained_ms == pytest.approx(1.0 - 0.4673)
    assert budget.complete and budget.missing == ()
    assert budget.target_ms == pytest.approx(0.5)
    attention = budget.segment("attention")
    assert attention is not None
    assert attention.p10_ms == pytest.approx(0.202 * 0.9)
    assert attention.p90_ms == pytest.approx(0.202 * 1.2)
    assert budget.to_dict()["segments"][0]["component"] == "attention"


def test_missing_data_stays_visible() -> None:
    inv = _tiny()
    budget = compose_budget(inv, _measure_all(inv, skip="attention"), observed_ms=1.0)
    seg = budget.segment("attention")
    assert seg is not None
    assert seg.status == "missing"
    assert seg.ms == pytest.approx(0.002)  # only the kv writes are known: a lower bound, not 0 and not the truth
    (missing,) = seg.missing_keys
    assert missing.startswith("attention:kind=gqa")
    assert missing in seg.reason and "cannot predict: no attention curve" in seg.reason
    assert not budget.complete
    assert budget.missing == ("attention",)
    assert budget.unexplained.status == "missing"
    assert "upper bound" in budget.unexplained.reason


def test_nothing_measured_and_no_estimate_is_all_missing() -> None:
    budget = compose_budget(_tiny())
    assert all(s.status == "missing" and s.ms is None for s in budget.segments)
    assert budget.total_ms == 0
    assert len(budget.missing) == len(budget.segments)


def test_all_reduce_between_measured_sizes_is_interpolated() -> None:
    inv = _tiny()  # all-reduce messages are 1 token × 64 × 2 = 128 B
    measured = {k: v for k, v in _measure_all(inv).items() if not k.startswith("allreduce:")}
    curve = Curve(((64.0, 0.010), (256.0, 0.020), (1024.0, 0.040)), source="sweep")
    budget = compose_budget(inv, measured, allreduce_curves={"all_reduce": curve, "all_gather": curve})
    comm = budget.segment("communication")
    assert comm is not None
    assert comm.status == "interpolated" and comm.curve_label == "interpolated"
    # 5 all-reduces of 128 B and one 100 B all-gather, each between its bracketing measured points (64 B and 256 B)
    assert 6 * 0.010 < comm.ms < 6 * 0.020
    assert comm.sources == ("sweep",)
    assert comm.range_p10_ms is not None and comm.range_p90_ms is not None
    assert comm.range_p10_ms < comm.ms < comm.range_p90_ms  # the curve family's own error widens the range


def test_curve_series_are_checked() -> None:
    assert Curve(((64.0, 2.0), (8.0, 1.0))).points == ((8.0, 1.0), (64.0, 2.0))
    with pytest.raises(UserInputError):
        Curve(((0.0, 1.0),))
    with pytest.raises(UserInputError):
        Curve(((8.0, 1.0), (8.0, 2.0)))


def test_gemm_curve_interpolates_missing_m() -> None:
    inv = _tiny(batch=3)
    measured = {k: v for k, v in _measure_all(inv).items() if not k.startswith("gemm:")}
    curves = {}
    for key in build_plan(inv).by_probe("gemm"):
        assert isinstance(key, GemmKey) and key.m == 3
        curves[key.curve_id] = Curve(((2.0, 0.01), (4.0, 0.02)))
    budget = compose_budget(inv, measured, gemm_curves=curves)
    proj = budget.segment("attention_proj")
    assert proj is not None
    assert proj.status == "interpolated"
    assert 4 * 0.01 < proj.ms < 4 * 0.02  # four GEMMs, each between its M = 2 and M = 4 points


def test_roofline_only_budget_is_estimated_everywhere() -> None:
    inv = build_inventory(load_preset("glm-5-nvfp4"), Deployment(tp=8))
    hw = hardware_for(GPUS["rtx-pro-6000"])
    roof = roofline(inv, hw)
    budget = compose_budget(inv, {}, roofline=roof, estimate=hw)
    assert all(s.status == "estimated" for s in budget.segments)
    assert budget.complete
    assert budget.roofline_ms == roof.step_ms
    assert budget.observed_ms == 95.0
    assert budget.target_ms == pytest.approx(1000 / 309)
    comm = budget.segment("communication")
    assert comm is not None and comm.ms == pytest.approx(roof.collective_ms)
    launch = budget.segment("launch")
    assert launch is not None and launch.ms == pytest.approx(inv.kernels * 0.6e-3)
    assert budget.unexplained_ms == pytest.approx(95.0 - budget.total_ms)


def test_measured_beats_estimate_and_launch_mode_picks_the_key() -> None:
    inv = _tiny()
    hw = Hardware("t", 1000.0, "t", 10.0, "t", 100.0, "pcie5", None)
    ar = AllreduceKey("all_reduce", 128, 2, "bf16").key_id
    measured = {ar: MeasuredTime.point(0.5), f"launch:mode=eager,kernels={inv.kernels}": MeasuredTime.point(0.01)}
    budget = compose_budget(inv, measured, estimate=hw, launch_mode="eager")
    comm = budget.segment("communication")
    assert comm is not None and comm.status == "estimated"  # the all-gather is still estimated
    assert comm.ms is not None and comm.ms > 5 * 0.5
    launch = budget.segment("launch")
    assert launch is not None and launch.status == "measured"
    assert launch.ms == pytest.approx(inv.kernels * 0.01)
    graph = compose_budget(inv, measured, launch_mode="graph")
    graph_launch = graph.segment("launch")
    assert graph_launch is not None and graph_launch.status == "missing"


def test_bad_inputs() -> None:
    with pytest.raises(UserInputError):
        MeasuredTime(float("nan"), 0, 0)
    with pytest.raises(UserInputError):
        compose_budget(_tiny(), observed_ms=0)
    with pytest.raises(UserInputError):
        compose_budget(_tiny(), launch_mode="warp")


def test_the_launch_carries_its_repeat_spread_and_between_runs_its_clocks_drift() -> None:
    """Composed at its own keys the launch's range is its repeat spread (kernels × p10 … p90); composed for another
    scenario (batch 8 from batch 1's keys) it is widened by the graph's per-node drift between runs (×1.6 at 80 %:
    the SM clock moves it), not by the kernels' 3 %."""
    from decodetop.budget.segment_costs import LAUNCH_RUN_TO_RUN_SIGMA
    from decodetop.budget.selfcheck import Z80

    one = _tiny()
    measured = _measure_all(one)
    launch = compose_budget(one, measured).segment("launch")
    assert launch is not None and launch.ms == pytest.approx(one.kernels * 0.0005)
    assert (launch.range_p10_ms, launch.range_p90_ms) == pytest.approx((one.kernels * 0.00045, one.kernels * 0.0006))
    other = compose_budget(_tiny(batch=8), measured).segment("launch")
    assert other is not None and other.status == "measured" and other.ms == pytest.approx(launch.ms)
    assert other.range_p10_ms is not None and other.range_p90_ms is not None
    assert other.range_p90_ms / other.ms > 1.2 * 1.4  # the repeat spread's ×1.2 widened by the drift
    own = math.log(1.2 / 0.9) / (2 * Z80)
    widen = math.exp(Z80 * (math.hypot(own, LAUNCH_RUN_TO_RUN_SIGMA) - own))
    assert other.range_p90_ms == pytest.approx(launch.range_p90_ms * widen)
