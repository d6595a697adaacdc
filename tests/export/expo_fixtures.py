"""Realistic export state for the exposition tests: telemetry from the NVML helper's H200 recording, probe results
(committed fixture under tests/fixtures/metrics), health checks, a budget and a live server's observed step."""

from __future__ import annotations

import functools
import json
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from decodetop.collectors.checks.model import CheckResult, Status
from decodetop.collectors.serving import ObservedStep
from decodetop.export.prometheus import ExportState

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "metrics"
RECORDING = "h200x1-load"
PROBES_JSON = FIXTURES / "probe_results_h200x2.json"


def _ns(value: Any) -> Any:
    if isinstance(value, dict):
        return SimpleNamespace(**{k: _ns(v) for k, v in value.items()})
    if isinstance(value, list):
        return tuple(_ns(v) for v in value)
    return value


class _ShiftedTime:
    """`time` for the sampler with a monotonic clock we step, so rates are over a recorded 1 s tick."""

    def __init__(self, mono: list[float]) -> None:
        self._mono = mono

    def monotonic(self) -> float:
        return self._mono[0]

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


@functools.lru_cache(maxsize=1)
def telemetry_snapshot() -> Any:
    """Two H200s under load: the NVML helper's real recording (`h200x1-load`, replicated to 2 GPUs) read by the
    real sampler over two ticks one second apart, so counters, rates and clock-event shares are present."""
    from decodetop.collectors import telemetry
    from decodetop.collectors.fake_nvml import FakeNvmlBackend, load_recording
    from decodetop.collectors.nvml import Nvml

    backend = FakeNvmlBackend(load_recording(RECORDING), replicate_to=2, clock=None)
    sampler = telemetry.TelemetrySampler(Nvml(backend))
    mono = [1000.0]
    real_time = telemetry.time
    telemetry.time = _ShiftedTime(mono)  # type: ignore[assignment]
    try:
        sampler.sample()
        backend.advance()
        mono[0] += 1.0
        return sampler.sample()
    finally:
        telemetry.time = real_time


def probe_results() -> tuple[Any, ...]:
    """The probe-results fixture (all-reduce sweep, membw, a timed-out probe) as ProbeResult objects."""
    try:
        from decodetop.probes.results import load_results
    except ImportError:
        return tuple(_ns(r) for r in json.loads(PROBES_JSON.read_text())["results"])
    return tuple(load_results(PROBES_JSON))


def budget() -> Any:
    """The budget helper's Budget for GLM-5-NVFP4 at TP8: composed segments (one still missing its GEMM data),
    the observed 95 ms step and the 309 tok/s target (docs/architecture.md defaults)."""
    from decodetop.budget.compose import Budget, Segment

    segments = (
        Segment("attention", 21.4, "measured", "MLA decode at 16k context", n_ops=78),
        Segment("attention_proj", 6.1, "interpolated", "GEMM curve vs M", n_ops=312),
        Segment("routed_experts", 28.7, "measured", "grouped GEMM", n_ops=75),
        Segment("shared_experts", 3.2, "measured", "GEMM", n_ops=75),
        Segment("routing", 1.9, "estimated", "roofline", n_ops=75),
        Segment("communication", 17.6, "measured", "all-reduce", n_ops=156),
        Segment("norms", 2.4, "measured", "rmsnorm", n_ops=313),
        Segment("lm_head", None, "missing", "no sampling probe yet", n_ops=1, missing_keys=("sampling:x",)),
        Segment("launch", 4.3, "measured", "graph replay", n_ops=1),
    )
    total = sum(s.ms or 0.0 for s in segments)
    return Budget(
        model="GLM-5-NVFP4",
        deployment="TP8 on 8 GPUs",
        segments=segments,
        total_ms=total,
        complete=False,
        observed_ms=95.0,
        target_tps=309.0,
        target_ms=1000 / 309,
        roofline_ms=11.8,
        unexplained_ms=95.0 - total,
        tokens_per_step=1.0,
        kernels=2400,
        launch_mode="graph",
        missing=("lm_head",),
    )


def checks() -> tuple[CheckResult, ...]:
    return (
        CheckResult(
            "C1",
            "CPU frequency governor",
            Status.WARN,
            "powersave",
            "performance",
            why="powersave adds latency to every kernel launch",
            fix="cpupower frequency-set -g performance",
            subject="host",
        ),
        CheckResult("C2", "C-states", Status.INFO, "not exposed in this VM", "C1 max", subject="host"),
        CheckResult("P1:0000:18:00.0", "PCIe link", Status.PASS, "Gen5 x16", "Gen5 x16", subject="GPU0 0000:18:00.0"),
        CheckResult("P1:0000:2a:00.0", "PCIe link", Status.FAIL, "Gen4 x16", "Gen5 x16", subject="GPU1 0000:2a:00.0"),
        CheckResult("N12", "row remapping", Status.UNKNOWN, "no permission", "no pending remaps", subject="GPU1"),
    )


def observed() -> ObservedStep:
    return ObservedStep(
        step_ms=19.2,
        itl_ms=19.2,
        source="sglang",
        metric="sglang:inter_token_latency_seconds",
        samples=512,
        window_s=10.0,
        accept_length=1.0,
        accept_length_from="none",
        url="http://127.0.0.1:30000/metrics",
        running_requests=1.0,
        model_names=("zai-org/GLM-5-NVFP4",),
    )


def full_state() -> ExportState:
    return ExportState(
        telemetry=telemetry_snapshot(),
        probe_results=probe_results(),
        budget=budget(),
        checks=checks(),
        checks_unix_s=1795959000.0,
        observed=observed(),
        probe_interval_s=600.0,
    )
