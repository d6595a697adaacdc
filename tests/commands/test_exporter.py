"""`decodetop exporter` as a real process on a loopback port (fake NVML from a real H200 recording, no probes):
scraped with urllib, checked by promtool, stopped with SIGINT; and the exporter's schedule with a stand-in probe
controller."""

from __future__ import annotations

import io
import json
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from decodetop.budget.scenario import ModelSource, Scenario, TpChoice, build_scenario
from decodetop.collectors.serving import ServerState, ServerStatus, ServerStep, ServerStepSource
from decodetop.errors import UserInputError
from decodetop.export.schedule import Exporter, PlannedRun, parse_duration, probe_plan_runs
from decodetop.probes.results import ProbeResult, ProbeStatus
from tests.conftest import require_tool
from tests.helpers.env import subprocess_env
from tests.helpers.trickle_server import TricklingServer
from tests.helpers.waiting import WAIT_S, process_ended, wait_for
from tests.probes.test_plan_hooks import TINY_LLAMA

SRC = Path(__file__).resolve().parents[2] / "src"
_EXPORTER = (sys.executable, "-m", "decodetop", "exporter")
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _env(tmp_path: Path) -> dict[str, str]:
    return subprocess_env(DECODETOP_STATE_DIR=str(tmp_path / "state"), DECODETOP_CONFIG_DIR=str(tmp_path / "config"))


def _cmdline(process: Any) -> str:
    try:
        return " ".join(process.cmdline())
    except Exception:  # gone meanwhile (psutil.Error): no rank of ours
        return ""


def _scrape_when(
    proc: subprocess.Popen[str],
    url: str,
    ready: Callable[[str], bool] = lambda page: True,
    what: str = "the exporter to answer",
) -> str:
    """The exposition at `url` once it answers and `ready` holds (the exporter process must stay up meanwhile)."""

    def answered() -> str | None:
        assert proc.poll() is None, proc.communicate()[1]
        page = _scrape(url)
        return page if page is not None and ready(page) else None

    page = wait_for(answered, what, interval_s=0.1)
    assert page is not None
    return page


def _scrape(url: str) -> str | None:
    try:
        with _OPENER.open(url, timeout=5) as response:
            return str(response.read().decode("utf-8"))
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return None


def _names(text: str) -> set[str]:
    return {s.name for f in text_string_to_metric_families(text) for s in f.samples}


@pytest.fixture
def exporter_process(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], str]]:
    port = _free_port()
    dead = _free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "decodetop",
            "exporter",
            "--no-probes",
            "--demo",
            "--listen",
            f"127.0.0.1:{port}",
            "--tick",
            "200ms",
            "--server",
            f"http://127.0.0.1:{dead}",
        ],
        env=_env(tmp_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        yield proc, f"http://127.0.0.1:{port}/metrics"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def test_exporter_serves_and_stops_on_sigint(exporter_process: tuple[subprocess.Popen[str], str]) -> None:
    proc, url = exporter_process
    wanted = {
        "decodetop_build_info",
        "decodetop_nvml_up",
        "decodetop_gpu_sm_clock_hertz",
        "decodetop_gpu_power_watts",
        "decodetop_gpu_pcie_tx_bytes_total",
        "decodetop_gpu_clock_event_reason_active",
        "decodetop_check_status",
        "decodetop_check_exit_code",
        "decodetop_server_up",
        "decodetop_process_resident_memory_bytes",
    }
    text = _scrape_when(proc, url, lambda page: wanted <= _names(page), "every family in the exposition")
    names = _names(text)
    assert wanted <= names, sorted(wanted - names)
    assert not any(n.startswith("decodetop_probe_status") for n in names)  # --no-probes
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
    }
    assert samples[("decodetop_nvml_up", ())] == 1
    assert samples[("decodetop_server_up", ())] == 0  # the --server URL is dead: a status, not a crash
    assert samples[("decodetop_server_status_info", (("state", "unreachable"),))] == 1
    result = subprocess.run(
        [require_tool("promtool"), "check", "metrics"], input=text, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr

    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=15)
    assert proc.returncode == 0, err
    assert "serving http://127.0.0.1:" in err and "stopping" in err
    assert _scrape(url) is None  # the port is closed


