"""The exporter's budget for --model: probe results (shaped as the probes record them: a `key` param, role, variant,
the all-reduce sweep by mode) composed by the probe engine's `compose_from_results` against the live server's step,
and exported."""

from __future__ import annotations

import functools
import subprocess
from types import SimpleNamespace

import pytest
from prometheus_client.parser import text_string_to_metric_families

from conftest import require_tool
from decodetop.budget.compose import Budget
from decodetop.budget.deployment import Deployment
from decodetop.budget.inventory import build_inventory
from decodetop.budget.keys import AllreduceKey, GemmKey, MoeKey
from decodetop.budget.plan import ProbePlan, build_plan
from decodetop.budget.spec import load_preset
from decodetop.export.prometheus import ExportState, render_exposition
from decodetop.export.service import budget_composer
from decodetop.probes.results import Measurement, ProbeResult, ProbeStatus, Stats

MODEL, TP = "glm-5-nvfp4", 8


@functools.lru_cache(maxsize=1)
def _plan() -> ProbePlan:
    return build_plan(build_inventory(load_preset(MODEL), Deployment(tp=TP)))


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


def test_budget_for_model_follows_observed_step() -> None:
    compose = budget_composer(MODEL, TP)
    budget = compose(_results_cached(), SimpleNamespace(step_ms=52.5))
    assert isinstance(budget, Budget)
    assert budget.observed_ms == 52.5
    assert budget.unexplained_ms == pytest.approx(52.5 - budget.total_ms)
    assert any(isinstance(k, AllreduceKey) and k.collective == "all_reduce" for k in _plan().by_probe("allreduce"))
    communication = budget.segment("communication")
    assert communication is not None and communication.ms is not None and communication.ms > 0
    routed = budget.segment("routed_experts")
    assert routed is not None and routed.status == "measured"
    from decodetop.budget.components import Component

    moe_ops = build_inventory(load_preset(MODEL), Deployment(tp=TP)).by_component()[Component.ROUTED_EXPERTS]
    instances = sum(op.count for op in moe_ops)
    assert routed.ms == pytest.approx(instances * 0.095)  # the faster MoE implementation (95 µs, not 180) counts
    attention = budget.segment("attention")
    assert attention is not None and attention.status == "missing"  # its probe failed: missing, never 0
    assert not budget.complete
    # without a server step the budget's default observed time stands
    assert compose(_results_cached(), None).observed_ms == 95.0
    text = render_exposition(ExportState(budget=budget))
    assert (
        subprocess.run(
            [require_tool("promtool"), "check", "metrics"], input=text, capture_output=True, text=True, check=False
        ).returncode
        == 0
    )
    names = {s.name for f in text_string_to_metric_families(text) for s in f.samples}
    assert {"decodetop_budget_segment_seconds", "decodetop_budget_segment_status", "decodetop_budget_complete"} <= names
