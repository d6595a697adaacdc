"""A probe's row shows the figure the budget uses, where it was taken, in a unit that reads: the GEMM row shows a
decode-shape GEMM (not the reference copy), a layer shows the whole layer (not a part), 128 ms is not 127993 µs,
a probe whose every point is unsupported says so, and an age of zero reads "just now".

The results are the ones recorded on the H200 machine (benchmarks/results)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from decodetop.collectors.checks.result import CheckResult, Status
from decodetop.probes.results import Measurement, MeasurementStatus, ProbeResult, ProbeStatus, Stats, load_results
from decodetop.tui.model import HealthView, ProbeState
from decodetop.tui.sources.probe_views import headline, probe_view
from decodetop.tui.widgets.cells import ago
from decodetop.tui.widgets.health_panel import HealthPanel

from .conftest import make_app
from .fakes import make_sources

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"
PLAN = RESULTS / "diagnosis" / "plans_h200x2" / "diagnosis_clean.eager.plan.json"
LAYER = RESULTS / "diagnosis" / "layer_allreduce_parts_h200x2" / "after_hold" / "l_ar.json"


def _by_probe(path: Path) -> dict[str, ProbeResult]:
    return {r.probe: r for r in load_results(path)}


def test_gemm_headline_is_a_decode_shape_not_the_reference_copy() -> None:
    gemm = _by_probe(PLAN)["gemm"]
    assert gemm.measurements[0].params["what"] == "copy"  # the recorded order starts with the reference
    text = headline(gemm)
    assert text == "26.0 µs @ m=1 n=5120 k=8192 [bf16]"
    details = dict(probe_view(gemm).details)
    assert "point m=1 n=8192 k=4096 [bf16]" in details and "point m=1 n=28672 k=8192 [bf16]" in details


def test_layer_headline_is_the_whole_layer() -> None:
    assert headline(_by_probe(LAYER)["layer"]) == "10.6 µs @ dense layer graph"


def test_long_times_scale_to_ms() -> None:
    membw = load_results(RESULTS / "primitives" / "cpu_gloo2.json")
    copy = next(r for r in membw if r.probe == "membw")
    assert headline(copy).startswith("80.3 ms @ 256 MiB")


def _unsupported(probe: str) -> ProbeResult:
    points = tuple(
        Measurement(f"moe {v}", {"what": "moe", "variant": v}, "us", MeasurementStatus.UNSUPPORTED, "needs fp8 GEMMs")
        for v in ("grouped", "loop")
    )
    return ProbeResult(probe, ProbeStatus.OK, {}, measurements=points)


def test_every_point_unsupported_says_unsupported_not_done() -> None:
    view = probe_view(_unsupported("moe"))
    assert view.state is ProbeState.UNSUPPORTED
    assert view.value_text == "unsupported: needs fp8 GEMMs"


def test_a_done_probe_with_one_good_point_stays_done() -> None:
    result = _unsupported("moe")
    good = dataclasses.replace(
        result.measurements[0], status=MeasurementStatus.OK, stats=Stats.from_samples([152.0], "us")
    )
    view = probe_view(dataclasses.replace(result, measurements=(good, result.measurements[1])))
    assert view.state is ProbeState.DONE and view.value_text == "152 µs @ moe [grouped]"


@pytest.mark.parametrize(
    ("age_s", "text"), [(0.0, "just now"), (0.4, "just now"), (42.0, "42s ago"), (7200.0, "2h ago")]
)
def test_ages_read_as_words(age_s: float, text: str) -> None:
    assert ago(age_s) == text


async def test_a_baseline_saved_this_second_reads_just_now() -> None:
    app = make_app(make_sources())
    async with app.run_test(size=(100, 30)) as pilot:
        panel = app.query_one("#health-panel", HealthPanel)
        check = CheckResult("C1", "governor", Status.PASS, "performance", "performance")
        panel.show(HealthView(checks=(check,), baseline_at_s=1000.0), 1000.0)
        await pilot.pause()
        summary = panel.summary_text().plain
        assert "baseline just now" in summary and "now ago" not in summary
