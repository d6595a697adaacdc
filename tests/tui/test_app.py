"""The live UI driven through Textual's Pilot: every key binding and every probe state, over fixed sources."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from textual.widgets import Static, TabbedContent

from decodetop.collectors.checks.result import Status
from decodetop.history import KIND_BASELINE, KIND_PROBE, History, HistoryEntry
from decodetop.settings import Settings, load_settings
from decodetop.tui.app import DecodetopApp
from decodetop.tui.messages import BaselineSaved, ChecksReady, ProbeFinished, ProbeProgress, TelemetryReady
from decodetop.tui.model import ProbeState
from decodetop.tui.screens.details import CheckDetailScreen, ProbeDetailScreen
from decodetop.tui.screens.help import HelpScreen
from decodetop.tui.screens.model_picker import ModelPickerScreen
from decodetop.tui.widgets.budget_bar import BudgetBar
from decodetop.tui.widgets.gpu_table import GpuTable
from decodetop.tui.widgets.health_panel import HealthPanel
from decodetop.tui.widgets.probe_table import ProbeTable
from decodetop.tui.widgets.status_line import StatusLine

from .conftest import MessageLog, make_app, wait_until
from .fakes import (
    NOW_S,
    FakeBudget,
    FakeChecks,
    FakeProbes,
    FakeTelemetry,
    eight_gpu_frame,
    failing_checks,
    make_sources,
)


def _states(app: DecodetopApp) -> dict[str, ProbeState]:
    return {pid: v.state for pid, v in app.probe_views.items()}


def _screen_text(app: DecodetopApp) -> str:
    return "\n".join("".join(seg.text for seg in strip) for strip in app.screen._compositor.render_strips())


async def test_first_frame_without_gpu_shows_the_bar_markers_and_why_nvml_is_empty() -> None:
    app = make_app(make_sources())
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_until(pilot, lambda: app.query_one(BudgetBar).budget is not None, "budget")
        text = _screen_text(app)
        assert "observed 95.0ms" in text
        assert "target 3.24ms" in text
        assert "░" in text  # the unexplained remainder
        await pilot.press("2")
        await wait_until(pilot, lambda: "NVML library not found" in _screen_text(app), "no-GPU reason")
        assert "no GPU telemetry" in app.query_one("#status", StatusLine).text


async def test_eight_gpus_fill_the_table_with_stable_keys_and_highlights() -> None:
    frames = [eight_gpu_frame(NOW_S - 1), eight_gpu_frame(NOW_S)]
    log = MessageLog()
    app = make_app(make_sources(telemetry=FakeTelemetry(frames)))
    async with app.run_test(size=(120, 40), message_hook=log) as pilot:
        await pilot.press("2")
        table = app.query_one("#gpu-table", GpuTable)
        await wait_until(pilot, lambda: table.row_count == 8, "8 GPU rows")
        assert [str(k.value) for k in table.rows] == [f"gpu-{i}" for i in range(8)]
        assert "3x" not in str(table.get_cell("gpu-3", "pcie"))
        assert str(table.get_cell("gpu-3", "pcie")) == "5x8/5x16"
        assert "HwThermal" in str(table.get_cell("gpu-5", "reasons"))
        assert log.of(TelemetryReady)


async def test_every_probe_state_and_the_progress_gauge() -> None:
    probes = FakeProbes(
        script={"allreduce": ProbeState.FAILED, "gemm": ProbeState.TIMED_OUT, "launch": ProbeState.UNSUPPORTED},
        hold=True,
    )
    log = MessageLog()
    app = make_app(make_sources(probes=probes, run_probes=True))
    async with app.run_test(size=(100, 30), message_hook=log) as pilot:
        await wait_until(pilot, lambda: _states(app).get("allreduce") is ProbeState.RUNNING, "running")
        await wait_until(pilot, lambda: bool(log.of(ProbeProgress)), "progress")
        await wait_until(pilot, lambda: app.probe_views["allreduce"].progress == 0.5, "progress applied")
        assert _states(app) == {
            "allreduce": ProbeState.RUNNING,
            "gemm": ProbeState.QUEUED,
            "launch": ProbeState.QUEUED,
        }
        assert "running ▰▰▱▱  50%" in str(app.query_one(ProbeTable).get_cell("allreduce", "state"))
        probes.gate.set()
        await wait_until(pilot, lambda: len(log.of(ProbeFinished)) == 3, "all finished")
        assert _states(app) == {
            "allreduce": ProbeState.FAILED,
            "gemm": ProbeState.TIMED_OUT,
            "launch": ProbeState.UNSUPPORTED,
        }
        assert "NCCL error" in str(app.query_one(ProbeTable).get_cell("allreduce", "value"))


async def test_done_probes_update_the_budget() -> None:
    """(Telemetry pauses around latency-sensitive probes in the plan runner: tests/tui/test_sources.py.)"""
    app = make_app(make_sources(run_probes=True))
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_until(pilot, lambda: set(app.results) == {"allreduce", "gemm", "launch"}, "results")
        await wait_until(pilot, lambda: app.budget_settled, "budget composed")
        budget = app.query_one(BudgetBar).budget
        assert budget is not None
        by_key = {s.key: s for s in budget.segments}
        assert by_key["communication"].ms == 6.55
        assert by_key["communication"].status == "measured"


async def test_r_reruns_the_selected_probe_and_R_all() -> None:
    probes = FakeProbes()
    log = MessageLog()
    app = make_app(make_sources(probes=probes, run_probes=True))
    async with app.run_test(size=(100, 30), message_hook=log) as pilot:
        await wait_until(pilot, lambda: len(log.of(ProbeFinished)) == 3, "first pass")
        await pilot.press("down")
        await pilot.press("r")
        await wait_until(pilot, lambda: len(log.of(ProbeFinished)) == 4, "re-run")
        assert probes.runs[-1] == "gemm"
        await pilot.press("R")
        await wait_until(pilot, lambda: len(log.of(ProbeFinished)) == 7, "re-run all")
        assert probes.runs[-3:] == ["allreduce", "gemm", "launch"]


async def test_x_cancels_the_running_probe_and_everything_queued() -> None:
    probes = FakeProbes(hold=True)
    log = MessageLog()
    app = make_app(make_sources(probes=probes, run_probes=True))
    async with app.run_test(size=(100, 30), message_hook=log) as pilot:
        await wait_until(pilot, lambda: _states(app).get("allreduce") is ProbeState.RUNNING, "running")
        await pilot.press("x")
        await wait_until(pilot, lambda: bool(log.of(ProbeFinished)), "cancelled run returns")
        assert probes.cancelled == 1
        assert set(_states(app).values()) == {ProbeState.CANCELLED}
        assert probes.runs == ["allreduce"]


async def test_enter_opens_probe_details_with_per_rank_values_and_the_traceback() -> None:
    probes = FakeProbes(script={"allreduce": ProbeState.FAILED})
    log = MessageLog()
    app = make_app(make_sources(probes=probes, run_probes=True))
    async with app.run_test(size=(100, 40), message_hook=log) as pilot:
        await wait_until(pilot, lambda: len(log.of(ProbeFinished)) == 3, "finished")
        app.query_one(ProbeTable).focus()
        await pilot.press("enter")
        await wait_until(pilot, lambda: isinstance(app.screen, ProbeDetailScreen), "detail screen")
        body = str(app.screen.query_one("#probe-detail-body", Static).content)
        assert "Traceback (most recent call last)" in body
        assert "rank 1: RuntimeError" in body
        await pilot.press("escape")
        await pilot.press("down")
        await pilot.press("enter")
        await wait_until(pilot, lambda: isinstance(app.screen, ProbeDetailScreen), "second detail screen")
        body = str(app.screen.query_one("#probe-detail-body", Static).content)
        assert "rank 1 (cuda:1): 41.4 µs" in body
        assert "p10 39.8 µs" in body
        assert "SM 1980/1980 MHz" in body  # the telemetry seen during the run


async def test_health_lists_failing_first_enter_explains_and_s_saves_a_baseline(tmp_path: Path) -> None:
    history = History(tmp_path / "history.jsonl", clock=lambda: NOW_S)
    log = MessageLog()
    app = make_app(make_sources(history=history))
    async with app.run_test(size=(100, 30), message_hook=log) as pilot:
        await wait_until(pilot, lambda: bool(log.of(ChecksReady)), "checks")
        await pilot.press("3")
        panel = app.query_one("#health-panel", HealthPanel)
        await wait_until(pilot, lambda: panel.table.row_count == 6, "rows")
        assert [c.status for c in panel._order][:3] == [Status.FAIL, Status.FAIL, Status.WARN]
        summary = str(app.query_one("#health-summary", Static).content)
        assert "2 fail · 1 warn · 0 unknown · 2 pass" in summary
        assert "no baseline" in summary
        await pilot.press("enter")
        await wait_until(pilot, lambda: isinstance(app.screen, CheckDetailScreen), "check detail")
        body = str(app.screen.query_one("#check-detail-body", Static).content)
        assert "how to fix" in body
        await pilot.press("escape")
        await pilot.press("s")
        await wait_until(pilot, lambda: bool(log.of(BaselineSaved)), "baseline saved")
        summary = str(app.query_one("#health-summary", Static).content)
        assert "baseline just now, 0 changed" in summary
    saved = History(tmp_path / "history.jsonl").latest(KIND_BASELINE)["default"]
    assert saved.payload["checks"]["P1"]["status"] == "fail"


async def test_changes_since_the_baseline_are_marked(tmp_path: Path) -> None:
    path = tmp_path / "history.jsonl"
    checks = failing_checks()
    stored = {c.check_id: {"status": c.status.value, "observed": c.observed, "facts": {}} for c in checks}
    stored["C1"] = {"status": "pass", "observed": "performance", "facts": {}}
    History(path).record(KIND_BASELINE, "default", {"checks": stored, "probes": {}}, recorded_at_s=NOW_S - 7200)
    app = make_app(make_sources(history=History(path, clock=lambda: NOW_S)))
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.press("3")
        panel = app.query_one("#health-panel", HealthPanel)
        await wait_until(pilot, lambda: panel.view.baseline_at_s is not None and panel.table.row_count == 6, "rows")
        assert panel.view.changed_ids == frozenset({"C1"})
        assert "baseline 2h ago, 1 changed" in str(app.query_one("#health-summary", Static).content)
        assert str(panel.table.get_cell("C1", "changed")) == "Δ"


async def test_budget_components_that_moved_since_the_baseline_are_marked(tmp_path: Path) -> None:
    """`s` stores the budget with the baseline; a budget composed later with attention slower marks attention Δ."""
    path = tmp_path / "history.jsonl"
    budget = FakeBudget()
    log = MessageLog()
    app = make_app(make_sources(history=History(path, clock=lambda: NOW_S), budget=budget))
    async with app.run_test(size=(100, 40), message_hook=log) as pilot:
        bar = app.query_one(BudgetBar)
        await wait_until(pilot, lambda: bar.budget is not None and app.budget_settled, "budget")
        await pilot.press("s")
        await wait_until(pilot, lambda: bool(log.of(BaselineSaved)), "baseline saved")
        assert bar.budget is not None and bar.budget.moved == ()
        assert "Δ" not in _screen_text(app)
        budget.scale = {"attention": 1.5, "norms": 1.01}  # attention +0.6 ms; norms +0.003 ms is noise
        await pilot.press("R")  # the probes finish, the budget is composed again
        await wait_until(
            pilot, lambda: app.budget_settled and bar.budget is not None and bar.budget.moved != (), "moved budget"
        )
        assert [(m.key, round(m.delta_ms, 6)) for m in bar.budget.moved] == [("attention", 0.6)]
        text = _screen_text(app)
        assert re.search(r"attention +1\.80ms Δ\+0\.600 ms", text), text  # the legend's label width follows the room
        assert text.count("Δ+") == 1  # communication, dense MLP, launch: missing at the baseline, no Δ
    stored = History(path).latest(KIND_BASELINE)["default"].payload["budget"]
    assert {s["component"]: s["ms"] for s in stored["segments"]}["attention"] == 1.2
    assert {s["component"]: s["status"] for s in stored["segments"]}["communication"] == "missing"


async def test_a_stored_baseline_budget_marks_at_start_and_a_corrupt_one_is_ignored(tmp_path: Path) -> None:
    path = tmp_path / "history.jsonl"
    stored = FakeBudget().compose(Settings(model="glm-5", tp=8), {}, NOW_S).to_budget_dict()
    segments = {s["component"]: s for s in stored["segments"]}  # type: ignore[attr-defined]
    segments["attention"].update(ms=1.1, p10_ms=1.0, p90_ms=1.3)  # 1.1 → 1.2: within its spread
    segments["routed_experts"].update(ms=2.6)  # 2.6 → 2.1: faster
    History(path).record(KIND_BASELINE, "default", {"checks": {}, "budget": stored}, recorded_at_s=NOW_S - 60)
    app = make_app(make_sources(history=History(path, clock=lambda: NOW_S)))
    async with app.run_test(size=(80, 24)) as pilot:  # the compact legend
        bar = app.query_one(BudgetBar)
        await wait_until(pilot, lambda: bar.budget is not None and bar.budget.moved != (), "moves")
        assert [(m.key, round(m.delta_ms, 6)) for m in bar.budget.moved] == [("routed_experts", -0.5)]
        assert re.search(r"▚ experts +2\.10ms Δ-0\.50ms", _screen_text(app)), _screen_text(app)
    History(path).record(KIND_BASELINE, "default", {"checks": {}, "budget": {"segments": "?"}}, recorded_at_s=NOW_S)
    app = make_app(make_sources(history=History(path, clock=lambda: NOW_S)))
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_until(pilot, lambda: app.baseline is not None and app.budget_settled, "baseline loaded")
        assert app.query_one(BudgetBar).budget.moved == ()  # type: ignore[union-attr]
        assert "Δ" not in _screen_text(app)


async def test_history_values_show_at_start_with_their_age(tmp_path: Path) -> None:
    path = tmp_path / "history.jsonl"
    History(path).record(KIND_PROBE, "gemm", {"value": "2.50 TB/s @ M=1", "ms": 4.0}, recorded_at_s=NOW_S - 3600)
    app = make_app(make_sources(history=History(path)))
    async with app.run_test(size=(100, 30)) as pilot:
        table = app.query_one(ProbeTable)
        await wait_until(
            pilot, lambda: app.probe_views.get("gemm") is not None and app.probe_views["gemm"].from_history, "restored"
        )
        assert str(table.get_cell("gemm", "value")) == "2.50 TB/s @ M=1"
        assert str(table.get_cell("gemm", "age")) == "1h ↺"
        assert app.results["gemm"] == 4.0


async def test_a_corrupt_history_is_reported_and_set_aside(tmp_path: Path) -> None:
    path = tmp_path / "history.jsonl"
    path.write_text("{broken\n")
    app = make_app(make_sources(history=History(path, clock=lambda: NOW_S)))
    async with app.run_test(size=(120, 30)) as pilot:
        status = app.query_one("#status", StatusLine)
        await wait_until(pilot, lambda: "corrupt history" in status.text, "reported")
    aside = list(tmp_path.glob("history.jsonl.corrupt-*"))
    assert len(aside) == 1
    assert aside[0].read_text() == "{broken\n"


class _CpuGroup:
    """Two CPU ranks' stand-in: every probe comes back ok, with the environment a real rank reports."""

    backend = "gloo"

    def run(self, probe: str, params: object = None, *, timeout_s: object = None, on_progress: object = None) -> Any:
        from decodetop.probes.results import Environment, ProbeResult, ProbeStatus

        env = Environment("vm", "2026-11-29T10:00:00Z", "3.11", "gloo", device_kind="cpu", world_size=2)
        return ProbeResult(probe, ProbeStatus.OK, {}, (), environment=env, world_size=2)

    def rank_pids(self) -> list[int]:
        return []


