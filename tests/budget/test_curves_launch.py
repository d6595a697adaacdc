"""The curve engine and the GQA kernel's launch regimes: where a curve's points say their launch, a figure
interpolated between points of another regime than its own is labelled so and takes the error of such figures;
the self-check tells the two kinds apart; results without the launch keep the plain rule, and say so."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

from decodetop.budget.curve_points import CurvePoint
from decodetop.budget.curves import ACROSS_LAUNCH, CurveEngine, Prediction
from decodetop.budget.gpus import GPUS
from decodetop.budget.gqa_launch import GqaLaunchFacts, attended_tokens, default_config, key_launch
from decodetop.budget.keys import AttentionKey
from decodetop.budget.keywork import roofline_ms
from decodetop.budget.roofline import hardware_for

H200 = hardware_for(GPUS["h200"])
SMS = 132
PAIRS = (1, 2, 4, 8)
CONTEXTS = tuple(1024 * 2**i for i in range(8))  # 1K … 128K


def gqa(batch: int, context: int) -> AttentionKey:
    return AttentionKey("gqa", batch, 1, context, 8, 1, 128, 128, 0, 128, 0, 0, 0, 0, "bf16")


def stepped_ms(key: AttentionKey) -> float:
    """A split kernel's time that steps with its launch: a latency per program on the busiest SM and per launch
    shape, plus its roofline work."""
    launch = key_launch(key, SMS)
    shape_ms = 0.002 if launch.config.programs_per_sm == 4 else 0.0
    return 0.005 + 0.003 * launch.programs_per_busiest_sm + shape_ms + roofline_ms(key, H200) / 0.8


def grid(*, launched: bool = True) -> list[CurvePoint]:
    out = []
    for pairs in PAIRS:
        for context in CONTEXTS:
            key = gqa(pairs, context)
            ms = stepped_ms(key)
            facts = GqaLaunchFacts(default_config(attended_tokens(key)), SMS) if launched else None
            out.append(CurvePoint(key, ms, ms * 0.99, ms * 1.01, "test", launch=facts))
    return out


def predicted(engine: CurveEngine, key: AttentionKey) -> Prediction:
    got = engine.predict(key)
    assert isinstance(got, Prediction), got
    return got


def test_a_figure_between_points_of_other_regimes_is_labelled_across_a_launch_change() -> None:
    engine = CurveEngine(grid(), H200)
    within = predicted(engine, gqa(1, 3072))  # 2K and 4K: one program per SM, SHORT, as at 3K
    across = predicted(engine, gqa(1, 24576))  # 16K: 129 programs (one per SM); 24K and 32K: two
    assert within.status == across.status == "interpolated"
    assert within.label == "interpolated" and across.label == "interpolated" + ACROSS_LAUNCH
    assert across.sigma_log > within.sigma_log  # the self-check's error of each kind


def test_the_self_check_tells_the_two_kinds_of_interior_figure_apart() -> None:
    check = CurveEngine(grid(), H200).self_check().family("attention")
    assert check is not None and check.interior is not None
    assert check.within_launch is not None and check.across_launch is not None
    assert check.within_launch.n + check.across_launch.n == check.interior.n
    assert check.across_launch.median_pct > check.within_launch.median_pct
    assert check.across_sigma > check.interior_sigma and check.launch_unknown == 0
    line = next(line for line in CurveEngine(grid(), H200).self_check().lines() if line.startswith("attention"))
    assert "within one launch regime" in line and "across a launch change" in line


def test_results_without_the_launch_keep_the_plain_rule_and_say_it() -> None:
    launched, plain = CurveEngine(grid(), H200), CurveEngine(grid(launched=False), H200)
    key = gqa(1, 24576)
    a, b = predicted(launched, key), predicted(plain, key)
    assert a.ms == b.ms  # the same blend: the launch tells which error a figure carries, not another figure
    assert b.label == "interpolated"
    check = plain.self_check().family("attention")
    assert check is not None and check.within_launch is None and check.across_launch is None
    assert check.launch_unknown == 1 and check.across_sigma == check.interior_sigma
    assert any("the launch of 1 GQA curve not recorded" in line for line in plain.self_check().lines())


def test_points_of_another_kernel_rule_tell_no_regimes() -> None:
    """Shapes neither today's rule nor one fixed shape gives (an earlier kernel's rule) leave the regimes unknown."""
    odd = [
        dataclasses.replace(p, launch=GqaLaunchFacts(default_config(1 << 20 if i % 2 else 1), SMS))
        for i, p in enumerate(grid())
    ]
    check = CurveEngine(odd, H200).self_check().family("attention")
    assert check is not None and check.launch_unknown == 1 and check.across_launch is None


def test_exact_points_stay_verbatim() -> None:
    points = grid()
    engine = CurveEngine(points, H200)
    for p in points:
        got = predicted(engine, p.key)  # type: ignore[arg-type]
        assert (got.ms, got.label) == (p.median_ms, "measured")


def test_a_one_wave_launch_counts_its_chain_of_tiles_and_its_share_of_all_tiles() -> None:
    launch = key_launch(gqa(8, 4096), SMS, rule="one wave")
    # 4097 cached tokens (the step's own one too) are 33 tiles of 128; 132 SMs over 8 pairs give 16 splits a pair,
    # so a split takes 3 tiles and 11 splits cover them: 88 programs, one on the busiest SM.
    assert (launch.splits, launch.tiles_per_program, launch.programs_per_busiest_sm) == (11, 3, 1)
    assert launch.work_tiles == 3 * 1 + 88 * 3 / 132


def one_wave_grid(ms_of: Callable[[AttentionKey], float]) -> list[CurvePoint]:
    out = []
    for pairs in PAIRS:
        for context in CONTEXTS:
            key = gqa(pairs, context)
            ms = ms_of(key)
            facts = GqaLaunchFacts(default_config(attended_tokens(key)), SMS, "one wave")
            out.append(CurvePoint(key, ms, ms * 0.99, ms * 1.01, "test", launch=facts))
    return out


def tiles_ms(key: AttentionKey) -> float:
    """A kernel whose time is a latency plus a cost per tile of its one-wave launch's work."""
    return 0.004 + 0.0005 * key_launch(key, SMS, rule="one wave").work_tiles


def test_a_one_wave_curve_is_interpolated_in_the_tiles_its_time_follows() -> None:
    points = one_wave_grid(tiles_ms)
    for left in (gqa(2, 8192), gqa(4, 4096), gqa(8, 16384)):
        rest = [p for p in points if p.key != left]
        got = predicted(CurveEngine(rest, H200), left)
        assert got.status == "interpolated"
        assert math.isclose(got.ms, tiles_ms(left), rel_tol=1e-9), (left, got.ms, tiles_ms(left))
    # the same times recorded under the even rule: a roofline blend, which misses the staircase
    even = [dataclasses.replace(p, launch=dataclasses.replace(p.launch, split_rule="even")) for p in points]  # type: ignore[arg-type]
    left = gqa(2, 8192)
    plain = predicted(CurveEngine([p for p in even if p.key != left], H200), left)
    assert not math.isclose(plain.ms, tiles_ms(left), rel_tol=1e-3)
