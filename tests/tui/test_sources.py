"""The sources beneath the UI (telemetry, probes, budget views) turning their packages' types into the UI's view types,
over data recorded on the H200 machine."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from decodetop.collectors.fake_nvml import FakeNvmlBackend, load_recording
from decodetop.collectors.nvml import NoNvmlBackend, Nvml
from decodetop.collectors.telemetry import TelemetrySampler
from decodetop.errors import UserInputError
from decodetop.probes.results import ProbeResult, ProbeStatus, load_results
from decodetop.settings import Settings
from decodetop.tui.launch import parse_gpus
from decodetop.tui.model import ProbeState
from decodetop.tui.sources.budget import PresetBudget
from decodetop.tui.sources.probe_curves import allreduce_curves
from decodetop.tui.sources.probe_views import headline, measured_at, probe_view
from decodetop.tui.sources.telemetry_views import telemetry_frame

H200_RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "primitives" / "h200x1.json"


@pytest.fixture(scope="module")
def h200() -> dict[str, ProbeResult]:
    return {r.probe: r for r in load_results(H200_RESULTS)}


def test_probe_view_of_a_recorded_h200_allreduce(h200: dict[str, ProbeResult]) -> None:
    view = probe_view(h200["allreduce"], title="allreduce")
    assert view.state is ProbeState.DONE
    assert view.value_text.startswith("18.6 µs @ 8 B pipelined")
    assert view.ranks and view.ranks[0].rank == 0
    assert "p10" in view.spread_text and "samples" in view.spread_text
    assert any(key == "backend" for key, _ in view.details)


def test_probe_view_of_failures_keeps_the_error_and_the_traceback(h200: dict[str, ProbeResult]) -> None:
    failed = dataclasses.replace(
        h200["launch"], status=ProbeStatus.FAILED, error="boom", error_rank=1, traceback="Traceback...", measurements=()
    )
    view = probe_view(failed)
    assert view.state is ProbeState.FAILED
    assert view.error == "rank 1: boom"
    assert view.traceback == "Traceback..."
    assert headline(failed) == ""
    for status, state in (
        (ProbeStatus.TIMED_OUT, ProbeState.TIMED_OUT),
        (ProbeStatus.UNSUPPORTED, ProbeState.UNSUPPORTED),
        (ProbeStatus.CANCELLED, ProbeState.CANCELLED),
    ):
        assert probe_view(dataclasses.replace(failed, status=status)).state is state


def test_allreduce_curves_one_series_per_mode(h200: dict[str, ProbeResult]) -> None:
    series = {s.label: s for s in allreduce_curves(h200["allreduce"])}
    assert set(series) == {"graph", "pipelined", "synced"}
    assert series["pipelined"].x[0] == 8.0
    assert list(series["graph"].x) == sorted(series["graph"].x)


def test_budget_uses_the_measured_launch_cost_and_copy_bandwidth(h200: dict[str, ProbeResult]) -> None:
    times = measured_at(h200)
    assert set(times) == {"allreduce", "launch", "membw"}
    view = PresetBudget(lambda: "NVIDIA H200").compose(Settings(model="glm-5-nvfp4", tp=8), h200, 0.0)
    by_key = {s.key: s for s in view.segments}
    assert by_key["launch"].status == "measured"  # graph per-node cost from the launch probe
    assert by_key["launch"].measured_at_s == times["launch"]
    # one H200: the all-reduce curve is not used for a TP8 plan (the planner's rule), so communication is estimated
    assert by_key["communication"].status == "estimated"
    assert by_key["attention"].status == "estimated"
    assert view.observed_ms == 95.0
    assert view.target_ms == pytest.approx(1000 / 309)
    assert view.roofline_ms is not None and view.roofline_ms > 0
    assert "H200" in view.note


def test_the_plan_on_cpu_ranks_lists_the_models_probes() -> None:
    from decodetop.probes.controller import GroupLayout
    from decodetop.tui.sources.probes import ControllerProbes

    probes = ControllerProbes(lambda: None, layout=lambda: GroupLayout("cpu", 2))  # type: ignore[arg-type,return-value]
    views = probes.plan(Settings(model="glm-5-nvfp4", tp=8))
    names = [v.probe_id for v in views]
    assert names[0] == "launch"
    assert {"gemm", "moe", "attention"} <= set(names)
    assert all(dict(v.details)["keys measured"].isdigit() for v in views)
    assert probes.plan_notes  # the TP8 collectives cannot be measured on 2 ranks, and it says so


def test_budget_without_results_is_all_estimates_and_names_the_assumed_gpu() -> None:
    view = PresetBudget().compose(Settings(model="llama-3.1-70b", tp=4), {}, 0.0)
    assert {s.status for s in view.segments} <= {"estimated", "missing"}
    assert "0 of 7 components measured, 7 roofline estimates" in view.note
    assert "(assumed: no --gpu and no GPU seen)" in view.hardware_text


def test_models_lists_the_presets() -> None:
    names = [name for name, _ in PresetBudget().models()]
    assert "glm-5-nvfp4" in names and "llama-3.1-70b" in names


def test_telemetry_frame_from_the_h200_recording_replicated_to_8() -> None:
    nvml = Nvml(FakeNvmlBackend(load_recording("h200x1-load"), replicate_to=8, clock=None))
    frame = telemetry_frame(TelemetrySampler(nvml).sample(processes=False))
    assert len(frame.gpus) == 8
    gpu = frame.gpus[0]
    assert gpu.sm_clock_max_mhz == 1980.0
    assert gpu.pcie_gen_max == 5 and gpu.pcie_width_max == 16
    assert gpu.power_limit_w == pytest.approx(700.0)
    assert "replicated 1→8" in frame.source_note
    assert frame.unavailable_reason == ""


def test_telemetry_frame_without_nvml_says_why() -> None:
    frame = telemetry_frame(TelemetrySampler(Nvml(NoNvmlBackend())).sample(processes=False))
    assert frame.gpus == ()
    assert "not found" in frame.unavailable_reason


@pytest.mark.parametrize(("text", "gpus"), [("0,1,2,3", (0, 1, 2, 3)), ("0-3", (0, 1, 2, 3)), ("4, 6-7", (4, 6, 7))])
def test_parse_gpus(text: str, gpus: tuple[int, ...]) -> None:
    assert parse_gpus(text) == gpus


@pytest.mark.parametrize("text", ["", "a", "3-1", "0,0", "-1"])
def test_parse_gpus_rejects(text: str) -> None:
    with pytest.raises(UserInputError, match="--gpus"):
        parse_gpus(text)


def test_history_payload_drops_raw_samples_but_restores(h200: dict[str, ProbeResult]) -> None:
    from decodetop.pipeline.result_history import compact_payload
    from decodetop.tui.sources.probes import ControllerProbes

    payload = compact_payload(h200["allreduce"].to_dict())
    assert all("samples" not in r for m in payload["measurements"] for r in m["per_rank"])
    outcome = ControllerProbes(lambda: None).restore("allreduce", payload, 5.0)  # type: ignore[arg-type,return-value]
    assert outcome is not None and outcome.view.value_text == probe_view(h200["allreduce"]).value_text
    assert ControllerProbes(lambda: None).restore("allreduce", {"bad": 1}, 5.0) is None  # type: ignore[arg-type,return-value]


def test_a_busy_gpu_refuses_probes_with_the_reason() -> None:
    """The plan runner's GPU guard (the 2×H200 load recording: another process on each GPU): no group is spawned,
    the row says why in the UI's words (its keys)."""
    from decodetop.collectors.fake_nvml import fake_nvml
    from decodetop.pipeline.gpu_guard import GpuGuard
    from decodetop.probes import gpuinfo
    from decodetop.tui.sources.probes import ControllerProbes

    nvml = fake_nvml("h200x2-load")
    gpus = gpuinfo.visible_gpus(nvml)
    made: list[int] = []
    probes = ControllerProbes(
        lambda: made.append(1),  # type: ignore[arg-type,return-value,func-returns-value]
        guard=GpuGuard(lambda: gpus, nvml=nvml),
    )
    outcome = probes.run("gemm", lambda fraction, note: None)
    assert outcome.view.state is ProbeState.UNSUPPORTED
    assert "in use by other processes" in outcome.view.error and "--force" in outcome.view.error
    assert made == []  # no group was spawned


