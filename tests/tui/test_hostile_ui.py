"""The live UI shows text from outside as text: a replayed recording (its source, GPU names, checks, probe results),
a trace (kernel and module names, the file's name) and a server's answers carrying Rich markup and terminal escape
sequences render as literal text with every control marked, never as markup (a stray ``[/oops]`` ended the app)
and never as an escape sequence on the screen; a /metrics whose latency sum overflows leaves the app running with
its observed step in range. Everything goes through the real readers: recordings written by the `--record` taps,
traces on disk, servers on loopback. A hypothesis property feeds arbitrary text with controls and markup through the
same replay to every widget and detail screen."""

from __future__ import annotations

import asyncio
import dataclasses
import gzip
import html
import json
import re
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from textual.pilot import Pilot
from textual.widgets import DataTable

from decodetop.budget.components import Component
from decodetop.collectors.checks.result import CheckResult, Status
from decodetop.collectors.fake_nvml import FakeNvmlBackend, load_recording
from decodetop.collectors.nvml import Nvml
from decodetop.collectors.serving import ServerStepSource
from decodetop.collectors.telemetry import TelemetrySampler
from decodetop.export.recording import Recorder
from decodetop.history import KIND_BASELINE, KIND_PROBE, Fingerprint, History
from decodetop.inert import inert
from decodetop.probes.results import load_results
from decodetop.quantity import OBSERVED_MS
from decodetop.settings import Settings
from decodetop.tui.app import DecodetopApp
from decodetop.tui.messages import BaselineSaved, HistoryLoaded
from decodetop.tui.screens.budget_details import BudgetDetailsScreen
from decodetop.tui.screens.details import CheckDetailScreen, ProbeDetailScreen
from decodetop.tui.screens.gpu_details import GpuDetailScreen
from decodetop.tui.screens.trace_kernels import TraceKernelsScreen
from decodetop.tui.sources.server import ServerPoller
from decodetop.tui.taps import Taps
from decodetop.tui.trace_source import TraceOptions
from decodetop.tui.widgets.gpu_table import GpuTable
from decodetop.tui.widgets.probe_table import ProbeTable
from decodetop.tui.widgets.traced_bar import TracedBar
from tests.helpers.hostile_text import ESCAPES, assert_inert, hostile_text

from .conftest import MessageLog, make_app, wait_until
from .fakes import NOW_S, FakeBudget, make_sources
from .test_replay_snapshot import H200_RESULTS, T0_UNIX_S, _replay_app

ROOT = Path(__file__).resolve().parents[2]
PLANTED = ROOT / "tests" / "fixtures" / "traces" / "h200_graph_planted.trace.json.gz"
SIZE = (200, 60)
HOSTILE = "[bold red]RED[/bold red][/oops]" + ESCAPES[0] + ESCAPES[1] + ESCAPES[4]
"""Markup (a stray closing tag among it) and escapes: OSC 0 (the window title), CSI 2J (clear), a C1 CSI."""
SHOWN = inert(HOSTILE)
"""What the screen must show instead: the markup as typed, each control as its visible mark."""


def screen_text(app: DecodetopApp) -> str:
    """Everything on the app's screen now, as the terminal would get it: the SVG export's text, unescaped (runs of
    spaces between styled runs may be lost: needles hold none)."""
    svg = app.export_screenshot()
    body = svg[svg.index("<g class=") :] if "<g class=" in svg else svg  # the terminal's text, not the styles
    return html.unescape(re.sub(r"<[^>]*>", "", body)).replace("\xa0", " ")


def assert_shown_inert(app: DecodetopApp, *needles: str) -> None:
    """No control reached the screen, and each needle (markup as typed) is there as text."""
    shown = screen_text(app)
    assert_inert(shown)
    for needle in needles:
        assert needle in shown, f"{needle!r} is not on the screen"


# -- a replayed recording ------------------------------------------------------------------------------------------


def _snapshot(text: str) -> Any:
    backend = FakeNvmlBackend(load_recording("h200x1-load"), replicate_to=2, clock=None)
    sampler = TelemetrySampler(Nvml(backend))
    sampler.sample(processes=False)
    backend.advance()
    snap = sampler.sample(processes=False)
    gpus = [dataclasses.replace(g, name=f"{text} {g.index}") for g in snap.gpus]
    return dataclasses.replace(snap, source=text, gpus=gpus, taken_at_unix_s=T0_UNIX_S, tick_cost_s=0.003)


