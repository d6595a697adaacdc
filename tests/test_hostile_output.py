"""The headless commands print text from outside inert: a trace's kernel and module names (`decodetop trace`),
`budget --diff` component names, a check's observed value read from a copied host tree, a server's error body
(`trace --server`). Property tests (hypothesis) feed arbitrary text with controls and Rich markup: no ESC, no C1
control and no other control but newline and tab reaches stdout or stderr. Only the commands are called, so each test
runs against any version of decodetop."""

from __future__ import annotations

import json
import shutil
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings

from decodetop.cli import main
from tests.helpers.hostile_text import ESCAPES, assert_inert, hostile_text


def _trace(path: Path, kernel: str, module: str, steps: int = 4) -> Path:
    """A small profiler trace whose first kernel and module frame carry the given names."""
    events: list[dict[str, Any]] = []
    corr = 0
    for s in range(steps):
        t0 = s * 1000.0
        events.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{s}", "ts": t0, "dur": 900})
        events.append({"ph": "X", "cat": "python_function", "name": f"nn.Module: {module}", "ts": t0 + 5, "dur": 850})
        events.append({"ph": "X", "cat": "cpu_op", "name": module, "ts": t0 + 10, "dur": 800, "pid": 1, "tid": 1})
        for k in range(3):
            corr += 1
            events.append(
                {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": t0 + 30 + k, "dur": 1,
                 "pid": 1, "tid": 1, "args": {"correlation": corr}}
            )  # fmt: skip
            events.append(
                {"ph": "X", "cat": "kernel", "name": kernel if k == 0 else f"k{k}", "ts": t0 + 40 + 50 * k,
                 "dur": 40, "pid": 0, "tid": 7, "args": {"device": 0, "stream": 7, "correlation": corr}}
            )  # fmt: skip
    path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": events}))
    return path


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(kernel=hostile_text, module=hostile_text)
def test_trace_output_shows_hostile_names_inert(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], kernel: str, module: str
) -> None:
    path = _trace(tmp_path / "t.json", kernel, module)
    assert main(["trace", str(path)]) == 0
    out, err = capsys.readouterr()
    assert_inert(out + err)
    assert "unclassified" in out  # the report was printed


def test_trace_output_shows_the_issues_names_inert(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    kernel = "[bold red]K" + "".join(ESCAPES[:4]) + "[/oops]"
    path = _trace(tmp_path / "t.json", kernel, "M" + ESCAPES[2])
    assert main(["trace", str(path)]) == 0
    out = capsys.readouterr().out
    assert_inert(out)
    assert "[bold red]K␛]0;PWNED␇" in out


def test_a_100k_character_module_name_is_shortened_in_the_via_column(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _trace(tmp_path / "t.json", "ker", "M" * 100_000)
    assert main(["trace", str(path)]) == 0
    out = capsys.readouterr().out
    assert len(out.splitlines()) < 60  # main printed ~18,000 lines: the via column was never shortened
    assert max(len(line) for line in out.splitlines()) < 400


def _budget_doc(component: str) -> dict[str, Any]:
    segs = [{"component": "attention", "ms": 1.0, "status": "measured"}, {"component": component, "ms": 2.0,
            "status": "measured"}]  # fmt: skip
    return {"model": "m", "deployment": "TP 2", "complete": True, "total_ms": 3.0, "segments": segs}


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(component=hostile_text)
def test_budget_diff_shows_hostile_component_names_inert(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], component: str
) -> None:
    if component == "attention":
        return
    old, new = tmp_path / "old.json", tmp_path / "new.json"
    old.write_text(json.dumps(_budget_doc(component)))
    doc = _budget_doc(component)
    doc["segments"][1]["ms"] = 20.0
    new.write_text(json.dumps(doc))
    code = main(["budget", "--diff", str(old), str(new)])
    out, err = capsys.readouterr()
    assert_inert(out + err)
    assert code in (0, 1, 2)


def test_check_output_shows_a_hostile_host_file_inert(
    hosts: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DECODETOP_STATE_DIR", str(tmp_path / "state"))
    root = tmp_path / "root"
    shutil.copytree(next(p for p in sorted(hosts.iterdir()) if (p / "root").is_dir()) / "root", root, symlinks=True)
    governors = list(root.glob("sys/devices/system/cpu/cpu*/cpufreq/scaling_governor"))
    assert governors, "the fixture host has no cpufreq governor files"
    for path in governors:
        path.unlink()
        path.write_text("\x1b]0;PWNED\x07\x1b[2J[bold]powersave\u202e\n")
    main(["check", "--root", str(root), "--sample-interval", "0"])
    out, err = capsys.readouterr()
    assert_inert(out + err)
    assert "␛]0;PWNED␇" in out


class _RefusingProfiler(BaseHTTPRequestHandler):
    """An SGLang-looking server whose /start_profile refuses with a hostile body."""

    def do_POST(self) -> None:
        body = b"\x1b]0;PWNED\x07\x1b[2J[bold red]no profiler[/oops]\r\nsecond line"
        self.send_response(500)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


def test_trace_server_error_body_is_inert_and_no_temp_dir_is_left(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _RefusingProfiler)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    temp = tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        assert main(["trace", "--server", url, "--engine", "sglang", "--timeout", "5"]) == 2
    finally:
        server.shutdown()
        server.server_close()
    err = capsys.readouterr().err
    assert_inert(err)
    assert "refused (500): ␛]0;PWNED␇␛[2J[bold red]no profiler[/oops]" in err and err.count("\n") == 1
    assert list(temp.iterdir()) == []  # the capture's temporary output directory is gone
