"""The traced bar in the live UI: --trace gives the bar under the probed one with the largest gap named, Enter on a
segment lists its kernels, and the capture key against loopback servers shaped like SGLang and vLLM, including
their refusals, a missing profiler, a timeout and a trace over the size cap, each one status line."""

from __future__ import annotations

import dataclasses
import json
import shutil
import threading
from collections.abc import Callable, Iterator, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from textual.pilot import Pilot
from textual.widgets import DataTable

from decodetop.budget.components import Component
from decodetop.settings import Settings
from decodetop.tui.app import DecodetopApp
from decodetop.tui.model import BudgetView
from decodetop.tui.screens.trace_kernels import TraceKernelsScreen
from decodetop.tui.trace_source import TraceOptions
from decodetop.tui.widgets.budget_bar import BudgetBar
from decodetop.tui.widgets.traced_bar import TracedBar

from .conftest import make_app, wait_until
from .fakes import FakeBudget, make_sources

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "traces"
PLANTED = FIXTURES / "h200_graph_planted.trace.json.gz"
SETTINGS = Settings(model="llama-3.1-8b", tp=1, observed_ms=12.0)
"""A small model's scenario: a probed budget of a few ms against a 12 ms observed step."""


def small_budget() -> FakeBudget:
    """The fake budget scaled down to the fixture model's size (the trace is a 4-layer model's)."""
    budget = FakeBudget()
    budget.scale = {c.value: 0.02 for c in Component}
    return budget


def trace_app(options: TraceOptions) -> DecodetopApp:
    sources = make_sources(budget=small_budget())
    sources.trace = options
    return make_app(sources, SETTINGS)


def traced(app: DecodetopApp) -> TracedBar:
    return app.query_one(TracedBar)


def loaded(app: DecodetopApp) -> Callable[[], bool]:
    return lambda: traced(app).view is not None and traced(app).budget is not None and not traced(app).busy


def status(app: DecodetopApp) -> str:
    return app.trace_note


async def test_trace_flag_gives_both_bars_and_the_named_gap() -> None:
    app = trace_app(TraceOptions(path=PLANTED))
    async with app.run_test(size=(160, 48)) as pilot:
        await wait_until(pilot, loaded(app), "the traced bar")
        assert app.query_one(BudgetBar).budget is not None
        bar = traced(app)
        assert bar.display
        view = bar.view
        assert view is not None and view.gap_key == "attention"
        text = bar.render().plain
        assert "largest gap: attention: traced 0.954 ms vs probed " in text
        assert "unrolled_elementwise_kernel<direct_copy_kernel_cuda>" in text
        assert "traced step 1.6 ms" in text and PLANTED.name in text
        assert status(app).startswith("trace: ") and "--trace" in status(app)


class RooflineBudget(FakeBudget):
    """The small budget with every figure a roofline estimate, as before any probe ran."""

    def compose(self, settings: Settings, results: Mapping[str, object], now_s: float) -> BudgetView:
        view = super().compose(settings, results, now_s)
        estimated = tuple(
            dataclasses.replace(s, status="estimated", provenance_kind="estimate") if s.status != "missing" else s
            for s in view.segments
        )
        return dataclasses.replace(view, segments=estimated)


