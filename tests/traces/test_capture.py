"""Live capture against loopback servers shaped like SGLang's and vLLM's profiling endpoints."""

from __future__ import annotations

import json
import shutil
import socket
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from decodetop.cli import main
from decodetop.errors import UserInputError
from decodetop.traces import analyze_trace, capture

from .conftest import fixture

Behaviour = Callable[["Handler"], None]


class Handler(BaseHTTPRequestHandler):
    """Routes to the test's behaviour table; records every request."""

    server: Any

    def log_message(self, *args: object) -> None:  # keep pytest output clean
        return

    def body(self) -> dict[str, Any]:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        return json.loads(raw) if raw else {}

    def reply(self, status: int, text: str = "") -> None:
        data = text.encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def handle_any(self) -> None:
        body = self.body()
        self.server.calls.append((self.command, self.path, body))
        action = self.server.routes.get((self.command, self.path))
        if action is None:
            self.reply(404, '{"detail":"Not Found"}')
        else:
            action(self, body)

    def do_GET(self) -> None:
        self.handle_any()

    def do_POST(self) -> None:
        self.handle_any()


@pytest.fixture
def server() -> Iterator[ThreadingHTTPServer]:
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    srv.daemon_threads = True
    srv.calls = []  # type: ignore[attr-defined]
    srv.routes = {}  # type: ignore[attr-defined]
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()


def url(srv: ThreadingHTTPServer) -> str:
    return f"http://127.0.0.1:{srv.server_address[1]}"


def _write_later(directory: Path, name: str, delay_s: float = 0.05) -> None:
    """Write a real trace the way a profiler does: after a while, in two parts."""

    def work() -> None:
        time.sleep(delay_s)
        data = fixture("h200_graph").read_bytes()
        directory.mkdir(parents=True, exist_ok=True)
        with (directory / name).open("wb") as out:
            out.write(data[: len(data) // 2])
            out.flush()
            time.sleep(0.05)
            out.write(data[len(data) // 2 :])

    threading.Thread(target=work, daemon=True).start()


def sglang_routes(srv: Any, *, write: bool = True) -> None:
    def info(h: Handler, _body: dict[str, Any]) -> None:
        h.reply(200, '{"version": "0.5"}')

    def start(h: Handler, body: dict[str, Any]) -> None:
        if write:
            _write_later(Path(body["output_dir"]), "1764400000.1-TP-1.trace.json.gz")
            _write_later(Path(body["output_dir"]), "1764400000.1-TP-0.trace.json.gz")
        h.reply(200, "Start profiling.")

    srv.routes[("GET", "/get_server_info")] = info
    srv.routes[("POST", "/start_profile")] = start


def test_sglang_capture_flow(server: Any, tmp_path: Path) -> None:
    sglang_routes(server)
    result = capture(url(server), steps=3, output_dir=tmp_path / "out", timeout_s=10, poll_s=0.02, settle_s=0.5)
    assert result.engine == "sglang"
    assert result.path.name.endswith("TP-0.trace.json.gz")
    assert [p.name for p in result.other_files] == ["1764400000.1-TP-1.trace.json.gz"]
    method, path, body = server.calls[-1]
    assert (method, path) == ("POST", "/start_profile")
    assert body == {"output_dir": str((tmp_path / "out").resolve()), "num_steps": 3, "activities": ["CPU", "GPU"]}
    assert len(analyze_trace(result.path).steps) == 4


def test_vllm_capture_flow(server: Any, tmp_path: Path) -> None:
    trace_dir = tmp_path / "vllm"
    trace_dir.mkdir()
    shutil.copy(fixture("cpu_eager"), trace_dir / "old.pt.trace.json.gz")  # an earlier trace is not taken

    def version(h: Handler, _b: dict[str, Any]) -> None:
        h.reply(200, '{"version": "0.11"}')

    def ok(h: Handler, _b: dict[str, Any]) -> None:
        h.reply(200)

    def stop(h: Handler, _b: dict[str, Any]) -> None:
        _write_later(trace_dir, "host_123.1764400000.pt.trace.json.gz", 0.0)
        h.reply(200)

    server.routes.update(
        {("GET", "/version"): version, ("POST", "/start_profile"): ok, ("POST", "/stop_profile"): stop}
    )
    result = capture(url(server), output_dir=trace_dir, timeout_s=10, duration_s=0.01, poll_s=0.02, settle_s=0.5)
    assert result.engine == "vllm" and result.path.name == "host_123.1764400000.pt.trace.json.gz"
    assert [c[1] for c in server.calls] == ["/get_server_info", "/version", "/start_profile", "/stop_profile"]
    with pytest.raises(UserInputError, match="VLLM_TORCH_PROFILER_DIR"):
        capture(url(server), engine="vllm", timeout_s=1)


def test_server_refuses(server: Any, tmp_path: Path) -> None:
    sglang_routes(server)

    def busy(h: Handler, _b: dict[str, Any]) -> None:
        h.reply(400, "Profiling is already in progress. Call /stop_profile first.\nmore")

    server.routes[("POST", "/start_profile")] = busy
    with pytest.raises(UserInputError) as err:
        capture(url(server), output_dir=tmp_path, timeout_s=5)
    assert str(err.value).endswith("refused (400): Profiling is already in progress. Call /stop_profile first.")


def test_server_times_out(server: Any, tmp_path: Path) -> None:
    sglang_routes(server)

    release, answered = threading.Event(), threading.Event()

    def hang(h: Handler, _b: dict[str, Any]) -> None:
        release.wait(30)
        h.reply(200)
        answered.set()

    server.routes[("POST", "/start_profile")] = hang
    with pytest.raises(UserInputError, match=r"no answer from .*/start_profile within"):
        capture(url(server), output_dir=tmp_path, timeout_s=0.5)
    assert not answered.is_set()  # the deadline ended the wait; the server never answered before it
    release.set()


def test_server_writes_no_file(server: Any, tmp_path: Path) -> None:
    sglang_routes(server, write=False)
    with pytest.raises(UserInputError, match=r"no trace file appeared in .* within"):
        capture(url(server), output_dir=tmp_path, timeout_s=0.4, poll_s=0.05)


def test_no_profiling_endpoint_says_how_to_start(server: Any, tmp_path: Path) -> None:
    server.routes[("GET", "/get_server_info")] = lambda h, _b: h.reply(200, "{}")
    with pytest.raises(UserInputError, match=r"no profiling endpoint; start a profiling-enabled server") as err:
        capture(url(server), output_dir=tmp_path, timeout_s=2)
    assert "VLLM_TORCH_PROFILER_DIR" in str(err.value)
    with pytest.raises(UserInputError, match="answers neither"):
        server.routes.clear()
        capture(url(server), timeout_s=2)


def test_nothing_listening(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    assert main(["trace", "--server", f"http://127.0.0.1:{port}", "--engine", "sglang", "--timeout", "2"]) == 2
    err = capsys.readouterr().err.strip()
    assert "cannot reach" in err and "start a profiling-enabled server" in err and "\n" not in err


def test_cli_capture_then_attribute(server: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sglang_routes(server)
    argv = [
        "trace",
        "--server",
        url(server),
        "--steps",
        "2",
        "--output-dir",
        str(tmp_path),
        "--json",
        "--timeout",
        "10",
    ]
    assert main(argv) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["captured"]["engine"] == "sglang" and len(data["trace"]["steps"]) == 4
