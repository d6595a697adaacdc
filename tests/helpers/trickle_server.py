"""A loopback HTTP server that answers one byte at a time (a slow or hostile `--server`), for the deadline tests of
every `--server` reader: the observed step, the exporter and the TUI."""

from __future__ import annotations

import contextlib
import socket
import threading
from types import TracebackType

METRICS_PAGE = (
    "# HELP vllm:inter_token_latency_seconds Histogram of inter-token latency in seconds.\n"
    "# TYPE vllm:inter_token_latency_seconds histogram\n"
    'vllm:inter_token_latency_seconds_bucket{le="+Inf",model_name="m"} 100.0\n'
    'vllm:inter_token_latency_seconds_count{model_name="m"} 100.0\n'
    'vllm:inter_token_latency_seconds_sum{model_name="m"} 1.0\n'
)


class TricklingServer:
    """Accepts connections on 127.0.0.1 and sends a complete metrics answer one byte every `interval_s`: from the
    status line on (`headers_first=False`) or after the headers at once. A reader with per-read timeouts longer than
    `interval_s` never gives up; only an overall deadline ends the read. `sent` counts the bytes sent so far."""

    def __init__(self, interval_s: float = 0.05, *, headers_first: bool = False, body: str = METRICS_PAGE) -> None:
        payload = body.encode() * 100  # long enough that trickling all of it takes minutes
        head = (
            f"HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {len(payload)}\r\n\r\n"
        ).encode()
        self.interval_s = interval_s
        self.headers_first = headers_first
        self._head, self._body = head, payload
        self.sent = 0
        self.connections = 0
        self._stop = threading.Event()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.1)
        self.port = int(self._listener.getsockname()[1])
        self.url = f"http://127.0.0.1:{self.port}/metrics"
        self._thread = threading.Thread(target=self._serve, name="trickle-accept", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._trickle, args=(conn,), name="trickle-conn", daemon=True).start()

    def _trickle(self, conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError):
            conn.settimeout(5.0)
            request = b""
            while b"\r\n\r\n" not in request and len(request) < 65536:
                chunk = conn.recv(4096)
                if not chunk:
                    return
                request += chunk
            data = self._head + self._body
            if self.headers_first:
                conn.sendall(self._head)
                self.sent += len(self._head)
                data = self._body
            for i in range(len(data)):
                if self._stop.wait(self.interval_s):
                    return
                conn.sendall(data[i : i + 1])
                self.sent += 1

    @property
    def total_bytes(self) -> int:
        """What a complete answer is: a reader that got this many bytes was not cut off."""
        return len(self._head) + len(self._body)

    def close(self) -> None:
        """Stop trickling and close the listener."""
        self._stop.set()
        self._listener.close()
        self._thread.join(5.0)

    def __enter__(self) -> TricklingServer:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
