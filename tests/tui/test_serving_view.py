"""The serving-time view: where other processes (a serving engine) hold the probe group's GPUs, the live UI starts
no probe on its own; it shows the stored budget of this scenario with its age and origin, says why probes did not
start, and runs them only after R (or r) and a confirmation; `--force` probes at start as before. Stored records of
other scenarios are listed on the budget's details (`b`) and never composed.

Real code throughout: the NVML process lists come from the fake NVML replaying the 2 × H200 load recording (two
compute processes, pids 1329 and 1330), through `probes.gpuinfo.compute_processes`; the probe source is the real
`ControllerProbes` (its plan for Llama-3.1-70B at TP 2, its runs through the plan runner and its GPU guard) over a
stand-in group that hands back the recorded plan run of tests/fixtures/budgets; the budget is the real `PresetBudget`.
"""

from __future__ import annotations

import dataclasses
import socket
import threading
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from decodetop.collectors.fake_nvml import fake_nvml
from decodetop.collectors.nvml import Nvml
from decodetop.collectors.serving import ServerStep
from decodetop.history import KIND_PROBE, History, local_host_id
from decodetop.pipeline.gpu_guard import GpuGuard, HeldGpus
from decodetop.pipeline.result_history import compact_payload
from decodetop.probes import gpuinfo
from decodetop.probes.controller import GroupLayout
from decodetop.probes.results import ProbeResult, load_results
from decodetop.settings import Settings
from decodetop.tui.app import DecodetopApp
from decodetop.tui.model import GpuProcessView, TelemetryFrame
from decodetop.tui.probe_group import GroupInfo
from decodetop.tui.screens.budget_details import BudgetDetailsScreen
from decodetop.tui.screens.confirm_probes import ConfirmProbesScreen
from decodetop.tui.sources import Sources
from decodetop.tui.sources.budget import PresetBudget
from decodetop.tui.sources.probes import ControllerProbes
from decodetop.tui.sources.server import ServerPoller
from decodetop.tui.trace_source import TraceOptions
from decodetop.tui.widgets.budget_bar import BudgetBar
from decodetop.tui.widgets.traced_bar import TracedBar

from .conftest import IdlePolls, make_app, wait_until
from .fakes import GIB, NOW_S, FakeChecks, FakeTelemetry, fixed_clock, h200_gpu, record_results
from .test_trace_bar import PLANTED

PLAN = Path(__file__).resolve().parents[1] / "fixtures" / "budgets" / "plan_llama-3.1-70b-tp2-h200x2.json"
HOST = "gpu-host-1"
"""The host name every test runs under (the provenance names it; a snapshot must not carry the CI machine's)."""
ENGINE = {1329: "python3", 1330: "python3"}
"""The load recording's two compute processes; the recording holds pids only, the test names them."""
SETTINGS = Settings(model="llama-3.1-70b", tp=None)
GROUP = GroupInfo(2, "cuda", "GPUs")
HELD_LINE = (
    "GPU 0, 1 are in use by other processes (pid 1329 python3, pid 1330 python3): probes not started; "
    "press R to run them anyway — they compete with production traffic"
)
STORED_AGO_S = 7200.0
SIZE = (120, 40)


@pytest.fixture(autouse=True)
def _fixed_host(monkeypatch: pytest.MonkeyPatch) -> None:
    """One host name, every GPU visible, the engine's processes named."""
    monkeypatch.setattr(socket, "gethostname", lambda: HOST)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(gpuinfo, "_process_name", lambda pid: ENGINE.get(pid, "?"))


def _iso(unix_s: float) -> str:
    return datetime.fromtimestamp(unix_s, UTC).isoformat()


def _results(device_kind: str = "cuda", at_s: float = NOW_S - STORED_AGO_S) -> list[ProbeResult]:
    """The recorded plan run, as taken on this host at `at_s` (on CPU ranks for `device_kind` "cpu")."""
    out = []
    for r in load_results(PLAN):
        assert r.environment is not None
        env = dataclasses.replace(r.environment, host=local_host_id(), world_size=2)
        if device_kind == "cpu":
            env = dataclasses.replace(env, device_kind="cpu", backend="gloo", gpu_names=(), driver=None)
        out.append(dataclasses.replace(r, environment=env, started_utc=_iso(at_s)))
    return out


class _Group:
    """The probe group's stand-in behind the real `ControllerProbes`: a run hands back the recorded result."""

    backend = "nccl"

    def __init__(self, results: Sequence[ProbeResult], runs: list[str], gate: threading.Event) -> None:
        self.results = {r.probe: r for r in results}
        self.runs = runs
        self.gate = gate

    def run(
        self,
        probe: str,
        params: Mapping[str, Any] | None,
        *,
        timeout_s: float | None = None,
        on_progress: Callable[[Any], None] | None = None,
    ) -> ProbeResult:
        self.runs.append(probe)
        assert self.gate.wait(10.0), "the test never released the run"
        return self.results[probe]

    def rank_pids(self) -> list[int]:
        return []

    def cancel(self) -> None:
        pass

    def close(self) -> None:
        pass