def _hostile_recording(path: Path, text: str) -> Path:
    ticks = iter(range(10_000))
    taps = Taps(recorder=Recorder(path, clock=lambda: T0_UNIX_S + next(ticks)))
    taps.on_snapshot(_snapshot(text))
    for result in load_results(H200_RESULTS)[:2]:
        env = result.environment
        hostile_env = dataclasses.replace(env, gpu_names=(text,)) if env is not None else None
        taps.on_probe_result(dataclasses.replace(result, environment=hostile_env, message=text))
    check = CheckResult("C1", text, Status.WARN, text, "performance", text, text, subject=text, facts={text: text})
    taps.on_checks([check], T0_UNIX_S)
    taps.close()
    return path


async def _open(pilot: Pilot[object], table: DataTable[object], screen: type, what: str) -> None:
    """Enter on the first row of `table`; wait for `screen`, check it, close it."""
    app = pilot.app
    assert isinstance(app, DecodetopApp)
    table.focus()
    table.move_cursor(row=0)
    await pilot.press("enter")
    await wait_until(pilot, lambda: isinstance(app.screen, screen), what)
    assert_shown_inert(app)
    await pilot.press("escape")
    await wait_until(pilot, lambda: not isinstance(app.screen, screen), f"{what} closed")


async def _walk_replay(path: Path, *needles: str, details: bool = True) -> None:
    """Start the app on the replay, then look at the main screen and (with `details`) every detail screen the data
    reaches."""
    app = _replay_app(path)
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: app.query_one(GpuTable).row_count > 0 and bool(app.checks), "replayed data")
        await wait_until(pilot, lambda: app.query_one(ProbeTable).row_count > 0, "the probe table")
        assert_shown_inert(app, *needles)
        if details:
            await _open(pilot, app.query_one(GpuTable), GpuDetailScreen, "GPU details")
            await _open(pilot, app.query_one(ProbeTable), ProbeDetailScreen, "probe details")
            await _open(pilot, app.query_one("#health-table", DataTable), CheckDetailScreen, "check details")
            await pilot.press("b")
            await wait_until(pilot, lambda: isinstance(app.screen, BudgetDetailsScreen), "budget details")
            assert_shown_inert(app)
            await pilot.press("escape")
        assert app.is_running  # markup in the data raised nothing
    assert app.crash_report.crash is None


async def test_a_replay_full_of_markup_and_escapes_is_shown_as_text(tmp_path: Path) -> None:
    """Main: the source name went to `Static.update` as markup (`[/oops]` ended the app at start, no key pressed);
    the GPU and check names reached the terminal with their OSC 0 title and CSI 2J clear."""
    path = _hostile_recording(tmp_path / "hostile.jsonl", HOSTILE)
    await _walk_replay(path, "[bold red]RED[/bold red][/oops]␛]0;PWNED␇")


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=hostile_text)
def test_any_text_in_a_replay_reaches_no_widget_as_markup_or_control(tmp_path_factory: Any, text: str) -> None:
    """Property: whatever text a recording holds (arbitrary, controls, markup, mixes), every widget and detail screen
    it reaches shows it inert and the app runs on (the detail screens' bodies: tests/tui/test_hostile_views.py)."""
    path = _hostile_recording(tmp_path_factory.mktemp("replay") / "r.jsonl", text)
    asyncio.run(_walk_replay(path, details=False))


# -- a trace -------------------------------------------------------------------------------------------------------


def _hostile_trace(directory: Path, text: str) -> Path:
    """The planted H200 trace with `text` before the name of every copy kernel, saved under a file name holding
    markup and an escape (a Linux file name may hold any byte but / and NUL)."""
    doc = json.loads(gzip.decompress(PLANTED.read_bytes()))
    for event in doc["traceEvents"]:
        if event.get("cat") == "kernel" and "unrolled_elementwise_kernel" in event.get("name", ""):
            event["name"] = text + event["name"]
    folder = directory / "x["
    folder.mkdir()
    path = folder / "oops]\x1b]0;FILE\x07.trace.json.gz"  # the full path holds a stray closing tag: x[/oops]
    path.write_bytes(gzip.compress(json.dumps(doc).encode()))
    return path


