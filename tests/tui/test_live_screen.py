"""The live screen as a new user meets it: a filter that survives the age refreshes, an internal error that ends
the app with a non-zero exit and one line, and the faults found in a quarter tmux pane, each driven through Pilot."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from textual.binding import Binding
from textual.widgets import TabbedContent

from decodetop.settings import Settings
from decodetop.themes import THEME_NAMES
from decodetop.tui.app import DecodetopApp
from decodetop.tui.model import ProbeState
from decodetop.tui.probe_group import GroupInfo
from decodetop.tui.screens.budget_details import BudgetDetailsScreen
from decodetop.tui.screens.model_picker import ModelPickerScreen
from decodetop.tui.sources import Sources
from decodetop.tui.sources.budget import PresetBudget
from decodetop.tui.sources.probes import NoProbes
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