@dataclasses.dataclass
class _Setup:
    app: DecodetopApp
    guard: GpuGuard
    runs: list[str]
    history: History
    gate: threading.Event


def _frame() -> TelemetryFrame:
    """The two GPUs the engine holds (what the GPU table shows beside the budget)."""
    gpus = tuple(
        h200_gpu(
            i,
            processes=(GpuProcessView(pid, 1721761792, "compute", "vllm", f"{ENGINE[pid]} -m sglang.launch_server"),),
            mem_used_bytes=int(1.6 * GIB),
            util_pct=71.0,
        )
        for i, pid in enumerate(ENGINE)
    )
    return TelemetryFrame(taken_at_s=NOW_S, gpus=gpus, source_note="fake NVML replaying the 2×H200 load recording")


def _setup(
    tmp_path: Path,
    *,
    recording: str = "h200x2-load",
    forced: bool = False,
    others: bool = False,
    server: bool = False,
    trace: TraceOptions | None = None,
    hold: bool = False,
) -> _Setup:
    nvml: Nvml = fake_nvml(recording)
    gpus = gpuinfo.visible_gpus(nvml)
    guard = GpuGuard(lambda: gpus, nvml=nvml, forced=forced)
    runs: list[str] = []
    gate = threading.Event()
    if not hold:
        gate.set()
    history = History(tmp_path / "history.jsonl", clock=fixed_clock)
    record_results(history, _results(), GROUP, SETTINGS.model, at_s=NOW_S - STORED_AGO_S)
    if others:  # newer records of other scenarios: were they mixed in, the budget's ages would say 10m or 1m
        record_results(
            history, _results("cpu", NOW_S - 600), GroupInfo(2, "cpu", "CPU ranks"), SETTINGS.model, at_s=NOW_S - 600
        )
        gemm = next(r for r in _results(at_s=NOW_S - 60) if r.probe == "gemm")
        history.record(KIND_PROBE, "gemm", compact_payload(gemm.to_dict()), recorded_at_s=NOW_S - 60)
    fresh = _results(at_s=NOW_S - 1)
    probes = ControllerProbes(
        lambda: _Group(fresh, runs, gate),  # type: ignore[arg-type, return-value]
        layout=lambda: GroupLayout("cuda", 2, tuple(gpus)),
        guard=guard,
    )
    budget = PresetBudget(lambda: "NVIDIA H200", group=lambda: GROUP, session_start_s=NOW_S - 30)
    poller = None
    if server:
        budget.server_url = _Server.url
        poller = ServerPoller(_Server(), period_s=0.05)  # the app hands each answer to the budget
    sources = Sources(
        telemetry=FakeTelemetry([_frame()]),
        probes=probes,
        budget=budget,
        checks=FakeChecks(),
        history=history,
        clock=fixed_clock,
        run_probes_at_start=True,
        server=poller,
        trace=trace,
        gpu_guard=guard,
    )
    return _Setup(make_app(sources, SETTINGS), guard, runs, history, gate)


class _Server:
    """A serving engine's /metrics that reads 38.4 ms per step over a 30 s window (more than the probes explain)."""

    url = "http://127.0.0.1:30000/metrics"

    def poll(self) -> ServerStep:
        return ServerStep(
            step_ms=38.4,
            itl_ms=38.4,
            source="sglang",
            metric="sglang:inter_token_latency_seconds",
            samples=400,
            window_s=30.0,
            accept_length=1.0,
            accept_length_from="none",
            url=self.url,
            taken_unix_s=NOW_S - 4,
        )


def _held_note(app: DecodetopApp) -> str:
    return app._held_text


def _shown(app: DecodetopApp) -> Callable[[], bool]:
    """The plan is on screen, the stored results restored and the budget composed from them."""

    def ready() -> bool:
        bar = app.query_one(BudgetBar).budget
        return (
            bool(app.probe_views)
            and any(v.from_history for v in app.probe_views.values())
            and app.budget_settled
            and bar is not None
            and any(s.status == "measured" for s in bar.components)
        )

    return ready


def _status(app: DecodetopApp) -> str:
    return app._status_text


