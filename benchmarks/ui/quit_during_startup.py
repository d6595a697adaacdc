"""Benchmark of quitting while the probe ranks start: how long `ProbeController.close()` takes when it is called
while the group is still spawning interpreters, importing torch and joining the gloo group, and whether any rank
is left behind.

What `q` in the live UI does during start-up: the probe thread is inside `start()` (or the first `run()`), and the
UI thread calls `close()`. For each delay after the start began, the script times `close()` (the UI's wait) and the
time until the starting thread returned, then checks that no rank survives (psutil, zombies and multiprocessing's
resource tracker aside). It does so twice: on the bare controller, and through the live UI's probe source
(`tui.sources.probes.ControllerProbes`: a probe thread in `run("launch")`, then `cancel()` and `close()` as the app's
`shutdown_sources` does). A full start-up is timed first for scale.

Target of the live UI: quit within 1 s whatever the ranks are doing.

    .venv/bin/python benchmarks/ui/quit_during_startup.py [--ranks 2] [--runs 3] [--delays 0.05,0.3,1,2,4]
        [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import threading
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))

from decodetop.probes.controller import ProbeController  # noqa: E402 - after the source path is set


def _new_children(before: set[int]) -> list[psutil.Process]:
    """Live descendants started since `before` (zombies and the resource tracker aside)."""
    out = []
    for child in psutil.Process().children(recursive=True):
        try:
            if child.pid in before or child.status() == psutil.STATUS_ZOMBIE:
                continue
            if "resource_tracker" in " ".join(child.cmdline()):
                continue
        except psutil.NoSuchProcess:
            continue
        out.append(child)
    return out


def full_start_s(ranks: int) -> float:
    """Seconds from `start()` to a joined group."""
    pc = ProbeController(device="cpu", cpu_ranks=ranks)
    t0 = time.monotonic()
    pc.start()
    took = time.monotonic() - t0
    pc.close()
    return took


def quit_once(ranks: int, delay_s: float, through_ui: bool) -> dict[str, float | int | bool]:
    """close() `delay_s` after start() (or the UI source's first run) began in another thread."""
    before = {c.pid for c in psutil.Process().children(recursive=True)}
    outcome: list[str] = []
    if through_ui:
        from decodetop.tui.sources.probes import ControllerProbes

        source = ControllerProbes(lambda: ProbeController(device="cpu", cpu_ranks=ranks))

        def start() -> None:
            done = source.run("launch", lambda fraction, text: None)
            outcome.append("started" if done.result is not None else "cancelled")

        def close() -> None:
            source.cancel()
            source.close()

    else:
        pc = ProbeController(device="cpu", cpu_ranks=ranks)

        def start() -> None:
            try:
                pc.start()
                outcome.append("started")
            except Exception as exc:
                outcome.append(type(exc).__name__)

        close = pc.close

    starter = threading.Thread(target=start, daemon=True)
    starter.start()
    time.sleep(delay_s)
    t0 = time.monotonic()
    close()
    close_s = time.monotonic() - t0
    starter.join(30)
    thread_s = time.monotonic() - t0
    time.sleep(0.05)  # let the kernel reap
    left = _new_children(before)
    return {
        "delay_s": delay_s,
        "close_s": close_s,
        "thread_s": thread_s,
        "left": len(left),
        "start_finished_first": outcome[:1] == ["started"],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--delays", default="0.05,0.3,1,2,4", help="seconds after start() began, comma-separated")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    delays = [float(d) for d in args.delays.split(",") if d.strip()]
    start_s = full_start_s(args.ranks)
    rows = [
        {**quit_once(args.ranks, d, ui), "through_ui": ui}
        for ui in (False, True)
        for d in delays
        for _ in range(args.runs)
    ]
    machine = f"{platform.node()} ({os.cpu_count()} CPUs), Python {platform.python_version()}"
    report = {"machine": machine, "ranks": args.ranks, "full_start_s": start_s, "runs": rows}
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    print(f"{machine}; {args.ranks} CPU ranks; a full start took {start_s:.2f} s")
    print(f"{'via':>10} {'delay s':>8} {'close median s':>15} {'close max s':>12} {'thread max s':>13} {'left':>5}")
    for ui in (False, True):
        for d in delays:
            mine = [r for r in rows if r["delay_s"] == d and r["through_ui"] == ui]
            closes = [float(r["close_s"]) for r in mine]
            via = "UI source" if ui else "controller"
            print(
                f"{via:>10} {d:>8.2f} {statistics.median(closes):>15.3f} {max(closes):>12.3f} "
                f"{max(float(r['thread_s']) for r in mine):>13.3f} {sum(int(r['left']) for r in mine):>5d}"
                + ("  (start had finished)" if any(r["start_finished_first"] for r in mine) else "")
            )
    return 1 if any(int(r["left"]) for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
