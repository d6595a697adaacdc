"""SVG snapshots of the main screen at 80×24 and 160×48, from fixed data: a fixed clock, no live probes or NVML.

The 8-GPU host is the H200 recording's shape replicated to 8 GPUs (as `--demo` does); the screen says so.
Review the report before `--snapshot-update` (docs/guide/testing.md).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from textual.pilot import Pilot

from decodetop.history import KIND_BASELINE, History
from decodetop.settings import Settings
from decodetop.tui.app import DecodetopApp
from decodetop.tui.model import ProbeState
from decodetop.tui.widgets.budget_bar import BudgetBar
from decodetop.tui.widgets.gpu_table import GpuTable

from .conftest import make_app, wait_until
from .fakes import NOW_S, FakeBudget, FakeProbes, FakeTelemetry, eight_gpu_frame, make_sources

SIZES = [(80, 24), (160, 48)]


def _ready(app: DecodetopApp) -> bool:
    return (
        app.query_one(BudgetBar).budget is not None
        and app.budget_settled
        and len(app.probe_views) == 3
        and bool(app.checks)
        and app.last_frame is not None
    )


def _runner(
    app: DecodetopApp, key: str | None, extra: Callable[[], bool] = lambda: True
) -> Callable[[Pilot[object]], object]:
    async def run_before(pilot: Pilot[object]) -> None:
        await wait_until(pilot, lambda: _ready(app) and extra(), "snapshot data")
        if key is not None:
            await pilot.press(key)
        await pilot.pause()

    return run_before


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_no_gpu(snap_compare: Callable[..., bool], size: tuple[int, int]) -> None:
    app = make_app(make_sources())
    assert snap_compare(app, terminal_size=size, run_before=_runner(app, "2"))


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_eight_gpus_replicated_from_the_h200_recording(
    snap_compare: Callable[..., bool], size: tuple[int, int]
) -> None:
    app = make_app(make_sources(telemetry=FakeTelemetry([eight_gpu_frame()])))
    ready = lambda: app.query_one("#gpu-table", GpuTable).row_count == 8  # noqa: E731
    assert snap_compare(app, terminal_size=size, run_before=_runner(app, "2", ready))


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_probes_running(snap_compare: Callable[..., bool], size: tuple[int, int]) -> None:
    app = make_app(make_sources(probes=FakeProbes(hold=True), run_probes=True))
    ready = lambda: (v := app.probe_views.get("allreduce")) is not None and v.progress == 0.5  # noqa: E731
    assert snap_compare(app, terminal_size=size, run_before=_runner(app, None, ready))


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_failed_probe(snap_compare: Callable[..., bool], size: tuple[int, int]) -> None:
    app = make_app(make_sources(probes=FakeProbes(script={"allreduce": ProbeState.FAILED}), run_probes=True))

    def done() -> bool:
        pending = (ProbeState.QUEUED, ProbeState.RUNNING, ProbeState.IDLE)
        return all(v.state not in pending for v in app.probe_views.values())

    assert snap_compare(app, terminal_size=size, run_before=_runner(app, None, done))


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_failing_checks(snap_compare: Callable[..., bool], size: tuple[int, int]) -> None:
    app = make_app(make_sources(telemetry=FakeTelemetry([eight_gpu_frame()])))
    assert snap_compare(app, terminal_size=size, run_before=_runner(app, "3"))


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_budget_moved_since_the_baseline(
    snap_compare: Callable[..., bool], size: tuple[int, int], tmp_path: Path
) -> None:
    """A baseline whose budget had attention faster and routed experts slower: both marked Δ in the legend."""
    path = tmp_path / "history.jsonl"
    stored = FakeBudget().compose(Settings(model="glm-5", tp=8), {}, NOW_S).to_budget_dict()
    segments = {s["component"]: s for s in stored["segments"]}  # type: ignore[attr-defined]
    segments["attention"].update(ms=0.6)
    segments["routed_experts"].update(ms=2.6)
    History(path).record(KIND_BASELINE, "default", {"checks": {}, "budget": stored}, recorded_at_s=NOW_S - 3600)
    app = make_app(make_sources(history=History(path, clock=lambda: NOW_S)))
    moved = lambda: (b := app.query_one(BudgetBar).budget) is not None and len(b.moved) == 2  # noqa: E731
    assert snap_compare(app, terminal_size=size, run_before=_runner(app, None, moved))
