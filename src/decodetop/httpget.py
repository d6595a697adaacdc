"""Provides `http_request`: one HTTP request to a live server under ONE overall deadline (connect, request, status
line, headers and body together), for every read of a `--server` (the observed step, the exporter, trace capture).

Socket timeouts alone bound each read, not the request: a server that sends one byte every 1.5 s never trips a 2 s
read timeout and holds the caller for as long as it likes. Here every read waits at most for what is left of the
deadline, so the request ends at the deadline whatever the server does. Redirects (vLLM's `/metrics` answers 307
to `/metrics/`) are followed within the same deadline, and only to the same scheme, host and port: a `Location`
naming another host (or another port) is never looked up nor connected to, the request ends with one line saying
where it pointed. Every URL (the one given and each redirect) is checked by `check_url` first: a malformed one
(an unclosed IPv6 bracket, a port past 65535, an empty host label, a control character) is one line, never a
traceback. Text the server chose (its reason phrase, a broken status line) is made inert (`decodetop.inert`)
before it goes into an answer or an error. Loopback never goes through a proxy from the environment;
other hosts honour `http_proxy`/`https_proxy`/`no_proxy` as urllib does. The host name is looked up on a helper
thread that the request stops waiting for at the deadline (`getaddrinfo` itself cannot be interrupted, and a slow DNS
server can take tens of seconds). A TLS handshake is bounded per read by what was left of the deadline when it
started.

Stdlib only, so every package may use it.
"""

from __future__ import annotations

import base64
import http.client
import io
import ipaddress
import socket
import ssl
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from decodetop.inert import inert

MAX_REDIRECTS = 5
"""Redirects followed before giving up (urllib follows 10; a metrics endpoint needs one)."""
_REDIRECTS = frozenset({301, 302, 303, 307, 308})
MAX_SERVER_TEXT = 200
"""Characters kept of a text the server chose (a reason phrase, a Location) in an answer or a message."""
MAX_URL_CHARS = 2048
"""A longer URL is refused (browsers and servers stop near 2,000-8,000; a --server URL is tens of characters)."""
_DEFAULT_PORTS = {"http": 80, "https": 443}


class BadUrlError(ValueError):
    """A URL that cannot be requested; the message is one line, without the URL."""


def server_text(text: str) -> str:
    """Text a server chose, inert and at most `MAX_SERVER_TEXT` characters: safe in a one-line message."""
    value = inert(text)
    return value if len(value) <= MAX_SERVER_TEXT else value[: MAX_SERVER_TEXT - 1] + "…"


def _check_host(host: str) -> None:
    """A host is an IP address or a DNS name whose labels are 1 to 63 characters (RFC 1035 §2.3.4)."""
    try:
        ipaddress.ip_address(host.split("%", 1)[0] if ":" in host else host)
        return
    except ValueError:
        pass
    if len(host) > 253 or any(not 1 <= len(label) <= 63 for label in host.rstrip(".").split(".")):
        raise BadUrlError(f"host name {server_text(host)!r} has an empty or over-long label")
    try:
        host.encode("idna")
    except UnicodeError as exc:
        raise BadUrlError(f"host name {server_text(host)!r} is not a valid name ({exc})") from None


def check_url(url: str) -> urllib.parse.SplitResult:
    """The parts of an http(s) URL that can be requested; `BadUrlError` (one line) for anything else: a control
    character or a space in it, a bracket left open, another scheme, no host, a malformed host name, a port that is
    not 1 to 65535."""
    if len(url) > MAX_URL_CHARS:
        raise BadUrlError(f"longer than {MAX_URL_CHARS} characters")
    if any(ch.isspace() or not ch.isprintable() for ch in url):
        raise BadUrlError("contains a space or a control character (a line break, a tab…)")
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port
    except ValueError as exc:  # "Invalid IPv6 URL", "Port out of range 0-65535", a port that is not a number
        reason = str(exc).splitlines()[0] if str(exc) else "malformed"
        if "port" in reason.lower():
            raise BadUrlError("the port is not a number from 1 to 65535") from None
        raise BadUrlError(f"not a URL ({reason})") from None
    if parts.scheme not in {"http", "https"}:
        raise BadUrlError(f"scheme {parts.scheme!r} is not http or https" if parts.scheme else "no http:// or https://")
    if not parts.hostname:
        raise BadUrlError("no host name")
    if port == 0:
        raise BadUrlError("the port is not a number from 1 to 65535")
    _check_host(parts.hostname)
    return parts


def _origin(parts: urllib.parse.SplitResult) -> tuple[str, str, int]:
    """(scheme, host, port) with the scheme's default port filled in: what a redirect must keep."""
    return parts.scheme, (parts.hostname or "").lower(), parts.port or _DEFAULT_PORTS.get(parts.scheme, 0)


@dataclass(frozen=True)
class HttpAnswer:
    """A complete answer: status, content type and at most `max_body_bytes` + 1 bytes of the body."""

    url: str
    """The URL that answered (after redirects)."""
    status: int
    reason: str
    content_type: str
    body: bytes
    truncated: bool
    """The body is longer than the limit asked for (only the limit + 1 bytes were read)."""
    location: str = ""
    """The Location header of a redirect that was not followed."""


