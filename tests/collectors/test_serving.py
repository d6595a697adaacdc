"""The observed step from a live engine's /metrics: real-format SGLang and vLLM pages served over loopback HTTP,
counters advancing between scrapes, and every way a URL can fail giving a clear status."""

from __future__ import annotations

import contextlib
import re
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from decodetop.collectors.serving import (
    ServerState,
    ServerStatus,
    ServerStep,
    ServerStepSource,
    normalize_url,
    parse_latency_totals,
)
from decodetop.errors import UserInputError
from tests.helpers.trickle_server import TricklingServer

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "metrics"
_SAMPLE = re.compile(r"^(?P<name>[^\s{]+)(?P<labels>\{[^}]*\})? (?P<value>\S+)$")
_LE = re.compile(r'le="([^"]+)"')


def advance(text: str, family: str, steps: list[tuple[float, int]], model_name: str | None = None) -> str:
    """The page after the engine observed `steps`: each (interval_s, new_tokens) adds the interval to _sum and
    new_tokens to _count and to every bucket whose bound holds interval/new_tokens (SGLang's own bookkeeping;
    vLLM passes new_tokens=1 per engine step)."""
    out = []
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if m is None or not m.group("name").startswith(family + "_"):
            out.append(line)
            continue
        labels = m.group("labels") or ""
        if model_name is not None and f'model_name="{model_name}"' not in labels:
            out.append(line)
            continue
        value = float(m.group("value"))
        suffix = m.group("name")[len(family) + 1 :]
        if suffix == "sum":
            value += sum(interval for interval, _ in steps)
        elif suffix == "count":
            value += sum(tokens for _, tokens in steps)
        elif suffix == "bucket":
            le_match = _LE.search(labels)
            assert le_match is not None
            le = float(le_match.group(1))
            value += sum(tokens for interval, tokens in steps if interval / tokens <= le)
        else:
            out.append(line)
            continue
        out.append(f"{m.group('name')}{labels} {value!r}")
    return "\n".join(out) + "\n"


@dataclass
class Engine:
    """What the fake engine serves on each path; tests change `pages` between scrapes."""

    pages: dict[str, tuple[int, str, str]] = field(default_factory=dict)
    delay_s: float = 0.0
    hits: int = 0
    redirects: dict[str, str] = field(default_factory=dict)


class _Handler(BaseHTTPRequestHandler):
    engine: Engine

    def do_GET(self) -> None:
        self.engine.hits += 1
        if self.engine.delay_s:
            time.sleep(self.engine.delay_s)
        status, content_type, body = self.engine.pages.get(self.path, (404, "text/plain", "Not Found"))
        data = body.encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        if self.path in self.engine.redirects:
            self.send_header("Location", self.engine.redirects[self.path])
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # the client gave up (timeout test)
            self.wfile.write(data)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def engine() -> Iterator[tuple[Engine, str]]:
    state = Engine()
    handler = type("Handler", (_Handler,), {"engine": state})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield state, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


PROM = "text/plain; version=0.0.4; charset=utf-8"


class FakeClock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _page(name: str) -> str:
    return (FIXTURES / name).read_text()


def test_sglang_step_from_advancing_counters(engine: tuple[Engine, str]) -> None:
    state, base = engine
    page = _page("sglang.txt")
    state.pages["/metrics"] = (200, PROM, page)
    clock = FakeClock()
    source = ServerStepSource(base, clock=clock, window_s=5.0)
    first = source.poll()
    assert isinstance(first, ServerStatus)
    assert first.state is ServerState.WAITING
    assert "sglang" in first.message
    # 250 decode steps of 19.0 ms, one token each (no speculative decoding)
    page = advance(page, "sglang:inter_token_latency_seconds", [(0.019, 1)] * 250)
    state.pages["/metrics"] = (200, PROM, page)
    clock.t += 5.0
    step = source.poll()
    assert isinstance(step, ServerStep), step
    assert step.source == "sglang"
    assert step.metric == "sglang:inter_token_latency_seconds"
    assert step.samples == 250
    assert step.window_s == pytest.approx(5.0)
    assert step.step_ms == pytest.approx(19.0, rel=1e-9)
    assert step.accept_length == 1.0
    assert step.running_requests == 1.0
    assert step.model_names == ("zai-org/GLM-5-NVFP4",)
    assert "250 samples" in step.summary and "sglang" in step.summary


