"""Cost of the history file's safety: load, an append when this process wrote last (no re-read), an append after
another process wrote (re-read under the lock), and two processes appending at once.

    PYTHONPATH=src python3 benchmarks/cost/history_writers.py [--entries 5000] [--appends 200]

Prints a short table; CPU only, writes only under a temporary directory.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from decodetop.history import KIND_PROBE, History

PAYLOAD = {"stats": {"median_us": 41.5, "p99_us": 60.0}, "points": [{"bytes": 2**i, "us": 10.0 + i} for i in range(20)]}
"""About the size of a stored all-reduce sweep result (20 sizes)."""

WRITER = """
import sys
from pathlib import Path
from decodetop.history import KIND_PROBE, History
history = History(Path(sys.argv[1]))
history.load()
for i in range(int(sys.argv[2])):
    history.record(KIND_PROBE, sys.argv[3], {"i": i})
"""


def _ms(samples: list[float]) -> str:
    return f"{statistics.median(samples) * 1e3:8.1f}"


def main() -> None:
    """Run every measurement and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--entries", type=int, default=5000, help="entries in the history first (default 5000)")
    parser.add_argument("--appends", type=int, default=200, help="appends per process in the two-writer run")
    args = parser.parse_args()
    path = Path(tempfile.mkdtemp(prefix="decodetop-history-bench-")) / "history.jsonl"
    mine = History(path)
    mine.load()
    for i in range(args.entries):
        mine.record(KIND_PROBE, f"p{i % 30}", PAYLOAD, recorded_at_s=float(i))
    loads, own, after_other = [], [], []
    for _ in range(5):
        t0 = time.perf_counter()
        History(path).load()
        loads.append(time.perf_counter() - t0)
    other = History(path)
    other.load()
    for _ in range(10):
        t0 = time.perf_counter()
        mine.record(KIND_PROBE, "mine", PAYLOAD)
        own.append(time.perf_counter() - t0)
        other.record(KIND_PROBE, "other", PAYLOAD)
        t0 = time.perf_counter()
        mine.record(KIND_PROBE, "mine", PAYLOAD)
        after_other.append(time.perf_counter() - t0)
        other.record(KIND_PROBE, "other", PAYLOAD)
        mine.record(KIND_PROBE, "mine", PAYLOAD)  # catch up, so that the next `own` sample follows its own write
    two = path.with_name("two.jsonl")
    t0 = time.perf_counter()
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(two), str(args.appends), name]) for name in ("a", "b")]
    codes = [p.wait() for p in procs]
    both_s = time.perf_counter() - t0
    lines = len(two.read_text().splitlines())
    size_mib = path.stat().st_size / 2**20
    print(f"history of {args.entries} entries ({size_mib:.1f} MiB), median ms")
    print(f"  load                                   {_ms(loads)}")
    print(f"  append, this process wrote last        {_ms(own)}")
    print(f"  append after another process wrote     {_ms(after_other)}")
    print(
        f"  2 processes x {args.appends} appends: {both_s:.1f} s wall, {lines} lines "
        f"(expected {2 * args.appends}), exit codes {codes}"
    )


if __name__ == "__main__":
    main()
