"""The one plan runner (`decodetop.pipeline.plan_runner`), without processes: progress, cancel and stop, the GPU
guard before every run, telemetry paused for latency-sensitive probes only, callbacks for every result, a group that
cannot run named as a failed result, and a model plan composed through the one composition."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from decodetop.budget.plan import build_plan
from decodetop.collectors.fake_nvml import fake_nvml
from decodetop.pipeline.context import BudgetContext
from decodetop.pipeline.gpu_guard import GpuGuard, GpusHeldError
from decodetop.pipeline.plan_runner import PlanRunner, run_model_plan
from decodetop.probes import gpuinfo
from decodetop.probes.registry import ProbeRegistry
from decodetop.probes.results import ProbeResult, ProbeStatus
from tests.probes.test_plan_hooks import tiny_scenario


class _FakeGroup:
    """Answers every probe at once (no processes); `cancel_at` names a probe that comes back cancelled."""

    def __init__(self, cancel_at: str = "", broken: str = "") -> None:
        self.cancel_at = cancel_at
        self.broken = broken
        self.calls: list[tuple[str, dict[str, Any]]] = []

    def run(self, probe: str, params: Any = None, *, timeout_s: Any = None, on_progress: Any = None) -> ProbeResult:
        if probe == self.broken:
            raise RuntimeError("rank 1 could not import torch")
        self.calls.append((probe, dict(params or {})))
        if on_progress is not None:
            on_progress(type("P", (), {"text": "key 1/1 x", "done": 0, "total": 1})())
        status = ProbeStatus.CANCELLED if probe == self.cancel_at else ProbeStatus.OK
        return ProbeResult(probe, status, dict(params or {}), (), world_size=2, message=status.value)

    def rank_pids(self) -> list[int]:
        return [4242]


def test_a_model_plan_relays_progress_and_stops_on_cancel(tmp_path: Path) -> None:
    scenario = tiny_scenario(tmp_path)
    seen: list[str] = []
    fake = _FakeGroup(cancel_at="attention")
    run = run_model_plan(
        PlanRunner(lambda: fake),
        BudgetContext(scenario),
        world_size=2,
        device_kind="cpu",
        on_progress=lambda p: seen.append(p.line()),
    )
    assert [c[0] for c in fake.calls] == ["launch", "gemm", "attention"]
    assert "probe 2/8 gemm: key 1/1 x" in seen and "probe 1/8 launch: starting" in seen
    assert any("cancelled during attention (probe 3/8)" in n for n in run.notes)
    assert not run.budget.complete  # nothing was measured: every component is missing, none is 0
    assert all(s.status == "missing" and s.ms is None for s in run.budget.segments)


def test_a_model_plan_stops_between_probes(tmp_path: Path) -> None:
    scenario = tiny_scenario(tmp_path)
    fake = _FakeGroup()
    run = run_model_plan(
        PlanRunner(lambda: fake),
        BudgetContext(scenario),
        world_size=2,
        device_kind="cpu",
        should_stop=lambda: len(fake.calls) >= 2,
    )
    assert [r.probe for r in run.results] == ["launch", "gemm"]
    assert any("stopped before attention" in n for n in run.notes)
    gemm_params = fake.calls[1][1]
    own = [k.key_id for k in build_plan(scenario.inventory()).by_probe("gemm")]
    assert gemm_params["keys"][: len(own)] == own  # then the curve plan's other TP shards


def test_telemetry_pauses_for_latency_sensitive_probes_only() -> None:
    """One rule on every surface: every probe timing µs-scale work pauses the costly NVML calls; membw does not."""
    paused: list[bool] = []

    @contextlib.contextmanager
    def pause() -> Iterator[None]:
        paused.append(True)
        yield

    runner = PlanRunner(_FakeGroup, pause=pause)
    runner.run("allreduce")
    runner.run("gemm")
    assert len(paused) == 2
    runner.run("membw")
    assert len(paused) == 2
    registry = ProbeRegistry()
    assert [s.name for s in registry.specs(include_hidden=True) if not s.latency_sensitive] == ["membw"]


def test_every_result_reaches_every_callback_and_a_broken_group_is_a_failed_result() -> None:
    got: list[str] = []
    runner = PlanRunner(lambda: _FakeGroup(broken="gemm"), on_result=[lambda r: got.append(r.probe)])
    outcome = runner.run_all([type("R", (), {"probe": p, "params": {}})() for p in ("launch", "gemm", "norms")])
    assert got == ["launch", "gemm", "norms"]
    broken = outcome.results[1]
    assert broken.status is ProbeStatus.FAILED and broken.error == "RuntimeError: rank 1 could not import torch"
    assert outcome.failures == ("gemm: failed (RuntimeError: rank 1 could not import torch)",)


def test_the_guard_refuses_a_run_on_held_gpus_until_consent() -> None:
    """The 2×H200 load recording holds another process on each GPU: no run starts, the line names the processes."""
    nvml = fake_nvml("h200x2-load")
    gpus = gpuinfo.visible_gpus(nvml)
    guard = GpuGuard(lambda: gpus, nvml=nvml)
    fake = _FakeGroup()
    runner = PlanRunner(lambda: fake, guard=guard)
    with pytest.raises(GpusHeldError, match=r"other processes hold GPU memory \(GPU 0: pid \d+ .*pass --force"):
        runner.run("gemm")
    assert fake.calls == []
    outcome = runner.run_all([type("R", (), {"probe": "gemm", "params": {}})()])
    assert outcome.results == () and outcome.refused is not None
    assert outcome.notes[0].startswith("stopped before gemm (probe 1/1): other processes hold GPU memory")
    guard.allow()  # the user consented (the UI's modal, or --force)
    assert runner.run("gemm").ok