async def test_busy_gpus_start_no_probe_and_show_the_stored_budget_with_its_age(tmp_path: Path) -> None:
    s = _setup(tmp_path)
    idle = IdlePolls(s.app)
    async with s.app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: _shown(s.app)() and s.app.held is not None, "the serving-time view")
        await idle.wait(pilot)  # a probe queued with the plan would have been taken by now
        assert s.runs == [] and len(s.app.queue) == 0 and s.app.running_probe is None
        assert _held_note(s.app) == (
            f"{HELD_LINE}\nthe budget shows this scenario's stored results, measured 2h ago on {HOST} "
            "(2 × NVIDIA H200) · b: details"
        )
        assert s.app.query_one("#held-note").display
        assert "GPUs in use: probes wait for R" in _status(s.app)
        view = s.app.query_one(BudgetBar).budget
        assert view is not None
        measured = [seg for seg in view.components if seg.status == "measured"]
        assert measured and all(seg.provenance.startswith(f"measured earlier: 2h ago on {HOST}") for seg in measured)


async def test_a_short_terminal_gets_the_header_in_one_line(tmp_path: Path) -> None:
    s = _setup(tmp_path)
    async with s.app.run_test(size=(80, 24)) as pilot:
        await wait_until(pilot, lambda: _shown(s.app)() and s.app.held is not None, "the serving-time view")
        assert _held_note(s.app) == "GPU 0, 1 in use by other processes: probes not started (R runs them)"
        assert s.app.query_one("#held-note").size.height == 1
        await pilot.resize_terminal(120, 40)
        await wait_until(pilot, lambda: _held_note(s.app).startswith(HELD_LINE), "the full header once there is room")


async def test_r_asks_first_and_runs_only_after_yes(tmp_path: Path) -> None:
    s = _setup(tmp_path)
    idle = IdlePolls(s.app)
    async with s.app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: _shown(s.app)() and s.app.held is not None, "the serving-time view")
        await pilot.press("R")
        await wait_until(pilot, lambda: isinstance(s.app.screen, ConfirmProbesScreen), "the warning")
        body = str(s.app.screen.query_one("#confirm-body").render())
        assert "compete with production traffic" in body and "pid 1329 python3" in body
        await pilot.press("n")
        await wait_until(pilot, lambda: not isinstance(s.app.screen, ConfirmProbesScreen), "the warning closed")
        await idle.wait(pilot)
        assert s.runs == [] and s.app.held is not None and not s.guard.forced
        await pilot.press("R")
        await wait_until(pilot, lambda: isinstance(s.app.screen, ConfirmProbesScreen), "the warning again")
        await pilot.press("y")
        plan = set(s.app.probe_views)
        await wait_until(pilot, lambda: set(s.runs) == plan and s.app.running_probe is None, "every probe run")
        assert s.guard.forced and s.app.held is None and not s.app.query_one("#held-note").display


async def test_r_on_one_probe_runs_that_probe_after_yes(tmp_path: Path) -> None:
    s = _setup(tmp_path)
    idle = IdlePolls(s.app)
    async with s.app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: _shown(s.app)() and s.app.held is not None, "the serving-time view")
        selected = s.app._selected_probe()
        assert selected is not None
        await pilot.press("r")
        await wait_until(pilot, lambda: isinstance(s.app.screen, ConfirmProbesScreen), "the warning")
        assert "Run 1 probe anyway?" in str(s.app.screen.query_one("#confirm-body").render())
        await pilot.press("y")
        await wait_until(pilot, lambda: s.runs == [selected] and s.app.running_probe is None, "the one probe run")
        await idle.wait(pilot, "the probe worker to find no second probe")
        assert s.runs == [selected]


async def test_force_probes_at_start_as_before(tmp_path: Path) -> None:
    s = _setup(tmp_path, forced=True)
    async with s.app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: bool(s.app.probe_views), "the plan")
        plan = set(s.app.probe_views)
        await wait_until(pilot, lambda: set(s.runs) == plan, "every probe run at start")
        assert s.app.held is None and not isinstance(s.app.screen, ConfirmProbesScreen)


async def test_free_gpus_probe_at_start(tmp_path: Path) -> None:
    s = _setup(tmp_path, recording="h200x2-idle")
    async with s.app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: bool(s.app.probe_views), "the plan")
        plan = set(s.app.probe_views)
        await wait_until(pilot, lambda: set(s.runs) == plan, "every probe run at start")
        assert s.app.held is None and not s.guard.forced


async def test_gpus_taken_after_start_refuse_the_run_and_r_asks(tmp_path: Path) -> None:
    """The engine came up after the plan started: the run's preflight refuses (naming the key), r then asks."""
    s = _setup(tmp_path, recording="h200x2-idle", hold=True)
    async with s.app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: bool(s.app.probe_views) and bool(s.runs), "the first run")
        s.guard.nvml = fake_nvml("h200x2-load")
        gpus = gpuinfo.visible_gpus(s.guard.nvml)
        s.guard.gpus = lambda: gpus
        s.gate.set()
        await wait_until(pilot, lambda: not s.app.queue and s.app.running_probe is None, "the plan ended")
        refused = [v for v in s.app.probe_views.values() if "not probed" in v.error]
        assert refused and "press r (R for all) to confirm" in refused[0].error
        await pilot.press("R")
        await wait_until(pilot, lambda: isinstance(s.app.screen, ConfirmProbesScreen), "the warning")
        assert s.app.held is not None