def _trace_app(path: Path) -> DecodetopApp:
    budget = FakeBudget()
    budget.scale = {c.value: 0.02 for c in Component}  # the trace is a 4-layer model's: a budget of a few ms
    sources = make_sources(budget=budget)
    sources.trace = TraceOptions(path=path)
    return make_app(sources, Settings(model="llama-3.1-8b", tp=1, observed_ms=12.0))


async def test_hostile_kernel_names_and_trace_path_are_shown_as_text(tmp_path: Path) -> None:
    """Main: the kernel table got `str` cells (markup: `[bold red]` rendered, `[/oops]` raised MarkupError and ended
    the app) and the path went to `Static(...)` as markup; the escapes in both reached the terminal."""
    path = _hostile_trace(tmp_path, HOSTILE)
    app = _trace_app(path)
    async with app.run_test(size=SIZE) as pilot:
        bar = app.query_one(TracedBar)
        await wait_until(pilot, lambda: bar.view is not None and not bar.busy, "the traced bar")
        assert_shown_inert(app, "oops]␛]0;FILE␇")  # the file's name in the bar's title
        bar.focus()
        await pilot.press("enter")
        await wait_until(pilot, lambda: isinstance(app.screen, TraceKernelsScreen), "the kernel list")
        table = app.screen.query_one(DataTable)
        cells = [str(cell) for row in range(table.row_count) for cell in table.get_row_at(row)]
        assert any(cell.startswith("[bold red]RED[/bold red][/oops]␛]0;PWNED␇") for cell in cells), cells
        assert_shown_inert(app, "[bold red]RED[/bold red][/oops]␛]0;PWNED␇", "x[/oops]␛]0;FILE␇.trace.json.gz")
        await pilot.press("escape")
        assert app.is_running
    assert app.crash_report.crash is None


# -- a server ------------------------------------------------------------------------------------------------------

FAMILY = "sglang:inter_token_latency_seconds"


class _Metrics(BaseHTTPRequestHandler):
    """/metrics whose latency `_sum` grows by 1e307 a poll (the mean overflows to infinity); with `refuse`, every
    answer is a 503 whose reason phrase is full of escapes and markup."""

    polls = 0
    refuse = False
    lock = threading.Lock()

    def do_GET(self) -> None:
        with self.lock:
            type(self).polls += 1
            k = type(self).polls
        body = (
            f"# TYPE {FAMILY} histogram\n{FAMILY}_sum {k * 1e307:.17g}\n{FAMILY}_count {k}\n"
            f'{FAMILY}_bucket{{le="+Inf"}} {k}\n'
        ).encode()
        self.send_response(503 if self.refuse else 200, "Busy " + HOSTILE)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        del format, args


@pytest.fixture
def metrics_url() -> Iterator[str]:
    _Metrics.polls = 0
    _Metrics.refuse = False
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Metrics)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/metrics"
    finally:
        server.shutdown()
        server.server_close()


def _server_app(url: str) -> DecodetopApp:
    sources = make_sources()
    sources.server = ServerPoller(ServerStepSource(url, window_s=0.01, timeout_s=5.0), period_s=0.05)
    return make_app(sources, Settings(model="glm-5", tp=8, observed_ms=12.0))


async def test_a_metrics_sum_that_overflows_leaves_the_ui_running_in_range(metrics_url: str) -> None:
    """Main: the observed step became infinite and the UI died by polling alone ("settings: observed_ms must be a
    positive number, got inf"), exit 0. Now every poll is one status line and the observed step stays in range."""
    app = _server_app(metrics_url)
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: _Metrics.polls >= 5 and "out-of-range totals" in app.server_note, "polls")
        assert app.is_running
        assert OBSERVED_MS.accepts(app.settings.observed_ms)
        assert_shown_inert(app)
    assert app.crash_report.crash is None


async def test_a_hostile_reason_phrase_reaches_the_status_line_inert(metrics_url: str) -> None:
    """Main: the reason phrase went to the status line as it was: its OSC 0 set the pane title, CSI 2J cleared the
    screen, by polling alone."""
    _Metrics.refuse = True
    app = _server_app(metrics_url)
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: "503" in app.server_note, "the refusal in the status line")
        assert "[bold red]RED[/bold red][/oops]␛]0;PWNED␇" in app.server_note
        assert_shown_inert(app, "503")
        assert app.is_running
    assert app.crash_report.crash is None