def test_sglang_speculative_step_is_itl_times_accept_length(engine: tuple[Engine, str]) -> None:
    """With MTP, SGLang counts every accepted token: the mean ITL is per token, the step is ITL x accept length."""
    state, base = engine
    page = _page("sglang.txt")
    state.pages["/metrics"] = (200, PROM, page)
    clock = FakeClock()
    given = ServerStepSource(base, accept_length=2.5, clock=clock)
    from_server = ServerStepSource(base, clock=clock)
    assert isinstance(given.poll(), ServerStatus)
    assert isinstance(from_server.poll(), ServerStatus)
    # 100 steps of 24 ms, each accepting 3 tokens; the server's gauge says 3.0
    page = advance(page, "sglang:inter_token_latency_seconds", [(0.024, 3)] * 100)
    page = page.replace(
        'sglang:spec_accept_length{dp_rank="0",engine_type="unified",model_name="zai-org/GLM-5-NVFP4",moe_ep_rank="0",'
        'pp_rank="0",tp_rank="0"} 0.0',
        'sglang:spec_accept_length{dp_rank="0",engine_type="unified",model_name="zai-org/GLM-5-NVFP4",moe_ep_rank="0",'
        'pp_rank="0",tp_rank="0"} 3.0',
    )
    state.pages["/metrics"] = (200, PROM, page)
    clock.t += 10.0
    a = given.poll()
    b = from_server.poll()
    assert isinstance(a, ServerStep) and isinstance(b, ServerStep)
    assert a.samples == b.samples == 300
    assert a.itl_ms == pytest.approx(8.0)
    assert (a.accept_length, a.accept_length_from) == (2.5, "given")
    assert a.step_ms == pytest.approx(20.0)
    assert (b.accept_length, b.accept_length_from) == (3.0, "server")
    assert b.step_ms == pytest.approx(24.0)


def test_vllm_step_prefers_itl_over_deprecated_tpot(engine: tuple[Engine, str]) -> None:
    state, base = engine
    page = _page("vllm.txt")
    state.pages["/metrics"] = (200, PROM, page)
    clock = FakeClock()
    source = ServerStepSource(base + "/metrics", accept_length=2.0, clock=clock)
    assert isinstance(source.poll(), ServerStatus)
    page = advance(page, "vllm:inter_token_latency_seconds", [(0.0104, 1)] * 400 + [(0.0124, 1)] * 100)
    # the deprecated twin moves differently: if it were read, the step would be wrong
    page = advance(page, "vllm:time_per_output_token_seconds", [(0.5, 1)] * 3)
    state.pages["/metrics"] = (200, PROM, page)
    clock.t += 10.0
    step = source.poll()
    assert isinstance(step, ServerStep), step
    assert step.source == "vllm"
    assert step.metric == "vllm:inter_token_latency_seconds"
    assert step.samples == 500
    assert step.itl_ms == pytest.approx(10.8)
    # vLLM records one ITL per engine step, so a given accept length does not multiply it
    assert step.step_ms == pytest.approx(10.8)
    assert (step.accept_length, step.accept_length_from) == (1.0, "none")
    assert "not applied" in step.summary
    assert step.running_requests == 1.0


@pytest.mark.parametrize(
    ("fixture", "family", "source"),
    [
        ("sglang_old_tpot.txt", "sglang:time_per_output_token_seconds", "sglang"),
        ("vllm_v0_tpot.txt", "vllm:time_per_output_token_seconds", "vllm"),
    ],
)
def test_older_time_per_output_token_fallback(
    engine: tuple[Engine, str], fixture: str, family: str, source: str
) -> None:
    state, base = engine
    page = _page(fixture)
    state.pages["/metrics"] = (200, PROM, page)
    clock = FakeClock()
    src = ServerStepSource(base, clock=clock)
    src.poll()
    state.pages["/metrics"] = (200, PROM, advance(page, family, [(0.0125, 1)] * 80))
    clock.t += 3.0
    step = src.poll()
    assert isinstance(step, ServerStep), step
    assert (step.source, step.metric, step.samples) == (source, family, 80)
    assert step.step_ms == pytest.approx(12.5)


