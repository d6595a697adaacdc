"""The exporter's per-rank series: one gauge per rank's composed step, the straggler flagged, the step bound and the
mean step as step lines."""

from __future__ import annotations

from dataclasses import replace

import pytest
from prometheus_client.parser import text_string_to_metric_families

from decodetop.budget.ranks import RankTotal, rank_spread
from decodetop.export.prometheus import ExportState, render_exposition
from tests.export.expo_fixtures import budget


def _series(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_one_gauge_per_rank_and_the_straggler_flagged() -> None:
    ranks = [RankTotal(r, f"GPU {r}", ms, ms, ms - 0.1, ms + 0.1, 17.6) for r, ms in enumerate((80.0, 80.2, 96.0))]
    spread = rank_spread(ranks, intervals=156, causes={2: ["another process on GPU 2"]})
    b = replace(budget(), ranks=spread)
    samples = _series(render_exposition(ExportState(budget=b)))
    name = "decodetop_budget_rank_step_seconds"
    model = b.model
    got = {dict(k)["device"]: (v, dict(k)["straggler"]) for (n, k), v in samples.items() if n == name}
    assert got == {
        "GPU 0": (pytest.approx(0.080), "0"),
        "GPU 1": (pytest.approx(0.0802), "0"),
        "GPU 2": (pytest.approx(0.096), "1"),
    }
    step = "decodetop_budget_step_seconds"
    bound = samples[(step, (("line", "rank_bound"), ("model", model), ("source", "probes")))]
    assert bound == pytest.approx(0.096)
    mean = samples[(step, (("line", "mean"), ("model", model), ("source", "probes")))]
    assert mean == pytest.approx(b.mean_total_ms / 1e3)


def test_one_rank_budget_has_no_rank_series() -> None:
    samples = _series(render_exposition(ExportState(budget=budget())))
    assert not any(n == "decodetop_budget_rank_step_seconds" for n, _ in samples)
