"""Fixed data sources for Pilot and snapshot tests: no threads of their own, no probes, no NVML, a fixed clock.

The 8-GPU frame is the shape of the H200 recording (docs/reference/h200-machine.md: SM max 1980 MHz, mem 3201 MHz, PCIe
Gen5 x16, 700 W limit, GpuIdle at rest) replicated to 8 GPUs, as `--demo` does; stated in `source_note`."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from decodetop.budget.components import Component
from decodetop.budget.scenario import build_scenario, choose_tp, model_source
from decodetop.collectors.checks.result import CheckResult, Status
from decodetop.history import KIND_PROBE, History
from decodetop.pipeline.context import BudgetContext, gpu_hint
from decodetop.pipeline.fingerprints import fingerprint_of
from decodetop.pipeline.result_history import compact_payload
from decodetop.pipeline.scenario_flags import ScenarioFlags
from decodetop.probes.results import ProbeResult
from decodetop.settings import Settings
from decodetop.tui.model import (
    BudgetSegment,
    BudgetView,
    GpuProcessView,
    GpuView,
    ProbeCurves,
    ProbeState,
    ProbeView,
    RankValue,
    Series,
    TelemetryFrame,
)
from decodetop.tui.probe_group import GroupInfo, scenario_for
from decodetop.tui.sources import ProbeOutcome, ProgressCallback, Sources

NOW_S = 1_800_000_000.0
"""The fixed clock of every UI test."""
GIB = 1024**3


def fixed_clock() -> float:
    return NOW_S


def h200_gpu(index: int, **changes: Any) -> GpuView:
    base: dict[str, Any] = {
        "index": index,
        "name": "NVIDIA H200",
        "util_pct": 0.0,
        "sm_clock_mhz": 345.0,
        "sm_clock_max_mhz": 1980.0,
        "mem_clock_mhz": 3201.0,
        "pcie_gen": 5,
        "pcie_gen_max": 5,
        "pcie_width": 16,
        "pcie_width_max": 16,
        "pcie_tx_gbps": 0.1,
        "pcie_rx_gbps": 0.2,
        "power_w": 76.0,
        "power_limit_w": 700.0,
        "temp_c": 31.0,
        "clock_reasons": ("GpuIdle",),
        "mem_used_bytes": 1 * GIB,
        "mem_total_bytes": 141 * GIB,
        # the 8 distinct buses of an 8-GPU host (what the fake NVML's replication gives: bus + copy)
        "bus_id": f"0000:{index:02x}:06.0",
        "mem_util_pct": 0.0,
        "mem_clock_max_mhz": 3201.0,
        "ecc_enabled": True,
        "ecc_uncorrected": 0,
        "ecc_corrected": 0,
        "nvlink_active": 18,
        "nvlink_links": 18,
        "processes": (),
    }
    base.update(changes)
    return GpuView(**base)


SERVING_PROCESSES = {
    0: (
        GpuProcessView(4242, 120 * GIB, "compute", "vllm", "python -m vllm.entrypoints.openai.api_server --tp 2", 71.0),
    ),
    1: (GpuProcessView(4243, 118 * GIB, "compute", "vllm", "python -m vllm.worker --rank 1", 69.0),),
    2: (
        GpuProcessView(5150, 3 * GIB, "compute", "alice", "python train.py --debug", 4.0),
        GpuProcessView(5151, 512 * 1024**2, "compute", "bob", "jupyter-lab", None),
    ),
}
"""A serving engine on GPUs 0-1 and two stray users on GPU 2 (pid, GPU memory, user, command, SM share)."""


def eight_gpu_frame(t: float = NOW_S, *, processes: bool = False, util: float | None = None) -> TelemetryFrame:
    """The 8-GPU host; with `processes`, a serving engine and stray users hold GPUs 0-2; `util` overrides GPU 0's
    utilisation (history tests feed a changing one)."""
    gpus = [h200_gpu(i) for i in range(8)]
    if processes:
        for index, procs in SERVING_PROCESSES.items():
            used = sum(p.used_mem_bytes or 0 for p in procs)
            gpus[index] = h200_gpu(index, processes=procs, mem_used_bytes=used, util_pct=70.0, mem_util_pct=40.0)
    if util is not None:
        gpus[0] = dataclasses.replace(gpus[0], util_pct=util, power_w=76.0 + 6.0 * util)
    gpus[3] = h200_gpu(3, pcie_width=8, util_pct=95.0, sm_clock_mhz=1410.0, clock_reasons=("SwPowerCap",))
    gpus[5] = h200_gpu(5, temp_c=88.0, clock_reasons=("HwThermalSlowdown",))
    return TelemetryFrame(
        taken_at_s=t,
        gpus=tuple(gpus),
        source_note="fake NVML replaying the 2×H200 recording, replicated to 8 GPUs",
        sample_ms=2.5,
    )


NO_GPU_FRAME = TelemetryFrame(taken_at_s=NOW_S, unavailable_reason="NVML library not found (no NVIDIA driver)")


class FakeTelemetry:
    """Delivers given frames when started (synchronously, on start) and records close calls."""

    def __init__(self, frames: Sequence[TelemetryFrame] = (NO_GPU_FRAME,)) -> None:
        self.frames = list(frames)
        self.closed = False
        self.on_frame: Callable[[TelemetryFrame], None] | None = None

    def start(self, on_frame: Callable[[TelemetryFrame], None]) -> None:
        self.on_frame = on_frame
        for frame in self.frames:
            on_frame(frame)

    def close(self) -> None:
        self.closed = True


PROBES = (("allreduce", "all-reduce"), ("gemm", "GEMM at decode shapes"), ("launch", "kernel launch"))


class FakeProbes:
    """Scripted probe group. `script[probe_id]` is the state it ends in; `gate` holds runs until released."""

    def __init__(self, script: Mapping[str, ProbeState] | None = None, hold: bool = False) -> None:
        self.script = dict(script or {})
        self.runs: list[str] = []
        self.cancelled = 0
        self.closed = False
        self.gate = threading.Event()
        if not hold:
            self.gate.set()
        self._cancel = threading.Event()
        self.started = threading.Event()

    def plan(self, settings: Settings) -> list[ProbeView]:
        return [ProbeView(probe_id=pid, title=title) for pid, title in PROBES]

    def run(self, probe_id: str, on_progress: ProgressCallback) -> ProbeOutcome:
        self.runs.append(probe_id)
        self.started.set()
        on_progress(0.5, "size 4 KiB")
        while not self.gate.wait(0.01):
            if self._cancel.is_set():
                break
        if self._cancel.is_set():
            self._cancel.clear()
            return ProbeOutcome(view=ProbeView(probe_id, "", ProbeState.CANCELLED, error="cancelled by the user"))
        state = self.script.get(probe_id, ProbeState.DONE)
        return outcome_for(probe_id, state)

    def restore(self, probe_id: str, payload: Mapping[str, Any], measured_at_s: float) -> ProbeOutcome | None:
        value = payload.get("value")
        if not isinstance(value, str):
            return None
        return ProbeOutcome(
            view=ProbeView(probe_id, "", ProbeState.DONE, value_text=value, measured_at_s=measured_at_s),
            payload=payload,
            result=float(payload.get("ms", 0.0)),
        )

    def cancel(self) -> None:
        self.cancelled += 1
        self._cancel.set()

    def close(self) -> None:
        self.closed = True
        self.gate.set()


def outcome_for(probe_id: str, state: ProbeState, at_s: float = NOW_S - 30) -> ProbeOutcome:
    if state is ProbeState.DONE:
        view = ProbeView(
            probe_id,
            "",
            state,
            value_text={"allreduce": "41.2 µs @ 32 KiB", "gemm": "2.91 TB/s @ M=1", "launch": "9.6 µs/op"}.get(
                probe_id, "1.0"
            ),
            measured_at_s=at_s,
            ranks=(RankValue(0, "41.0 µs", "cuda:0"), RankValue(1, "41.4 µs", "cuda:1")),
            spread_text="p10 39.8 µs · p90 44.0 µs · ranks ±0.5%",
            telemetry_text=("SM 1980/1980 MHz on every GPU", "clock events: none"),
        )
        ms = {"allreduce": 6.55, "gemm": 3.2, "launch": 1.5}.get(probe_id, 1.0)
        return ProbeOutcome(view=view, payload={"value": view.value_text, "ms": ms}, result=ms)
    if state is ProbeState.FAILED:
        view = ProbeView(
            probe_id,
            "",
            state,
            error="rank 1: RuntimeError: NCCL error: unhandled system error",
            traceback=(
                'Traceback (most recent call last):\n  File "worker.py", line 12, in run\nRuntimeError: NCCL error'
            ),
            measured_at_s=at_s,
        )
        return ProbeOutcome(view=view)
    if state is ProbeState.TIMED_OUT:
        return ProbeOutcome(
            view=ProbeView(probe_id, "", state, error="no answer within 300 s; ranks terminated", measured_at_s=at_s)
        )
    if state is ProbeState.UNSUPPORTED:
        return ProbeOutcome(
            view=ProbeView(probe_id, "", state, error="CUDA graphs need a GPU (CPU ranks)", measured_at_s=at_s)
        )
    return ProbeOutcome(view=ProbeView(probe_id, "", state, measured_at_s=at_s))


_MS = {
    Component.ATTENTION: 1.2,
    Component.ATTENTION_PROJ: 0.41,
    Component.ROUTED_EXPERTS: 2.1,
    Component.SHARED_EXPERTS: 0.35,
    Component.ROUTING: 0.12,
    Component.NORMS: 0.3,
    Component.LM_HEAD: 0.22,
}


class FakeBudget:
    """A GLM-5-like budget: fixed component figures, plus communication/launch from the fake probe results.
    `scale` multiplies a component's figure (a planted slowdown for the baseline tests)."""

    def __init__(self) -> None:
        self.scale: dict[str, float] = {}
        self.server_step_ms: float | None = None
        """The last step a --server answer gave (the real source's rule is tested on PresetBudget)."""

    def models(self) -> Sequence[tuple[str, str]]:
        return [("glm-5", "GLM-5 (NVFP4)"), ("llama-3.1-70b", "Llama 3.1 70B (BF16)"), ("deepseek-v3", "DeepSeek-V3")]

    def compose(self, settings: Settings, results: Mapping[str, object], now_s: float) -> BudgetView:
        segments = []
        for component in Component:
            ms = _MS.get(component)
            status = "measured"
            at: float | None = NOW_S - 120
            if component is Component.COMMUNICATION:
                ms = _as_float(results.get("allreduce"))
            elif component is Component.LAUNCH:
                ms = _as_float(results.get("launch"))
            elif component is Component.DENSE_MLP:
                ms = _as_float(results.get("gemm"))
            if component is Component.ROUTING:
                status = "interpolated"
            if ms is None:
                status, at, ms = "missing", None, 0.0
            ms *= self.scale.get(component.value, 1.0)
            segments.append(BudgetSegment(component.value, component.label, ms, status, at))
        return BudgetView(
            title=f"{settings.model} · TP{settings.tp or 8}",
            segments=tuple(segments),
            observed_ms=self.server_step_ms or settings.observed_ms,
            target_ms=settings.target_ms,
            roofline_ms=2.1,
        )

    def note_server(self, answer: object) -> None:
        """A --server answer: its step is the observed one."""
        step = getattr(answer, "step_ms", None)
        if isinstance(step, float):
            self.server_step_ms = step

    def note_trace(self, traced: object) -> None:
        """A trace's steps (the fixed budget keeps its observed step)."""

    def accepts(self, fingerprint: object, settings: Settings) -> bool:
        """Every stored record feeds the fixed budget (the real source's rules are tested on PresetBudget)."""
        return True

    def context(self, settings: Settings, results: Mapping[str, object], now_s: float) -> BudgetContext:
        """The fixed budget composes no results: the what-if screen over it predicts the settings' scenario from the
        roofline of the 8 fake H200s."""
        scenario = scenario_for(settings, GroupInfo(8, "cuda", "fake GPUs", "of the demo"), ScenarioFlags())
        return BudgetContext(scenario, (), gpu=gpu_hint(seen="NVIDIA H200"), now_s=now_s)

    def curves(self, results: Mapping[str, object]) -> ProbeCurves:
        if "allreduce" not in results:
            return ProbeCurves()
        sizes = tuple(float(8 * 4**i) for i in range(10))
        return ProbeCurves(
            allreduce_us_by_mode=(
                Series("pipelined", sizes, tuple(13.0 + s / 2e5 for s in sizes)),
                Series("graph", sizes, tuple(6.5 + s / 2.2e5 for s in sizes)),
            ),
            gemm_gbps_by_shape=(Series("7168×18432", (1, 2, 4, 8, 16), (2900, 2950, 3000, 3010, 3020)),),
        )


