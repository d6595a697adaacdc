"""The Charts tab maximised at 120×64 over the fake NVML: the H200 recording replicated to 8 GPUs, sampled for twelve
ticks, drawn as per-GPU history (utilisation, memory, SM clock, PCIe, power, temperature), beneath the probe curves
and the observed step and the components over time."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from textual.pilot import Pilot

from decodetop.collectors.fake_nvml import FakeNvmlBackend, load_recording
from decodetop.collectors.nvml import Nvml
from decodetop.collectors.telemetry import TelemetrySampler
from decodetop.tui.app import DecodetopApp
from decodetop.tui.messages import TelemetryReady
from decodetop.tui.model import TelemetryFrame
from decodetop.tui.sources.telemetry_views import telemetry_frame
from decodetop.tui.widgets.budget_bar import BudgetBar

from .conftest import make_app, wait_until
from .fakes import FakeTelemetry, make_sources

TICKS = 12
"""Ticks of history: the recording's five samples over twice and more, so every series has a shape."""
T0_UNIX_S = 1_796_000_000.0
"""2026-11-29 (UTC), the day the H200 recording was made: ticks at fixed times, so the snapshot never moves."""


def _frames() -> list[TelemetryFrame]:
    """One frame per tick from the fake NVML, each at a pinned time (one second apart)."""
    backend = FakeNvmlBackend(load_recording("h200x2-load"), replicate_to=8, clock=None)
    sampler = TelemetrySampler(Nvml(backend))
    frames = []
    for tick in range(TICKS):
        snapshot = sampler.sample(processes=False)
        pinned = dataclasses.replace(
            snapshot, taken_at_unix_s=T0_UNIX_S + tick, monotonic_s=float(tick), tick_cost_s=0.0033
        )
        frames.append(telemetry_frame(pinned))
        backend.advance()
    return frames


def _charts_drawn(app: DecodetopApp) -> bool:
    history = app.telemetry.series.get("util", {})
    return (
        app.charts is not None
        and app.query_one(BudgetBar).budget is not None
        and app.budget_settled
        and len(history.get(7, ())) == TICKS
    )


def test_the_fake_nvml_history_reaches_every_gpu() -> None:
    frames = _frames()
    assert {len(f.gpus) for f in frames} == {8}
    powers = {f.gpus[0].power_w for f in frames}
    assert len(powers) > 1  # the recording moves: the plots have a shape, not a flat line


def test_snapshot_charts_with_fake_nvml_history(snap_compare: Callable[..., bool]) -> None:
    frames = _frames()
    app = make_app(make_sources(telemetry=FakeTelemetry(frames[:1])))

    async def run_before(pilot: Pilot[object]) -> None:
        await wait_until(pilot, lambda: app.last_frame is not None, "first frame")
        for frame in frames[1:]:  # one tick at a time: a newer frame replaces a queued one, as it should live
            app.post_message(TelemetryReady(frame))
            await wait_until(pilot, lambda frame=frame: app.last_frame is frame, "the tick shown")
        await pilot.press("4")
        await wait_until(pilot, lambda: _charts_drawn(app), "charts with twelve ticks on every GPU")
        await pilot.press("z")  # the charts maximised: four rows of plots, the GPUs' history among them
        await pilot.pause()

    assert snap_compare(app, terminal_size=(120, 64), run_before=run_before)
