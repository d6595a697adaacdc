"""The Prometheus exposition: promtool accepts it, prometheus_client's parser reads it back with the values in base
units, a failing part never fails a scrape, the check textfile is written atomically, the server serves and stops."""

from __future__ import annotations

import socket
import subprocess
import urllib.request
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from expo_fixtures import budget, checks, full_state, observed, probe_results, telemetry_snapshot
from prometheus_client.parser import text_string_to_metric_families

from conftest import require_tool
from decodetop.collectors.serving import ServerState, ServerStatus
from decodetop.errors import UserInputError
from decodetop.export.prometheus import (
    ExportState,
    StateBox,
    metric_for_key,
    parse_listen,
    render_exposition,
    start_metrics_server,
    write_check_textfile,
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
    # probes: µs → s, GB/s → bytes/s, by probe/measurement/size/mode/rank
    allreduce = next(r for r in probe_results() if r.probe == "allreduce")
    point = next(
        m for m in allreduce.measurements if m.params["size_bytes"] == 32 * 1024**2 and m.params["mode"] == "graph"
    )
    labels = {"probe": "allreduce", "measurement": point.name, "size": str(32 * 1024**2), "mode": "graph"}
    assert _value(samples, "decodetop_probe_time_seconds", rank="all", **labels) == pytest.approx(
        point.metrics["time_us"] * 1e-6
    )
    assert _value(samples, "decodetop_probe_busbw_bytes_per_second", rank="1", **labels) == pytest.approx(
        point.per_rank[1].metrics["busbw_gbps"] * 1e9
    )
    assert _value(samples, "decodetop_probe_sample_seconds", rank="all", stat="p99", **labels) == pytest.approx(
        point.stats.p99 * 1e-6
    )
    assert _value(samples, "decodetop_probe_status", probe="launch", status="timed_out") == 1
    assert _value(samples, "decodetop_probe_status", probe="launch", status="ok") == 0
    unsupported = {"probe": "membw", "measurement": "h2d pinned", "size": str(256 * 1024**2), "mode": ""}
    assert _value(samples, "decodetop_probe_measurement_ok", **unsupported) == 0
    # budget (the budget helper's Budget): ms → s by component, unexplained as a segment, statuses, step lines
    b = budget()
    model = {"model": b.model}
    assert _value(samples, "decodetop_budget_segment_seconds", component="communication", **model) == pytest.approx(
        0.0176
    )
    assert _value(samples, "decodetop_budget_segment_seconds", component="unexplained", **model) == pytest.approx(
        b.unexplained_ms / 1e3
    )
    assert ("decodetop_budget_segment_seconds", (("component", "lm_head"), ("model", b.model))) not in samples
    assert _value(samples, "decodetop_budget_segment_status", component="lm_head", status="missing", **model) == 1
    assert _value(samples, "decodetop_budget_segment_status", component="routing", status="estimated", **model) == 1
    assert _value(samples, "decodetop_budget_complete", **model) == 0
    assert _value(samples, "decodetop_budget_step_seconds", line="observed", **model) == pytest.approx(0.095)
    assert _value(samples, "decodetop_budget_step_seconds", line="sum", **model) == pytest.approx(b.total_ms / 1e3)
    assert _value(samples, "decodetop_budget_target_tokens_per_second", **model) == 309
    # checks: a state set per check, counts, the exit code (a FAIL → 2)
    c1 = {"check": "C1", "subject": "host", "title": "CPU frequency governor"}
    assert _value(samples, "decodetop_check_status", status="warn", **c1) == 1
    assert _value(samples, "decodetop_check_status", status="pass", **c1) == 0
    assert _value(samples, "decodetop_checks", status="fail") == 1
    assert _value(samples, "decodetop_check_exit_code") == 2
    # the live server's step
    assert _value(samples, "decodetop_observed_step_seconds", source="sglang") == pytest.approx(0.0192)
    assert _value(samples, "decodetop_server_up") == 1
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
    assert not any(name.startswith("decodetop_gpu_") for name, _ in samples)


class _Exploding:
    def __getattr__(self, name: str) -> Any:
        raise RuntimeError(f"boom reading {name}")


def test_failing_part_is_left_out_and_counted() -> None:
    box = StateBox(ExportState(telemetry=_Exploding(), checks=checks(), observed=observed()))
    from prometheus_client import generate_latest

    from decodetop.export.prometheus import make_registry

    registry = make_registry(box)
    for expected_errors in (1, 2):
        samples = _samples(generate_latest(registry).decode())
        assert _value(samples, "decodetop_exporter_render_errors_total", part="telemetry") == expected_errors
        assert _value(samples, "decodetop_exporter_render_errors_total", part="checks") == 0
        assert _value(samples, "decodetop_checks", status="warn") == 1
        assert _value(samples, "decodetop_observed_step_seconds", source="sglang") == pytest.approx(0.0192)


def test_state_box_keeps_latest_result_per_probe() -> None:
    box = StateBox()
    first, second = SimpleNamespace(probe="allreduce", n=1), SimpleNamespace(probe="allreduce", n=2)
    box.add_probe_result(first)
    box.add_probe_result(SimpleNamespace(probe="membw", n=3))
    box.add_probe_result(second)
    assert [getattr(r, "n", None) for r in box().probe_results] == [3, 2]
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
    from decodetop.export.prometheus import _GPU_GAUGES

    state = ExportState(telemetry=telemetry_snapshot())
    samples = _samples(render_exposition(state))
    for gpu in state.telemetry.gpus:
        for attr, name, _, _ in _GPU_GAUGES:
            present = ("decodetop_" + name, (("gpu", str(gpu.index)),)) in samples
            assert present == (getattr(gpu, attr) is not None), (attr, name)
