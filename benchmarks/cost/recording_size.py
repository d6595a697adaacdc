"""Measures the bytes a `--record` recording takes per tick at 8 GPUs (the `--demo` fake host), before and after.

The telemetry is the demo's: the fake NVML replaying the H200 recording `h200x1-load` on 8 GPUs, sampled by
decodetop's own sampler, one tick a second (the fake's clock moves a recorded sample per tick). "before" is the line
layout decodetop wrote until recordings were compressed (every snapshot whole, plain JSON lines: the same JSON
`to_jsonable` gives, one object per line); "after" is what `Recorder` writes now (gzip, deltas between keyframes).
The recording written is then read back and every tick compared with the snapshot recorded.

    .venv/bin/python benchmarks/cost/recording_size.py --ticks 600
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from decodetop.collectors.fake_nvml import DEFAULT_RECORDING, FakeNvmlBackend, load_recording
from decodetop.collectors.nvml import Nvml
from decodetop.collectors.telemetry import TelemetrySampler, TelemetrySnapshot
from decodetop.export.recording import (
    FORMAT_NAME,
    Recorder,
    decode_replay,
    read_recording,
    to_jsonable,
    type_name,
)

DEMO_GPUS = 8
"""The demo's host (tui/launch.py DEMO_GPUS)."""
SECONDS_PER_HOUR = 3600


def _snapshots(ticks: int) -> list[TelemetrySnapshot]:
    fake = FakeNvmlBackend(load_recording(DEFAULT_RECORDING), replicate_to=DEMO_GPUS, clock=None)
    sampler = TelemetrySampler(Nvml(fake))
    out = []
    for _ in range(ticks):
        out.append(sampler.sample(processes=True))
        fake.advance()
    return out


def _plain_bytes(snaps: list[TelemetrySnapshot]) -> int:
    """The bytes the earlier plain layout took for these ticks (one whole JSON line each)."""
    total = 0
    for i, snap in enumerate(snaps):
        line = {"v": 1, "t": 1795959000.0 + i, "kind": "telemetry", "type": type_name(snap), "data": to_jsonable(snap)}
        total += len(json.dumps(line, allow_nan=False, ensure_ascii=False, separators=(",", ":")).encode()) + 1
    return total


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ticks", type=int, default=600, help="ticks to record (one a second)")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)
    snaps = _snapshots(args.ticks)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "demo.jsonl.gz"
        start = time.perf_counter()
        with Recorder(path, meta={"source": "benchmarks/cost/recording_size.py"}, clock=lambda: 1795959000.0) as rec:
            for i, snap in enumerate(snaps):
                rec.record("telemetry", snap, t=1795959000.0 + i)
        write_s = time.perf_counter() - start
        after = path.stat().st_size
        start = time.perf_counter()
        decoded = decode_replay(read_recording(path))
        read_s = time.perf_counter() - start
    replayed = decoded.values(TelemetrySnapshot)
    same = replayed == snaps and decoded.skipped == 0 and decoded.replay.meta.get("format") == FORMAT_NAME
    before = _plain_bytes(snaps)
    figures = {
        "ticks": args.ticks,
        "gpus": DEMO_GPUS,
        "before_bytes_per_tick": before / args.ticks,
        "after_bytes_per_tick": after / args.ticks,
        "before_mb_per_hour": before / args.ticks * SECONDS_PER_HOUR / 1e6,
        "after_mb_per_hour": after / args.ticks * SECONDS_PER_HOUR / 1e6,
        "write_ms_per_tick": write_s * 1e3 / args.ticks,
        "read_ms_per_tick": read_s * 1e3 / args.ticks,
        "replay_identical": same,
    }
    if args.json is not None:
        args.json.write_text(json.dumps(figures, indent=1) + "\n", encoding="utf-8")
    print(f"{args.ticks} ticks at {DEMO_GPUS} GPUs (fake NVML replaying {DEFAULT_RECORDING}), 1 tick/s")
    print(f"{'layout':<34} {'bytes/tick':>11} {'MB/hour':>9}")
    print(
        f"{'before: plain JSON lines, whole':<34} {figures['before_bytes_per_tick']:>11,.0f} "
        f"{figures['before_mb_per_hour']:>9.1f}"
    )
    print(
        f"{'after: gzip, deltas + keyframes':<34} {figures['after_bytes_per_tick']:>11,.0f} "
        f"{figures['after_mb_per_hour']:>9.2f}"
    )
    print(
        f"write {figures['write_ms_per_tick']:.2f} ms/tick, read back {figures['read_ms_per_tick']:.2f} ms/tick; "
        f"every tick replayed identical: {same}"
    )
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