def test_the_held_line_counts_gpus_and_processes() -> None:
    procs = tuple(gpuinfo.GpuProcess(0, 100 + i, "python3" if i else "?", None) for i in range(5))
    one = HeldGpus(gpus=(0,), processes=procs[:1])
    assert one.who == "GPU 0 is in use by other processes (pid 100)"
    many = HeldGpus(gpus=(0, 3), processes=procs)
    assert many.who.endswith("(pid 100, pid 101 python3, pid 102 python3, +2 more)")
    guard = GpuGuard(lambda: (), forced=True)
    assert guard.forced and guard.refusal() is None and guard.held() is None


async def test_other_scenarios_are_listed_and_never_composed(tmp_path: Path) -> None:
    s = _setup(tmp_path, others=True)
    async with s.app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, _shown(s.app), "the stored budget")
        view = s.app.query_one(BudgetBar).budget
        assert view is not None
        provenance = [seg.provenance for seg in view.components if seg.status == "measured"]
        assert provenance and all("2h ago" in p and "CPU" not in p for p in provenance)
        assert "9 stored records of 2 other scenarios (b)" in _status(s.app)
        await pilot.press("b")
        await wait_until(pilot, lambda: isinstance(s.app.screen, BudgetDetailsScreen), "the budget's details")
        body = str(s.app.screen.query_one("#budget-details-body").render())
        assert "other scenarios: 9 stored records of 2 other scenarios, listed here and never mixed into" in body
        assert f"llama-3.1-70b · TP 2 · on {HOST} (2 CPU ranks) · 8 records, newest 10m ago" in body
        assert "of unknown origin (stored before records said where they were measured) · 1 record, newest 1m ago" in (
            body
        )
        assert "the stored results of 8 probes of this scenario feed the budget, newest 2h ago" in body
        await pilot.press("escape")


async def test_the_traced_bar_shows_beside_the_stored_budget(tmp_path: Path) -> None:
    s = _setup(tmp_path, trace=TraceOptions(path=PLANTED))
    async with s.app.run_test(size=(160, 48)) as pilot:
        bar = s.app.query_one(TracedBar)
        await wait_until(pilot, lambda: _shown(s.app)() and bar.view is not None and not bar.busy, "both bars")
        assert bar.display and s.app.held is not None and s.runs == []


def test_snapshot_serving_time_view(snap_compare: Callable[..., bool], tmp_path: Path) -> None:
    """The stored budget (2h old) against the server's live step, the held GPUs named above it."""
    s = _setup(tmp_path, server=True)

    async def run_before(pilot: Any) -> None:
        def ready() -> bool:
            view = s.app.query_one(BudgetBar).budget
            return (
                _shown(s.app)()
                and s.app.held is not None
                and view is not None
                and view.observed_ms == 38.4
                and "server" in view.observed_text
                and bool(s.app.checks)
            )

        await wait_until(pilot, ready, "the serving-time view with the server's step")
        await pilot.pause()

    try:
        assert snap_compare(s.app, terminal_size=SIZE, run_before=run_before)
    finally:
        if s.app.sources.server is not None:
            s.app.sources.server.close()


@pytest.mark.parametrize("force", [False, True], ids=["default", "force"])
def test_the_command_line_wires_the_guard(monkeypatch: pytest.MonkeyPatch, force: bool) -> None:
    """`decodetop`'s sources on a host whose two GPUs the engine holds: the plan is asked to run at start, the
    guard holds it back (and each run's preflight refuses) unless `--force` consented."""
    from decodetop.tui.launch import LaunchOptions, build_sources

    nvml = fake_nvml("h200x2-load")
    gpus = gpuinfo.visible_gpus(nvml)
    monkeypatch.setattr("decodetop.probes.controller.visible_gpus", lambda: gpus)
    monkeypatch.setattr(gpuinfo, "_shared_nvml", nvml)
    sources = build_sources(SETTINGS, LaunchOptions(force=force))
    try:
        guard = sources.gpu_guard
        assert guard is not None and guard.forced is force and sources.run_probes_at_start
        assert isinstance(sources.probes, ControllerProbes) and sources.probes.runner.guard is guard
        refusal = guard.refusal([])  # what the plan runner refuses each run with, in the UI's words
        if force:
            assert refusal is None
        else:
            held = guard.held()
            assert held is not None and held.line() == HELD_LINE
            assert refusal is not None and refusal.startswith("GPU 0, 1 are in use by other processes")
    finally:
        sources.probes.close()
        sources.telemetry.close()
