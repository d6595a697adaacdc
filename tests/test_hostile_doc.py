"""docs/hostile-input.md says what decodetop prints for each class of hostile text and numbers; this test makes
each input of its "Text and numbers from outside" section here (files in a temp dir, servers on loopback), runs the
real code and checks that the message printed is the one the doc's row shows. A row with no recipe here, or a
recipe with no row, fails too: the doc and the code cannot drift apart.

In a row's message, `…` stands for any text (a temp path, a port, a timestamp); everything else is literal.
`python -m tests.test_hostile_doc` prints what each recipe gives (to write a new row)."""

from __future__ import annotations

import contextlib
import dataclasses
import gzip
import io
import json
import os
import re
import sys
import tarfile
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from decodetop.cli import main
from decodetop.collectors.fake_nvml import FakeNvmlBackend, load_recording
from decodetop.collectors.nvml import Nvml
from decodetop.collectors.serving import ServerStatus, ServerStepSource, fetch_metrics_text
from decodetop.collectors.telemetry import TelemetrySampler
from decodetop.errors import DecodetopError
from decodetop.export.prometheus.server import listen_warning
from decodetop.history import KIND_PROBE, History, HistoryUnavailableError
from decodetop.httpget import HttpRequestError, http_request
from decodetop.settings import load_settings
from decodetop.traces.reader import read_trace
from decodetop.tui.trace_source import TraceOptions, load
from tests.helpers.hostile_text import ESCAPES

DOC = Path(__file__).resolve().parents[1] / "docs" / "hostile-input.md"
SECTION = "## Text and numbers from outside"
BIG = "9" * 400
"""An integer of 400 digits: within the JSON loader's 4,300-digit cap, beyond any float."""
HOSTILE = "[bold red]K" + ESCAPES[0] + ESCAPES[1] + "[/oops]"
FAMILY = "sglang:inter_token_latency_seconds"

Recipe = Callable[[Path], str]
"""Makes the input under a temp dir, runs decodetop's code, returns everything it printed (or the message)."""


def _cli(argv: list[str]) -> str:
    """`decodetop ARGV`: stdout and stderr together (argparse's exit 2 included)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), contextlib.suppress(SystemExit):
        main(argv)  # SystemExit: argparse's exit 2
    return out.getvalue() + err.getvalue()


def _raised(call: Callable[[], object]) -> str:
    """The one line a call raises (as `decodetop` prints it for an error that ends a command)."""
    try:
        call()
    except DecodetopError as exc:
        return f"decodetop: error: {exc}"
    except (HttpRequestError, HistoryUnavailableError) as exc:  # said by the UI or the exporter, not a command's end
        return str(exc)
    raise AssertionError("no error")


@contextlib.contextmanager
def _server(status: int, reason: str, headers: dict[str, str], body: bytes = b"") -> Iterator[str]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(status, reason)
            for key, value in headers.items():
                self.send_header(key, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            del format, args

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/metrics"
    finally:
        server.shutdown()
        server.server_close()


def _trace(path: Path, kernel: str, module: str = "M", kernel_ts: str = "40") -> Path:
    events = [
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#0", "ts": 0, "dur": 900},
        {"ph": "X", "cat": "cpu_op", "name": module, "ts": 10, "dur": 800, "pid": 1, "tid": 1},
        {"ph": "X", "cat": "kernel", "name": kernel, "ts": 40, "dur": 40, "pid": 0, "tid": 7,
         "args": {"device": 0, "stream": 7}},
    ]  # fmt: skip
    path.write_text(json.dumps({"traceEvents": events}).replace('"ts": 40,', f'"ts": {kernel_ts},'))
    return path


def _polls(pages: list[str]) -> str:
    """What the status line says after the UI's poller scraped `pages` in turn, one second apart."""
    now = [0.0]
    texts = iter(pages)

    def fetch(url: str, timeout_s: float) -> str | ServerStatus:
        del url, timeout_s
        return next(texts)

    source = ServerStepSource("http://127.0.0.1:9/metrics", clock=lambda: now[0], window_s=0.5, fetch=fetch)
    answer = None
    for _ in pages:
        answer = source.poll()
        now[0] += 1.0
    assert answer is not None
    return answer.summary


