"""Measures what decodetop's NVML telemetry costs per tick, per GPU, with and without process lists.

Run on a GPU machine from the repository root:

    PYTHONPATH=src python3 benchmarks/cost/nvml_tick_cost.py --out DIR [--ticks 40]

It times `TelemetrySampler.sample()` back to back (`--gap` seconds apart) through the real NVML choke point,
first with the process lists (the costly calls, MangoHud PR #2104) and then without, and reports the median and
p90 tick cost in total and per GPU, the one-time static reads, the cost of each NVML function, and the wall time
of `gpu_checks` (what `decodetop check` adds for the GPUs). Writes `nvml_tick_cost.json`, `nvml_tick_cost.md` and
`gpu_checks.txt` (the check results, one a line).
`--backend fake:NAME` runs it over the fake (to test the script; the figures then mean nothing).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from decodetop.collectors.fake_nvml import FakeNvmlBackend, load_recording
from decodetop.collectors.nvml import Nvml, NvmlBackend, PynvmlBackend
from decodetop.collectors.telemetry import TelemetrySampler


def _backend(spec: str) -> NvmlBackend:
    if spec == "real":
        return PynvmlBackend()
    if spec.startswith("fake:"):
        return FakeNvmlBackend(load_recording(spec[len("fake:") :]))
    raise SystemExit(f"--backend must be 'real' or 'fake:NAME', got {spec!r}")


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _series(sampler: TelemetrySampler, ticks: int, gap_s: float, *, processes: bool) -> dict[str, Any]:
    totals: list[float] = []
    per_gpu: list[float] = []
    gpu_costs: dict[int, list[float]] = {}
    calls = 0
    for _ in range(ticks):
        snap = sampler.sample(processes=processes)
        totals.append(snap.tick_cost_s)
        per_gpu.append(snap.tick_cost_per_gpu_s)
        calls = snap.nvml_calls
        for g in snap.gpus:
            gpu_costs.setdefault(g.index, []).append(g.sample_cost_s)
        time.sleep(gap_s)
    return {
        "ticks": ticks,
        "processes": processes,
        "nvml_calls_per_tick": calls,
        "tick_ms_median": statistics.median(totals) * 1e3,
        "tick_ms_p90": _pct(totals, 0.9) * 1e3,
        "per_gpu_ms_median": statistics.median(per_gpu) * 1e3,
        "per_gpu_ms_p90": _pct(per_gpu, 0.9) * 1e3,
        "gpu_ms_median": {str(i): statistics.median(v) * 1e3 for i, v in gpu_costs.items()},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--backend", default="real")
    parser.add_argument("--ticks", type=int, default=40)
    parser.add_argument("--gap", type=float, default=0.05, help="seconds between ticks")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)

    nvml = Nvml(_backend(args.backend))
    status = nvml.status()
    if not status.available:
        print(f"NVML unavailable: {status.reason}")
        return 1
    sampler = TelemetrySampler(nvml)
    first = sampler.sample(processes=True)
    gpus = first.system.device_count
    with_procs = _series(sampler, args.ticks, args.gap, processes=True)
    without = _series(sampler, args.ticks, args.gap, processes=False)
    stats = nvml.call_stats()
    functions = sorted(
        (
            {"fn": fn, "calls": s.calls, "errors": s.errors, "mean_us": s.total_s / s.calls * 1e6}
            for fn, s in stats.items()
            if s.calls
        ),
        key=lambda d: -d["mean_us"],
    )
    checks_s: float | None = None
    checks_n = 0
    try:
        from decodetop.collectors.checks.gpu import gpu_checks
        from decodetop.collectors.hostroot import HostRoot

        start = time.perf_counter()
        results = gpu_checks(HostRoot(), Nvml(_backend(args.backend)))
        checks_s = time.perf_counter() - start
        checks_n = len(results)
        (args.out / "gpu_checks.txt").write_text(
            "".join(f"{r.status.value:7} {r.check_id:24} {r.title}: {r.observed}\n" for r in results),
            encoding="utf-8",
        )
    except ImportError as exc:
        print(f"gpu_checks not timed: {exc}")
    result = {
        "machine": {"host": platform.node(), "kernel": platform.release(), "python": platform.python_version()},
        "source": first.source,
        "driver": first.system.driver_version,
        "gpus": gpus,
        "gpu_names": [g.name for g in first.gpus],
        "static_ms": first.static_cost_s * 1e3,
        "with_processes": with_procs,
        "without_processes": without,
        "functions": functions,
        "gpu_checks_s": checks_s,
        "gpu_checks_results": checks_n,
    }
    (args.out / "nvml_tick_cost.json").write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    lines = [
        f"{gpus} × {', '.join(sorted({str(g.name) for g in first.gpus}))}, driver {first.system.driver_version}, "
        f"source {first.source}; {args.ticks} ticks each, {args.gap * 1e3:.0f} ms apart.",
        "",
        "| tick | NVML calls | tick median (ms) | tick p90 (ms) | per GPU median (ms) | per GPU p90 (ms) |",
        "|---|---|---|---|---|---|",
    ]
    for name, s in (("with process lists", with_procs), ("without process lists", without)):
        lines.append(
            f"| {name} | {s['nvml_calls_per_tick']} | {s['tick_ms_median']:.2f} | {s['tick_ms_p90']:.2f} | "
            f"{s['per_gpu_ms_median']:.2f} | {s['per_gpu_ms_p90']:.2f} |"
        )
    lines += [
        "",
        f"One-time reads (names, max clocks, NVLink scan, topology, P2P): {first.static_cost_s * 1e3:.1f} ms.",
        "gpu_checks (two samples 0.5 s apart + host files): "
        + (f"{checks_s:.2f} s, {checks_n} results." if checks_s is not None else "not run."),
        "",
        "| NVML function (slowest first) | calls | mean (µs) |",
        "|---|---|---|",
    ]
    lines += [f"| {f['fn']} | {f['calls']} | {f['mean_us']:.1f} |" for f in functions[:15]]
    text = "\n".join(lines) + "\n"
    (args.out / "nvml_tick_cost.md").write_text(text, encoding="utf-8")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
