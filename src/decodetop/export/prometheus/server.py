"""Provides the /metrics HTTP server: the `--listen` address (parsed, and a warning when it is every interface) and
a daemon-thread server on its own registry.

    handle = start_metrics_server("127.0.0.1:9464", box)   # box: StateBox, or any () -> ExportState
    ...
    handle.close()
"""

from __future__ import annotations

import ipaddress
import socket
import threading
from dataclasses import dataclass
from wsgiref.simple_server import WSGIServer

from prometheus_client import start_http_server

from decodetop.errors import UserInputError
from decodetop.export.prometheus.rendering import make_registry
from decodetop.export.prometheus.state import StateProvider

DEFAULT_LISTEN = "127.0.0.1:9464"
"""9464 is the port OpenTelemetry's Prometheus exporter uses by default; loopback unless told otherwise (AGENTS.md)."""


def listen_warning(host: str) -> str | None:
    """The line to print when `host` serves the metrics on every interface: decided by the address it resolves to,
    as the server's bind resolves it (`0`, `0x0`, `0.0`, `[::0]`, `[::ffff:0.0.0.0]` are 0.0.0.0 or ::), not by
    its spelling; an empty host is the wildcard too."""
    if not _is_wildcard(host.strip("[]")):
        return None
    return (
        f"--listen {host or '*'}: the metrics (GPU names, host checks, probe results) are exposed on every network "
        "interface of this host; use 127.0.0.1 or a firewall unless that is what you want"
    )


def _is_wildcard(host: str) -> bool:
    """True when any address `host` resolves to is unspecified (0.0.0.0, ::, or :: mapping 0.0.0.0)."""
    if not host:
        return True
    try:
        found = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (OSError, UnicodeError):
        return False  # a name that does not resolve cannot be bound either: the server's own error says so
    for *_, sockaddr in found:
        try:
            address = ipaddress.ip_address(str(sockaddr[0]).split("%", 1)[0])
        except ValueError:
            continue
        mapped = address.ipv4_mapped if isinstance(address, ipaddress.IPv6Address) else None
        if address.is_unspecified or (mapped is not None and mapped.is_unspecified):
            return True
    return False


def parse_listen(text: str) -> tuple[str, int]:
    """HOST:PORT (or [IPv6]:PORT, or PORT alone, or :PORT) → (host, port); loopback when no host is given."""
    value = text.strip()
    host = "127.0.0.1"
    port_text = value
    if value.startswith("["):
        end = value.find("]")
        if end < 0 or not value[end + 1 :].startswith(":"):
            raise UserInputError(f"--listen {text!r}: expected [IPv6]:PORT")
        host, port_text = value[1:end], value[end + 2 :]
    elif ":" in value:
        head, _, port_text = value.rpartition(":")
        if ":" in head:
            raise UserInputError(f"--listen {text!r}: put an IPv6 address in brackets, e.g. [::1]:9464")
        host = head or host
    try:
        port = int(port_text)
    except ValueError:
        raise UserInputError(f"--listen {text!r}: port {port_text!r} is not a number") from None
    if not 0 <= port <= 65535:
        raise UserInputError(f"--listen {text!r}: port {port} is out of range 0-65535")
    return host, port


@dataclass
class MetricsServer:
    """A running /metrics server; `close()` stops it (idempotent)."""

    host: str
    port: int
    _server: WSGIServer | None
    _thread: threading.Thread

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop serving and release the port."""
        server, self._server = self._server, None
        if server is None:
            return
        server.shutdown()
        server.server_close()
        self._thread.join(timeout_s)

    def __enter__(self) -> MetricsServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def start_metrics_server(addr: str | tuple[str, int], state_provider: StateProvider) -> MetricsServer:
    """Serve the exposition of `state_provider()` on http://addr/metrics from a daemon thread; own registry.

    `addr` is "HOST:PORT" (default form "127.0.0.1:9464"; port 0 picks a free one, see `.port`). A port in use or
    a host that is not ours gives one UserInputError line.
    """
    host, port = parse_listen(addr) if isinstance(addr, str) else addr
    registry = make_registry(state_provider, process=True)
    try:
        server, thread = start_http_server(port, addr=host, registry=registry)
    except OSError as exc:
        raise UserInputError(f"--listen {host}:{port}: cannot listen ({exc.strerror or exc})") from None
    bound_port = int(server.server_address[1])
    return MetricsServer(host=host, port=bound_port, _server=server, _thread=thread)
