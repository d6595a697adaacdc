"""Benchmark of quitting the live UI while `--server` points at a server that trickles one byte every 1.5 s: the
time from `q` to the app's exit, with a poll of that server in flight (per-read timeouts never fire on such a
server; each poll has one overall deadline, and quitting does not wait for it).

The app runs headless (`run_test`) over the demo sources (fake NVML, no probes) with `--server` at a loopback server
in this process that answers one byte every 1.5 s. For each run the script waits until a poll is reading from the
server, presses `q` and times until the app has exited; it also reports whether the poller thread was left behind
(a daemon thread, abandoned with its poll) rather than joined.

Target of the live UI: quit within 1 s whatever the server does.

    .venv/bin/python benchmarks/ui/quit_with_slow_server.py [--runs 5] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import socket
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))

from decodetop.settings import Settings  # noqa: E402 - after the source path is set
from decodetop.tui.app import DecodetopApp  # noqa: E402
from decodetop.tui.launch import LaunchOptions, build_sources  # noqa: E402

TRICKLE_S = 1.5
"""One byte every 1.5 s: the slow server of the hostile-input review."""
POLL_WAIT_S = 30.0


class Trickler:
    """A loopback server that sends a metrics answer one byte every `TRICKLE_S`; counts connections."""

    def __init__(self) -> None:
        self.connections = 0
        self._stop = threading.Event()
        self._sock = socket.create_server(("127.0.0.1", 0))
        self._sock.settimeout(0.1)
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}/metrics"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._trickle, args=(conn,), daemon=True).start()

    def _trickle(self, conn: socket.socket) -> None:
        body = b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n" + b"#" * 100000
        with conn, contextlib.suppress(OSError):
            conn.recv(65536)
            for i in range(len(body)):
                if self._stop.wait(TRICKLE_S):
                    return
                conn.sendall(body[i : i + 1])

    def close(self) -> None:
        self._stop.set()
        self._sock.close()


async def quit_once(url: str, trickler: Trickler, state_dir: Path) -> dict[str, float | bool]:
    """Seconds from `q` to the app's exit while a poll of the slow server is in flight."""
    settings = Settings(model="glm-5", tp=8)
    sources = build_sources(settings, LaunchOptions(demo=True, no_probes=True, server=url, history_path=state_dir))
    app = DecodetopApp(sources, settings, save_theme=False)
    before = trickler.connections
    async with app.run_test(size=(120, 40)) as pilot:
        deadline = time.monotonic() + POLL_WAIT_S
        while trickler.connections <= before and time.monotonic() < deadline:
            await pilot.pause(0.02)
        t0 = time.monotonic()
        await pilot.press("q")
        while app.return_value is None and time.monotonic() < t0 + POLL_WAIT_S:
            await pilot.pause(0.005)
        quit_s = time.monotonic() - t0
    poller = sources.server._thread if sources.server is not None else None
    return {"quit_s": quit_s, "poll_left_behind": bool(poller is not None and poller.is_alive())}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    trickler = Trickler()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["DECODETOP_STATE_DIR"] = tmp
        os.environ["DECODETOP_CONFIG_DIR"] = tmp
        for i in range(args.runs):
            rows.append(asyncio.run(quit_once(trickler.url, trickler, Path(tmp) / f"history{i}.jsonl")))
    trickler.close()
    machine = f"{platform.node()} ({os.cpu_count()} CPUs), Python {platform.python_version()}"
    times = [float(r["quit_s"]) for r in rows]
    report = {"machine": machine, "trickle_s": TRICKLE_S, "runs": rows}
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    print(f"{machine}; server trickling one byte every {TRICKLE_S} s; {len(rows)} runs")
    print(f"{'quit median s':>14} {'quit max s':>11} {'polls left behind':>18}")
    print(
        f"{statistics.median(times):>14.3f} {max(times):>11.3f} {sum(bool(r['poll_left_behind']) for r in rows):>18d}"
    )
    return 0 if max(times) < 1.0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