class _RecordedGroup:
    """Stands in for a spawned probe group: answers each probe with a result recorded on the H200."""

    backend = "nccl"

    def __init__(self, recorded: dict[str, ProbeResult]) -> None:
        self.recorded = recorded

    def run(
        self, probe: str, params: object = None, *, timeout_s: object = None, on_progress: object = None
    ) -> ProbeResult:
        return self.recorded[probe]

    def rank_pids(self) -> list[int]:
        return []


def test_a_live_run_goes_through_the_plan_runner(h200: dict[str, ProbeResult], tmp_path: Path) -> None:
    """The UI's probe source runs each probe as `decodetop probe` and the exporter do: telemetry paused around a
    latency-sensitive probe only, the result into the history with its fingerprint and to the taps, a callback's
    failure said once (the run stands)."""
    import contextlib

    from decodetop.budget.scenario import build_scenario, choose_tp, model_source
    from decodetop.history import History
    from decodetop.pipeline.fingerprints import SessionFingerprints
    from decodetop.pipeline.result_history import ResultHistory
    from decodetop.tui.sources.probes import ControllerProbes

    paused: list[bool] = []

    @contextlib.contextmanager
    def pause() -> object:
        paused.append(True)
        yield

    history = History(tmp_path / "history.jsonl")
    scenario = build_scenario(model_source("llama-3.1-70b", None), choose_tp(1))
    tapped: list[str] = []
    hooks = [ResultHistory(history, scenario=lambda: scenario, fingerprints=SessionFingerprints()), tapped.append]
    probes = ControllerProbes(lambda: _RecordedGroup(h200), pause=pause, on_result=hooks)  # type: ignore[arg-type,return-value]
    for probe in ("allreduce", "membw"):
        outcome = probes.run(probe, lambda fraction, note: None)
        assert outcome.view.state is ProbeState.DONE and outcome.problem == ""
    assert paused == [True]  # allreduce is latency-sensitive, membw (256 MiB copies) is not
    assert tapped == [h200["allreduce"], h200["membw"]]
    stored = history.load().entries
    assert [e.key for e in stored] == ["allreduce", "membw"]
    assert all(e.fingerprint is not None and e.fingerprint.scenario == scenario.fingerprint_id for e in stored)

    def full(result: ProbeResult) -> None:
        raise OSError(28, "No space left on device")

    probes.runner.on_result = (full,)
    outcome = probes.run("allreduce", lambda fraction, note: None)
    assert outcome.view.state is ProbeState.DONE
    assert outcome.problem == "result not kept: allreduce: OSError: [Errno 28] No space left on device"