async def test_finished_probes_are_appended_to_the_history(tmp_path: Path) -> None:
    """Each run of the live probe source stores its result through the plan runner's history callback, with the
    fingerprint of the scenario the plan was made for."""
    from decodetop.pipeline.fingerprints import SessionFingerprints
    from decodetop.pipeline.result_history import ResultHistory
    from decodetop.probes.controller import GroupLayout
    from decodetop.tui.sources.probes import ControllerProbes

    path = tmp_path / "history.jsonl"
    probes = ControllerProbes(_CpuGroup, layout=lambda: GroupLayout("cpu", 2))  # type: ignore[arg-type]
    hook = ResultHistory(History(path), scenario=lambda: probes.scenario, fingerprints=SessionFingerprints())  # type: ignore[arg-type,return-value]
    probes.runner.on_result = (hook,)
    log = MessageLog()
    app = make_app(make_sources(probes=probes, history=History(path), run_probes=True), Settings(model="llama-3.1-70b"))  # type: ignore[arg-type]
    async with app.run_test(size=(100, 30), message_hook=log) as pilot:
        await wait_until(pilot, lambda: len(log.of(ProbeFinished)) == len(app.probe_views) > 0, "finished")
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [line["key"] for line in lines] == list(app.probe_views)
    entries = [HistoryEntry.from_json(json.dumps(line)) for line in lines]
    assert all(e.fingerprint is not None and e.fingerprint.device_kind == "cpu" for e in entries)
    assert {e.fingerprint.scenario for e in entries if e.fingerprint} == {probes.scenario.fingerprint_id}  # type: ignore[union-attr]


