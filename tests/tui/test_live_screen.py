"""The live screen as a new user meets it: a filter that survives the age refreshes, an internal error that ends
the app with a non-zero exit and one line, and the faults found in a quarter tmux pane, each driven through Pilot."""

from __future__ import annotations

from pathlib import Path

import pytest

from decodetop.settings import Settings
from decodetop.tui.app import DecodetopApp
from decodetop.tui.probe_group import GroupInfo
from decodetop.tui.screens.budget_details import BudgetDetailsScreen
from decodetop.tui.sources import Sources
from decodetop.tui.sources.budget import PresetBudget
from decodetop.tui.sources.probes import NoProbes
from decodetop.tui.model import ProbeState
from decodetop.tui.widgets.gpu_table import GpuTable
from decodetop.tui.widgets.health_panel import HealthPanel
from decodetop.tui.widgets.probe_table import ProbeTable
from decodetop.tui.widgets.process_table import ProcessTable

from .conftest import make_app, wait_until
from .fakes import NOW_S, FakeChecks, FakeTelemetry, eight_gpu_frame, fixed_clock, make_sources


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


def screen_text(app: DecodetopApp) -> str:
    """What the terminal shows now (the active screen, modals included)."""
    return "\n".join("".join(seg.text for seg in strip) for strip in app.screen._compositor.render_strips())


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
