"""Key-to-bar time and peak memory of the live UI's traced bar for large generated traces (10 MB, 100 MB, 1 GB).

For each size a synthetic PyTorch-profiler-shaped trace (tests/helpers/synth.py, two TP ranks' worth when
`--ranks 2`) is written once; then, in a fresh interpreter each:

- `key`: the live UI (Textual headless, fake telemetry/probes/budget) against a loopback server shaped like SGLang
  whose /start_profile hard-links the generated trace(s) into the output directory; the clock runs from pressing
  `c` to the traced bar holding the trace's figures. This includes the capture's settle time (a trace file counts
  as written once its size has not changed for `decodetop.traces.capture.SETTLE_S`).
- `load`: the same read without the UI and the server: `tui.trace_source.load` + `traces.traced.traced_view`,
  what the UI's worker runs for `--trace FILE`.
- `base`: the UI started without a trace (the memory baseline).

Peak memory is the child's ru_maxrss. Results go to stdout as a table and, with --json, to a file.

    PYTHONPATH=src:. python3 benchmarks/traces/trace_load.py [--sizes 10,100,1000] [--ranks 1] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

CHILD = r"""
import asyncio, json, os, resource, sys, threading, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

mode, traces = sys.argv[1], [Path(p) for p in sys.argv[2:]]
out = {}
if mode == "load":
    from decodetop.tui.trace_source import TraceOptions, load
    from decodetop.traces.traced import traced_view
    t0 = time.perf_counter()
    path = traces[0].parent if len(traces) > 1 else traces[0]
    got = load(path, TraceOptions(path=path))
    view = traced_view(got.traces)
    out["seconds"] = time.perf_counter() - t0
    out["steps"] = len(got.traces.report.steps)
else:
    from decodetop.settings import Settings
    from decodetop.tui.trace_source import TraceOptions
    from decodetop.tui.widgets.traced_bar import TracedBar
    from tests.tui.conftest import make_app
    from tests.tui.fakes import make_sources

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            return

        def reply(self, code, text=""):
            data = text.encode()
            self.send_response(code)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            self.reply(200, "{}") if self.path == "/get_server_info" else self.reply(404)

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
            for rank, trace in enumerate(traces):
                os.link(trace, Path(body["output_dir"]) / f"1764400000.1-TP-{rank}.trace.json")
            self.reply(200, "Start profiling.")

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    sources = make_sources()
    state = Path(os.environ["BENCH_STATE"])
    sources.trace = TraceOptions(server=f"http://127.0.0.1:{srv.server_address[1]}", state_dir=state, timeout_s=600)
    app = make_app(sources, Settings(model="llama-3.1-70b", tp=max(1, len(traces)), observed_ms=95.0))

    async def run():
        async with app.run_test(size=(160, 48)) as pilot:
            while not app.budget_settled:
                await pilot.pause(0.01)
            bar = app.query_one(TracedBar)
            if mode == "key":
                t0 = time.perf_counter()
                await pilot.press("c")
                while bar.view is None:
                    if not bar.busy and time.perf_counter() - t0 > 1:  # ended without a trace: say why
                        raise SystemExit(app.trace_note)
                    await pilot.pause(0.02)
                bar.render()
                out["seconds"] = time.perf_counter() - t0
                out["steps"] = len(bar.view.segments)

    asyncio.run(run())
out["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps(out))
"""


def child(mode: str, traces: list[Path], state: Path) -> dict[str, float]:
    """One measurement in a fresh interpreter, so that earlier work does not raise its peak."""
    env = {
        "PYTHONPATH": f"{ROOT / 'src'}:{ROOT}",
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "BENCH_STATE": str(state),
        "DECODETOP_STATE_DIR": str(state),
        "DECODETOP_CONFIG_DIR": str(state / "config"),
    }
    done = subprocess.run(
        [sys.executable, "-c", CHILD, mode, *map(str, traces)],
        capture_output=True,
        text=True,
        check=False,
        env=env,
        cwd=ROOT,
    )
    if done.returncode != 0:
        raise SystemExit(f"{mode} child failed: {done.stderr.strip().splitlines()[-1:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> int:
    """Generate each size, measure, print the table."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="10,100", help="trace sizes in MB, comma-separated (default 10,100)")
    ap.add_argument("--ranks", type=int, default=1, help="per-rank files of that size each (default 1)")
    ap.add_argument("--json", metavar="OUT", help="also write the results as JSON")
    args = ap.parse_args()
    sys.path[:0] = [str(ROOT / "src"), str(ROOT / "tests")]  # the synthetic traces are the tests' helpers
    from helpers.synth import SynthSpec, write_synthetic_trace

    rows = []
    with tempfile.TemporaryDirectory(prefix="decodetop-trace-load-") as tmp:
        base = child("base", [], Path(tmp) / "state-base")
        for mb in (float(s) for s in args.sizes.split(",")):
            traces = []
            t0 = time.perf_counter()
            for rank in range(args.ranks):
                path = Path(tmp) / f"{mb:.0f}mb-TP-{rank}.trace.json"
                steps, events = write_synthetic_trace(path, int(mb * 1e6), SynthSpec(allreduce=args.ranks > 1))
                traces.append(path)
            written = time.perf_counter() - t0
            load = child("load", traces, Path(tmp) / f"state-load-{mb:.0f}")
            key = child("key", traces, Path(tmp) / f"state-key-{mb:.0f}")
            size = sum(p.stat().st_size for p in traces) / 1e6
            rows.append(
                {
                    "mb": size,
                    "events": events,
                    "steps": steps,
                    "write_s": written,
                    "load_s": load["seconds"],
                    "load_rss_mib": load["peak_rss_mib"],
                    "key_to_bar_s": key["seconds"],
                    "ui_rss_mib": key["peak_rss_mib"],
                    "ui_base_rss_mib": base["peak_rss_mib"],
                }
            )
            for p in traces:
                p.unlink()
    print(
        f"{'trace MB':>9} {'events':>10} {'load s':>7} {'load MiB':>9} {'key→bar s':>10} {'UI MiB':>7} {'UI base':>8}"
    )
    for r in rows:
        print(
            f"{r['mb']:>9.0f} {r['events']:>10,} {r['load_s']:>7.1f} {r['load_rss_mib']:>9.0f} "
            f"{r['key_to_bar_s']:>10.1f} {r['ui_rss_mib']:>7.0f} {r['ui_base_rss_mib']:>8.0f}"
        )
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": os.uname().nodename, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