@pytest.mark.parametrize(
    ("model", "findings"),
    [
        (
            "llama-3.1-70b",
            ("4 layers traced vs 80 (", "; TP 8 given, the trace shows 1 rank and no all-reduce kernels"),
        ),
        (
            "glm-5",
            (
                "4 layers traced vs 78 (",
                "; no expert or routing kernels for a MoE model (75 MoE layers)",
                "; TP 8 given, the trace shows 1 rank and no all-reduce kernels",
            ),
        ),
    ],
)
async def test_a_trace_of_another_model_or_tp_is_said_and_estimates_are_called_roofline(
    model: str, findings: tuple[str, ...]
) -> None:
    """The 4-layer one-GPU dense trace under a model of 80 layers (or GLM-5, a MoE) at TP 8: one line under the bar's
    header names the layers, the missing experts and the missing all-reduce, as `decodetop trace` does; the budget
    beside it is roofline estimates, called so (never 'probed')."""
    budget = RooflineBudget()
    budget.scale = {c.value: 0.02 for c in Component}
    sources = make_sources(budget=budget)
    sources.trace = TraceOptions(path=PLANTED)
    app = make_app(sources, Settings(model=model, tp=8, observed_ms=12.0))
    async with app.run_test(size=(160, 48)) as pilot:
        await wait_until(pilot, loaded(app), "the traced bar")
        view = traced(app).view
        assert view is not None and "\n" not in view.mismatch
        name = {"llama-3.1-70b": "Llama-3.1-70B", "glm-5": "GLM-5"}[model]
        assert view.mismatch.startswith(f"the trace does not match {name} at TP 8: {findings[0]}")
        assert view.mismatch.endswith(findings[-1]) and all(f in view.mismatch for f in findings)
        lines = traced(app).render().plain.splitlines()
        assert lines[1].startswith(f"the trace does not match {name} at TP 8: 4 layers traced vs")
        text = " ".join(lines)
        assert "legend: roofline/traced ms" in text and "vs roofline " in view.gap_text
        assert "probed" not in text


async def test_a_new_tp_or_model_checks_the_loaded_trace_again() -> None:
    """`p` or `m` change the scenario for the session: the traced bar's mismatch line follows it (TP 8 → 1 leaves only
    the layers; a model of 4 layers, nothing), as the budget beside it does."""
    sources = make_sources(budget=small_budget())
    sources.trace = TraceOptions(path=PLANTED)
    app = make_app(sources, Settings(model="llama-3.1-70b", tp=8, observed_ms=12.0))
    async with app.run_test(size=(160, 48)) as pilot:
        await wait_until(pilot, loaded(app), "the traced bar")
        view = traced(app).view
        assert view is not None and "TP 8 given" in view.mismatch
        app.change_scenario(dataclasses.replace(app.settings, tp=1), "TP 1", "--tp")

        def rechecked() -> bool:
            now = traced(app).view
            return now is not None and "at TP 1:" in now.mismatch

        await wait_until(pilot, rechecked, "the trace checked at TP 1")
        view = traced(app).view
        assert view is not None and view.mismatch.startswith("the trace does not match Llama-3.1-70B at TP 1: 4 layers")
        assert "TP 8" not in view.mismatch and "all-reduce" not in view.mismatch
        assert traced(app).render().plain.splitlines()[1] == view.mismatch


async def test_enter_on_the_segment_lists_its_kernels() -> None:
    app = trace_app(TraceOptions(path=PLANTED))
    async with app.run_test(size=(160, 48)) as pilot:
        await wait_until(pilot, loaded(app), "the traced bar")
        traced(app).focus()
        await pilot.press("enter")
        await wait_until(pilot, lambda: isinstance(app.screen, TraceKernelsScreen), "the kernel list")
        screen = app.screen
        assert isinstance(screen, TraceKernelsScreen) and screen.segment.key == "attention"
        table = screen.query_one(DataTable)
        first = [str(cell) for cell in table.get_row_at(0)]
        assert first[0] == "unrolled_elementwise_kernel<direct_copy_kernel_cuda>"
        assert first[1] == "4" and first[5] == "graph replay, attention block"
        await pilot.press("escape")
        await wait_until(pilot, lambda: not isinstance(app.screen, TraceKernelsScreen), "closed")
        await pilot.press("right", "enter")
        await wait_until(pilot, lambda: isinstance(app.screen, TraceKernelsScreen), "the next segment")
        assert app.screen.segment.key != "attention"  # type: ignore[attr-defined]


async def test_a_directory_of_ranks_names_the_slow_one(tmp_path: Path) -> None:
    from tests.traces.test_traced import two_ranks

    app = trace_app(TraceOptions(path=two_ranks(tmp_path / "ranks")))
    async with app.run_test(size=(160, 48)) as pilot:
        await wait_until(pilot, loaded(app), "the traced bar")
        assert "rank 1 is slow" in traced(app).render().plain