class HttpRequestError(Exception):
    """No complete answer: the host is unreachable, refused, broke the protocol, or the deadline passed."""

    def __init__(self, url: str, reason: str, *, timed_out: bool = False) -> None:
        self.url = url
        self.reason = reason
        """One line, without the URL."""
        self.timed_out = timed_out
        """True when the deadline passed (the server was reached, or not, but did not finish in time)."""
        super().__init__(f"{server_text(url)}: {reason}")  # one line whatever the URL holds


class _DeadlineReader(io.RawIOBase):
    """The socket's bytes, each read waiting at most for what is left of the deadline. Holds its own file over the
    socket (as the response's own file does), so the connection closing early does not close the socket under it."""

    def __init__(self, sock: socket.socket, deadline_s: float, clock: Callable[[], float]) -> None:
        super().__init__()
        self._sock = sock
        self._raw = sock.makefile("rb", buffering=0)
        self._deadline_s = deadline_s
        self._clock = clock

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview | bytearray) -> int:  # type: ignore[override]
        remaining = self._deadline_s - self._clock()
        if remaining <= 0:
            raise TimeoutError("deadline passed")
        self._sock.settimeout(remaining)
        return self._raw.readinto(buffer) or 0  # None only on a non-blocking socket, which this is not

    def close(self) -> None:
        self._raw.close()
        super().close()


def _response_class(deadline_s: float, clock: Callable[[], float]) -> type[http.client.HTTPResponse]:
    class _DeadlineResponse(http.client.HTTPResponse):
        def __init__(
            self, sock: socket.socket, debuglevel: int = 0, method: str | None = None, url: str | None = None
        ) -> None:
            super().__init__(sock, debuglevel, method, url)
            self.fp.close()  # the plain file over the socket: every read goes through the deadline instead
            self.fp = io.BufferedReader(_DeadlineReader(sock, deadline_s, clock))

    return _DeadlineResponse


class _Http(http.client.HTTPConnection):
    _create_connection: Callable[..., socket.socket]


class _Https(http.client.HTTPSConnection):
    _create_connection: Callable[..., socket.socket]


AddrInfo = tuple[socket.AddressFamily, socket.SocketKind, int, str, tuple[object, ...]]


def _lookup(host: str, port: int, wait_s: float) -> list[AddrInfo]:
    """`getaddrinfo` on a daemon thread, waited for at most `wait_s` (TimeoutError after that)."""
    answer: list[list[AddrInfo]] = []
    failure: list[OSError] = []

    def work() -> None:
        try:
            answer.append(
                [(f, k, p, n, tuple(a)) for f, k, p, n, a in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)]
            )
        except OSError as exc:
            failure.append(exc)
        except (UnicodeError, ValueError) as exc:  # a name the IDNA codec refuses: said, never a thread traceback
            failure.append(socket.gaierror(socket.EAI_NONAME, f"not a valid host name ({exc})"))

    worker = threading.Thread(target=work, name="decodetop-name-lookup", daemon=True)
    worker.start()
    worker.join(max(wait_s, 0.0))
    if failure:
        raise failure[0]
    if not answer:
        raise TimeoutError(f"looking up {host}")
    return answer[0]


def _connector(deadline_s: float, clock: Callable[[], float]) -> Callable[..., socket.socket]:
    """A `socket.create_connection` whose name lookup and connects keep to the deadline."""

    def create_connection(address: tuple[str, int], *_: object, **__: object) -> socket.socket:
        host, port = address
        last: OSError | None = None
        for family, kind, proto, _name, sockaddr in _lookup(host, port, deadline_s - clock()):
            remaining = deadline_s - clock()
            if remaining <= 0:
                raise TimeoutError("deadline passed")
            sock = socket.socket(family, kind, proto)
            try:
                sock.settimeout(remaining)
                sock.connect(sockaddr)
            except OSError as exc:
                sock.close()
                last = exc
                continue
            return sock
        raise last if last is not None else OSError(f"no address for {host}")

    return create_connection


