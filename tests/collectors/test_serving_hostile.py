"""A hostile /metrics server cannot crash or steer a reader: infinite or absurd observed steps, sums that overflow,
fractional counts, a reason phrase or a status line full of escape sequences, malformed URLs. Every poll is a
`ServerStatus` with one inert line, or an `ServerStep` in range; never an exception. Servers on loopback."""

from __future__ import annotations

import math
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from decodetop.collectors.serving import ServerStatus, ServerStep, ServerStepSource
from decodetop.errors import UserInputError
from tests.helpers.hostile_text import assert_inert

PROM = "text/plain; version=0.0.4; charset=utf-8"
FAMILY = "sglang:inter_token_latency_seconds"


def _page(sums: dict[str, float], counts: dict[str, float]) -> str:
    lines = [f"# HELP {FAMILY} ITL", f"# TYPE {FAMILY} histogram"]
    for model, total in sums.items():
        label = f'model_name="{model}"'
        lines += [
            f'{FAMILY}_bucket{{{label},le="+Inf"}} {counts[model]!r}',
            f"{FAMILY}_sum{{{label}}} {total!r}",
            f"{FAMILY}_count{{{label}}} {counts[model]!r}",
        ]
    return "\n".join(lines) + "\n"


@dataclass
class Script:
    """The pages served, one per scrape (the last one repeats), with the status line to send."""

    pages: list[str] = field(default_factory=list)
    status: int = 200
    reason: str = "OK"
    raw_status_line: bytes | None = None
    served: int = 0


class _Handler(BaseHTTPRequestHandler):
    script: Script

    def do_GET(self) -> None:
        script = self.script
        body = script.pages[min(script.served, len(script.pages) - 1)].encode()
        script.served += 1
        if script.raw_status_line is not None:
            self.wfile.write(script.raw_status_line + b"Content-Length: 0\r\n\r\n")
            return
        self.send_response(script.status, script.reason)
        self.send_header("Content-Type", PROM)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[tuple[Script, str]]:
    script = Script()
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), type("H", (_Handler,), {"script": script}))
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        yield script, f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _polls(url: str, n: int) -> list[ServerStep | ServerStatus]:
    clock = Clock()
    source = ServerStepSource(url, clock=clock, window_s=5.0)
    out = []
    for _ in range(n):
        out.append(source.poll())
        clock.t += 5.0
    return out


def _in_range_or_said(answers: list[ServerStep | ServerStatus]) -> list[ServerStatus]:
    for answer in answers:
        if isinstance(answer, ServerStep):
            assert math.isfinite(answer.step_ms) and 0 < answer.step_ms < 1e7, answer  # never inf, never 1e300
        else:
            assert_inert(answer.message)
    return [a for a in answers if isinstance(a, ServerStatus)]


def test_a_sum_growing_by_1e307_a_poll_never_gives_an_infinite_step(server: tuple[Script, str]) -> None:
    script, url = server
    script.pages = [_page({"m": k * 1e307}, {"m": float(k)}) for k in range(1, 8)]
    statuses = _in_range_or_said(_polls(url, 7))  # main: ServerStep(step_ms=inf), then the UI died
    assert any("not an observed step" in s.message or "out-of-range" in s.message for s in statuses)


def test_a_tiny_count_never_gives_a_300_digit_step(server: tuple[Script, str]) -> None:
    script, url = server
    script.pages = [_page({"m": 1.0 + k}, {"m": 1e-300 * k}) for k in range(1, 5)]
    _in_range_or_said(_polls(url, 4))


def test_totals_that_overflow_when_summed_are_said_not_raised(server: tuple[Script, str]) -> None:
    script, url = server
    script.pages = [_page({"a": 1.7e308, "b": 1.7e308}, {"a": 1.0, "b": 1.0})]
    statuses = _in_range_or_said(_polls(url, 2))  # main: OverflowError from math.fsum
    assert statuses and "out-of-range totals" in statuses[0].message


def test_a_hostile_reason_phrase_is_inert(server: tuple[Script, str]) -> None:
    script, url = server
    script.pages = ["x"]
    script.status, script.reason = 503, "\x1b]0;PWNED\x07\x1b[2J[bold red]down[/oops]"
    status = _in_range_or_said(_polls(url, 1))[0]
    assert "HTTP 503 ␛]0;PWNED␇␛[2J[bold red]down[/oops]" in status.message


def test_a_status_line_that_is_not_http_is_inert(server: tuple[Script, str]) -> None:
    script, url = server
    script.pages = ["x"]
    script.raw_status_line = b"\x1b]0;PWNED\x07\x1b[2Jgarbage\r\n"
    status = _in_range_or_said(_polls(url, 1))[0]
    assert "␛]0;PWNED␇" in status.message and "\n" not in status.message


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


BAD_URLS = {
    "open-bracket": "http://[::1",
    "port-99999": "http://127.0.0.1:99999/",
    "empty-label": "http://a..b/",
    "crlf": "http://127.0.0.1:{port}/\r\nX-Injected: 1",
    "escape": "http://x\x1b]0;t\x07/",
}


@pytest.mark.parametrize("url", list(BAD_URLS.values()), ids=list(BAD_URLS))
def test_malformed_server_urls_are_one_line(url: str, capfd: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(UserInputError) as info:  # main: a traceback, a thread traceback per poll, or two lines
        ServerStepSource(url.format(port=_free_port())).poll()
    message = str(info.value)
    assert "\n" not in message and "\r" not in message
    assert_inert(message)
    assert "Traceback" not in capfd.readouterr().err


@pytest.mark.parametrize("command", [["trace", "--server"], ["exporter", "--server"], ["--server"]])
@pytest.mark.parametrize("url", list(BAD_URLS.values()), ids=list(BAD_URLS))
def test_malformed_server_flags_are_one_line(command: list[str], url: str, capsys: pytest.CaptureFixture[str]) -> None:
    from decodetop.cli import main

    with pytest.raises(SystemExit) as info:  # main: exit 1 with a traceback for trace --server (bracket, port)
        main([*command, url.format(port=_free_port())])
    err = capsys.readouterr().err
    assert info.value.code == 2 and err.count("\n") == 1 and "--server" in err
    assert_inert(err)