def _two_models(page: str) -> str:
    """A second model's series beside the first (two engines behind one port, e.g. a router's aggregate)."""
    extra = [
        line.replace("zai-org/GLM-5-NVFP4", "Qwen/Qwen3-8B")
        for line in page.splitlines()
        if line.startswith("sglang:inter_token_latency_seconds_")
    ]
    lines = page.splitlines()
    last = max(i for i, line in enumerate(lines) if line.startswith("sglang:inter_token_latency_seconds_"))
    return "\n".join(lines[: last + 1] + extra + lines[last + 1 :]) + "\n"


def test_model_name_label_pick_or_aggregate(engine: tuple[Engine, str]) -> None:
    state, base = engine
    page = _two_models(_page("sglang.txt"))
    state.pages["/metrics"] = (200, PROM, page)
    clock = FakeClock()
    pick = ServerStepSource(base, model_name="Qwen/Qwen3-8B", clock=clock)
    both = ServerStepSource(base, clock=clock)
    wrong = ServerStepSource(base, model_name="nope", clock=clock)
    pick.poll()
    both.poll()
    page = advance(page, "sglang:inter_token_latency_seconds", [(0.006, 1)] * 300, model_name="Qwen/Qwen3-8B")
    page = advance(page, "sglang:inter_token_latency_seconds", [(0.020, 1)] * 100, model_name="zai-org/GLM-5-NVFP4")
    state.pages["/metrics"] = (200, PROM, page)
    clock.t += 10.0
    a = pick.poll()
    b = both.poll()
    assert isinstance(a, ServerStep) and isinstance(b, ServerStep)
    assert (a.samples, a.model_names) == (300, ("Qwen/Qwen3-8B",))
    assert a.step_ms == pytest.approx(6.0)
    assert b.samples == 400
    assert b.model_names == ("Qwen/Qwen3-8B", "zai-org/GLM-5-NVFP4")
    assert b.step_ms == pytest.approx((300 * 6.0 + 100 * 20.0) / 400)
    missing = wrong.poll()
    assert isinstance(missing, ServerStatus)
    assert missing.state is ServerState.NO_LATENCY_METRIC
    assert "'nope'" in missing.message and "Qwen/Qwen3-8B" in missing.message


def test_idle_window_then_restart_then_sliding_window(engine: tuple[Engine, str]) -> None:
    state, base = engine
    page = _page("vllm.txt")
    state.pages["/metrics"] = (200, PROM, page)
    clock = FakeClock()
    source = ServerStepSource(base, clock=clock, window_s=10.0)
    source.poll()
    clock.t += 2.0
    idle = source.poll()
    assert isinstance(idle, ServerStatus) and idle.state is ServerState.IDLE
    assert "no tokens" in idle.message
    # the engine restarts: counters begin again from a small value
    restarted = re.sub(
        r"^(vllm:inter_token_latency_seconds_(?:sum|count|bucket)\{[^}]*\}) \S+$",
        r"\1 0.0",
        page,
        flags=re.MULTILINE,
    )
    state.pages["/metrics"] = (200, PROM, restarted)
    clock.t += 2.0
    reset = source.poll()
    assert isinstance(reset, ServerStatus) and reset.state is ServerState.RESET
    # a slow phase, then a fast one: after the window slides past the slow phase only the fast one counts
    slow = advance(restarted, "vllm:inter_token_latency_seconds", [(0.050, 1)] * 100)
    state.pages["/metrics"] = (200, PROM, slow)
    clock.t += 5.0
    mixed = source.poll()
    assert isinstance(mixed, ServerStep) and mixed.step_ms == pytest.approx(50.0)
    fast = advance(slow, "vllm:inter_token_latency_seconds", [(0.010, 1)] * 200)
    state.pages["/metrics"] = (200, PROM, fast)
    clock.t += 6.0  # window 10 s: baseline is still the restart scrape, 11 s ago
    both = source.poll()
    assert isinstance(both, ServerStep)
    assert both.samples == 300 and both.window_s == pytest.approx(11.0)
    faster = advance(fast, "vllm:inter_token_latency_seconds", [(0.010, 1)] * 200)
    state.pages["/metrics"] = (200, PROM, faster)
    clock.t += 5.0  # the slow scrape is now 11 s old and becomes the baseline
    recent = source.poll()
    assert isinstance(recent, ServerStep)
    assert recent.samples == 400
    assert recent.step_ms == pytest.approx(10.0)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_dead_url_is_unreachable() -> None:
    status = ServerStepSource(f"127.0.0.1:{_free_port()}", timeout_s=1.0).poll()
    assert isinstance(status, ServerStatus)
    assert status.state is ServerState.UNREACHABLE
    assert "unreachable" in status.message and "/metrics" in status.message
    assert "\n" not in status.message


