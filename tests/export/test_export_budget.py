"""The exporter's budget for --model: probe results (shaped as the probes record them: a `key` param, role, variant,
the all-reduce sweep by mode) composed through the one composition (`pipeline.composition.compose`) against the live
server's step, and exported with each component's status and provenance."""

from __future__ import annotations

import functools
import subprocess
import time

import pytest
from prometheus_client.parser import text_string_to_metric_families

from decodetop.budget.compose import Budget
from decodetop.budget.keys import AllreduceKey, GemmKey, MoeKey
from decodetop.budget.plan import ProbePlan, build_plan
from decodetop.budget.scenario import ModelSource, Scenario, TpChoice, build_scenario
from decodetop.collectors.serving import ServerState, ServerStatus, ServerStep
from decodetop.export.prometheus import ExportState, render_exposition
from decodetop.export.schedule import BudgetComposer
from decodetop.probes.results import Measurement, ProbeResult, ProbeStatus, Stats
from tests.conftest import require_tool

MODEL, TP = "glm-5-nvfp4", 8


@functools.lru_cache(maxsize=1)
def _scenario() -> Scenario:
    return build_scenario(ModelSource("preset", MODEL), TpChoice(TP, "--tp"))


@functools.lru_cache(maxsize=1)
def _plan() -> ProbePlan:
    return build_plan(_scenario().inventory())


@functools.lru_cache(maxsize=1)
def _results_cached() -> tuple[ProbeResult, ...]:
    return _results()


def _point(name: str, params: dict[str, object], median_us: float) -> Measurement:
    samples = [median_us * f for f in (0.97, 0.99, 1.0, 1.01, 1.04)]
    return Measurement(name, params, "us", stats=Stats.from_samples(samples, "us"), metrics={"time_us": median_us})


def _results() -> tuple[ProbeResult, ...]:
    """A GEMM result for every planned GEMM key (plus a slower FP8-style variant and sweep points), an MoE result
    with two implementations, and an all-reduce sweep in two modes."""
    plan = _plan()
    gemm: list[Measurement] = []
    for key in plan.by_probe("gemm"):
        assert isinstance(key, GemmKey)
        base = {
            "what": "gemm",
            "key": key.key_id,
            "curve": key.curve_id,
            "m": key.m,
            "variant": key.dtype,
            "role": "budget",
        }
        us = 2.0 + key.n * key.k / 2e6  # weight-streaming-like: grows with the matrix
        gemm.append(_point(key.key_id, base, us))
        gemm.append(_point(key.key_id + " [row-wise]", {**base, "variant": "row"}, us * 3))
        sweep = GemmKey(64, key.n, key.k, key.batch, key.dtype)
        gemm.append(_point(sweep.key_id, {**base, "key": sweep.key_id, "m": 64, "role": "sweep"}, us * 1.5))
    moe: list[Measurement] = []
    for key in plan.by_probe("moe"):
        assert isinstance(key, MoeKey)
        for variant, us in (("loop", 180.0), ("grouped", 95.0)):
            moe.append(
                _point(f"{key.key_id} [{variant}]", {"key": key.key_id, "variant": variant, "role": "budget"}, us)
            )
    allreduce = [
        _point(f"allreduce {size} {mode}", {"size_bytes": size, "mode": mode, "world_size": TP}, us + size / 2e5)
        for size in plan.allreduce_sweep_bytes
        for mode, us in (("pipelined", 13.0), ("graph", 6.5))
    ]
    return (
        ProbeResult("gemm", ProbeStatus.OK, {}, tuple(gemm)),
        ProbeResult("moe", ProbeStatus.OK, {}, tuple(moe)),
        ProbeResult("allreduce", ProbeStatus.OK, {}, tuple(allreduce)),
        ProbeResult("attention", ProbeStatus.FAILED, {}, (), error="CUDA out of memory"),
    )


def _step(ms: float) -> ServerStep:
    return ServerStep(
        step_ms=ms,
        itl_ms=ms,
        source="sglang",
        metric="sglang:inter_token_latency_seconds",
        samples=100,
        window_s=30.0,
        accept_length=1.0,
        accept_length_from="none",
        url="http://127.0.0.1:30000/metrics",
        taken_unix_s=time.time(),
    )


def test_budget_for_model_follows_observed_step() -> None:
    compose = BudgetComposer(_scenario(), 309.0, "cuda")
    budget = compose(_results_cached(), _step(52.5), None)
    assert isinstance(budget, Budget)
    assert budget.observed_ms == 52.5 and budget.observed_step.source == "server"
    assert budget.unexplained_ms == pytest.approx(52.5 - budget.total_ms)
    assert any(isinstance(k, AllreduceKey) and k.collective == "all_reduce" for k in _plan().by_probe("allreduce"))
    communication = budget.segment("communication")
    assert communication is not None and communication.ms is not None and communication.ms > 0
    routed = budget.segment("routed_experts")
    assert routed is not None and routed.status == "measured" and routed.provenance_kind == "measured_now"
    from decodetop.budget.components import Component

    moe_ops = _scenario().inventory().by_component()[Component.ROUTED_EXPERTS]
    instances = sum(op.count for op in moe_ops)
    assert routed.ms == pytest.approx(instances * 0.095)  # the faster MoE implementation (95 µs, not 180) counts
    attention = budget.segment("attention")
    assert attention is not None and attention.provenance_kind == "estimate"  # its probe failed: estimated, never 0
    # without a server step the default stands, marked as assumed and saying why
    down = ServerStatus(ServerState.TIMED_OUT, "http://127.0.0.1:30000/metrics: no complete answer within 2 s", "u")
    assumed = compose(_results_cached(), down, None)
    assert assumed.observed_ms == 95.0 and assumed.observed_step.assumed
    assert "no complete answer within 2 s" in assumed.observed_step.text
    # exported: one series per component, its provenance in the labels
    text = render_exposition(ExportState(budget=budget))
    assert (
        subprocess.run(
            [require_tool("promtool"), "check", "metrics"], input=text, capture_output=True, text=True, check=False
        ).returncode
        == 0
    )
    series = [s for f in text_string_to_metric_families(text) for s in f.samples]
    segments = {s.labels["component"]: s for s in series if s.name == "decodetop_budget_segment_seconds"}
    assert set(segments) == {seg.component for seg in budget.segments} | {"unexplained"}
    for seg in budget.segments:
        labels = segments[seg.component].labels
        assert (labels["status"], labels["provenance"]) == (seg.status, seg.provenance_kind)
    assert segments["routed_experts"].value == pytest.approx(routed.ms / 1e3)
    assert segments["attention"].labels["provenance"] == "estimate"
    (info,) = [s for s in series if s.name == "decodetop_budget_info"]
    assert info.labels["hardware"] == budget.hardware_text and "RTX PRO 6000" in info.labels["hardware"]
    observed = [s for s in series if s.name == "decodetop_budget_step_seconds" and s.labels["line"] == "observed"]
    assert [(s.labels["source"], s.value) for s in observed] == [("server", pytest.approx(0.0525))]