async def test_a_bad_trace_is_one_status_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"traceEvents": [')
    app = trace_app(TraceOptions(path=bad))
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_until(pilot, lambda: "truncated" in status(app), "the status line")
        assert "\n" not in status(app) and not traced(app).display


# -- capture against loopback servers ----------------------------------------------------------------------------


class Handler(BaseHTTPRequestHandler):
    server: Any

    def log_message(self, *args: object) -> None:
        return

    def _any(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length)) if length else {}
        self.server.calls.append((self.command, self.path, body))
        route = self.server.routes.get((self.command, self.path))
        if route is None:
            self.reply(404, '{"detail":"Not Found"}')
        else:
            route(self, body)

    def reply(self, code: int, text: str = "") -> None:
        data = text.encode()
        self.send_response(code)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = _any  # noqa: N815 - http.server's method names
    do_POST = _any  # noqa: N815


@pytest.fixture
def server() -> Iterator[ThreadingHTTPServer]:
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    srv.daemon_threads = True
    srv.calls = []  # type: ignore[attr-defined]
    srv.routes = {}  # type: ignore[attr-defined]
    release = threading.Event()
    srv.release = release  # type: ignore[attr-defined]
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield srv
    release.set()
    srv.shutdown()
    srv.server_close()


def url(srv: ThreadingHTTPServer) -> str:
    return f"http://127.0.0.1:{srv.server_address[1]}"


def sglang(srv: Any, start: Callable[[Handler, dict[str, Any]], None] | None = None) -> None:
    """SGLang's shape: /get_server_info answers; /start_profile writes one trace per TP rank into output_dir."""

    def write_ranks(h: Handler, body: dict[str, Any]) -> None:
        out = Path(body["output_dir"])
        for rank in (0, 1):
            shutil.copy(PLANTED, out / f"1764400000.1-TP-{rank}.trace.json.gz")
        h.reply(200, "Start profiling.")

    srv.routes[("GET", "/get_server_info")] = lambda h, _b: h.reply(200, '{"version": "0.5"}')
    srv.routes[("POST", "/start_profile")] = start or write_ranks


async def capture_with(app: DecodetopApp, pilot: Pilot[object]) -> None:
    await wait_until(pilot, lambda: app.budget_settled, "the budget")
    await pilot.press("c")


async def test_sglang_capture_key_gives_the_traced_bar(server: Any, tmp_path: Path) -> None:
    sglang(server)
    app = trace_app(TraceOptions(server=url(server), state_dir=tmp_path / "state", timeout_s=20))
    async with app.run_test(size=(160, 48)) as pilot:
        await capture_with(app, pilot)
        await wait_until(pilot, loaded(app), "the captured trace", timeout_s=30)
        body = next(b for m, p, b in server.calls if p == "/start_profile")
        assert body["num_steps"] == 5 and body["activities"] == ["CPU", "GPU"]
        kept = Path(body["output_dir"])
        assert kept.parent == tmp_path / "state" / "traces"
        record = json.loads((kept / "capture.json").read_text())
        assert record["scenario"] == {"model": {"kind": "preset", "value": "llama-3.1-8b"}, "tp": 1}
        assert record["engine"] == "sglang"
        view = traced(app).view
        assert view is not None and view.ranks_text.startswith("2 ranks: step ")
        assert "captured from" in status(app)


async def test_vllm_capture_key_uses_its_trace_directory(server: Any, tmp_path: Path) -> None:
    trace_dir = tmp_path / "vllm"
    trace_dir.mkdir()

    def stop(h: Handler, _b: dict[str, Any]) -> None:
        shutil.copy(PLANTED, trace_dir / "host_1.1764400000.pt.trace.json.gz")
        h.reply(200)

    server.routes.update(
        {
            ("GET", "/version"): lambda h, _b: h.reply(200, '{"version": "0.11"}'),
            ("POST", "/start_profile"): lambda h, _b: h.reply(200),
            ("POST", "/stop_profile"): stop,
        }
    )
    options = TraceOptions(path=None, server=url(server), state_dir=tmp_path / "state", timeout_s=20)
    app = trace_app(options)
    async with app.run_test(size=(160, 48)) as pilot:
        await capture_with(app, pilot)  # no trace directory given: one line says which flag
        await wait_until(pilot, lambda: "VLLM_TORCH_PROFILER_DIR" in status(app), "the vLLM hint")
        assert "--trace DIR" in status(app)
    app = trace_app(TraceOptions(path=trace_dir, server=url(server), state_dir=tmp_path / "state", timeout_s=20))
    async with app.run_test(size=(160, 48)) as pilot:
        await wait_until(pilot, lambda: "no trace files" in status(app), "the empty directory said")
        await capture_with(app, pilot)
        await wait_until(pilot, loaded(app), "the captured trace", timeout_s=30)
        assert [p for _m, p, _b in server.calls][-2:] == ["/start_profile", "/stop_profile"]


