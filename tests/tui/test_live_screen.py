"""The live screen as a new user meets it: a filter that survives the age refreshes, an internal error that ends
the app with a non-zero exit and one line, and the faults found in a quarter tmux pane, each driven through Pilot."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
from textual.binding import Binding
from textual.widgets import TabbedContent

from decodetop.settings import Settings
from decodetop.themes import THEME_NAMES
from decodetop.tui.app import DecodetopApp
from decodetop.tui.messages import TelemetryReady
from decodetop.tui.model import ProbeState
from decodetop.tui.probe_group import GroupInfo
from decodetop.tui.screens.budget_details import BudgetDetailsScreen
from decodetop.tui.screens.model_picker import ModelPickerScreen
from decodetop.tui.sources import Sources
from decodetop.tui.sources.budget import PresetBudget
from decodetop.tui.sources.probes import NoProbes
from decodetop.tui.widgets.budget_bar import BudgetBar
from decodetop.tui.widgets.gpu_table import GpuTable
from decodetop.tui.widgets.health_panel import HealthPanel
from decodetop.tui.widgets.probe_table import ProbeTable
from decodetop.tui.widgets.process_table import ProcessTable

from .conftest import make_app, wait_until
from .fakes import NOW_S, FakeChecks, FakeTelemetry, eight_gpu_frame, fixed_clock, make_sources
from .screens import PLAN, PlanProbes, bare_numbers, screen_text
from .screens import ready as _ready
from .screens import rows_shown as _rows_shown


class Clock:
    """A clock the test moves (the app's ages are measured against it)."""

    def __init__(self, t: float = NOW_S) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


AGE_TICK_S = 0.02
"""The age refresh's period in these tests: 30 refreshes take well under a second of real time."""


def _driven_app() -> tuple[DecodetopApp, Clock]:
    clock = Clock()
    sources = make_sources(telemetry=FakeTelemetry([eight_gpu_frame(processes=True)]), run_probes=True)
    sources.clock = clock
    return make_app(sources, age_refresh_s=AGE_TICK_S), clock


@pytest.mark.parametrize(
    ("text", "tab"),
    [("gemm", "1"), ("vllm", "2"), ("P1", "3"), ("zzz", "1")],
    ids=["probes", "gpus-processes", "health", "no-row"],
)
async def test_the_filter_on_every_table_survives_30_s_of_age_refreshes(text: str, tab: str) -> None:
    app, clock = _driven_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_until(
            pilot, lambda: all(v.state is ProbeState.DONE for v in app.probe_views.values()), "every probe measured"
        )
        await pilot.press(tab, "slash", *text, "enter")
        await wait_until(pilot, lambda: app.query_one(ProbeTable).filter_text == text, "the filter applied")
        for _ in range(30):  # 30 s of the once-a-second age refresh, the clock moved instead of waited
            clock.t += 1.0
            await pilot.pause(AGE_TICK_S * 2)
        assert app.is_running and app.crash_report.crash is None
        assert app.query_one(ProbeTable).row_count == sum(1 for v in app.probe_views.values() if text in v.probe_id)
        assert all(t.filter_text == text for t in app.query(GpuTable))
        assert app.query_one(ProcessTable).filter_text == text
        assert all(p.filter_text == text for p in app.query(HealthPanel))


async def test_an_uncaught_exception_ends_the_app_non_zero_with_one_line_and_the_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def planted(self: ProbeTable, now_s: float) -> None:
        raise RuntimeError("planted fault\nsecond line")

    monkeypatch.setattr(ProbeTable, "refresh_ages", planted)
    app, _clock = _driven_app()
    with pytest.raises(RuntimeError, match="planted fault"):  # Pilot re-raises what ended the app
        async with app.run_test(size=(80, 24)) as pilot:
            await wait_until(pilot, lambda: not app.is_running, "the app ends on the error", timeout_s=5)
    assert app.return_code == 1
    crash = app.crash_report.crash
    assert crash is not None
    line = crash.line
    assert "\n" not in line and "RuntimeError: planted fault" in line
    log = crash.log_path
    assert log is not None and log.is_relative_to(tmp_path)  # the state dir of this test
    assert str(log) in line
    assert "Traceback (most recent call last)" in log.read_text() and "planted" in log.read_text()


def test_the_command_prints_one_line_and_exits_non_zero_after_a_crash(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from decodetop.cli import main
    from decodetop.tui import launch
    from decodetop.tui.crash import CRASH_EXIT, Crash

    def crashed_run(self: DecodetopApp) -> None:
        self.crash_report.crash = Crash("RuntimeError: planted", tmp_path / "ui.log")
        self._return_code = 1

    monkeypatch.setattr(launch, "require_terminal", lambda *args: None)
    monkeypatch.setattr(launch, "build_sources", lambda settings, options: make_sources())
    monkeypatch.setattr(DecodetopApp, "run", crashed_run)
    assert main(["--no-probes"]) == CRASH_EXIT
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"decodetop: error: the live UI stopped on an internal error (RuntimeError: planted); "
        f"the traceback is in {tmp_path / 'ui.log'}"
    ]


def demo_sources(budget: PresetBudget | None = None) -> Sources:
    """The `--demo` host (8 fake H200s, no probes) over the real budget source."""
    demo = GroupInfo(8, "cuda", "fake GPUs", "of the demo")
    return Sources(
        telemetry=FakeTelemetry([eight_gpu_frame()]),
        probes=NoProbes("demo: no probes unless --cpu-ranks is given"),
        budget=budget or PresetBudget(lambda: "NVIDIA H200", group=lambda: demo, gpu_how="fake NVML of the demo"),
        checks=FakeChecks(),
        clock=fixed_clock,
        run_probes_at_start=False,
    )


async def test_weights_that_do_not_fit_are_said_on_the_main_screen_and_in_b() -> None:
    app = make_app(demo_sources(), Settings(model="glm-5", tp=8))
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_until(pilot, lambda: app.budget_settled and app.composer.view is not None, "the budget")
        text = " ".join(screen_text(app).split())
        assert "of weights per GPU do not fit in the 141 GiB" in text
        assert "no kernel tuning reaches it" not in text  # no tuning verdict for a deployment that cannot load
        await pilot.press("b")
        await wait_until(pilot, lambda: isinstance(app.screen, BudgetDetailsScreen), "budget details")
        await pilot.pause()
        assert "do not fit in the 141 GiB" in " ".join(screen_text(app).split())


async def test_after_m_the_old_models_figures_leave_the_rows() -> None:
    app = make_app(make_sources(run_probes=True))
    async with app.run_test(size=(100, 30)) as pilot:
        done = lambda: all(v.state is ProbeState.DONE for v in app.probe_views.values())  # noqa: E731
        await wait_until(pilot, lambda: bool(app.probe_views) and done(), "glm-5's probes measured")
        assert app.probe_views["allreduce"].value_text
        app.sources.run_probes_at_start = False  # the new model's plan waits for R
        await pilot.press("m")
        await wait_until(pilot, lambda: isinstance(app.screen, ModelPickerScreen), "picker")
        await pilot.press("down", "enter")
        await wait_until(pilot, lambda: app.settings.model == "llama-3.1-70b" and app.budget_settled, "new model")
        await pilot.pause(0.2)
        assert all(not v.value_text and v.measured_at_s is None for v in app.probe_views.values())
        table = app.query_one(ProbeTable)
        assert all(str(table.get_cell(pid, "value")) == "" for pid in app.probe_views)
        assert app.results == {}


def test_the_ranks_line_waits_for_a_figure() -> None:
    from decodetop.budget.ranks import RankSpread, RankTotal

    def spread(*totals: float, label: str = "GPU") -> RankSpread:
        ranks = tuple(RankTotal(r, f"{label} {r}", ms, ms, ms, ms) for r, ms in enumerate(totals))
        return RankSpread(ranks, max(totals), max(totals), 0)

    none = spread(0.0, 0.0, label="CPU rank")
    assert none.short_line() == ""  # "CPU rank 0 0 · spread 0 ms" before any figure
    some = spread(1.23, 1.45)
    assert some.short_line().startswith("ranks GPU 0 1.23ms · GPU 1 1.45ms · spread 0.220ms")


async def test_4_shows_the_charts_from_every_tab() -> None:
    app = make_app(make_sources(telemetry=FakeTelemetry([eight_gpu_frame(processes=True)])))
    async with app.run_test(size=(160, 48)) as pilot:  # the processes show, and take focus from the GPU table
        tabs = app.query_one(TabbedContent)
        for start in ("1", "2", "3"):
            await pilot.press(start)
            await pilot.press("4")
            await wait_until(pilot, lambda: tabs.active == "charts", f"charts from tab {start}")
            await pilot.pause(0.2)
            assert tabs.active == "charts"


async def test_the_palette_offers_decodetops_actions_and_themes_only() -> None:
    from textual.command import CommandPalette

    app = make_app(make_sources())
    async with app.run_test(size=(100, 30)) as pilot:
        titles = [c.title for c in app.get_system_commands(app.screen)]
        assert "Fold the budget box (f)" in titles and "Maximise the tab (z)" in titles
        assert [t for t in titles if t.startswith("Theme")] == [f"Theme {n}" for n in THEME_NAMES]
        await pilot.press("ctrl+p")
        await wait_until(pilot, lambda: isinstance(app.screen, CommandPalette), "the palette")
        await pilot.press(*"fold", "enter")
        await wait_until(pilot, lambda: app.folded, "folded from the palette")


@pytest.mark.parametrize("size", [(60, 16), (80, 24)], ids=lambda s: f"{s[0]}x{s[1]}")
async def test_f_folds_the_budget_box_to_one_line_and_z_maximises_the_table(size: tuple[int, int]) -> None:
    probes = PlanProbes()
    app = make_app(make_sources(probes=probes, run_probes=True, telemetry=FakeTelemetry([eight_gpu_frame()])))
    async with app.run_test(size=size) as pilot:
        await wait_until(pilot, lambda: _ready(app), "the plan measured")
        box = app.query_one("#budget-box")
        before = box.outer_size.height
        await pilot.press("f")
        await wait_until(pilot, lambda: box.outer_size.height == 1, "one line")
        line = screen_text(app).splitlines()[0]
        assert "explained" in line and "observed" in line and "target" in line
        assert _rows_shown(app) > 3 and before > 1
        await pilot.press("f")
        await wait_until(pilot, lambda: box.outer_size.height == before, "unfolded")
        await pilot.press("z")
        await wait_until(pilot, lambda: app.screen.maximized is not None, "maximised")
        assert _rows_shown(app) == len(PLAN)  # the whole plan
        assert "explained" not in screen_text(app)
        await pilot.press("z")
        await wait_until(pilot, lambda: app.screen.maximized is None, "back")


def test_numbers_without_a_unit_are_found() -> None:
    """The scanner the size snapshots use: it finds a bare figure and lets units, ranges and names through."""
    assert bare_numbers("█ attention 1.20 1.3% ▄ all-reduce 6.55ms") == ["1.20"]
    assert bare_numbers("zoom 12.2 │ unexplained 79.0 ms (83%) · 1.99e+03") == ["12.2", "1.99e+03"]
    assert bare_numbers("0–95.0ms glm-5 · TP8 · GPU 1 1.23ms 29.4× over target (309 tok/s) 2m ↺ Δ+0.61ms") == []


def _readme_keys() -> set[str]:
    """The keys README's key table names (a range like `1`–`4` names every key in it)."""
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    table = readme[readme.index("| key | action |") :].split("\n\n", 1)[0]
    keys: set[str] = set()
    for row in table.splitlines()[2:]:
        first = row.split("|")[1]
        named = re.findall(r"`([^`]+)`", first)
        keys.update(k.strip() for name in named for k in name.split(","))
        if "–" in first and len(named) == 2 and all(n.isdigit() for n in named):
            keys.update(str(n) for n in range(int(named[0]), int(named[1]) + 1))
    return keys


def test_readme_and_question_mark_list_every_key() -> None:
    from decodetop.tui import layout
    from decodetop.tui.bindings import BINDINGS, help_keys

    shown = {key for key, _ in help_keys()}
    readme = _readme_keys()
    for binding in BINDINGS:
        assert isinstance(binding, Binding)
        if binding.action.startswith("show_panel(") and int(binding.key) > len(layout.panels()):
            continue  # no panel in that place
        key = binding.key_display or binding.key
        assert key in shown, key
        assert key in readme, key
    assert {"f", "z", "↺", "ctrl+p"} <= shown and {"f", "z", "ctrl+p"} <= readme


def test_gpu_history_spans_ten_minutes_downsampled() -> None:
    from decodetop.tui.widgets.telemetry_history import HISTORY_POINTS, TelemetryHistory

    trend = TelemetryHistory()
    for second in range(1800):  # half an hour of 1 s ticks
        trend.add(eight_gpu_frame(NOW_S - 1800 + second, util=float(second % 100)))
    ring = trend.series["util"][0]
    points = ring.points()
    assert len(points) <= HISTORY_POINTS
    assert NOW_S - points[0][0] >= 20 * 60  # more than the ten minutes the screen shows
    cells = trend.means("util", 0, NOW_S, 600.0, 9)
    assert all(c is not None for c in cells)  # every slice of the last ten minutes has a value


async def test_gpu_table_has_bars_ten_minute_sparklines_and_a_reversible_sort() -> None:
    frames = [eight_gpu_frame(NOW_S - 600 + 60 * k, processes=True, util=10.0 * k) for k in range(11)]
    app = make_app(make_sources(telemetry=FakeTelemetry([])))
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("2")
        table = app.query_one("#gpu-table", GpuTable)
        for frame in frames:  # one tick at a time (a newer frame still queued would replace it)
            app.post_message(TelemetryReady(frame))
            await wait_until(pilot, lambda f=frame: table.frame is f, "the tick shown")
        assert str(table.get_cell("gpu-0", "util_bar")).startswith("█████")  # 100 %
        assert str(table.get_cell("gpu-1", "mem_bar")).startswith("████")  # 118 of 141 GiB
        spark = str(table.get_cell("gpu-0", "util_hist"))
        assert spark[0] != " " and spark[0] != spark[-1]  # ten minutes, from 0 % to 100 %
        await pilot.press("o")  # by utilisation, largest first: ▼
        await wait_until(pilot, lambda: table.sort_key == "util", "sorted by util")
        assert "▼" in str(table.columns["util"].label)  # type: ignore[index]
        await pilot.press("O")
        await wait_until(pilot, lambda: table.sort_reverse, "reversed")
        assert "▲" in str(table.columns["util"].label)  # type: ignore[index]
        assert next(str(k.value) for k in table.rows) != "gpu-0"  # smallest first now


async def test_process_list_at_nvitops_level_sortable_and_filterable() -> None:
    from decodetop.tui.model import GpuProcessView

    frame = eight_gpu_frame(processes=True)
    gpus = list(frame.gpus)
    gpus[2] = dataclasses.replace(
        gpus[2],
        processes=(
            GpuProcessView(5150, 3 * 2**30, "compute", "alice", "python train.py", 4.0, 180.0, 6 * 2**30, NOW_S - 7200),
            GpuProcessView(5151, 2**29, "compute", "bob", "jupyter-lab", None, 2.0, 2**28, NOW_S - 90),
        ),
    )
    frame = dataclasses.replace(frame, gpus=tuple(gpus))
    app = make_app(make_sources(telemetry=FakeTelemetry([frame])))
    async with app.run_test(size=(160, 48)) as pilot:
        await pilot.press("2")
        procs = app.query_one(ProcessTable)
        await wait_until(pilot, lambda: procs.row_count == 4, "four processes")
        labels = [str(c.label).rstrip("▼▲") for c in procs.columns.values()]
        assert {"GPU", "pid", "user", "GPU mem", "CPU%", "command"} <= set(labels)  # a 68-column pane: by priority
        await pilot.press("z")  # maximised: the whole width, every column
        await wait_until(pilot, lambda: "rss" in procs.columns, "every column")
        labels = [str(c.label) for c in procs.columns.values()]
        assert {"SM%", "CPU%", "RSS", "time", "user", "command"} <= {label.rstrip("▼▲") for label in labels}
        assert str(procs.get_cell("pid-2-5150", "cpu")) == "180%"
        assert str(procs.get_cell("pid-2-5150", "rss")) == "6 GiB"
        assert str(procs.get_cell("pid-2-5150", "elapsed")) == "2h"
        assert "GPU mem▼" in labels  # largest GPU memory first, said in the header
        procs.focus()
        for _ in range(5):  # mem → gpu → pid → user → sm → cpu
            await pilot.press("o")
        await wait_until(pilot, lambda: procs.sort_key == "cpu", "sorted by CPU")
        assert next(str(k.value) for k in procs.rows) == "pid-2-5150"  # 180 % first
        await pilot.press("O")
        await wait_until(pilot, lambda: procs.sort_reverse, "reversed")
        assert "CPU%▲" in [str(c.label) for c in procs.columns.values()]
        await pilot.press("slash", *"bob", "enter")
        await wait_until(pilot, lambda: procs.row_count == 1, "only bob's process")
        assert [str(k.value) for k in procs.rows] == ["pid-2-5151"]


def test_the_host_names_its_own_process_with_cpu_rss_and_start() -> None:
    import os
    import time

    from decodetop.tui.sources.telemetry_views import LocalProcesses

    processes = LocalProcesses()
    first = processes(os.getpid())
    assert first.cpu_pct is None  # one reading: no share yet
    assert first.rss_bytes and first.rss_bytes > 0 and first.started_at_s is not None
    assert first.started_at_s <= time.time() and first.command
    sum(i * i for i in range(200_000))  # some CPU time between the two ticks
    second = processes(os.getpid())
    assert second.cpu_pct is not None and second.cpu_pct >= 0
    assert processes(2**22 + 12345).command == "(exited)"  # no such pid


async def test_charts_that_do_not_mislead(tmp_path: Path) -> None:
    from decodetop.history import History
    from decodetop.tui.widgets.charts import Charts

    frames = [eight_gpu_frame(NOW_S - 60 + t, util=99.0 + (t % 2)) for t in range(60)]  # 99–100 % noise
    history = History(tmp_path / "history.jsonl", clock=lambda: NOW_S)
    app = make_app(make_sources(telemetry=FakeTelemetry(frames), run_probes=True, history=history))
    async with app.run_test(size=(160, 48)) as pilot:
        await wait_until(pilot, lambda: "allreduce" in app.results and app.budget_settled, "probes and budget")
        await pilot.press("s")
        await wait_until(pilot, lambda: app.baseline is not None, "baseline")
        await pilot.press("4")
        await wait_until(pilot, lambda: bool(list(app.query(Charts))), "charts")
        await pilot.pause(0.3)
        charts = app.query_one(Charts)
        charts.replot()
        util = charts.query_one("#chart-util")
        util_text = util.render().plain  # type: ignore[union-attr]
        assert "100┤" in util_text and " 0┤" in util_text and " 50┤" in util_text  # 0–100: noise stays flat
        assert "GPU0" not in util_text and "GPU0" in str(util.border_subtitle)  # the legend is under the curves
        assert "minutes ago" in util_text and "%" in util_text  # axis names with their units
        gemm = charts.query_one("#chart-gemm").render().plain  # type: ignore[union-attr]
        assert "M (rows)" in gemm and "GB/s" in gemm
        assert re.search(r"\b1\s+2\s+4\s+8\s+16\b", gemm) and not re.search(r"\d\.\d", gemm.split("┘")[-1])
        step = charts.query_one("#chart-step").render().plain  # type: ignore[union-attr]
        assert "tok/s" in step and "minutes ago" in step
        components = charts.query_one("#chart-components")
        assert "minutes since the baseline" in components.render().plain  # type: ignore[union-attr]
        assert "attention" in str(components.border_subtitle)
        assert charts.budgets.baseline_at_s == app.baseline.recorded_at_s  # type: ignore[union-attr]


def test_the_demo_keeps_its_own_baseline(tmp_path: Path) -> None:
    from decodetop.tui.launch import LaunchOptions, build_sources

    demo = build_sources(Settings(), LaunchOptions(demo=True, no_probes=True, history_path=tmp_path / "h.jsonl"))
    try:
        assert demo.baseline_name == "demo"
    finally:
        demo.telemetry.close()


async def test_after_s_on_this_host_the_demo_diffs_against_nothing(tmp_path: Path) -> None:
    """`s` on the real host, then `--demo`: it used to diff the fake 8-GPU host against this host's baseline."""
    from decodetop.history import KIND_BASELINE, KIND_PROBE, History

    history = History(tmp_path / "history.jsonl", clock=lambda: NOW_S)
    real = {"checks": {"N3": {"status": "pass", "observed": "none", "facts": {}}}, "probes": {}}
    history.record(KIND_BASELINE, "default", real, recorded_at_s=NOW_S - 3600)
    history.record(KIND_PROBE, "gemm", {"value": "2.50 TB/s @ M=1", "ms": 4.0}, recorded_at_s=NOW_S - 3600)
    for name, found in (("default", True), ("demo", False)):
        sources = make_sources(telemetry=FakeTelemetry([eight_gpu_frame()]), history=history)
        sources.baseline_name = name
        app = make_app(sources)
        async with app.run_test(size=(120, 40)) as pilot:
            await wait_until(pilot, lambda app=app: bool(app.checks and app.stored.probes), "checks and history")
            assert (app.baseline is not None) is found  # this host's baseline is not the demo's
            if name == "demo":
                await pilot.press("s")
                await wait_until(pilot, lambda app=app: app.baseline is not None, "the demo's baseline")
    keys = [(e.kind, e.key) for e in history.load().entries if e.kind == KIND_BASELINE]
    assert keys == [(KIND_BASELINE, "default"), (KIND_BASELINE, "demo")]  # this host's stays as it was


@pytest.mark.parametrize("size", [(80, 24), (120, 40)])
async def test_components_over_the_observed_step_are_said_in_words_on_screen(size: tuple[int, int]) -> None:
    """It read "0 ms 0.0%" (a clamped remainder) in the UI, "(≤) -12367" in the CLI, "-9.70" in the exporter."""
    app = make_app(
        make_sources(telemetry=FakeTelemetry([eight_gpu_frame()])), Settings(model="glm-5", tp=8, observed_ms=1.0)
    )
    async with app.run_test(size=size) as pilot:
        await wait_until(pilot, lambda: app.budget_settled and app.query_one(BudgetBar).budget is not None, "budget")
        await pilot.pause()
        text = screen_text(app)
        verdict = text.splitlines()[1]
        assert (
            "exceed" in verdict or "over by" in verdict
        ) and "3.70" in verdict  # 4.70 ms of parts against 1 ms observed
        assert not re.search(r"(?<!\w)-\d", text) and "unexplained 0" not in text


def test_components_over_the_observed_step_are_said_in_words_by_the_cli(capsys: pytest.CaptureFixture[str]) -> None:
    from decodetop.budget.remainder import EXCEEDS_OBSERVED
    from decodetop.cli import main

    assert main(["budget", "--model", "glm-5", "--tp", "8", "--gpu", "h200", "--observed-ms", "0.5"]) == 0
    out = capsys.readouterr().out
    assert EXCEEDS_OBSERVED in out and not re.search(r"\(≤\)\s*-\d", out)


@pytest.mark.parametrize("size", [(80, 24), (120, 40)])
async def test_a_notice_covers_neither_the_status_line_nor_the_verdict(size: tuple[int, int]) -> None:
    from textual.widgets._toast import Toast

    from decodetop.tui.widgets.status_line import StatusLine

    app = make_app(make_sources(telemetry=FakeTelemetry([eight_gpu_frame(processes=True)])))
    async with app.run_test(size=size, notifications=True) as pilot:
        await wait_until(pilot, lambda: app.query_one(BudgetBar).budget is not None, "budget")
        await pilot.press("2", "o")  # "GPUs sorted by util"
        await wait_until(pilot, lambda: bool(app.screen.query(Toast)), "the notice")
        await pilot.pause()
        toast = app.screen.query_one(Toast).region
        status = app.query_one(StatusLine).region
        verdict_row = app.query_one(BudgetBar).region.y  # the verdict is the bar's first line
        assert not toast.overlaps(status), (toast, status)
        assert not (toast.y <= verdict_row < toast.bottom), (toast, verdict_row)