async def test_t_cycles_themes_and_remembers_the_choice(tmp_path: Path) -> None:
    settings_path = tmp_path / "settings.toml"
    app = make_app(make_sources(), settings_path=settings_path, save_theme=True)
    async with app.run_test(size=(80, 24)) as pilot:
        assert app.theme == "decodetop-dark"
        await pilot.press("t")
        assert app.theme == "decodetop-light"
        await pilot.press("t")
        assert app.theme == "decodetop-contrast"
        await wait_until(pilot, lambda: settings_path.exists() and "contrast" in settings_path.read_text(), "saved")
    assert load_settings(settings_path).theme == "decodetop-contrast"


async def test_m_picks_a_model_and_the_budget_follows() -> None:
    app = make_app(make_sources())
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.press("m")
        await wait_until(pilot, lambda: isinstance(app.screen, ModelPickerScreen), "picker")
        await pilot.press("down")
        await pilot.press("enter")
        await wait_until(pilot, lambda: app.settings.model == "llama-3.1-70b", "model changed")
        await wait_until(pilot, lambda: app.budget_settled, "budget composed")
        budget = app.query_one(BudgetBar).budget
        assert budget is not None and budget.title.startswith("llama-3.1-70b")
        await pilot.press("m")
        await wait_until(pilot, lambda: isinstance(app.screen, ModelPickerScreen), "picker again")
        await pilot.press("escape")
        assert app.settings.model == "llama-3.1-70b"


