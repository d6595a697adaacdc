"""The Prometheus exposition: promtool accepts it, prometheus_client's parser reads it back with the values in base
units, a failing part never fails a scrape, the check textfile is written atomically, the server serves and stops."""

from __future__ import annotations

import math
import socket
import subprocess
import time
import urllib.request
from dataclasses import replace
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from decodetop.collectors.serving import ServerState, ServerStatus
from decodetop.errors import UserInputError
from decodetop.export.prometheus import (
    PARTS,
    ExportState,
    StateBox,
    listen_warning,
    metric_for_key,
    parse_listen,
    render_exposition,
    start_metrics_server,
    write_check_textfile,
)
from decodetop.probes.results import ProbeResult, ProbeStatus
from tests.conftest import require_tool
from tests.export.expo_fixtures import (
    budget,
    checks,
    full_state,
    gpu_check_results,
    observed,
    plan_results,
    probe_results,
    telemetry_snapshot,
)


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            key = (s.name, tuple(sorted(s.labels.items())))
            assert key not in out, f"duplicate series {key}"
            out[key] = s.value
    return out


def _value(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


def _promtool(text: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [require_tool("promtool"), "check", "metrics"],
        input=text,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_promtool_accepts_full_exposition() -> None:
    text = render_exposition(full_state())
    result = _promtool(text)
    assert result.returncode == 0, result.stdout + result.stderr


def test_exposition_reads_back_in_base_units() -> None:
    state = full_state()
    samples = _samples(render_exposition(state))
    names = {name for name, _ in samples}
    # GPU telemetry (a real H200 recording): MHz → Hz, % → ratio, ns → s, counters with _total, a gpu label
    snap = state.telemetry
    g1 = snap.gpus[1]
    assert _value(samples, "decodetop_gpu_sm_clock_hertz", gpu="0") == pytest.approx(snap.gpus[0].sm_clock_mhz * 1e6)
    assert _value(samples, "decodetop_gpu_power_watts", gpu="1") == pytest.approx(g1.power_w)
    assert _value(samples, "decodetop_gpu_utilization_ratio", gpu="1") == pytest.approx(g1.gpu_util_pct / 100)
    assert _value(samples, "decodetop_gpu_memory_total_bytes", gpu="0") == snap.gpus[0].mem_total_bytes
    assert _value(samples, "decodetop_gpu_pcie_tx_bytes_total", gpu="1") == g1.pcie_tx_bytes_total
    assert _value(samples, "decodetop_gpu_pcie_tx_bytes_per_second", gpu="1") == pytest.approx(g1.pcie_tx_bytes_per_s)
    from decodetop.collectors.telemetry import CLOCK_EVENT_REASONS

    assert g1.clock_event_reasons  # the load recording is power-capped: SwPowerCap
    for reason in CLOCK_EVENT_REASONS:
        active = _value(samples, "decodetop_gpu_clock_event_reason_active", gpu="1", reason=reason.name)
        assert active == (1 if reason.name in g1.clock_event_reasons else 0)
    for reason, ns in g1.clock_event_time_ns.items():
        assert _value(samples, "decodetop_gpu_clock_event_seconds_total", gpu="1", reason=reason) == pytest.approx(
            ns * 1e-9
        )
    info = [dict(labels) for name, labels in samples if name == "decodetop_gpu_info"]
    assert len(info) == 2 and info[0]["name"] == snap.gpus[0].name
    # probes: µs → s, the median and the tail of each point pooled over the ranks (no per-rank, no per-sample series)
    allreduce = next(r for r in probe_results() if r.probe == "allreduce")
    point = next(
        m for m in allreduce.measurements if m.params["size_bytes"] == 32 * 1024**2 and m.params["mode"] == "graph"
    )
    assert point.stats is not None
    labels = {"probe": "allreduce", "measurement": point.name, "size": str(32 * 1024**2), "mode": "graph"}
    assert _value(samples, "decodetop_probe_seconds", percentile="50", **labels) == pytest.approx(
        point.stats.median * 1e-6
    )
    assert _value(samples, "decodetop_probe_seconds", percentile="99", **labels) == pytest.approx(
        point.stats.p99 * 1e-6
    )
    assert not any("rank" in dict(labels) for _, labels in samples)
    assert _value(samples, "decodetop_probe_ok", probe="launch", status="timed_out") == 0
    assert _value(samples, "decodetop_probe_ok", probe="allreduce", status="ok") == 1
    assert _value(samples, "decodetop_probe_points", probe="membw", outcome="unsupported") == 1
    # budget: ms → s, one series per component with its status and provenance, unexplained, step lines
    b = budget()
    model = {"model": b.model}
    measured = {"status": "measured", "provenance": "measured_now"}
    assert _value(
        samples, "decodetop_budget_segment_seconds", component="communication", **measured, **model
    ) == pytest.approx(0.0176)
    assert _value(
        samples,
        "decodetop_budget_segment_seconds",
        component="routed_experts",
        status="measured",
        provenance="measured_earlier",
        **model,
    ) == pytest.approx(0.0287)
    assert _value(
        samples,
        "decodetop_budget_segment_seconds",
        component="routing",
        status="estimated",
        provenance="estimate",
        **model,
    ) == pytest.approx(0.0019)
    assert math.isnan(
        _value(
            samples,
            "decodetop_budget_segment_seconds",
            component="lm_head",
            status="missing",
            provenance="missing",
            **model,
        )
    )
    assert _value(
        samples,
        "decodetop_budget_segment_seconds",
        component="unexplained",
        status="missing",
        provenance="assumed",
        **model,
    ) == pytest.approx(b.unexplained_ms / 1e3)
    per_component = [
        dict(labels)["component"] for name, labels in samples if name == "decodetop_budget_segment_seconds"
    ]
    assert sorted(per_component) == sorted([*(s.component for s in b.segments), "unexplained"])
    assert _value(samples, "decodetop_budget_complete", **model) == 0
    assert _value(samples, "decodetop_budget_step_seconds", line="observed", source="default", **model) == (
        pytest.approx(0.095)
    )
    assert _value(samples, "decodetop_budget_step_seconds", line="sum", source="probes", **model) == pytest.approx(
        b.total_ms / 1e3
    )
    assert _value(samples, "decodetop_budget_target_tokens_per_second", **model) == 309
    info = {"deployment": b.deployment, "hardware": "NVIDIA H200 (detected by NVML)", "device_kind": "cuda"}
    assert _value(samples, "decodetop_budget_info", header="", **info, **model) == 1
    # checks: one series per check labelled with its status (value: its exit code), counts, the exit code
    c1 = {"check": "C1", "subject": "host", "title": "CPU frequency governor"}
    assert _value(samples, "decodetop_check_status", status="warn", **c1) == 1
    assert ("decodetop_check_status", tuple(sorted({**c1, "status": "pass"}.items()))) not in samples
    assert _value(samples, "decodetop_checks", status="fail") == 1
    assert _value(samples, "decodetop_check_exit_code") == 2
    # the live server's step
    assert _value(samples, "decodetop_observed_step_seconds", source="sglang") == pytest.approx(0.0192)
    assert _value(samples, "decodetop_server_up") == 1
    assert _value(samples, "decodetop_observed_step_age_seconds", source="sglang") >= 0
    assert _value(samples, "decodetop_probe_interval_seconds") == 600
    assert ("decodetop_build_info", (("version", __import__("decodetop").__version__),)) in samples
    assert all(name.startswith("decodetop_") for name in names)
    assert not any(name.endswith(("_milliseconds", "_mhz", "_us", "_gbps")) for name in names)


def test_empty_state_and_server_status() -> None:
    down = ServerStatus(
        ServerState.UNREACHABLE, "http://127.0.0.1:1/metrics: unreachable", "http://127.0.0.1:1/metrics"
    )
    text = render_exposition(ExportState(observed=down))
    assert _promtool(text).returncode == 0
    samples = _samples(text)
    assert _value(samples, "decodetop_server_up") == 0
    assert _value(samples, "decodetop_server_status_info", state="unreachable") == 1
    assert not any(name.startswith(("decodetop_gpu_", "decodetop_observed_")) for name, _ in samples)


def test_server_down_keeps_the_last_step_with_its_age() -> None:
    last = replace(observed(), taken_unix_s=time.time() - 3600.0)
    down = ServerStatus(ServerState.TIMED_OUT, "no complete answer within 2 s", last.url, last_step=last)
    samples = _samples(render_exposition(ExportState(observed=down)))
    assert _value(samples, "decodetop_server_up") == 0
    assert _value(samples, "decodetop_server_status_info", state="timed_out") == 1
    assert _value(samples, "decodetop_observed_step_seconds", source="sglang") == pytest.approx(0.0192)
    assert _value(samples, "decodetop_observed_step_age_seconds", source="sglang") >= 3600.0


def test_failing_part_is_left_out_and_counted(monkeypatch: pytest.MonkeyPatch) -> None:
    from prometheus_client import generate_latest

    from decodetop.export.prometheus import rendering

    def explode(snap: object, out: object) -> None:
        raise RuntimeError("boom rendering telemetry")

    monkeypatch.setattr(rendering, "_render_telemetry", explode)
    box = StateBox(ExportState(telemetry=telemetry_snapshot(), checks=checks(), observed=observed()))
    registry = rendering.make_registry(box)
    for expected_errors in (1, 2):
        samples = _samples(generate_latest(registry).decode())
        assert _value(samples, "decodetop_exporter_render_errors_total", part="telemetry") == expected_errors
        assert _value(samples, "decodetop_exporter_render_errors_total", part="checks") == 0
        assert _value(samples, "decodetop_checks", status="warn") == 1
        assert _value(samples, "decodetop_observed_step_seconds", source="sglang") == pytest.approx(0.0192)


def test_state_box_keeps_latest_result_per_probe() -> None:
    box = StateBox()

    def result(probe: str, duration_s: float) -> ProbeResult:
        return ProbeResult(probe, ProbeStatus.OK, {}, duration_s=duration_s)

    box.add_probe_result(result("allreduce", 1))
    box.add_probe_result(result("membw", 3))
    box.add_probe_result(result("allreduce", 2))
    assert [r.duration_s for r in box().probe_results] == [3, 2]
    box.update(probe_interval_s=60.0)
    assert box().probe_interval_s == 60.0


def test_metric_for_key_units() -> None:
    assert metric_for_key("time_us") == ("time_seconds", 1e-6)
    assert metric_for_key("busbw_gbps") == ("busbw_bytes_per_second", 1e9)
    assert metric_for_key("per_node_us") == ("per_node_seconds", 1e-6)
    assert metric_for_key("achieved_pct") == ("achieved_ratio", 0.01)
    assert metric_for_key("ops_per_sample") is None
    assert metric_for_key("us") is None


def test_check_textfile_atomic_and_valid(tmp_path: Path) -> None:
    target = tmp_path / "textfile" / "decodetop.prom"
    write_check_textfile(target, list(checks()), now_unix_s=1795959000.0)
    text = target.read_text()
    assert _promtool(text).returncode == 0
    samples = _samples(text)
    assert _value(samples, "decodetop_check_exit_code") == 2
    assert _value(samples, "decodetop_check_last_run_timestamp_seconds") == 1795959000.0
    assert not any(name.startswith(("decodetop_gpu_", "decodetop_probe_")) for name, _ in samples)
    # rewriting replaces the file whole and leaves no temporary file beside it
    write_check_textfile(target, [], now_unix_s=1795959600.0)
    assert _value(_samples(target.read_text()), "decodetop_check_exit_code") == 0
    assert [p.name for p in target.parent.iterdir()] == ["decodetop.prom"]
    with pytest.raises(UserInputError, match=r"\.prom"):
        write_check_textfile(tmp_path / "decodetop.txt", list(checks()))
    (tmp_path / "dir.prom").mkdir()
    with pytest.raises(UserInputError, match="directory"):
        write_check_textfile(tmp_path / "dir.prom", list(checks()))


def test_parse_listen() -> None:
    assert parse_listen("127.0.0.1:9464") == ("127.0.0.1", 9464)
    assert parse_listen("9464") == ("127.0.0.1", 9464)
    assert parse_listen(":9100") == ("127.0.0.1", 9100)
    assert parse_listen("0.0.0.0:9464") == ("0.0.0.0", 9464)
    assert parse_listen("[::1]:9464") == ("::1", 9464)
    for bad in ("host:port", "1.2.3.4:70000", "::1:9464", "[::1]9464"):
        with pytest.raises(UserInputError):
            parse_listen(bad)


def test_metrics_server_serves_state_and_closes() -> None:
    box = StateBox(ExportState(checks=checks()))
    server = start_metrics_server("127.0.0.1:0", box)
    try:
        assert server.port > 0
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(server.url, timeout=10) as response:
            body = response.read().decode()
        assert _value(_samples(body), "decodetop_checks", status="fail") == 1
        assert "process_cpu_seconds_total" not in body or "decodetop_process_cpu_seconds_total" in body
        # the state provider is read at every scrape
        box.update(observed=observed())
        with opener.open(server.url, timeout=10) as response:
            body = response.read().decode()
        assert _value(_samples(body), "decodetop_observed_step_seconds", source="sglang") == pytest.approx(0.0192)
        # a second server on the same port: one clear line
        with pytest.raises(UserInputError, match="cannot listen"):
            start_metrics_server(("127.0.0.1", server.port), box)
    finally:
        server.close()
    server.close()  # idempotent
    with socket.socket() as sock:  # the port is free again
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", server.port))


def test_every_gpu_field_with_a_value_is_exported() -> None:
    """Each numeric GpuSnapshot field the exposition maps appears for each GPU whenever NVML gave a value."""
    from decodetop.export.prometheus.rendering import _GPU_GAUGES

    snap = telemetry_snapshot()
    samples = _samples(render_exposition(ExportState(telemetry=snap)))
    for gpu in snap.gpus:
        for gauge in _GPU_GAUGES:
            present = ("decodetop_" + gauge.name, (("gpu", str(gpu.index)),)) in samples
            assert present == (gauge.read(gpu) is not None), gauge.name


@pytest.mark.parametrize(
    "listen", ["0:9464", "0.0:9464", "0x0:9464", "[::0]:9464", "[0:0:0:0:0:0:0:0]:9464", "[::ffff:0.0.0.0]:9464", ":0"]
)
def test_every_wildcard_spelling_warns(listen: str) -> None:
    """Decided by the address the host resolves to, as the server binds it: not by the spelling."""
    host, _ = parse_listen(listen)
    if listen == ":0":
        assert listen_warning(host) is None  # no host: loopback
        return
    warning = listen_warning(host)
    assert warning is not None and "every network interface" in warning


def test_listen_warning_names_every_interface() -> None:
    for host in ("0.0.0.0", "::", "[::]"):
        warning = listen_warning(host)
        assert warning is not None and "every network interface" in warning
    for host in ("127.0.0.1", "::1", "10.0.0.5"):
        assert listen_warning(host) is None


SERIES_PER_GPU_MAX = 150
PROBE_PLAN_SERIES_MAX = 400


def _series_by_part(state: ExportState) -> dict[str, int]:
    """Series per part, without the exporter's own (build info, render errors, part failing), which are "exporter"."""
    empty = ExportState(probe_interval_s=state.probe_interval_s)
    out = {
        part: len(_samples(render_exposition(state, parts=(part,))))
        - len(_samples(render_exposition(empty, parts=(part,))))
        for part in PARTS
    }
    out["exporter"] = len(_samples(render_exposition(empty)))
    return out


def test_series_count_at_eight_gpus_with_a_full_plan() -> None:
    """The exposition's size at 8 (fake) GPUs with a full model plan's results: at most 150 series per GPU (telemetry
    and checks) plus 400 for the probe plan, counted on the generated text (docs/benchmarks.md states the count)."""
    gpus = 8
    state = ExportState(
        telemetry=telemetry_snapshot(gpus),
        probe_results=plan_results(),
        budget=budget(),
        checks=(*checks(), *gpu_check_results(gpus)),
        checks_unix_s=1795959000.0,
        observed=observed(),
        probe_interval_s=600.0,
    )
    assert len(state.telemetry.gpus) == gpus if state.telemetry else False
    assert sum(len(r.measurements) for r in state.probe_results) > 300
    per_part = _series_by_part(state)
    total = len(_samples(render_exposition(state)))
    assert total == sum(per_part.values())
    assert per_part["probes"] <= PROBE_PLAN_SERIES_MAX, per_part
    assert per_part["budget"] <= 2 * (len(state.budget.segments) + 1) if state.budget else False
    per_gpu = (per_part["telemetry"] + per_part["checks"]) / gpus
    assert per_gpu <= SERIES_PER_GPU_MAX, per_part
    assert total <= SERIES_PER_GPU_MAX * gpus + PROBE_PLAN_SERIES_MAX, per_part
