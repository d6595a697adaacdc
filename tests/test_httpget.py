"""One overall deadline per request to a live server (`decodetop.httpget`), for every `--server` reader: a server
trickling one byte at a time is cut off at the deadline (the observed step's reader is tested in
tests/collectors/test_serving.py, the exporter's in tests/export, the UI's quit in tests/tui/test_server_quit.py;
here the helper itself and `trace --server` capture)."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import pytest

from decodetop.errors import UserInputError
from decodetop.httpget import MAX_REDIRECTS, HttpRequestError, http_request
from decodetop.traces.capture import capture
from tests.helpers.trickle_server import TricklingServer


class _Redirecting(BaseHTTPRequestHandler):
    """/loop redirects to itself; /post answers a POST with a redirect; /big sends 10 kB."""

    def _answer(self) -> None:
        if self.path in {"/loop", "/post"}:
            self.send_response(307)
            self.send_header("Location", self.path)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        body = b"x" * 10_000
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        self._answer()

    def do_POST(self) -> None:
        self._answer()

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def base() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Redirecting)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_a_trickling_server_is_cut_off_at_the_deadline() -> None:
    with TricklingServer(interval_s=0.3) as slow:
        with pytest.raises(HttpRequestError) as info:
            http_request(slow.url, deadline_s=1.0)
        assert slow.sent < slow.total_bytes
    assert info.value.timed_out and str(info.value) == f"{slow.url}: no complete answer within 1 s"


def test_redirect_loops_end_and_a_post_is_not_redirected(base: str) -> None:
    with pytest.raises(HttpRequestError, match=f"more than {MAX_REDIRECTS} redirects"):
        http_request(base + "/loop", deadline_s=5.0)
    answer = http_request(base + "/post", deadline_s=5.0, method="POST", body=b"{}")
    assert answer.status == 307 and answer.location == "/post"


def test_body_is_bounded(base: str) -> None:
    answer = http_request(base + "/big", deadline_s=5.0, max_body_bytes=100)
    assert answer.truncated and len(answer.body) == 100


def test_refused_and_bad_urls_are_one_line() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(HttpRequestError, match="connection refused") as info:
        http_request(f"http://127.0.0.1:{port}/metrics", deadline_s=2.0)
    assert not info.value.timed_out
    with pytest.raises(HttpRequestError, match="is not http or https"):
        http_request("file:///etc/passwd", deadline_s=2.0)


def test_trace_capture_from_a_trickling_server_ends_at_its_deadline(tmp_path: Path) -> None:
    with TricklingServer(interval_s=0.3) as slow:
        base_url = slow.url.removesuffix("/metrics")
        with pytest.raises(UserInputError, match=r"no answer from .*/start_profile within 1 s"):
            capture(base_url, engine="sglang", output_dir=tmp_path, timeout_s=1.0)
        assert slow.sent < slow.total_bytes


def test_a_slow_name_lookup_ends_at_the_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    """getaddrinfo cannot be interrupted (a dead DNS server takes tens of seconds); the request stops waiting for it
    at the deadline."""
    release = threading.Event()
    real = socket.getaddrinfo

    def stuck_dns(*args: object, **kwargs: object) -> object:
        release.wait(60.0)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(socket, "getaddrinfo", stuck_dns)
    try:
        with pytest.raises(HttpRequestError) as info:
            http_request("http://metrics.invalid:30000/metrics", deadline_s=0.5)
    finally:
        release.set()
    assert info.value.timed_out and "no complete answer within 0.5 s" in str(info.value)


# ------------------------------------------------------------------------------------ redirects stay on the server


class _Counting(BaseHTTPRequestHandler):
    """Counts every request it gets: the decoy a redirect must never reach."""

    hits: ClassVar[list[str]] = []

    def do_GET(self) -> None:
        self.hits.append(self.path)
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, format: str, *args: object) -> None:
        pass


def _serve(handler: type[BaseHTTPRequestHandler]) -> ThreadingHTTPServer:
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    return server


def _redirecting_to(location: str) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(302)
            self.send_header("Location", location)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: object) -> None:
            pass

    return Handler


@pytest.mark.parametrize(
    "location",
    [
        "http://127.0.0.1:{decoy}/metrics",  # another port on the same host: another server
        "http://localhost:{decoy}/metrics",
        "http://decoy.invalid/metrics",  # an outside name: never even looked up
        "http://192.0.2.1/metrics",  # an outside address (TEST-NET-1)
        "https://127.0.0.1:{port}/metrics",  # another scheme
        "//decoy.invalid/metrics",  # scheme-relative
    ],
)
def test_a_redirect_off_the_server_is_not_followed_and_said(location: str, monkeypatch: pytest.MonkeyPatch) -> None:
    decoy = _serve(type("Decoy", (_Counting,), {"hits": []}))
    looked_up: list[str] = []
    real_getaddrinfo = socket.getaddrinfo

    def recording_getaddrinfo(host: object, *args: object, **kwargs: object) -> object:
        looked_up.append(str(host))
        return real_getaddrinfo(host, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(socket, "getaddrinfo", recording_getaddrinfo)
    server = None
    try:
        server = _serve(_redirecting_to("PLACEHOLDER"))
        port = server.server_address[1]
        target = location.format(decoy=decoy.server_address[1], port=port)
        server.RequestHandlerClass = _redirecting_to(target)
        with pytest.raises(HttpRequestError, match="not followed") as info:
            http_request(f"http://127.0.0.1:{port}/metrics", deadline_s=3.0)
        assert "\n" not in str(info.value)
        assert decoy.RequestHandlerClass.hits == []  # type: ignore[attr-defined]
        assert set(looked_up) <= {"127.0.0.1"}  # main looked up decoy.invalid and connected to 192.0.2.1
    finally:
        decoy.shutdown()
        decoy.server_close()
        if server is not None:
            server.shutdown()
            server.server_close()


def test_a_redirect_on_the_same_server_is_still_followed() -> None:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path == "/metrics":
                self.send_response(307)
                self.send_header("Location", "/metrics/")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = _serve(Handler)
    try:
        answer = http_request(f"http://127.0.0.1:{server.server_address[1]}/metrics", deadline_s=3.0)
        assert answer.status == 200 and answer.body == b"ok" and answer.url.endswith("/metrics/")
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("url", ["http://[::1", "http://127.0.0.1:99999/", "http://a..b/", "http://h/\r\nX: y"])
def test_malformed_urls_are_one_line_without_a_thread_traceback(url: str, capfd: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(HttpRequestError, match="bad URL") as info:
        http_request(url, deadline_s=2.0)
    assert "\n" not in str(info.value) and "\r" not in str(info.value)
    assert "Traceback" not in capfd.readouterr().err
