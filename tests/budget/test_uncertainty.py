"""How component ranges combine into the total's (Fenton–Wilkinson over independent log-normals)."""

from __future__ import annotations

import math

import pytest

from decodetop.budget.uncertainty import Z80, Part, combine


def test_one_part_keeps_its_own_range() -> None:
    got = combine([Part("gemm", 2.0, 1.6, 2.5)])  # ×/÷ 1.25 around its median: one log-normal, exactly
    assert (got.p10_ms, got.median_ms, got.p90_ms) == pytest.approx((1.6, 2.0, 2.5), rel=1e-9)
    assert got.dominant == "gemm" and got.dominant_share == pytest.approx(1.0)


def test_independent_parts_narrow_the_relative_range_and_name_the_widest() -> None:
    parts = [Part("a", 1.0, 0.8, 1.25), Part("b", 1.0, 0.8, 1.25), Part("c", 1.0, 0.5, 2.0)]
    got = combine(parts)
    assert got.p10_ms < 3.0 < got.p90_ms
    assert got.p90_ms / got.p10_ms < 2.0 / 0.5  # narrower than the widest part alone
    assert got.dominant == "c" and got.dominant_share > 0.5


def test_point_figures_combine_to_a_point_and_a_very_wide_part_still_holds_the_sum() -> None:
    assert combine([Part("a", 1.0, 1.0, 1.0), Part("b", 2.0, 2.0, 2.0)]).p90_ms == pytest.approx(3.0)
    wide = combine([Part("a", 10.0, 0.01, 10_000.0), Part("b", 5.0, 4.9, 5.1)])
    assert wide.p10_ms <= 15.0 <= wide.p90_ms
    assert combine([]).p90_ms == 0.0


def test_a_factor_every_part_shares_keeps_its_width_in_the_total() -> None:
    wide = math.log(1.5) / Z80  # ±50 % at 80 %: one GPU-to-GPU ratio for every figure
    parts = [Part(f"c{i}", 1.0, math.exp(-Z80 * wide), math.exp(Z80 * wide), wide) for i in range(8)]
    shared = combine(parts)
    assert shared.p10_ms == pytest.approx(8 / 1.5, rel=0.01) and shared.p90_ms == pytest.approx(8 * 1.5, rel=0.01)
    alone = combine([Part(p.name, p.ms, p.p10_ms, p.p90_ms) for p in parts])  # independent: averaged away
    assert shared.p90_ms - shared.p10_ms > 2 * (alone.p90_ms - alone.p10_ms)
