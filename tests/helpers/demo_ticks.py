"""Telemetry of the `--demo` host for tests: the H200 recording on 8 GPUs through decodetop's own sampler."""

from __future__ import annotations

from decodetop.collectors.fake_nvml import FakeNvmlBackend, load_recording
from decodetop.collectors.nvml import Nvml
from decodetop.collectors.telemetry import TelemetrySampler, TelemetrySnapshot


def demo_ticks(count: int, *, processes: bool = True, gpus: int = 8) -> list[TelemetrySnapshot]:
    """`count` ticks of `h200x1-load` replicated to `gpus` GPUs, the fake moving a recorded sample per tick."""
    backend = FakeNvmlBackend(load_recording("h200x1-load"), replicate_to=gpus, clock=None)
    sampler = TelemetrySampler(Nvml(backend))
    out = []
    for _ in range(count):
        out.append(sampler.sample(processes=processes))
        backend.advance()
    return out