def _page(total_s: float, count: float) -> str:
    return f"# TYPE {FAMILY} histogram\n{FAMILY}_sum {total_s!r}\n{FAMILY}_count {count!r}\n"


# -- the recipes, by the row's input as the doc writes it ----------------------------------------------------------


def _kernel_name(tmp: Path) -> str:
    return _cli(["trace", str(_trace(tmp / "t.json", HOSTILE, "M" + ESCAPES[2]))])


def _diff_label(tmp: Path) -> str:
    docs = []
    for name, ms in (("old", 2.0), ("new", 20.0)):
        segs = [{"component": HOSTILE, "ms": ms, "status": "measured"}]
        doc = {"model": "m", "deployment": "TP 2", "complete": True, "total_ms": ms, "segments": segs}
        (tmp / f"{name}.json").write_text(json.dumps(doc))
        docs.append(str(tmp / f"{name}.json"))
    return _cli(["budget", "--diff", *docs])


def _gpu_name(tmp: Path) -> str:
    from decodetop.tui.sources.telemetry_views import telemetry_frame

    snap = TelemetrySampler(Nvml(FakeNvmlBackend(load_recording("h200x1-load"), clock=None))).sample(processes=False)
    gpus = [dataclasses.replace(g, name=HOSTILE) for g in snap.gpus]
    return telemetry_frame(dataclasses.replace(snap, gpus=gpus)).gpus[0].name


def _reason(tmp: Path) -> str:
    with _server(503, "Busy " + ESCAPES[0] + "[/oops]", {}) as url:
        answer = fetch_metrics_text(url, 5.0)
    assert isinstance(answer, ServerStatus)
    return answer.summary


def _redirect(tmp: Path) -> str:
    with _server(302, "Found", {"Location": "http://192.0.2.1/metrics"}) as url:
        return _raised(lambda: http_request(url, deadline_s=5.0))


def _history_big_at(tmp: Path) -> str:
    path = tmp / "history.jsonl"
    good = '{"v":1,"kind":"probe","key":"membw","at":1796000000.0,"data":{}}'
    path.write_text(good + "\n" + f'{{"v":1,"kind":"probe","key":"gemm","at":{BIG},"data":{{}}}}\n')
    problem = History(path).load().problem
    assert problem is not None
    return problem


def _history_link(tmp: Path) -> str:
    (tmp / "victim.jsonl").write_text("")
    (tmp / "history.jsonl").symlink_to(tmp / "victim.jsonl")
    return _raised(lambda: History(tmp / "history.jsonl").record(KIND_PROBE, "x", {}))


def _lock_link(tmp: Path) -> str:
    (tmp / "history.jsonl.lock").symlink_to(tmp / "nowhere")
    return _raised(lambda: History(tmp / "history.jsonl").record(KIND_PROBE, "x", {}))


def _settings(line: str) -> Recipe:
    def recipe(tmp: Path) -> str:
        (tmp / "settings.toml").write_text(line + "\n")
        return _raised(lambda: load_settings(tmp / "settings.toml"))

    return recipe


def _diff_big(tmp: Path) -> str:
    doc = '{"model": "m", "deployment": "TP 2", "segments": [{"component": "attention", "ms": ' + BIG + "}]}"
    (tmp / "a.json").write_text(doc)
    return _cli(["budget", "--diff", str(tmp / "a.json"), str(tmp / "a.json")])


def _trace_big(tmp: Path) -> str:
    return _cli(["trace", str(_trace(tmp / "t.json", "k", kernel_ts=BIG))])


def _gz(path: Path, head: bytes, chunk: bytes, times: int, tail: bytes) -> Path:
    with gzip.open(path, "wb", compresslevel=1) as out:
        out.write(head)
        for _ in range(times):
            out.write(chunk)
        out.write(tail)
    return path