def is_loopback(host: str) -> bool:
    """`localhost` or a loopback address (127.0.0.0/8, ::1)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _proxy_for(parts: urllib.parse.SplitResult) -> urllib.parse.SplitResult | None:
    host = parts.hostname or ""
    if is_loopback(host):
        return None
    proxy = urllib.request.getproxies().get(parts.scheme)
    if not proxy or urllib.request.proxy_bypass(host):
        return None
    return urllib.parse.urlsplit(proxy if "://" in proxy else "http://" + proxy)


def _connection(parts: urllib.parse.SplitResult, timeout_s: float) -> tuple[_Http | _Https, str, dict[str, str]]:
    """(connection, request target, extra headers) for a URL, through the environment's proxy where one applies."""
    host = parts.hostname or ""
    port = parts.port
    target = urllib.parse.urlunsplit(("", "", parts.path or "/", parts.query, ""))
    proxy = _proxy_for(parts)
    extra: dict[str, str] = {}
    conn: _Http | _Https
    if proxy is not None and proxy.username:
        token = base64.b64encode(f"{proxy.username}:{proxy.password or ''}".encode()).decode("ascii")
        extra["Proxy-Authorization"] = f"Basic {token}"
    if parts.scheme == "https":
        context = ssl.create_default_context()
        if proxy is None:
            conn = _Https(host, port, timeout=timeout_s, context=context)
        else:
            conn = _Https(proxy.hostname or "", proxy.port, timeout=timeout_s, context=context)
            conn.set_tunnel(host, port, headers=extra)
            extra = {}
    elif proxy is None:
        conn = _Http(host, port, timeout=timeout_s)
    else:
        conn = _Http(proxy.hostname or "", proxy.port, timeout=timeout_s)
        target = urllib.parse.urlunsplit((parts.scheme, parts.netloc, parts.path or "/", parts.query, ""))
    return conn, target, extra


def _describe(exc: BaseException) -> str:
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, socket.gaierror):
        return f"cannot resolve the host name ({exc.strerror or exc})"
    if isinstance(exc, ssl.SSLError):
        return f"TLS failed ({server_text(str(exc.reason or exc))})"
    text = server_text(str(exc)) if str(exc) else ""  # a broken status line is the server's text: inert
    return f"connection failed ({type(exc).__name__}{': ' + text if text else ''})"


def _once(
    url: str,
    *,
    method: str,
    body: bytes | None,
    headers: Mapping[str, str],
    deadline_s: float,
    max_body_bytes: int,
    clock: Callable[[], float],
    total_s: float,
) -> HttpAnswer:
    try:
        parts = check_url(url)
    except BadUrlError as exc:
        raise HttpRequestError(url, f"bad URL: {exc}") from None
    remaining = deadline_s - clock()
    if remaining <= 0:
        raise HttpRequestError(url, f"no complete answer within {total_s:g} s", timed_out=True)
    conn, target, extra = _connection(parts, remaining)
    conn._create_connection = _connector(deadline_s, clock)
    conn.response_class = _response_class(deadline_s, clock)
    try:
        conn.request(method, target, body=body, headers={**headers, **extra})
        response = conn.getresponse()
        data = response.read(max_body_bytes + 1)
        return HttpAnswer(
            url=url,
            status=response.status,
            reason=server_text(str(response.reason or "")),
            content_type=server_text(str(response.headers.get("Content-Type", ""))),
            body=data[:max_body_bytes],
            truncated=len(data) > max_body_bytes,
            location=str(response.headers.get("Location", ""))[: MAX_URL_CHARS + 1],
        )
    except TimeoutError:
        raise HttpRequestError(url, f"no complete answer within {total_s:g} s", timed_out=True) from None
    except (OSError, http.client.HTTPException, ValueError) as exc:
        raise HttpRequestError(url, _describe(exc)) from None
    finally:
        conn.close()


def http_request(
    url: str,
    *,
    deadline_s: float,
    method: str = "GET",
    body: bytes | None = None,
    headers: Mapping[str, str] | None = None,
    max_body_bytes: int = 1024 * 1024,
    clock: Callable[[], float] = time.monotonic,
) -> HttpAnswer:
    """Send one request and read the whole answer (any status) within `deadline_s` seconds from now, following
    redirects of GET and HEAD to the same scheme, host and port within the same deadline. Raises `HttpRequestError`
    (one line) when there is no complete answer in time or at all, or a redirect points elsewhere."""
    if not deadline_s > 0:
        raise ValueError(f"deadline_s must be positive, got {deadline_s!r}")
    deadline = clock() + deadline_s
    current = url
    for hop in range(MAX_REDIRECTS + 1):
        if hop:
            _check_redirect(url, current)
        answer = _once(
            current,
            method=method,
            body=body,
            headers=headers or {},
            deadline_s=deadline,
            max_body_bytes=max_body_bytes,
            clock=clock,
            total_s=deadline_s,
        )
        if answer.status not in _REDIRECTS or not answer.location or method not in {"GET", "HEAD"}:
            return answer
        try:
            current = urllib.parse.urljoin(current, answer.location)
        except ValueError:
            raise HttpRequestError(url, f"redirected to a malformed URL ({server_text(answer.location)})") from None
    raise HttpRequestError(url, f"more than {MAX_REDIRECTS} redirects")


def _check_redirect(url: str, target: str) -> None:
    """Refuse a redirect to another scheme, host or port (or to a malformed URL) before anything is looked up."""
    try:
        parts = check_url(target)
    except BadUrlError as exc:
        raise HttpRequestError(url, f"redirected to a bad URL ({server_text(target)}: {exc}); not followed") from None
    if _origin(parts) != _origin(urllib.parse.urlsplit(url)):
        raise HttpRequestError(
            url,
            f"redirected to {server_text(target)}, another host or port; not followed (only redirects to the same "
            "host and port are: give that URL itself if it is the server)",
        )