def test_exporter_bad_flags_and_busy_port_exit_2(tmp_path: Path) -> None:
    env = _env(tmp_path)
    bad = subprocess.run(
        [sys.executable, "-m", "decodetop", "exporter", "--no-probes", "--probe-every", "10x"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert bad.returncode == 2
    assert bad.stderr.strip().splitlines() == [
        "decodetop: error: --probe-every '10x': give a duration like 30s, 10m or 1h"
    ]
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        taken = subprocess.run(
            [sys.executable, "-m", "decodetop", "exporter", "--no-probes", "--demo", "--listen", f"127.0.0.1:{port}"],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    assert taken.returncode == 2
    assert "cannot listen" in taken.stderr and len(taken.stderr.strip().splitlines()) == 1


def test_parse_duration() -> None:
    assert parse_duration("10m", "--probe-every") == 600
    assert parse_duration("30s", "x") == 30
    assert parse_duration("1.5h", "x") == 5400
    assert parse_duration("200ms", "x") == pytest.approx(0.2)
    assert parse_duration("90", "x") == 90
    for bad in ("", "0", "0s", "-5m", "10 minutes", "m"):
        with pytest.raises(UserInputError):
            parse_duration(bad, "--probe-every")


class _Registry:
    """The names of a build that registers only some probes."""

    def __init__(self, names: Sequence[str]) -> None:
        self._names = list(names)

    def names(self) -> list[str]:
        return list(self._names)


REGISTRY = _Registry(["allreduce", "launch", "membw", "gemm", "tracer"])


def _scenario(model: str, tp: int) -> Scenario:
    return build_scenario(ModelSource("preset", model), TpChoice(tp, "--tp"))


def test_plan_without_model_is_every_registered_probe() -> None:
    runs, notes = probe_plan_runs(None, REGISTRY, world_size=2, device_kind="cpu")
    assert runs == tuple(PlannedRun(n) for n in REGISTRY.names()) and notes == ()


def test_plan_for_a_model_is_the_probe_engines_plan() -> None:
    """--model runs what `decodetop probe --model` runs (probes.plan_hooks) less the charts' sweeps, limited to the
    registered probes."""
    from decodetop.budget.plan import build_plan
    from decodetop.probes.plan_hooks import plan_requests

    scenario = _scenario("glm-5-nvfp4", 8)
    inventory = scenario.inventory()
    requests, _ = plan_requests(build_plan(inventory), inventory, world_size=8, device_kind="cuda", sweeps=False)
    runs, notes = probe_plan_runs(scenario, REGISTRY, world_size=8, device_kind="cuda")
    assert [(r.probe, dict(r.params)) for r in runs] == [
        (r.probe, dict(r.params)) for r in requests if r.probe in REGISTRY.names()
    ]
    assert {"allreduce", "gemm", "launch"} <= {r.probe for r in runs}
    gemm = next(r for r in runs if r.probe == "gemm")
    assert not gemm.params.get("sweep")  # the charts' GEMM-vs-M sweep is not run on a schedule
    assert any("not in this build's probe registry" in n for n in notes)  # moe, attention, ... are not in REGISTRY
    # a group smaller than the plan's TP measures no collective, and says so
    small, small_notes = probe_plan_runs(scenario, REGISTRY, world_size=2, device_kind="cpu")
    assert "allreduce" not in {r.probe for r in small}
    assert any("collectives not measured" in n for n in small_notes)


class _FakeController:
    """Stands in for ProbeController: records runs, fails one probe, honours cancel/close."""

    def __init__(self) -> None:
        self.runs: list[tuple[str, Any]] = []
        self.closed = False
        self.cancelled = 0

    def run(self, probe: str, params: Any = None, *, timeout_s: Any = None, on_progress: Any = None) -> ProbeResult:
        self.runs.append((probe, params))
        if probe == "broken":
            raise RuntimeError("rank 1 could not import torch")
        status = ProbeStatus.TIMED_OUT if probe == "slow" else ProbeStatus.OK
        return ProbeResult(probe, status, {}, message="timed out after 60 s" if probe == "slow" else "")

    def rank_pids(self) -> list[int]:
        return []

    def cancel(self) -> None:
        self.cancelled += 1

    def close(self) -> None:
        self.closed = True


def test_probe_schedule_stores_results_and_notes_failures() -> None:
    controller = _FakeController()
    log = io.StringIO()
    exporter = Exporter(
        listen="127.0.0.1:0",
        nvml=None,
        check_every_s=None,
        probe_every_s=3600.0,
        plan=(PlannedRun("allreduce", {"sizes": [8, 4096]}), PlannedRun("broken"), PlannedRun("slow")),
        make_controller=lambda: controller,
        log=log,
    )
    exporter.start()
    try:
        wait_for(lambda: "probes" in exporter.box().notes, "the probe cycle's note")
        state = exporter.box()
        # a probe the group could not run is a failed result naming the error (as on the CLI and in the UI)
        assert [(r.probe, r.status.value) for r in state.probe_results] == [
            ("allreduce", "ok"),
            ("broken", "failed"),
            ("slow", "timed_out"),
        ]
        assert controller.runs[0] == ("allreduce", {"sizes": [8, 4096]})
        note = state.notes["probes"]
        assert (
            "broken: failed (RuntimeError: rank 1 could not import torch)" in note
            and "slow: timed_out (timed out after 60 s)" in note
        )
        assert state.probe_interval_s == 3600.0
        assert exporter.server is not None
        body = _scrape(exporter.server.url)
        assert body is not None and 'decodetop_exporter_part_failing{part="probes"} 1.0' in body
    finally:
        exporter.stop()
    assert controller.closed and controller.cancelled >= 1
    assert "probes: broken" in log.getvalue()
    assert not [t for t in threading.enumerate() if t.name.startswith("decodetop-exporter-") and t.is_alive()]


def test_budget_follows_probe_results_and_observed_step() -> None:
    """After a probe cycle and after a server poll that gave a step, the exporter recomposes the budget through the
    one composition, with the server's step as observed (not assumed)."""
    from decodetop.export.schedule import BudgetComposer

    step = ServerStep(
        step_ms=19.2,
        itl_ms=19.2,
        source="sglang",
        metric="sglang:inter_token_latency_seconds",
        samples=10,
        window_s=30.0,
        accept_length=1.0,
        accept_length_from="none",
        url="http://127.0.0.1:30000/metrics",
        taken_unix_s=time.time(),
    )

    class Server:
        def poll(self) -> ServerStep:
            return step

    exporter = Exporter(
        listen="127.0.0.1:0",
        nvml=None,
        check_every_s=None,
        probe_every_s=3600.0,
        plan=(PlannedRun("allreduce"),),
        make_controller=_FakeController,
        server_source=Server(),
        budget_for=BudgetComposer(_scenario("llama-3.1-70b", 2), 309.0, "cpu"),
        log=io.StringIO(),
    )
    exporter.start()
    try:

        def composed() -> bool:
            budget = exporter.box().budget
            return budget is not None and budget.observed_ms == 19.2 and bool(exporter.box().probe_results)

        wait_for(composed, "a budget over the server's observed step")
        budget = exporter.box().budget
        assert budget is not None and budget.observed_ms == 19.2
        assert budget.observed_step.source == "server" and "http://127.0.0.1:30000/metrics" in budget.observed_step.text
    finally:
        exporter.stop()


def test_trickling_server_reports_up_0_within_its_deadline() -> None:
    """A server that sends one byte every 0.3 s: each poll ends at its 1 s deadline and the exposition says the
    server is down and why, while the exporter keeps serving."""
    with TricklingServer(interval_s=0.3) as slow:
        exporter = Exporter(
            listen="127.0.0.1:0",
            nvml=None,
            check_every_s=None,
            probe_every_s=None,
            server_source=ServerStepSource(slow.url, timeout_s=1.0),
            server_every_s=0.1,
            log=io.StringIO(),
        )
        exporter.start()
        try:
            # liveness only: per-read timeouts would keep the poll for minutes
            wait_for(lambda: isinstance(exporter.box().observed, ServerStatus), "the server's status")
            observed = exporter.box().observed
            assert isinstance(observed, ServerStatus) and observed.state is ServerState.TIMED_OUT
            assert exporter.server is not None
            body = _scrape(exporter.server.url)
            assert body is not None
            assert "decodetop_server_up 0.0" in body
            assert 'decodetop_server_status_info{state="timed_out"} 1.0' in body
            assert slow.sent < slow.total_bytes
        finally:
            exporter.stop()


def test_listen_on_every_interface_warns(tmp_path: Path) -> None:
    port = _free_port()
    proc = subprocess.Popen(
        [*_EXPORTER, "--no-probes", "--no-checks", "--demo", "--listen", f"0.0.0.0:{port}"],
        env=_env(tmp_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _scrape_when(proc, f"http://127.0.0.1:{port}/metrics")
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert proc.returncode == 0, err
    warning = [line for line in err.splitlines() if "warning" in line]
    assert warning == [
        "decodetop exporter: warning: --listen 0.0.0.0: the metrics (GPU names, host checks, probe results) are "
        "exposed on every network interface of this host; use 127.0.0.1 or a firewall unless that is what you want"
    ]


def test_busy_gpus_skip_the_probe_cycle() -> None:
    """A serving engine holding the GPUs (the 2×H200 load recording): no probe runs, and the note says why
    (architecture: consent needed), in `decodetop probe`'s words."""
    from decodetop.collectors.fake_nvml import fake_nvml
    from decodetop.pipeline.gpu_guard import GpuGuard
    from decodetop.probes import gpuinfo

    controller = _FakeController()
    nvml = fake_nvml("h200x2-load")
    gpus = gpuinfo.visible_gpus(nvml)
    exporter = Exporter(
        listen="127.0.0.1:0",
        nvml=None,
        check_every_s=None,
        probe_every_s=3600.0,
        plan=(PlannedRun("allreduce"),),
        make_controller=lambda: controller,
        guard=GpuGuard(lambda: gpus, nvml=nvml),
        log=io.StringIO(),
    )
    exporter.start()
    try:
        wait_for(lambda: "probes" in exporter.box().notes, "the probe cycle's note")
        note = exporter.box().notes["probes"]
        assert note.startswith("skipped this cycle: other processes hold GPU memory (GPU 0: pid ")
        assert note.endswith("pass --force to probe anyway")
        assert controller.runs == []
    finally:
        exporter.stop()


@pytest.mark.slow
def test_sigint_while_probing_ends_every_rank(tmp_path: Path) -> None:
    """SIGINT while the probe group starts or runs: a clean exit, and no rank process left behind."""
    psutil = pytest.importorskip("psutil")
    port = _free_port()
    proc = subprocess.Popen(
        [*_EXPORTER, "--demo", "--no-checks", "--cpu-ranks", "2", "--listen", f"127.0.0.1:{port}"],
        env=_env(tmp_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:

        def spawned() -> list[Any]:
            assert proc.poll() is None, proc.communicate()[1]
            ranks = [c for c in psutil.Process(proc.pid).children(recursive=True) if "spawn_main" in _cmdline(c)]
            return ranks if len(ranks) >= 2 else []

        ranks = wait_for(spawned, "the probe group's ranks")
        proc.send_signal(signal.SIGINT)  # while the group starts or runs: either must end cleanly
        _, err = proc.communicate(timeout=WAIT_S)
        assert proc.returncode == 0, err
        assert "stopping" in err and "cancelled" not in err
        wait_for(lambda: all(process_ended(r) for r in ranks), "every rank to end")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def _budget_hardware(page: str) -> str:
    """The `hardware` label of the page's `decodetop_budget_info` ('' where it has none yet)."""
    families = text_string_to_metric_families(page)
    return next((s.labels["hardware"] for f in families for s in f.samples if s.name == "decodetop_budget_info"), "")


def test_exporter_takes_a_config_like_every_command(tmp_path: Path) -> None:
    """`exporter --config PATH` (the shared scenario flags): its budget is exported with provenance labels."""
    config = tmp_path / "tiny" / "config.json"
    config.parent.mkdir()
    config.write_text(json.dumps(TINY_LLAMA))
    port = _free_port()
    proc = subprocess.Popen(
        [*_EXPORTER, "--no-probes", "--no-checks", "--demo", "--listen", f"127.0.0.1:{port}", "--config", str(config)],
        env=_env(tmp_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        # the first budget may be composed before telemetry has seen the demo's GPUs (the assumed GPU, said so):
        # wait for the budget's own hardware label, not for the GPU's name anywhere on the page
        text = _scrape_when(
            proc,
            f"http://127.0.0.1:{port}/metrics",
            lambda page: "NVIDIA H200" in _budget_hardware(page) and "decodetop_budget_segment_seconds" in page,
            "the budget composed for the H200",
        )
        series = [s for f in text_string_to_metric_families(text) for s in f.samples]
        (info,) = [s for s in series if s.name == "decodetop_budget_info"]
        assert "NVIDIA H200" in info.labels["hardware"]
        segments = [s for s in series if s.name == "decodetop_budget_segment_seconds"]
        assert segments and {s.labels["provenance"] for s in segments} <= {"estimate", "not_applicable", "assumed"}
        (observed,) = [
            s for s in series if s.name == "decodetop_budget_step_seconds" and s.labels["line"] == "observed"
        ]
        assert observed.labels["source"] == "default"
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=20)
        assert proc.returncode == 0, err
        assert "budget: " in err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--config", "/dev/zero"], "--config"),
        (["--model", "no-such-model"], "no-such-model"),
        (["--model", "glm-5", "--config", "x.json"], "not allowed with argument"),
    ],
)
def test_exporter_bad_scenario_is_one_line_exit_2(tmp_path: Path, flags: list[str], message: str) -> None:
    bad = subprocess.run(
        [*_EXPORTER, "--no-probes", "--no-checks", "--demo", "--listen", "127.0.0.1:0", *flags],
        env=_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert bad.returncode == 2, bad.stderr
    lines = [line for line in bad.stderr.strip().splitlines() if not line.startswith("usage:")]
    assert len(lines) == 1 and message in lines[0], bad.stderr