def _as_float(value: object) -> float | None:
    return float(value) if isinstance(value, (int, float)) else None


def failing_checks() -> list[CheckResult]:
    return [
        CheckResult(
            "C1",
            "CPU frequency governor",
            Status.WARN,
            "powersave",
            "performance",
            "slow ramp",
            "cpupower frequency-set -g performance",
        ),
        CheckResult(
            "N3",
            "clock event reasons",
            Status.FAIL,
            "HwSlowdown on GPU5",
            "none under load",
            "clocks halve",
            "check cooling",
        ),
        CheckResult("C3", "NUMA balancing", Status.PASS, "0", "0"),
        CheckResult(
            "P1",
            "PCIe link at max",
            Status.FAIL,
            "GPU3 Gen5 x8",
            "Gen5 x16",
            "half the H2D bandwidth",
            "reseat the card",
        ),
        CheckResult("C5", "kernel", Status.INFO, "6.18.44", "any"),
        CheckResult("N12", "persistence mode", Status.PASS, "on", "on"),
    ]


class FakeChecks:
    def __init__(self, checks: Sequence[CheckResult] | None = None, error: Exception | None = None) -> None:
        self.checks = list(checks if checks is not None else failing_checks())
        self.error = error

    def run(self) -> list[CheckResult]:
        if self.error is not None:
            raise self.error
        return list(self.checks)


