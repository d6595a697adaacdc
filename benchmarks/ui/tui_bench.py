"""Benchmark of the live UI: time to first frame, RSS, CPU at a 1 s telemetry tick, and the longest event-loop
stall while a probe runs.

- First frame, RSS and CPU: `decodetop` runs in a real tmux pane (as a user runs it); the first frame is the first
  `capture-pane` that shows the budget bar's "observed" marker, timed from the moment tmux starts the command
  (Python start-up and imports included). RSS is read after the app settled; CPU is the process's user+system time
  over a window at `--tick 1`, as a share of one core.
- Stall: the app runs in this process (headless `run_test`) over the real sources with CPU probe ranks. Once it has
  settled (checks shown, budget composed), `R` starts the probes; a task on the app's event loop sleeps 5 ms in a
  loop and records how late each wake-up is, from the first probe's start to the last one's end (rank start-up
  included).

Targets of the live UI: first frame ≤ 1.0 s, RSS ≤ 150 MB, idle CPU ≤ 2 %, stall ≤ 50 ms.

    .venv/bin/python benchmarks/ui/tui_bench.py [--window 20] [--runs 5] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parents[2]
POLL_S = 0.01
"""capture-pane poll period for the first frame (the figure's resolution)."""
STALL_SLEEP_S = 0.005
"""The probe task's sleep: lateness beyond this is time the event loop was busy elsewhere."""


def _tmux(sock: Path, *args: str) -> str:
    return subprocess.run(
        ["tmux", "-S", str(sock), *args], capture_output=True, text=True, check=False, timeout=30
    ).stdout


def _env(tmp: Path) -> dict[str, str]:
    return {
        "HOME": str(tmp / "home"),
        "DECODETOP_STATE_DIR": str(tmp / "state"),
        "DECODETOP_CONFIG_DIR": str(tmp / "config"),
        "TERM": "xterm-256color",
        "PATH": os.environ.get("PATH", ""),
        "PYTHONPATH": str(ROOT / "src"),
    }


def terminal_run(flags: list[str], window_s: float, size: tuple[int, int] = (160, 48)) -> dict[str, float]:
    """First frame (s), RSS (MB) and CPU (% of a core over `window_s`) of `decodetop FLAGS` in a tmux pane."""
    with tempfile.TemporaryDirectory(prefix="decodetop-bench-") as name:
        tmp = Path(name)
        sock = tmp / "tmux.sock"
        env_args = [f"{k}={v}" for k, v in _env(tmp).items()]
        command = shlex.join(["env", *env_args, sys.executable, "-m", "decodetop", *flags])
        start = time.monotonic()
        _tmux(sock, "new-session", "-d", "-s", "b", "-x", str(size[0]), "-y", str(size[1]), f"{command}; sleep 600")
        try:
            first_frame_s = float("nan")
            deadline = start + 30
            while time.monotonic() < deadline:
                if "observed" in _tmux(sock, "capture-pane", "-p", "-t", "b"):
                    first_frame_s = time.monotonic() - start
                    break
                time.sleep(POLL_S)
            pane = int(_tmux(sock, "display-message", "-p", "-t", "b", "#{pane_pid}").strip())
            procs = [p for p in psutil.Process(pane).children(recursive=True) if "decodetop" in " ".join(p.cmdline())]
            proc = procs[0]
            time.sleep(3.0)  # let start-up work (checks, history, first ticks) finish
            cpu0 = proc.cpu_times()
            t0 = time.monotonic()
            time.sleep(window_s)
            cpu1 = proc.cpu_times()
            elapsed = time.monotonic() - t0
            rss_mb = proc.memory_info().rss / 1e6
            cpu_pct = 100.0 * ((cpu1.user - cpu0.user) + (cpu1.system - cpu0.system)) / elapsed
            _tmux(sock, "send-keys", "-t", "b", "q")
            psutil.wait_procs([proc], timeout=20)
        finally:
            _tmux(sock, "kill-server")
    return {"first_frame_s": first_frame_s, "rss_mb": rss_mb, "cpu_pct": cpu_pct}


async def _stall_during_probes(cpu_ranks: int, probes: int | None, timeout_s: float) -> dict[str, float]:
    sys.path.insert(0, str(ROOT / "src"))
    from decodetop.settings import Settings
    from decodetop.tui.app import DecodetopApp
    from decodetop.tui.launch import LaunchOptions, build_sources
    from decodetop.tui.messages import ProbeFinished, ProbeStarted

    settings = Settings()
    sources = build_sources(settings, LaunchOptions(cpu_ranks=cpu_ranks))
    sources.run_probes_at_start = False  # start them with R once the app settled: the stall is the probes' own
    app = DecodetopApp(sources, settings, save_theme=False)
    started: list[float] = []
    finished: list[float] = []

    def hook(message: object) -> None:
        if isinstance(message, ProbeStarted):
            started.append(time.monotonic())
        elif isinstance(message, ProbeFinished):
            finished.append(time.monotonic())

    lateness: list[tuple[float, float]] = []
    try:
        async with app.run_test(size=(160, 48), message_hook=hook) as pilot:

            async def watch() -> None:
                while True:
                    t = time.monotonic()
                    await asyncio.sleep(STALL_SLEEP_S)
                    lateness.append((t, time.monotonic() - t - STALL_SLEEP_S))

            settle_deadline = time.monotonic() + 60
            while not (app.checks and app.budget_settled and app.last_frame) and time.monotonic() < settle_deadline:
                await pilot.pause(0.1)
            await pilot.pause(1.0)
            task = asyncio.create_task(watch())
            await pilot.press("R")
            deadline = time.monotonic() + timeout_s
            wanted = probes if probes is not None else len(app.probe_views)
            while len(finished) < wanted and time.monotonic() < deadline:
                await pilot.pause(0.1)
            task.cancel()
            await app.action_quit()
            await pilot.pause(0.5)
    finally:
        app.shutdown_sources()
    if not started:
        return {"stall_ms": float("nan"), "probes_done": 0}
    window = [late for t, late in lateness if started[0] <= t <= (finished[-1] if finished else time.monotonic())]
    return {
        "stall_ms": 1000 * max(window) if window else float("nan"),
        "stall_p99_ms": 1000 * statistics.quantiles(window, n=100)[98] if len(window) > 100 else float("nan"),
        "probes_done": len(finished),
        "probe_s": (finished[-1] - started[0]) if finished else float("nan"),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--window", type=float, default=20.0, help="CPU measurement window, s (default 20)")
    parser.add_argument("--runs", type=int, default=5, help="first-frame runs (the median is reported)")
    parser.add_argument("--cpu-ranks", type=int, default=2, help="probe ranks for the stall measurement")
    parser.add_argument(
        "--probes", type=int, default=None, help="probes to wait for in the stall measurement (default: the whole plan)"
    )
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    if shutil.which("tmux") is None:
        print("tmux is needed for the terminal measurements", file=sys.stderr)
        return 2

    results: dict[str, Any] = {
        "machine": f"{platform.node()} · {psutil.cpu_count()} cores · {platform.python_version()}",
    }
    for label, flags in (("no-gpu --no-probes", ["--no-probes"]), ("--demo (fake NVML, 8 GPUs)", ["--demo"])):
        runs = [terminal_run([*flags, "--tick", "1"], args.window if i == 0 else 1.0) for i in range(args.runs)]
        results[label] = {
            "first_frame_s_median": statistics.median(r["first_frame_s"] for r in runs),
            "first_frame_s_max": max(r["first_frame_s"] for r in runs),
            "rss_mb": runs[0]["rss_mb"],
            "cpu_pct": runs[0]["cpu_pct"],
        }
        print(label, json.dumps(results[label]), flush=True)
    stall = asyncio.run(_stall_during_probes(args.cpu_ranks, args.probes, timeout_s=300))
    results["stall while probes run (CPU ranks)"] = stall
    print("stall", json.dumps(stall), flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