async def test_question_mark_lists_every_key() -> None:
    app = make_app(make_sources())
    async with app.run_test(size=(100, 40)) as pilot:
        await pilot.press("question_mark")
        await wait_until(pilot, lambda: isinstance(app.screen, HelpScreen), "help")
        listed = {key for key, _ in app.screen.keys}  # type: ignore[attr-defined]
        assert {"q", "?", "r", "R", "x", "s", "m", "t", "1", "2", "3", "4", "enter"} <= listed
        await pilot.press("escape")
        assert not isinstance(app.screen, HelpScreen)


async def test_number_keys_switch_tabs() -> None:
    app = make_app(make_sources())
    async with app.run_test(size=(100, 30)) as pilot:
        tabs = app.query_one(TabbedContent)
        for key, tab in (("2", "gpus"), ("3", "health"), ("4", "charts"), ("1", "probes")):
            await pilot.press(key)
            assert tabs.active == tab


async def test_q_quits_and_closes_the_probe_group_and_the_collector() -> None:
    probes = FakeProbes(hold=True)
    telemetry = FakeTelemetry()
    app = make_app(make_sources(probes=probes, telemetry=telemetry, run_probes=True))
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_until(pilot, lambda: app.running_probe == "allreduce", "running")
        await pilot.press("q")
        await wait_until(pilot, lambda: probes.closed and telemetry.closed, "closed")
    assert app.return_value == 0
    assert probes.cancelled >= 1


