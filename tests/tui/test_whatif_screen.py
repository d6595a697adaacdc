"""The what-if screen (`w`) over the real budget source and a recorded plan run in the history: each knob key
changes the variant, its Δ and the chart, every figure the one composition's (`decodetop.pipeline.whatif.predict`
on the budget's own context), escape returns; no probe runs from it (the main screen's probe keys do not reach
through); a key's comparison is drawn before its chart's points are predicted, and a newer key supersedes a chart
still being predicted; CPU results say CPU, no results say roofline; the live UI's scenario flags are the screen's
current deployment. SVG snapshots at 80×24 and 160×48 (review the report before `--snapshot-update`)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest
from textual.pilot import Pilot

from decodetop.cli import build_parser
from decodetop.commands._scenario_args import flags_from_args
from decodetop.pipeline.whatif import predict
from decodetop.textfmt import format_number
from decodetop.tui.app import DecodetopApp
from decodetop.tui.screens.help import HelpScreen
from decodetop.tui.screens.whatif import WhatIfScreen
from decodetop.tui.sources import whatif as whatif_source
from decodetop.tui.sources.whatif_views import AxisSeries
from decodetop.tui.widgets.whatif_chart import WhatIfChart
from decodetop.tui.widgets.whatif_compare import WhatIfCompare

from .conftest import wait_until
from .whatif_app import CPU_PLAN, CPUS, CountingProbes, whatif_app

WAIT_S = 60.0
"""A first composition of the plan on two loaded cores takes a few seconds; a failure waits this long at most."""


def _screen(app: DecodetopApp) -> WhatIfScreen:
    screen = app.screen
    assert isinstance(screen, WhatIfScreen)
    return screen


async def _open(pilot: Pilot[object], app: DecodetopApp, results: bool = True) -> WhatIfScreen:
    """The main screen with the stored results read back, then `w`, until the screen shows its first prediction."""
    await wait_until(pilot, lambda: app.budget_settled and (bool(app.results) or not results), "results", WAIT_S)
    await pilot.press("w")
    await wait_until(pilot, lambda: isinstance(app.screen, WhatIfScreen) and app.screen.settled, "what-if", WAIT_S)
    return _screen(app)


async def _press(pilot: Pilot[object], screen: WhatIfScreen, *keys: str) -> None:
    for key in keys:
        await pilot.press(key)
    await wait_until(pilot, lambda: screen.settled, "the prediction of the last key", WAIT_S)


async def test_knob_keys_change_the_variant_its_delta_and_the_chart_then_escape_returns(tmp_path: Path) -> None:
    app = whatif_app(tmp_path)
    async with app.run_test(size=(120, 40)) as pilot:
        screen = await _open(pilot, app)
        assert screen.view is not None and screen.series is not None and screen.predictor is not None
        base = screen.predictor.base
        now = screen.view.now
        assert now.step_ms == predict(base, {}).step_ms  # the one composition of the budget's own context
        assert screen.view.variant.delta_pct is None and screen.view.variant.knobs.startswith("as now")
        assert screen.series.title == "tok/s over batch" and screen.series.variant_index == 0

        await _press(pilot, screen, "B", "B")  # batch 1 → 2 → 4
        assert screen.state is not None and dict(screen.state.turned) == {"batch": "4"}
        variant = screen.view.variant
        expected = predict(base, {"batch": "4"})
        assert variant.knobs == "batch=4" and variant.step_ms == expected.step_ms
        assert variant.tokens_per_s_total == expected.tokens_per_s_total
        assert variant.delta_pct is not None and variant.delta_pct > 0  # four sequences: a longer step
        assert screen.series.variant_index == screen.series.values.index("4")

        await _press(pilot, screen, "p")  # TP 2 → 1 (the chart's points follow the variant's other knobs)
        assert screen.view.variant.knobs == "tp=1 batch=4"
        assert screen.view.variant.step_ms == predict(base, {"tp": "1", "batch": "4"}).step_ms
        assert screen.series.tokens_per_s[0] == predict(base, {"tp": "1"}).tokens_per_s

        await _press(pilot, screen, "K", "x")  # KV dtype up (BF16 → FP16), the chart over the next knob
        assert screen.view.variant.knobs == "tp=1 batch=4 kv=fp16"
        assert screen.series.title == "tok/s over context" and "128K" in screen.series.values

        await _press(pilot, screen, "0", "G")  # another GPU model: every figure carried from this host's curves
        assert screen.view.variant.knobs == "gpu=rtx-pro-6000" and "transferred" in screen.view.variant.labels
        assert screen.view.variant.step_ms == predict(base, {"gpu": "rtx-pro-6000"}).step_ms

        await _press(pilot, screen, "0")
        assert screen.view.variant.knobs.startswith("as now") and screen.view.variant.step_ms == now.step_ms
        await pilot.press("question_mark")  # this screen's keys, over it
        await wait_until(pilot, lambda: isinstance(app.screen, HelpScreen), "the what-if keys")
        await pilot.press("escape")
        await wait_until(pilot, lambda: app.screen is screen, "back on the what-if screen")
        await pilot.press("escape")
        await wait_until(pilot, lambda: not isinstance(app.screen, WhatIfScreen), "back on the main screen")


class GatedPredict:
    """`predict` as the screen's predictor calls it, holding every deployment but the `free` ones while the gate is
    shut: the chart's points wait, a key's own variant does not."""

    def __init__(self) -> None:
        self.real = whatif_source.predict
        self.open = threading.Event()
        self.open.set()
        self.free: list[dict[str, str]] = []
        self.held: list[dict[str, str]] = []
        self.asked: list[dict[str, str]] = []

    def __call__(self, base: Any, knobs: Mapping[str, str], **kwargs: Any) -> Any:
        self.asked.append(dict(knobs))
        if dict(knobs) not in self.free and not self.open.is_set():
            self.held.append(dict(knobs))
            self.open.wait(WAIT_S)
        return self.real(base, knobs, **kwargs)


async def test_a_knob_key_draws_its_comparison_before_the_chart_and_a_newer_key_supersedes_the_pending_chart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gate = GatedPredict()
    monkeypatch.setattr(whatif_source, "predict", gate)
    drawn: list[AxisSeries | None] = []
    show = WhatIfChart.show
    monkeypatch.setattr(WhatIfChart, "show", lambda chart, series: (drawn.append(series), show(chart, series))[1])
    app = whatif_app(tmp_path)
    async with app.run_test(size=(120, 40)) as pilot:
        screen = await _open(pilot, app)
        await wait_until(pilot, lambda: screen.idle, "the neighbours of now predicted ahead", WAIT_S)
        assert screen.predictor is not None
        base = screen.predictor.base
        compare = screen.query_one(WhatIfCompare)
        gate.free = [{"tp": "8"}]  # the second key's variant: predicted by its key's worker, never held
        gate.open.clear()
        drawn.clear()
        try:
            await pilot.press("P")  # TP 2 → 4 (predicted ahead): its comparison at once, its chart's points held
            await wait_until(
                pilot, lambda: bool(gate.held) and screen.shown_seq == screen.seq, "TP 4 drawn, chart held"
            )
            assert compare.view is not None and compare.view.variant.knobs == "tp=4"
            assert "tp=4" in compare.render().plain and not compare.pending
            assert (
                screen.drawn_seq < screen.seq and not screen.settled and drawn == []
            )  # the chart still the last key's

            await pilot.press("P")  # TP 4 → 8, never predicted: the key's own worker, beside the held chart point
            await wait_until(pilot, lambda: screen.shown_seq == screen.seq, "TP 8 drawn while the chart waits")
            assert compare.view is not None and compare.view.variant.knobs == "tp=8"
            assert drawn == [] and {"tp": "8"} in gate.asked
        finally:
            gate.open.set()  # a failure above leaves no thread held
        await wait_until(pilot, lambda: screen.settled, "the chart of the last key", WAIT_S)
        assert len(drawn) == 1 and drawn[0] is screen.series is not None  # TP 4's chart never drawn: TP 8's instead
        assert screen.series.tokens_per_s[0] == predict(base, {"tp": "8"}).tokens_per_s
        assert screen.series.tokens_per_s[0] != predict(base, {"tp": "4"}).tokens_per_s
        assert screen.series.title == "tok/s over batch"
        assert {"tp": "4", "batch": "4"} not in gate.asked  # TP 4's chart stopped at the point it was at


async def test_no_probe_runs_from_the_screen_while_the_main_screens_keys_would(tmp_path: Path) -> None:
    probes = CountingProbes()
    app = whatif_app(tmp_path, probes=probes)
    async with app.run_test(size=(100, 30)) as pilot:
        screen = await _open(pilot, app)
        # every knob both ways, the axis, the reset; r and R re-run probes on the main screen
        await _press(pilot, screen, *"pPeEbBcCkKfFaAlLrRgGx0")
        assert probes.runs == [] and app.running_probe is None and len(app.queue) == 0
        await pilot.press("escape")
        await wait_until(pilot, lambda: not isinstance(app.screen, WhatIfScreen), "back on the main screen")
        await pilot.press("R")  # the control: the same key on the main screen does run the plan
        await wait_until(pilot, lambda: len(probes.runs) > 0, "a probe run from the main screen", WAIT_S)


async def test_cpu_results_are_labelled_cpu(tmp_path: Path) -> None:
    app = whatif_app(tmp_path, group=CPUS, plan=CPU_PLAN)
    async with app.run_test(size=(160, 48)) as pilot:
        screen = await _open(pilot, app)
        assert screen.view is not None
        assert screen.view.lines[0] == "CPU ranks (gloo): timings show the method, not a GPU"
        assert "CPU" in screen.view.now.labels and "H200" not in " ".join(screen.view.lines)
        # CPU ranks time no kernel launch: the step is a lower bound, said so, never a tok/s
        assert screen.view.now.step_ms is None and "incomplete" in screen.view.now.problem
        text = "\n".join(line.plain for line in screen.query_one(WhatIfCompare)._lines(150))
        assert "step ≥ " in text and "CPU" in text


async def test_no_results_say_every_figure_is_a_roofline_estimate(tmp_path: Path) -> None:
    app = whatif_app(tmp_path, plan=None)
    async with app.run_test(size=(100, 30)) as pilot:
        screen = await _open(pilot, app, results=False)
        assert screen.view is not None
        assert any(
            line.startswith("no probe results yet: every figure is a roofline estimate") for line in screen.view.lines
        )
        assert "roofline" in screen.view.now.labels and screen.view.now.step_ms is not None
        await _press(pilot, screen, "B")
        assert "roofline" in screen.view.variant.labels and screen.view.variant.delta_pct is not None


async def test_an_observed_step_calibrates_every_variant_beside_its_uncalibrated_figure(tmp_path: Path) -> None:
    app = whatif_app(tmp_path, observed_ms=30.0)  # `decodetop --observed-ms 30`
    async with app.run_test(size=(160, 48)) as pilot:
        screen = await _open(pilot, app)
        assert screen.view is not None and screen.predictor is not None
        cal = screen.predictor.calibration
        assert cal is not None and any(line.startswith("calibrated ×") for line in screen.view.lines)
        await _press(pilot, screen, "B")
        variant = screen.view.variant
        assert variant.step_ms is not None and variant.calibrated_ms == pytest.approx(cal.scale(variant.step_ms))
        text = "\n".join(line.plain for line in screen.query_one(WhatIfCompare)._lines(150))
        assert f"calibrated {format_number(variant.calibrated_ms)} ms" in text


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--batch", "8", "--context", "32768", "--kv-dtype", "fp8"], {"batch": "8", "context": "32768", "kv": "fp8"}),
        (["--model", "deepseek-v3", "--accept-length", "2"], {"accept": "2"}),
    ],
)
async def test_the_live_uis_scenario_flags_are_the_screens_current_deployment(
    tmp_path: Path, argv: list[str], expected: dict[str, str]
) -> None:
    flags = flags_from_args(build_parser().parse_args(argv))  # `decodetop --batch 8 …`: the live UI's command line
    app = whatif_app(tmp_path, plan=None, flags=flags, model=flags.model or "llama-3.1-70b")
    async with app.run_test(size=(100, 30)) as pilot:
        screen = await _open(pilot, app, results=False)
        assert screen.state is not None
        assert {k: screen.state.now[k] for k in expected} == expected


SIZES = [(80, 24), (160, 48)]


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_snapshot_whatif_screen(snap_compare: Callable[..., bool], size: tuple[int, int], tmp_path: Path) -> None:
    """Llama-3.1-70B at TP 2 from the 2 × H200 plan; the variant TP 1, batch 4: weights that do not fit, its bar
    longer on the shared scale, Δ, the extrapolated and transferred labels, the chart over batch."""
    app = whatif_app(tmp_path)

    async def run_before(pilot: Pilot[object]) -> None:
        screen = await _open(pilot, app)
        await _press(pilot, screen, "B", "B", "p")

    assert snap_compare(app, terminal_size=size, run_before=run_before)