def _huge_event(tmp: Path) -> str:
    head = b'{"traceEvents":[{"ph":"X","cat":"kernel","name":"k","ts":1,"dur":1,"args":{"x":"'
    path = _gz(tmp / "event.json.gz", head, b"a" * (1 << 20), 16, b'"}}]}')
    return _raised(lambda: read_trace(path))


def _blanks(tmp: Path) -> str:
    path = _gz(tmp / "blanks.json.gz", b'{"traceEvents":[', b" " * (1 << 20), 80, b"]}")
    return _raised(lambda: read_trace(path))


def _names(tmp: Path) -> str:
    events = (f'{{"ph":"X","cat":"kernel","name":"k{i}","ts":{i},"dur":1}}' for i in range(100_001))
    (tmp / "names.json").write_text('{"traceEvents":[' + ",".join(events) + "]}")
    return _raised(lambda: read_trace(tmp / "names.json"))


def _long_name(tmp: Path) -> str:
    event = {"ph": "X", "cat": "kernel", "name": "n" * (1 << 20) * 3, "ts": 1, "dur": 1}
    (tmp / "name.json").write_text(json.dumps({"traceEvents": [event]}))
    return _raised(lambda: read_trace(tmp / "name.json"))


def _bomb(tmp: Path) -> str:
    event = b'{"ph":"X","cat":"cpu_op","name":"aten::mm","ts":1,"dur":1},'
    path = _gz(tmp / "bomb.trace.json.gz", b'{"traceEvents":[', event * 1000, 100, event[:-1] + b"]}")
    return _raised(lambda: load(path, TraceOptions(max_bytes=5_000_000)))


def _pax(tmp: Path) -> str:
    from tests.collectors.test_archive import R, _raw_header, _top_headers

    archive = tmp / "pax.tar.gz"
    size = 1 << 20
    record = b"%d path=" % size
    with gzip.open(archive, "wb") as out:
        out.write(_top_headers() + _raw_header("././@PaxHeader", size, tarfile.XHDTYPE))
        out.write(record + b"a" * (size - len(record) - 1) + b"\n")
        out.write(_raw_header(f"{R}/x", 0) + b"\0" * 1024)
    return _cli(["check", "--root", str(archive)])


def _save_baseline(tmp: Path) -> str:
    state = tmp / "state"
    (state / "baselines").parent.mkdir()
    (state / "baselines").write_text("not a directory")
    root = tmp / "root"
    root.mkdir()
    saved = os.environ.get("DECODETOP_STATE_DIR")
    os.environ["DECODETOP_STATE_DIR"] = str(state)  # this recipe's own state dir, whatever the session's is
    try:
        return _cli(["check", "--root", str(root), "--save-baseline"])
    finally:
        if saved is None:
            del os.environ["DECODETOP_STATE_DIR"]
        else:
            os.environ["DECODETOP_STATE_DIR"] = saved


def _crash(tmp: Path) -> str:
    from decodetop.tui.crash import CrashReport

    report = CrashReport(tmp / "logs")
    try:
        raise RuntimeError("boom " + ESCAPES[0])
    except RuntimeError as exc:
        report.record(exc)
    return _raised(report.raise_if_crashed)


