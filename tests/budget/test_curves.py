"""The curve engine: exact points verbatim, interpolation monotone where the curve is, extrapolation and transfer
labelled, refusal with the command to run, latency floors held, ranges that contain the measured value."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from decodetop.budget import leave_one_out
from decodetop.budget.curve_points import CurvePoint
from decodetop.budget.curves import CurveEngine, Prediction, Refusal, nominal_hardware
from decodetop.budget.gpus import GPUS
from decodetop.budget.inventory import expected_distinct_experts
from decodetop.budget.keys import AllreduceKey, AttentionKey, GemmKey, LaunchKey, MoeKey, NormKey, ProbeKey
from decodetop.budget.keywork import roofline_ms
from decodetop.budget.roofline import hardware_for
from decodetop.budget.selfcheck import DEFAULT_TRANSFER_SIGMA, Z80

H200 = hardware_for(GPUS["h200"])
MS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


def gqa(batch: int = 1, context: int = 4096, heads: int = 64, kv: str = "bf16", q_len: int = 1) -> AttentionKey:
    return AttentionKey("gqa", batch, q_len, context, heads, heads // 8, 128, 128, 0, 128, 0, 0, 0, 0, kv)


def point(key: ProbeKey, ms: float, spread: float = 0.02, variant: str = "") -> CurvePoint:
    return CurvePoint(key, ms, ms * (1 - spread), ms * (1 + spread), "test", variant)


def affine(key: ProbeKey, latency_ms: float = 0.005, efficiency: float = 0.8) -> float:
    """A kernel that costs a fixed latency plus its roofline work at `efficiency`."""
    return latency_ms + roofline_ms(key, H200) / efficiency


def gemm_curve(n: int, k: int, dtype: str = "bf16", time: Callable[[ProbeKey], float] = affine) -> list[CurvePoint]:
    return [point(GemmKey(m, n, k, 1, dtype), time(GemmKey(m, n, k, 1, dtype))) for m in MS]


def predicted(engine: CurveEngine, key: ProbeKey, variant: str = "") -> Prediction:
    got = engine.predict(key, variant)
    assert isinstance(got, Prediction), got
    return got


# --- exact, inside, outside ------------------------------------------------------------------------------------


def test_exact_points_are_returned_verbatim_with_their_spread() -> None:
    points = gemm_curve(8192, 8192)
    engine = CurveEngine(points, H200)
    for p in points:
        got = predicted(engine, p.key)
        assert (got.ms, got.p10_ms, got.p90_ms) == (p.median_ms, p.p10_ms, p.p90_ms)
        assert got.status == got.label == "measured" and got.anchors == (p.key.key_id,)


def test_between_points_an_affine_kernel_is_exact_and_labelled_interpolated() -> None:
    engine = CurveEngine(gemm_curve(8192, 8192), H200)
    for m in (3, 12, 48, 100, 200):
        key = GemmKey(m, 8192, 8192, 1, "bf16")
        got = predicted(engine, key)
        assert got.status == got.label == "interpolated"
        assert got.ms == pytest.approx(affine(key), rel=1e-9)
        assert got.p10_ms < got.ms < got.p90_ms


@settings(max_examples=60, deadline=None)
@given(
    steps=st.lists(st.floats(min_value=0.0, max_value=3.0), min_size=len(MS), max_size=len(MS)),
    queries=st.lists(st.integers(min_value=1, max_value=256), min_size=2, max_size=12, unique=True),
)
def test_interpolation_is_monotone_where_the_curve_is(steps: list[float], queries: list[int]) -> None:
    times = [0.002 + sum(steps[: i + 1]) / 100 for i in range(len(MS))]  # any non-decreasing curve
    points = [point(GemmKey(m, 4096, 4096, 1, "bf16"), t) for m, t in zip(MS, times, strict=True)]
    engine = CurveEngine(points, H200)
    got = [predicted(engine, GemmKey(m, 4096, 4096, 1, "bf16")).ms for m in sorted(queries)]
    assert got == sorted(got)
    for m, ms in zip(sorted(queries), got, strict=True):
        i = max(j for j, x in enumerate(MS) if x <= m)
        assert times[i] <= ms <= times[min(i + 1, len(MS) - 1)]  # between its bracketing measured times


@settings(max_examples=40, deadline=None)
@given(
    base=st.floats(min_value=0.003, max_value=0.02),
    per_ctx=st.floats(min_value=1e-7, max_value=1e-5),
    per_batch=st.floats(min_value=0.0, max_value=0.5),
)
def test_two_axis_blend_is_monotone_along_each_axis(base: float, per_ctx: float, per_batch: float) -> None:
    """Attention over batch × context: a grid monotone along both axes stays monotone between its points."""

    def t(b: int, c: int) -> float:
        return base * (1 + per_batch * b) + per_ctx * b * c

    grid = [point(gqa(b, c), t(b, c)) for b in (1, 4, 16) for c in (1024, 4096, 16384)]
    engine = CurveEngine(grid, H200)
    for b in (1, 2, 4, 8, 16):
        row = [predicted(engine, gqa(b, c)).ms for c in (1024, 2048, 4096, 8192, 16384)]
        assert row == sorted(row)
    for c in (1024, 3000, 16384):
        col = [predicted(engine, gqa(b, c)).ms for b in (1, 2, 3, 4, 8, 16)]
        assert col == sorted(col)


def test_a_gqa_shard_and_the_whole_model_with_as_many_sequence_kv_head_pairs_are_one_point() -> None:
    """The TP-8 shard (8 heads, 1 KV head) at batch 8 reads the same KV and does the same FLOPs as the whole model
    (64 heads, 8 KV heads) at batch 1: one point of one curve, a figure of the other labelled interpolated."""
    from decodetop.budget.curve_points import coords_of, key_at

    whole = {(b, c): point(gqa(b, c), affine(gqa(b, c))) for b in (1, 2, 4) for c in (1024, 4096, 16384)}
    engine = CurveEngine(whole.values(), H200)
    same = predicted(engine, gqa(8, 4096, heads=8))
    assert same.status == same.label == "interpolated" and same.ms == whole[1, 4096].median_ms
    between = predicted(engine, gqa(24, 4096, heads=8))  # 24 pairs: between batch 2 and 4 of the whole model
    assert whole[2, 4096].median_ms < between.ms < whole[4, 4096].median_ms
    for key in (gqa(8, 4096, heads=8), gqa(3, 1000, heads=32, kv="fp8", q_len=2)):
        moved = key_at(gqa(1, 1024, kv=key.kv_dtype), coords_of(key))  # a template of its curve
        assert roofline_ms(moved, H200) == pytest.approx(roofline_ms(key, H200), rel=1e-12)
    both = CurveEngine([*whole.values(), point(gqa(8, 4096, heads=8), whole[1, 4096].median_ms * 1.1)], H200)
    assert predicted(both, gqa(8, 4096, heads=8)).ms == whole[1, 4096].median_ms * 1.1  # measured: verbatim
    check = both.self_check().family("attention")
    assert check is not None and check.interior is not None and check.interior.n >= 2  # each from the other


def test_beyond_the_grid_is_labelled_with_the_octaves_it_reached() -> None:
    points = [point(gqa(1, c), affine(gqa(1, c))) for c in (1024, 2048, 4096, 8192, 16384)]
    engine = CurveEngine(points, H200)
    got = predicted(engine, gqa(1, 65536))
    assert got.status == "extrapolated"
    assert got.label == "extrapolated 2 octaves" and got.octaves == pytest.approx(2.0, abs=0.01)
    assert got.ms == pytest.approx(affine(gqa(1, 65536)), rel=0.02)  # the marginal cost held: affine stays exact
    edge = predicted(engine, gqa(1, 16384))
    assert got.ms <= edge.ms * roofline_ms(gqa(1, 65536), H200) / roofline_ms(gqa(1, 16384), H200)  # ≤ eff held
    near = predicted(engine, gqa(1, 24576))
    assert near.label == "extrapolated 0.6 octave"
    assert (got.p90_ms / got.ms) > (near.p90_ms / near.ms)  # each octave widens the range


def test_latency_bound_work_never_drops_below_its_measured_floor() -> None:
    floor = 0.0025  # a norm kernel's launch-bound time, whatever its width
    points = [point(NormKey("rmsnorm", t, 8192, "bf16"), floor + t * 1e-6) for t in (1, 4, 16, 64)]
    engine = CurveEngine(points, H200)
    small = predicted(engine, NormKey("rmsnorm", 1, 512, "bf16"))  # 16× less work than anything measured
    assert small.status == "extrapolated" and small.ms >= floor and small.floor_held
    assert roofline_ms(NormKey("rmsnorm", 1, 512, "bf16"), H200) < floor / 100  # the spec sheet says ×100 less
    below = [point(gqa(1, c), affine(gqa(1, c))) for c in (1024, 2048, 4096)]
    short = predicted(CurveEngine(below, H200), gqa(1, 128))
    assert affine(gqa(1, 128)) * 0.98 <= short.ms <= affine(gqa(1, 1024))  # the latency stays, the work shrinks


# --- transfer and refusal --------------------------------------------------------------------------------------


def test_a_shape_never_measured_is_transferred_from_its_kind_and_dtype() -> None:
    points = gemm_curve(8192, 8192) + gemm_curve(28672, 8192) + gemm_curve(1024, 1024, "fp8")
    engine = CurveEngine(points, H200)
    key = GemmKey(1, 14336, 8192, 1, "bf16")  # between the two bf16 shapes' work
    got = predicted(engine, key)
    assert got.status == "transferred"
    assert got.label.startswith("transferred from gemm:") and "dtype=bf16" in got.label
    assert got.ms == pytest.approx(affine(key), rel=0.05)
    interpolated = predicted(engine, GemmKey(3, 8192, 8192, 1, "bf16"))
    assert math.log(got.p90_ms / got.ms) > math.log(interpolated.p90_ms / interpolated.ms)


def test_a_dtype_this_host_cannot_run_is_carried_from_the_next_one_with_a_wide_band() -> None:
    small = gemm_curve(1024, 1024)  # the fastest GEMM here: the family's latency floor
    engine = CurveEngine(gemm_curve(8192, 8192, "fp8") + gemm_curve(8192, 8192) + small, H200)
    got = predicted(engine, GemmKey(1, 8192, 8192, 1, "nvfp4"))
    assert got.status == "transferred" and got.cross_dtype == "fp8"
    assert "fp8 efficiency: no nvfp4 curve here" in got.label
    assert got.p90_ms / got.ms >= math.exp(Z80 * DEFAULT_TRANSFER_SIGMA)  # at least ±35 %
    fp8 = predicted(engine, GemmKey(1, 8192, 8192, 1, "fp8")).ms
    assert got.ms < fp8  # half the weight bytes at the same efficiency


def test_nothing_to_anchor_is_refused_with_the_command_that_measures_it() -> None:
    engine = CurveEngine(gemm_curve(8192, 8192), H200, measure_hint="`decodetop probe --model m --budget`")
    got = engine.predict(gqa())
    assert isinstance(got, Refusal)
    assert got.text.startswith(f"{gqa().key_id}: cannot predict: no attention curve (kind=gqa) at bf16")
    assert got.text.endswith("measure it with `decodetop probe --model m --budget`")
    launch = CurveEngine([], H200).predict(LaunchKey("graph", 10))
    assert isinstance(launch, Refusal) and "measure it with `decodetop probe launch`" in launch.text


def test_all_reduce_curves_keep_their_implementations_apart() -> None:
    nccl = [point(AllreduceKey("all_reduce", s, 2, "bf16"), 0.020, variant="nccl") for s in (1024, 65536)]
    custom = [point(AllreduceKey("all_reduce", s, 2, "bf16"), 0.005, variant="one_shot") for s in (1024, 65536)]
    engine = CurveEngine(nccl + custom, H200)
    key = AllreduceKey("all_reduce", 8192, 2, "bf16")
    assert predicted(engine, key, "nccl").ms == pytest.approx(0.020)
    assert predicted(engine, key, "one_shot").ms == pytest.approx(0.005)
    four = predicted(engine, AllreduceKey("all_reduce", 8192, 4, "bf16"), "nccl")
    assert four.status == "extrapolated" and four.label == "extrapolated 1 octave"


def moe(tokens: int, local: int = 8) -> MoeKey:
    active = math.ceil(expected_distinct_experts(8, 2, tokens) * local / 8 - 1e-9)
    return MoeKey(tokens, 2, local, min(local, active), 4096, 14336, "bf16", 0)


def test_routed_experts_follow_the_experts_their_tokens_touch() -> None:
    """The touched experts follow from the token count: between two measured token counts is interpolation."""
    engine = CurveEngine([point(moe(t), affine(moe(t))) for t in (1, 2, 4, 8)], H200)
    got = predicted(engine, moe(3))
    assert got.status == "interpolated" and got.octaves == 0
    assert affine(moe(2)) < got.ms < affine(moe(4))
    ep2 = predicted(engine, moe(4, local=4))  # EP 2: half the local experts, fewer touched
    assert ep2.status == "extrapolated" and ep2.ms < affine(moe(4))


def test_an_unchecked_engine_ranges_on_the_published_errors() -> None:
    engine = CurveEngine(gemm_curve(8192, 8192), H200, checked=False)
    got = predicted(engine, GemmKey(3, 8192, 8192, 1, "bf16"))
    assert got.p10_ms < got.ms < got.p90_ms


# --- ranges and the self-check ---------------------------------------------------------------------------------


def _noisy(n: int, k: int, seed: int) -> list[CurvePoint]:
    """A GEMM curve with ±3 % measurement noise (a fixed pseudo-random pattern)."""
    noise = [math.sin(seed * 7.1 + i * 2.3) * 0.03 for i in range(len(MS))]
    return [
        point(GemmKey(m, n, k, 1, "bf16"), affine(GemmKey(m, n, k, 1, "bf16")) * (1 + e))
        for m, e in zip(MS, noise, strict=True)
    ]


def coverage(engine: CurveEngine, held_out: Sequence[CurvePoint]) -> float:
    """The share of held-out points whose measured time lies in the 80 % range predicted without them."""
    inside = 0
    for p in held_out:
        rest = CurveEngine([q for q in engine.points if q is not p], engine.hardware, self_check=engine.self_check())
        got = rest.predict(p.key, p.variant)
        assert isinstance(got, Prediction)
        inside += got.p10_ms <= p.median_ms <= got.p90_ms
    return inside / len(held_out)


def test_the_self_check_measures_the_engine_on_its_own_points() -> None:
    points = [p for i, (n, k) in enumerate(((4096, 4096), (8192, 8192), (8192, 28672))) for p in _noisy(n, k, i)]
    engine = CurveEngine(points, H200)
    check = engine.self_check().family("gemm")
    assert check is not None and check.points == 27 and check.curves == 3
    assert check.interior is not None and check.interior.n == 21  # every point but the two ends of each curve
    assert check.interior.median_pct < 5 and check.defaults == ()
    assert check.transfer is not None and check.transfer.n == 27
    lines = engine.self_check().lines()
    assert lines[0].startswith("gemm: ") and "inside the grid (21)" in lines[0]
    interior = [p for p in points if p.key.PROBE == "gemm" and 1 < getattr(p.key, "m", 0) < 256]
    assert coverage(engine, interior) >= 0.75


def test_few_points_fall_back_to_the_published_errors_and_say_so() -> None:
    engine = CurveEngine(gemm_curve(8192, 8192)[:3], H200)
    check = engine.self_check().family("gemm")
    assert check is not None and set(check.defaults) == {"interior", "per_octave", "transfer"}


def test_cpu_rank_engines_take_ratios_against_nominal_or_measured_rates() -> None:
    hw = nominal_hardware(2.0, 0.07)
    assert hw.mem_bandwidth_gbps == 2.0 and hw.bf16_dense_tflops == 0.07
    engine = CurveEngine(gemm_curve(64, 64), hw)
    assert predicted(engine, GemmKey(3, 64, 64, 1, "bf16")).status == "interpolated"
    assert "ratios only" in nominal_hardware().gpu_name


def test_a_family_checked_once_is_not_checked_again_by_an_engine_over_the_same_points(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A what-if's TP change builds a new engine (another refusal hint, other all-reduce points): the families whose
    points did not change take the check already made, the same figures; a family whose points changed is checked."""
    gemm = _noisy(4096, 8192, seed=11)
    reduce_2 = [point(AllreduceKey("all_reduce", 2**s, 2, "bf16"), 0.01 + 2**s / 1e11) for s in range(10, 24, 2)]
    reduce_4 = [point(AllreduceKey("all_reduce", 2**s, 4, "bf16"), 0.02 + 2**s / 1e11) for s in range(10, 24, 2)]
    first = CurveEngine(gemm + reduce_2, H200, measure_hint="`decodetop probe --tp 2`").self_check()
    checked: list[str] = []
    real = leave_one_out._family_check

    def counting(engine: CurveEngine, probe: str) -> object:
        checked.append(probe)
        return real(engine, probe)

    monkeypatch.setattr(leave_one_out, "_family_check", counting)
    again = CurveEngine(gemm + reduce_2, H200, measure_hint="`decodetop probe --tp 4`").self_check()
    assert checked == [] and again == first
    other = CurveEngine(gemm + reduce_4, H200).self_check()
    assert checked == ["allreduce"] and other.family("gemm") == first.family("gemm")