def make_sources(
    *,
    telemetry: FakeTelemetry | None = None,
    probes: FakeProbes | None = None,
    checks: FakeChecks | None = None,
    run_probes: bool = False,
    history: Any = None,
    budget: FakeBudget | None = None,
) -> Sources:
    return Sources(
        telemetry=telemetry or FakeTelemetry(),
        probes=probes or FakeProbes(),
        budget=budget or FakeBudget(),
        checks=checks or FakeChecks(),
        history=history,
        clock=fixed_clock,
        run_probes_at_start=run_probes,
    )


def record_results(
    history: History,
    results: Sequence[ProbeResult],
    group: GroupInfo,
    model: str,
    *,
    tp: int | None = None,
    flags: ScenarioFlags | None = None,
    at_s: float = NOW_S - 600,
) -> None:
    """Store `results` in `history` as a session of `model` on `group` would have: each with the fingerprint of
    the scenario (`tp`: None chooses as the app does; `flags`: the scenario flags), recorded at `at_s`."""
    tp_choice = choose_tp(tp, group_size=group.size, group_label=group.label, group_where=group.where)
    fields = flags.deployment_fields() if flags is not None else {}
    scenario = build_scenario(model_source(model, None), tp_choice, **fields)  # type: ignore[arg-type]
    for r in results:
        assert r.environment is not None
        fp = fingerprint_of(r.environment, scenario)
        history.record(KIND_PROBE, r.probe, compact_payload(r.to_dict()), recorded_at_s=at_s, fingerprint=fp)