def test_404_names_enable_metrics(engine: tuple[Engine, str]) -> None:
    _, base = engine
    status = ServerStepSource(base).poll()
    assert isinstance(status, ServerStatus)
    assert status.state is ServerState.HTTP_ERROR
    assert "HTTP 404" in status.message and "--enable-metrics" in status.message


def test_html_page_is_not_metrics(engine: tuple[Engine, str]) -> None:
    state, base = engine
    html = "<!DOCTYPE html>\n<html><head><title>Grafana</title></head><body>login</body></html>\n"
    state.pages["/metrics"] = (200, "text/html; charset=utf-8", html)
    # also served mislabelled as text/plain
    state.pages["/plain"] = (200, "text/plain", html)
    for path in ("/metrics", "/plain"):
        status = ServerStepSource(base + path).poll()
        assert isinstance(status, ServerStatus)
        assert status.state is ServerState.NOT_METRICS
        assert "HTML" in status.message


@pytest.mark.parametrize(
    "body",
    [
        "garbage garbage garbage\n",
        'sglang:inter_token_latency_seconds_sum{model_name="m" 1.0\n',
        "\x00\x01\x02binary\n",
        "just some words\nand more\n",
    ],
)
def test_garbage_is_unparseable(engine: tuple[Engine, str], body: str) -> None:
    state, base = engine
    state.pages["/metrics"] = (200, PROM, body)
    status = ServerStepSource(base).poll()
    assert isinstance(status, ServerStatus)
    assert status.state is ServerState.UNPARSEABLE
    assert "not Prometheus text" in status.message


def test_metrics_without_itl_and_json_and_empty(engine: tuple[Engine, str]) -> None:
    state, base = engine
    node = "# HELP node_load1 1m load average.\n# TYPE node_load1 gauge\nnode_load1 0.21\n"
    state.pages["/metrics"] = (200, PROM, node)
    state.pages["/json"] = (200, "application/json", '{"object": "list", "data": []}')
    state.pages["/empty"] = (200, PROM, "")
    status = ServerStepSource(base).poll()
    assert isinstance(status, ServerStatus) and status.state is ServerState.NO_LATENCY_METRIC
    assert "1 metric families" in status.message
    status = ServerStepSource(base + "/json").poll()
    assert isinstance(status, ServerStatus) and status.state is ServerState.NOT_METRICS
    status = ServerStepSource(base + "/empty").poll()
    assert isinstance(status, ServerStatus) and status.state is ServerState.NO_LATENCY_METRIC


def test_hung_server_times_out(engine: tuple[Engine, str]) -> None:
    state, base = engine
    state.pages["/metrics"] = (200, PROM, _page("vllm.txt"))
    state.delay_s = 2.0
    status = ServerStepSource(base, timeout_s=0.2).poll()
    assert isinstance(status, ServerStatus)
    assert status.state is ServerState.TIMED_OUT
    assert "no complete answer within 0.2 s" in status.message