def refuse(h: Handler, _b: dict[str, Any]) -> None:
    h.reply(400, "Profiling is already in progress. Call /stop_profile first.")


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ("refused", "refused (400): Profiling is already in progress"),
        ("no profiler", "no profiling endpoint"),
        ("timeout", "no answer from"),
        ("over the cap", "over the 0 MB cap"),
    ],
)
async def test_capture_failures_are_one_line_and_the_ui_stays_live(
    server: Any, tmp_path: Path, case: str, expected: str
) -> None:
    if case == "refused":
        sglang(server, refuse)
    elif case == "no profiler":
        sglang(server)
        del server.routes[("POST", "/start_profile")]
    elif case == "timeout":
        sglang(server, lambda h, _b: (server.release.wait(30), h.reply(200)))
    else:
        sglang(server)
    cap = 1000 if case == "over the cap" else 1 << 30
    timeout_s = 0.5 if case == "timeout" else 20
    app = trace_app(TraceOptions(server=url(server), state_dir=tmp_path / "s", timeout_s=timeout_s, max_bytes=cap))
    async with app.run_test(size=(120, 40)) as pilot:
        await capture_with(app, pilot)
        await wait_until(pilot, lambda: expected in status(app), f"the {case} line", timeout_s=30)
        assert "\n" not in status(app) and not traced(app).busy
        await pilot.press("2")  # the UI still answers keys
        await wait_until(pilot, lambda: app.query_one("#tabs").active == "gpus", "the GPUs tab")  # type: ignore[attr-defined]


async def test_capture_without_a_server_says_so() -> None:
    app = trace_app(TraceOptions())
    async with app.run_test(size=(120, 40)) as pilot:
        await capture_with(app, pilot)
        await wait_until(pilot, lambda: "needs --server" in status(app), "the hint")


async def test_quitting_does_not_wait_for_a_capture_in_flight(server: Any, tmp_path: Path) -> None:
    """A server that never answers /start_profile: q still ends the app while its request is open."""
    answered = threading.Event()

    def hang(h: Handler, _b: dict[str, Any]) -> None:
        server.release.wait(30)
        answered.set()

    sglang(server, hang)
    app = trace_app(TraceOptions(server=url(server), state_dir=tmp_path / "s", timeout_s=60))
    async with app.run_test(size=(120, 40)) as pilot:
        await capture_with(app, pilot)
        await wait_until(pilot, lambda: any(p == "/start_profile" for _m, p, _b in server.calls), "the request")
        assert traced(app).busy
        await pilot.press("q")
        await wait_until(pilot, lambda: not app.is_running, "the app to end")
    assert not answered.is_set()  # the app ended while the server still held the request


async def test_the_idle_segment_opens_with_no_kernels_and_says_why() -> None:
    app = trace_app(TraceOptions(path=PLANTED))
    async with app.run_test(size=(160, 48)) as pilot:
        await wait_until(pilot, loaded(app), "the traced bar")
        bar = traced(app)
        view = bar.view
        assert view is not None
        bar.focus()
        bar.selected = [s.key for s in view.segments].index("launch")
        await pilot.press("enter")
        await wait_until(pilot, lambda: isinstance(app.screen, TraceKernelsScreen), "the idle segment")
        assert app.screen.segment.key == "launch"  # type: ignore[attr-defined]
        assert not app.screen.query(DataTable)
        assert "the GPU waited for the host" in str(app.screen.query_one("Vertical Static:last-of-type").render())