async def test_failing_checks_source_is_shown_not_raised() -> None:
    app = make_app(make_sources(checks=FakeChecks(error=RuntimeError("sysfs went away"))))
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.press("3")
        summary = app.query_one("#health-summary", Static)
        await wait_until(pilot, lambda: "sysfs went away" in str(summary.content), "problem shown")


def test_settings_theme_falls_back_when_unknown() -> None:
    app = DecodetopApp(make_sources(), Settings(theme="no-such-theme"), save_theme=False)
    assert app.theme == "decodetop-dark"


async def test_charts_mount_on_first_view_and_plot_probe_curves_and_telemetry() -> None:
    from decodetop.tui.widgets.charts import Charts

    log = MessageLog()
    frames = [eight_gpu_frame(NOW_S - 1), eight_gpu_frame(NOW_S)]
    app = make_app(make_sources(telemetry=FakeTelemetry(frames), run_probes=True))
    async with app.run_test(size=(160, 48), message_hook=log) as pilot:
        await wait_until(pilot, lambda: len(log.of(ProbeFinished)) == 3, "finished")
        assert not list(app.query(Charts))  # nothing plotted while the tab is hidden
        await pilot.press("4")
        await wait_until(pilot, lambda: bool(list(app.query(Charts))), "charts mounted")
        charts = app.query_one(Charts)
        assert [s.label for s in charts.curves.allreduce_us_by_mode] == ["pipelined", "graph"]
        assert sorted(charts.history.series["sm"]) == list(range(8))
        # frames queued together coalesce (TelemetryReady.can_replace): the newest is always there
        assert charts.history.series["power"][0][-1] == (NOW_S, 76.0)


def test_health_ids_drop_the_pci_domain() -> None:
    from decodetop.tui.widgets.health_panel import display_id

    assert display_id("N3:0000:3b:00.0") == "N3:3b:00.0"
    assert display_id("P7:GPU0-GPU1") == "P7:GPU0-GPU1"
    assert display_id("C10") == "C10"