@pytest.mark.parametrize("headers_first", [False, True], ids=["status-line-trickles", "body-trickles"])
def test_trickling_server_is_cut_off_at_one_overall_deadline(headers_first: bool) -> None:
    """A server sending one byte every 0.3 s never trips a 1 s read timeout; the one deadline ends the scrape."""
    with TricklingServer(interval_s=0.3, headers_first=headers_first) as server:
        answers: list[ServerStep | ServerStatus] = []
        poller = threading.Thread(target=lambda: answers.append(ServerStepSource(server.url, timeout_s=1.0).poll()))
        poller.start()
        poller.join(60.0)  # liveness only: per-read timeouts would keep reading for minutes
        assert not poller.is_alive(), "the scrape did not end at its deadline"
        assert server.sent < server.total_bytes
    (status,) = answers
    assert isinstance(status, ServerStatus)
    assert status.state is ServerState.TIMED_OUT
    assert status.message == f"{server.url}: no complete answer within 1 s"


def test_a_failed_poll_carries_the_last_step_and_its_age(engine: tuple[Engine, str]) -> None:
    state, base = engine
    first = _page("vllm.txt")
    state.pages["/metrics"] = (200, PROM, first)
    clock, wall = FakeClock(), FakeClock()
    wall.t = 1_800_000_000.0
    source = ServerStepSource(base, clock=clock, wall_clock=wall)
    assert isinstance(source.poll(), ServerStatus)  # first scrape: waiting
    state.pages["/metrics"] = (200, PROM, advance(first, "vllm:inter_token_latency_seconds", [(0.01, 1)] * 50))
    clock.t += 5.0
    wall.t += 5.0
    step = source.poll()
    assert isinstance(step, ServerStep)
    assert step.taken_unix_s == wall.t
    assert step.age_s(wall.t + 12.5) == pytest.approx(12.5)
    del state.pages["/metrics"]  # the engine stops serving metrics
    status = source.poll()
    assert isinstance(status, ServerStatus) and status.state is ServerState.HTTP_ERROR
    assert status.last_step == step


def test_redirect_is_followed_within_the_deadline(engine: tuple[Engine, str]) -> None:
    """vLLM mounts its metrics app at /metrics/ and answers /metrics with 307."""
    state, base = engine
    state.pages["/metrics"] = (307, "text/plain", "")
    state.redirects["/metrics"] = "/metrics/"
    state.pages["/metrics/"] = (200, PROM, _page("vllm.txt"))
    status = ServerStepSource(base).poll()
    assert isinstance(status, ServerStatus) and status.state is ServerState.WAITING


def test_url_forms_and_bad_input() -> None:
    assert normalize_url("127.0.0.1:30000") == "http://127.0.0.1:30000/metrics"
    assert normalize_url("http://h:8000/") == "http://h:8000/metrics"
    assert normalize_url("https://h/engine/metrics") == "https://h/engine/metrics"
    for bad in ("", "ftp://h/metrics", "http://:80", "http://h:99999"):
        with pytest.raises(UserInputError):
            normalize_url(bad)
    with pytest.raises(UserInputError, match="accept length"):
        ServerStepSource("h:1", accept_length=0.5)
    for deadline in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(UserInputError, match="server deadline"):
            ServerStepSource("h:1", timeout_s=deadline)


def test_parse_fixtures_directly() -> None:
    """The committed fixtures parse with prometheus_client and give plausible lifetime means."""
    for name, family, mean_ms in (
        ("sglang.txt", "sglang:inter_token_latency_seconds", 19.2),
        ("vllm.txt", "vllm:inter_token_latency_seconds", 10.4),
        ("sglang_old_tpot.txt", "sglang:time_per_output_token_seconds", 7.1),
        ("vllm_v0_tpot.txt", "vllm:time_per_output_token_seconds", 12.5),
    ):
        totals = parse_latency_totals(_page(name), "fixture")
        assert not isinstance(totals, ServerStatus), totals
        assert totals.metric == family
        assert totals.sum_s / totals.count * 1e3 == pytest.approx(mean_ms, rel=0.02)
