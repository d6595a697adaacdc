"""Realistic export state for the exposition tests: telemetry from the NVML helper's H200 recording, probe results
(committed fixtures under tests/fixtures/metrics), health checks, a budget and a live server's observed step."""

from __future__ import annotations

import functools
import time
from pathlib import Path
from typing import Any

from decodetop.budget import compose
from decodetop.budget.compose import Budget
from decodetop.budget.segment import Segment
from decodetop.collectors.checks.gpu import gpu_checks
from decodetop.collectors.checks.result import CheckResult, Status
from decodetop.collectors.fake_nvml import FakeNvmlBackend, load_recording
from decodetop.collectors.nvml import Nvml
from decodetop.collectors.serving import ServerStep
from decodetop.collectors.telemetry import TelemetrySnapshot
from decodetop.collectors.telemetry import sampler as telemetry_sampler
from decodetop.export.prometheus import ExportState
from decodetop.probes.results import ProbeResult, load_results

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "metrics"
RECORDING = "h200x1-load"
PROBES_JSON = FIXTURES / "probe_results_h200x2.json"
PLAN_JSON = FIXTURES / "probe_results_plan_glm5_tp2_h200x2.json"
"""A full model plan's results (GLM-5 at TP 2 on 2 × H200: 10 probes, 312 points; per-rank samples left out, the
pooled stats kept), from benchmarks/results/plans."""


class _ShiftedTime:
    """`time` for the sampler with a monotonic clock we step, so rates are over a recorded 1 s tick."""

    def __init__(self, mono: list[float]) -> None:
        self._mono = mono

    def monotonic(self) -> float:
        return self._mono[0]

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


@functools.lru_cache(maxsize=2)
def telemetry_snapshot(gpus: int = 2) -> TelemetrySnapshot:
    """H200s under load: the NVML helper's real recording (`h200x1-load`, replicated to `gpus` GPUs) read by the
    real sampler over two ticks one second apart, so counters, rates and clock-event shares are present."""
    backend = FakeNvmlBackend(load_recording(RECORDING), replicate_to=gpus, clock=None)
    sampler = telemetry_sampler.TelemetrySampler(Nvml(backend))
    mono = [1000.0]
    real_time = telemetry_sampler.time
    telemetry_sampler.time = _ShiftedTime(mono)  # type: ignore[assignment]
    try:
        sampler.sample()
        backend.advance()
        mono[0] += 1.0
        return sampler.sample()
    finally:
        telemetry_sampler.time = real_time


def probe_results() -> tuple[ProbeResult, ...]:
    """The probe-results fixture (all-reduce sweep, membw, a timed-out probe)."""
    return tuple(load_results(PROBES_JSON))


@functools.lru_cache(maxsize=1)
def plan_results() -> tuple[ProbeResult, ...]:
    """A full model plan's results (`PLAN_JSON`)."""
    return tuple(load_results(PLAN_JSON))


def gpu_check_results(gpus: int) -> tuple[CheckResult, ...]:
    """The GPU checks over the H200 recording replicated to `gpus` GPUs (no host tree, one sample)."""
    nvml = Nvml(FakeNvmlBackend(load_recording(RECORDING), replicate_to=gpus, clock=None))
    return tuple(gpu_checks(None, nvml, window_s=0))


def budget() -> Budget:
    """A Budget for GLM-5-NVFP4 at TP8: composed segments (one still missing its GEMM data), the observed 95 ms
    step and the 309 tok/s target (docs/architecture.md defaults)."""
    segments = (
        Segment("attention", 21.4, "measured", "MLA decode at 16k context", n_ops=78, provenance_kind="measured_now"),
        Segment("attention_proj", 6.1, "interpolated", "GEMM curve vs M", n_ops=312, provenance_kind="measured_now"),
        Segment("routed_experts", 28.7, "measured", "grouped GEMM", n_ops=75, provenance_kind="measured_earlier"),
        Segment("shared_experts", 3.2, "measured", "GEMM", n_ops=75, provenance_kind="measured_now"),
        Segment("routing", 1.9, "estimated", "roofline", n_ops=75, provenance_kind="estimate"),
        Segment("communication", 17.6, "measured", "all-reduce", n_ops=156, provenance_kind="measured_now"),
        Segment("norms", 2.4, "measured", "rmsnorm", n_ops=313, provenance_kind="measured_now"),
        Segment(
            "lm_head",
            None,
            "missing",
            "no sampling probe yet",
            n_ops=1,
            missing_keys=("sampling:x",),
            provenance_kind="missing",
        ),
        Segment("launch", 4.3, "measured", "graph replay", n_ops=1, provenance_kind="measured_now"),
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
        observed=compose.default_observed("no --server"),
        hardware_text="NVIDIA H200 (detected by NVML)",
        device_kind="cuda",
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


def observed() -> ServerStep:
    return ServerStep(
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
        taken_unix_s=1795959000.0,
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
