"""--record / --replay / --prometheus / --server wired into the UI."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from decodetop.collectors.serving import ServerStep
from decodetop.export.prometheus import StateBox, render_exposition
from decodetop.export.recording import Recorder
from decodetop.probes.results import load_results
from decodetop.settings import Settings
from decodetop.tui.launch import LaunchOptions, build_sources
from decodetop.tui.model import ProbeState
from decodetop.tui.sources.server import ServerPoller
from decodetop.tui.taps import Taps
from decodetop.tui.widgets.gpu_table import GpuTable
from tests.helpers.demo_ticks import demo_ticks

from .conftest import make_app, wait_until
from .fakes import failing_checks, make_sources

H200_RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "primitives" / "h200x1.json"


def _snapshots(n: int) -> list[Any]:
    return list(demo_ticks(n, processes=False))


async def test_a_recording_replays_telemetry_probe_results_and_checks(tmp_path: Path) -> None:
    path = tmp_path / "session.jsonl"
    taps = Taps(recorder=Recorder(path))
    for snap in _snapshots(3):
        taps.on_snapshot(snap)
    for result in load_results(H200_RESULTS):
        taps.on_probe_result(result)
    taps.on_checks(failing_checks(), 1.0)
    taps.close()

    sources = build_sources(Settings(tick_s=0.25), LaunchOptions(replay=path))
    assert any("replay of session.jsonl" in note for note in sources.notes)
    app = make_app(sources)
    async with app.run_test(size=(160, 48)) as pilot:
        table = app.query_one("#gpu-table", GpuTable)
        await wait_until(pilot, lambda: table.row_count == 8, "8 replayed GPUs")
        await wait_until(pilot, lambda: set(app.results) == {"allreduce", "launch", "membw"}, "replayed results")
        assert app.probe_views["allreduce"].state is ProbeState.DONE
        await wait_until(pilot, lambda: len(app.checks) == len(failing_checks()), "replayed checks")
        await pilot.press("q")
        await wait_until(pilot, lambda: app.return_value == 0, "quit")


async def test_probe_results_and_checks_reach_the_prometheus_state() -> None:
    """Every result reaches the taps as a callback of the run (here a replay's: a live group's are the plan
    runner's, tests/tui/test_sources.py), the checks as the app runs them."""
    from decodetop.tui.sources.probes import ReplayProbes

    box = StateBox()
    taps = Taps(state_box=box)
    probes = ReplayProbes(load_results(H200_RESULTS), on_result=[taps.on_probe_result])
    sources = dataclasses.replace(make_sources(probes=probes, run_probes=True), taps=taps)  # type: ignore[arg-type]
    app = make_app(sources)
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_until(pilot, lambda: len(box().probe_results) == 3 and bool(box().checks), "state filled")
    text = render_exposition(box)
    assert "allreduce" in text
    assert "decodetop_check" in text


class _FakeServer:
    def __init__(self) -> None:
        self.polls = 0

    def poll(self) -> ServerStep:
        self.polls += 1
        return ServerStep(
            step_ms=19.2,
            itl_ms=19.2,
            source="sglang",
            metric="sglang:inter_token_latency_seconds",
            samples=120,
            window_s=30.0,
            accept_length=1.0,
            accept_length_from="none",
            url="http://127.0.0.1:30000/metrics",
        )


async def test_the_server_step_replaces_the_observed_figure() -> None:
    server = ServerPoller(_FakeServer(), period_s=0.05)
    sources = dataclasses.replace(make_sources(), server=server)
    app = make_app(sources)
    async with app.run_test(size=(100, 30)) as pilot:
        # the budget source hears the server (the app never writes the step into its settings)
        await wait_until(pilot, lambda: app.sources.budget.server_step_ms == 19.2, "observed from the server")
        await wait_until(pilot, lambda: app.budget_settled, "budget recomposed")
        budget = app.query_one("BudgetBar").budget  # type: ignore[attr-defined]
        assert budget is not None and budget.observed_ms == 19.2
        assert "observed 19.20 ms/step from sglang" in app.server_note
        await pilot.press("q")
        await wait_until(pilot, lambda: app.return_value == 0, "quit")
    assert server._thread is not None and not server._thread.is_alive()