# -- the history ---------------------------------------------------------------------------------------------------


async def test_a_history_line_no_float_holds_still_lets_s_save_a_baseline(tmp_path: Path) -> None:
    """Main: an `"at"` of 400 digits made `History.load()` raise OverflowError; the UI swallowed it and then saved
    nothing all session (`s` did nothing, no message). Now the line is set aside, said once, and `s` saves."""
    path = tmp_path / "history.jsonl"
    good = '{"v":1,"kind":"probe","key":"membw","at":1796000000.0,"data":{}}'
    path.write_text(good + "\n" + '{"v":1,"kind":"probe","key":"gemm","at":' + "9" * 400 + ',"data":{}}\n')
    log = MessageLog()
    app = make_app(make_sources(history=History(path, clock=lambda: NOW_S)))
    async with app.run_test(size=SIZE, message_hook=log) as pilot:
        await wait_until(pilot, lambda: bool(log.of(HistoryLoaded)), "the history read")
        (loaded,) = log.of(HistoryLoaded)
        assert isinstance(loaded, HistoryLoaded) and loaded.problem and "line 2" in loaded.problem
        await wait_until(pilot, lambda: bool(app.checks), "checks")
        await pilot.press("s")
        await wait_until(pilot, lambda: bool(log.of(BaselineSaved)), "baseline saved")
        (saved,) = log.of(BaselineSaved)
        assert isinstance(saved, BaselineSaved) and saved.entry is not None, saved
    assert "default" in History(path).latest(KIND_BASELINE)


async def test_a_hostile_start_profile_refusal_reaches_the_status_line_inert(tmp_path: Path) -> None:
    """Main: key `c` against a server whose /start_profile refusal body held escapes put them in the status line
    as they were (the pane title set, the screen cleared)."""
    from .test_trace_bar import Handler, capture_with, sglang, status, trace_app, url

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    srv.daemon_threads = True
    srv.calls = []  # type: ignore[attr-defined]
    srv.routes = {}  # type: ignore[attr-defined]
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        sglang(srv, lambda h, _b: h.reply(400, "refused " + HOSTILE))
        app = trace_app(TraceOptions(server=url(srv), state_dir=tmp_path / "s", timeout_s=20))
        async with app.run_test(size=SIZE) as pilot:
            await capture_with(app, pilot)
            await wait_until(pilot, lambda: "refused (400)" in status(app), "the refusal", timeout_s=30)
            assert "[bold red]RED[/bold red][/oops]␛]0;PWNED␇" in status(app)
            assert_shown_inert(app)
            assert app.is_running
        assert app.crash_report.crash is None
    finally:
        srv.shutdown()
        srv.server_close()


class _OtherHostBudget(FakeBudget):
    """Takes only this host's records: the history's other fingerprints are listed under "other scenarios" (b)."""

    def accepts(self, fingerprint: object, settings: Settings) -> bool:
        return fingerprint is None


async def test_hostile_fingerprint_fields_in_the_history_show_inert_under_b(tmp_path: Path) -> None:
    """Main: a history entry's fingerprint (host name, GPU name, versions) went to the `b` screen as it was: its
    escapes reached the terminal."""
    path = tmp_path / "history.jsonl"
    fingerprint = Fingerprint(HOSTILE, "cuda", HOSTILE, 2, HOSTILE, HOSTILE, HOSTILE, None, HOSTILE, "model=preset:x")
    History(path).record(KIND_PROBE, "gemm", {"value": "1.0"}, recorded_at_s=NOW_S - 60, fingerprint=fingerprint)
    sources = make_sources(history=History(path, clock=lambda: NOW_S), budget=_OtherHostBudget())
    app = make_app(sources)
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: (app.stored.baseline is None and bool(app.status_notes)) or True, "start")
        await pilot.pause(0.2)
        await pilot.press("b")
        await wait_until(pilot, lambda: isinstance(app.screen, BudgetDetailsScreen), "budget details")
        await wait_until(pilot, lambda: "other scenarios: " in screen_text(app), "the other scenario listed")
        assert_shown_inert(app, "[bold red]RED[/bold red][/oops]␛]0;PWNED␇")
        await pilot.press("escape")
        assert app.is_running
