"""A recorded run replays into the screen (SVG snapshots at 80×24 and 160×48), and a recording with corrupt lines
replays with the number of skipped lines shown on screen.

The recording is made here through the same taps `--record` uses: telemetry sampled from the fake NVML replaying the
H200 recording (replicated to 8 GPUs), the probe results recorded on the H200 machine, and failing checks. Wall-clock
values are pinned (tick cost, timestamps, the app's clock) so the screen is the same on every run.
"""

from __future__ import annotations

import dataclasses
import gzip
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from decodetop.collectors.fake_nvml import FakeNvmlBackend, load_recording
from decodetop.collectors.nvml import Nvml
from decodetop.collectors.telemetry import TelemetrySampler
from decodetop.export.recording import Recorder
from decodetop.probes.results import load_results
from decodetop.settings import Settings
from decodetop.tui.launch import LaunchOptions, build_sources
from decodetop.tui.sources.telemetry import ReplayTelemetry
from decodetop.tui.widgets.gpu_table import GpuTable

from .conftest import make_app, wait_until
from .fakes import failing_checks

H200_RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "primitives" / "h200x1.json"
T0_UNIX_S = 1_796_000_000.0  # 2026-11-29 (UTC), the day the H200 data was recorded
SIZES = [(80, 24), (160, 48)]


def _pinned_snapshots(n: int) -> list[Any]:
    backend = FakeNvmlBackend(load_recording("h200x1-load"), replicate_to=8, clock=None)
    sampler = TelemetrySampler(Nvml(backend))
    out = []
    for i in range(n):
        snap = sampler.sample(processes=False)
        out.append(
            dataclasses.replace(
                snap,
                taken_at_unix_s=T0_UNIX_S + i,
                monotonic_s=float(i),
                tick_cost_s=0.0033,
                tick_cost_per_gpu_s=0.0033 / 8,
                static_cost_s=0.0,
            )
        )
        backend.advance()
    return out


def _record(path: Path, corrupt: tuple[str, ...] = ()) -> Path:
    from decodetop.tui.taps import Taps

    ticks = iter(range(10_000))
    taps = Taps(recorder=Recorder(path, clock=lambda: T0_UNIX_S + next(ticks)))
    # One telemetry frame (the second sample, so PCIe rates exist): a replay steps through its frames in real
    # time, and a snapshot must not depend on which frame the screen shows when it is taken.
    taps.on_snapshot(_pinned_snapshots(2)[-1])
    for result in load_results(H200_RESULTS):
        taps.on_probe_result(result)
    taps.on_checks(failing_checks(), T0_UNIX_S)
    taps.close()
    if corrupt:  # damaged lines in a session of their own (a recording is gzip, a member per session)
        with path.open("ab") as handle:
            handle.write(gzip.compress(("\n".join(corrupt) + "\n").encode()))
    return path


def _replay_app(path: Path) -> Any:
    sources = build_sources(Settings(model="glm-5", tp=8, tick_s=0.25), LaunchOptions(replay=path))
    assert isinstance(sources.telemetry, ReplayTelemetry)
    # played once, not looped: the sparklines then hold one point, however long the snapshot takes to settle
    once = ReplayTelemetry(sources.telemetry.snapshots, interval_s=0.25, loop=False)
    return make_app(dataclasses.replace(sources, telemetry=once, clock=lambda: T0_UNIX_S + 3600))


def _ready(app: Any) -> Callable[[Any], object]:
    async def run_before(pilot: Any) -> None:
        table = app.query_one("#gpu-table", GpuTable)
        await wait_until(pilot, lambda: table.row_count == 8, "8 replayed GPUs")
        await wait_until(pilot, lambda: set(app.results) == {"allreduce", "launch", "membw"}, "replayed results")
        await wait_until(pilot, lambda: len(app.checks) == len(failing_checks()), "replayed checks")
        await wait_until(pilot, lambda: app.budget_settled, "budget")
        await pilot.pause()

    return run_before


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_a_recorded_run_replays_into_the_screen(
    snap_compare: Callable[..., bool], size: tuple[int, int], tmp_path: Path
) -> None:
    app = _replay_app(_record(tmp_path / "session.jsonl"))
    assert snap_compare(app, terminal_size=size, run_before=_ready(app))


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_corrupt_lines_are_skipped_and_counted_on_screen(
    snap_compare: Callable[..., bool], size: tuple[int, int], tmp_path: Path
) -> None:
    path = _record(tmp_path / "session.jsonl", corrupt=('{"kind": "telemetry", "t": 1', "garbage", "[1, 2"))
    app = _replay_app(path)
    assert any("3 corrupt lines skipped" in note for note in app.sources.notes)
    assert snap_compare(app, terminal_size=size, run_before=_ready(app))
