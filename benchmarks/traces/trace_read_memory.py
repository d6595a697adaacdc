"""Read a large synthetic profiler trace and report peak memory (traces of hundreds of MB in bounded memory).

Writes a synthetic PyTorch-profiler-shaped trace of `--mb` MB (default 300) into a temporary directory, then, in a
fresh interpreter each, (1) imports decodetop.traces only (baseline), (2) reads the trace, (3) reads and analyses it,
and prints each one's peak RSS (ru_maxrss) and wall time. The figure for docs/benchmarks.md is (2) and (3) against
(1) and the file size.

    PYTHONPATH=src python3 benchmarks/traces/trace_read_memory.py [--mb 300] [--gz]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

CHILD = r"""
import json, resource, sys, time
mode, path = sys.argv[1], sys.argv[2]
import decodetop.traces
t0 = time.perf_counter()
out = {}
if mode == "read":
    trace = decodetop.traces.read_trace(path)
    out["events"] = trace.events_total
elif mode == "analyze":
    report = decodetop.traces.analyze_trace(path)
    out["steps"] = len(report.steps)
    out["kernels_per_step"] = report.kernels_per_step_mean
out["seconds"] = time.perf_counter() - t0
out["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps(out))
"""


def child(mode: str, path: Path) -> dict[str, float]:
    """Run one measurement in a fresh interpreter (so earlier work does not raise the peak)."""
    env = {"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin"}
    out = subprocess.run(
        [sys.executable, "-c", CHILD, mode, str(path)], capture_output=True, text=True, check=True, env=env
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    """Generate, measure, print."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=float, default=300.0, help="uncompressed trace size, MB (default 300)")
    ap.add_argument("--gz", action="store_true", help="write the trace gzipped")
    args = ap.parse_args()
    sys.path[:0] = [str(ROOT / "src"), str(ROOT / "tests")]  # the synthetic traces are the tests' helpers
    from helpers.synth import write_synthetic_trace

    with tempfile.TemporaryDirectory(prefix="decodetop-bench-") as tmp:
        path = Path(tmp) / ("big.trace.json.gz" if args.gz else "big.trace.json")
        t0 = time.perf_counter()
        steps, events = write_synthetic_trace(path, int(args.mb * 1e6))
        size_mib = path.stat().st_size / 2**20
        print(
            f"wrote {path.name}: {size_mib:.0f} MiB on disk, {events} events, {steps} steps "
            f"({time.perf_counter() - t0:.0f} s)"
        )
        base = child("baseline", path)
        read = child("read", path)
        full = child("analyze", path)
    print(f"baseline (import decodetop.traces): peak RSS {base['peak_rss_mib']:.0f} MiB")
    print(f"read_trace:    peak RSS {read['peak_rss_mib']:.0f} MiB, {read['seconds']:.1f} s, {read['events']} events")
    print(
        f"analyze_trace: peak RSS {full['peak_rss_mib']:.0f} MiB, {full['seconds']:.1f} s, "
        f"{full['steps']} steps of {full['kernels_per_step']:.0f} kernels"
    )
    print(json.dumps({"file_mib": size_mib, "events": events, "baseline": base, "read": read, "analyze": full}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