RECIPES: dict[str, Recipe] = {
    "a kernel or module name with markup and escapes (the `trace` command)": _kernel_name,
    "a component label with escapes (`budget --diff`)": _diff_label,
    "a replayed GPU name, check or source with markup and escapes (live UI)": _gpu_name,
    "a `/metrics` reason phrase with escapes and markup (status line, exporter)": _reason,
    "`/metrics` whose latency `_sum` grows by 1e307 a poll": lambda tmp: _polls(
        [_page(k * 1e307, float(k)) for k in range(1, 4)]
    ),
    "`/metrics` with a tiny `_count` (a 300-digit step)": lambda tmp: _polls([_page(0.0, 0.0), _page(1.0, 1e-300)]),
    "a redirect off the server (another host, port or scheme)": _redirect,
    "`--server 'http://[::1'`": lambda tmp: _cli(["trace", "--server", "http://[::1"]),
    "`--server http://127.0.0.1:99999/`": lambda tmp: _cli(["trace", "--server", "http://127.0.0.1:99999/"]),
    "`--server` with a CR LF in it": lambda tmp: _cli(["trace", "--server", "http://h/\r\nX: y"]),
    "`exporter --listen 0:9400` (also `0x0`, `0.0`, `[::0]`, `[::ffff:0.0.0.0]`)": lambda tmp: (
        listen_warning("0") or ""
    ),
    "`budget --target-tps 1e-320`": lambda tmp: _cli(["budget", "--model", "llama-3.1-70b", "--target-tps", "1e-320"]),
    "`--observed-ms 1e308` (UI, `budget`)": lambda tmp: _cli(["--observed-ms", "1e308"]),
    "`--tick 1e308`": lambda tmp: _cli(["--tick", "1e308"]),
    "`probe --timeout 1e308`": lambda tmp: _cli(["probe", "--timeout", "1e308"]),
    "settings `observed_ms = 1e308`": _settings("observed_ms = 1e308"),
    "settings `target_tps = 1e-320`": _settings("target_tps = 1e-320"),
    "a history line whose `at` has 400 digits": _history_big_at,
    "a `budget --diff` input with a 400-digit figure": _diff_big,
    "a trace with a 400-digit time": _trace_big,
    "`history.jsonl` a symbolic link (to any file)": _history_link,
    "`history.jsonl.lock` a dangling symbolic link": _lock_link,
    "a trace event of 16 Mi characters (a small `.json.gz`)": _huge_event,
    "80 MiB of blanks in a row (80 KB gzipped)": _blanks,
    "100,001 distinct kernel names": _names,
    "a name of 3 Mi characters": _long_name,
    "a gzip bomb past the UI's trace cap (`--trace`, key `c`)": _bomb,
    "an archive with a 1 MiB pax path record (`check --root`)": _pax,
    "`check --save-baseline` where the state dir cannot take it": _save_baseline,
    "an exception nothing handled in the live UI": _crash,
}


def doc_rows() -> dict[str, str]:
    """The section's rows: input (the first cell) → message (the second cell, its backticks off)."""
    text = DOC.read_text(encoding="utf-8")
    assert SECTION in text, f"{DOC.name} has no section {SECTION!r}"
    section = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")] if line.startswith("| ") else []
        if len(cells) == 2 and cells[1].startswith("`") and cells[1].endswith("`"):
            rows[cells[0]] = cells[1][1:-1]
    return rows


def pattern(message: str) -> re.Pattern[str]:
    """A row's message as a regular expression: `…` is any text, the rest literal."""
    return re.compile(".*?".join(re.escape(part) for part in message.split("…")))


def test_every_recipe_has_its_row_and_every_row_its_recipe() -> None:
    rows = doc_rows()
    assert set(rows) == set(RECIPES), {"rows without a recipe": set(rows) - set(RECIPES), "recipes without a row":
                                       set(RECIPES) - set(rows)}  # fmt: skip


@pytest.mark.parametrize("row", sorted(RECIPES))
def test_the_doc_shows_the_message_the_code_prints(row: str, tmp_path: Path) -> None:
    message = doc_rows().get(row)
    assert message is not None, f"no row {row!r} in {DOC.name}"
    printed = RECIPES[row](tmp_path)
    lines = printed.splitlines() or [""]
    assert any(pattern(message).fullmatch(line) for line in lines), f"{message!r} is not in:\n{printed}"


if __name__ == "__main__":  # print what each recipe gives, one block a row
    import tempfile

    for name, recipe in RECIPES.items():
        with tempfile.TemporaryDirectory() as tmp:
            print(f"### {name}\n{recipe(Path(tmp))}", file=sys.stdout)