def test_gemm_curves_one_series_per_weight_shape_fastest_variant() -> None:
    from decodetop.probes.results import Measurement, MeasurementStatus, Stats
    from decodetop.tui.sources.probe_curves import gemm_curves

    def point(curve: str, m: int, variant: str, gbps: float) -> Measurement:
        return Measurement(
            name=f"{curve} m={m} {variant}",
            params={"curve": curve, "m": m, "variant": variant, "role": "sweep"},
            unit="us",
            status=MeasurementStatus.OK,
            stats=Stats.from_samples([1.0], "us"),
            metrics={"gbps": gbps},
        )

    result = ProbeResult(
        probe="gemm",
        status=ProbeStatus.OK,
        params={},
        measurements=(
            point("gemm:n=2048,k=6144", 1, "bf16", 1000.0),
            point("gemm:n=2048,k=6144", 1, "fp8_rowwise", 1500.0),
            point("gemm:n=2048,k=6144", 4, "bf16", 1200.0),
            point("gemm:n=7168,k=18432", 1, "bf16", 2900.0),
        ),
    )
    series = {s.label: s for s in gemm_curves(result)}
    assert series["n=2048,k=6144"].x == (1.0, 4.0)
    assert series["n=2048,k=6144"].y == (1500.0, 1200.0)
    assert series["n=7168,k=18432"].y == (2900.0,)


def test_the_whatif_predictor_composes_a_variant_two_threads_ask_for_at_once_only_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A key pressed while the look-ahead predicts that very variant waits for it rather than composing it beside
    it; both get the one prediction."""
    import threading
    import types

    from decodetop.budget.scenario import build_scenario, choose_tp, model_source
    from decodetop.pipeline.context import BudgetContext
    from decodetop.tui.sources import whatif as whatif_source

    plan = (
        Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "plans" / "plan_llama-3.1-70b-tp1-h200x1.json"
    )
    scenario = build_scenario(model_source("llama-3.1-70b", None), choose_tp(1))
    predictor = whatif_source.WhatIfPredictor(BudgetContext(scenario, tuple(load_results(plan))))
    waiting = threading.Event()

    class NotedEvent(threading.Event):
        def wait(self, timeout: float | None = None) -> bool:
            waiting.set()  # the second thread is waiting for the first one's prediction
            return super().wait(timeout)

    monkeypatch.setattr(whatif_source, "threading", types.SimpleNamespace(Lock=threading.Lock, Event=NotedEvent))
    started, release = threading.Event(), threading.Event()
    asked: list[dict[str, str]] = []
    real = whatif_source.predict

    def held(base: BudgetContext, knobs: dict[str, str], **kwargs: object) -> object:
        asked.append(dict(knobs))
        started.set()
        release.wait(60)
        return real(base, knobs, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(whatif_source, "predict", held)
    got: list[object] = []
    threads = [threading.Thread(target=lambda: got.append(predictor.variant({"batch": "8"}))) for _ in range(2)]
    threads[0].start()
    assert started.wait(60)
    threads[1].start()
    assert waiting.wait(60)
    release.set()
    for t in threads:
        t.join(60)
    assert asked == [{"batch": "8"}] and len(got) == 2 and got[0] is got[1]
    assert predictor.kept({"batch": "8"}) is got[0] and predictor.kept({"batch": "16"}) is None
