"""Writes docs/screenshots/main.svg: the main screen over data recorded on the H200 machine.

- Telemetry: the NVML recording `h200x1-load` (one H200 under load), replicated to the plan's 2 GPUs; the GPU
  panel says so.
- Probes: `benchmarks/results/primitives/h200x1.json` (allreduce, launch, membw measured on that H200) and
  `plan_glm-5-tp2-h200x1.json` (GLM-5's TP-2 plan measured on one rank of it: every component but the all-reduces,
  which the budget shows as a roofline estimate).
- Health: the checks run over the host tree copied from the same Firecracker VM
  (`firecracker-h200-vm`, built by tests/fixtures/hosts/build_fixtures.py), with the recorded NVML.

    .venv/bin/python benchmarks/ui/tui_screenshot.py [--size 160x48] [--out docs/screenshots/main.svg]
"""

from __future__ import annotations

import argparse
import asyncio
import runpy
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: The GLM-5 TP-2 plan measured on the H200 (one rank: its all-reduces are missing and shown so), beside the
#: primitives; the one recorded GPU is replicated to the plan's two (the GPU panel says so).
MODEL = "glm-5"
GPUS = 2
PRIMITIVES = "benchmarks/results/primitives/h200x1.json"
PLAN = "benchmarks/results/plans/plan_glm-5-tp2-h200x1.json"
sys.path.insert(0, str(ROOT / "src"))


async def shoot(size: tuple[int, int], out: Path, text: bool = False) -> None:
    from decodetop.collectors.checks.host import run_all_checks
    from decodetop.collectors.fake_nvml import FakeNvmlBackend, load_recording
    from decodetop.collectors.hostroot import HostRoot
    from decodetop.collectors.nvml import Nvml
    from decodetop.collectors.telemetry import TelemetrySampler
    from decodetop.probes.results import load_results
    from decodetop.settings import Settings
    from decodetop.tui.app import DecodetopApp
    from decodetop.tui.sources import Sources
    from decodetop.tui.sources.budget import PresetBudget
    from decodetop.tui.sources.checks import RecordedChecks
    from decodetop.tui.sources.probes import ReplayProbes
    from decodetop.tui.sources.telemetry import ReplayTelemetry

    backend = FakeNvmlBackend(load_recording("h200x1-load"), replicate_to=GPUS, clock=None)
    sampler = TelemetrySampler(Nvml(backend))
    snapshots = []
    for _ in range(6):
        snapshots.append(sampler.sample(processes=False))
        backend.advance()
        time.sleep(0.25)  # PCIe rates come from counter deltas between ticks
    # The host trees are generated, not committed: build this one with the fixture generator.
    generator = runpy.run_path(str(ROOT / "tests/fixtures/hosts/build_fixtures.py"), run_name="build_fixtures")
    with tempfile.TemporaryDirectory(prefix="decodetop-shot-") as tmp:
        checks = run_all_checks(
            HostRoot(generator["build"]("firecracker-h200-vm", Path(tmp) / "root")),
            nvml=Nvml(FakeNvmlBackend(load_recording("h200x1-load"), replicate_to=GPUS, clock=None)),
            sample_interval_s=0,
        )
    results = [*load_results(ROOT / PRIMITIVES), *load_results(ROOT / PLAN)]
    sources = Sources(
        telemetry=ReplayTelemetry(snapshots, interval_s=0.05, loop=False),
        probes=ReplayProbes(results),
        budget=PresetBudget(lambda: "NVIDIA H200"),
        checks=RecordedChecks(checks),
        history=None,
        run_probes_at_start=True,
        notes=(f"H200 recordings: NVML h200x1-load ×{GPUS}, probes {Path(PRIMITIVES).name} + {Path(PLAN).name}",),
    )
    app = DecodetopApp(sources, Settings(model=MODEL, tp=GPUS), save_theme=False, age_refresh_s=0)
    async with app.run_test(size=size) as pilot:
        for _ in range(400):
            done = len(app.results) == len(results) and app.budget_settled and app.checks
            if done and app.telemetry.series["sm"] and len(next(iter(app.telemetry.series["sm"].values()))) >= 5:
                break
            await pilot.pause(0.05)
        await pilot.pause(1.5)  # let DataTable re-measure its columns (it does so when the app is idle)
        out.parent.mkdir(parents=True, exist_ok=True)
        app.save_screenshot(filename=out.name, path=str(out.parent))
        if text:
            strips = app.screen._compositor.render_strips()
            print("\n".join("".join(segment.text for segment in strip) for strip in strips))
        app.shutdown_sources()
    print(f"wrote {out}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", default="160x48")
    parser.add_argument("--out", type=Path, default=ROOT / "docs/screenshots/main.svg")
    parser.add_argument("--text", action="store_true", help="also print the screen as text")
    args = parser.parse_args()
    width, height = (int(v) for v in args.size.split("x"))
    asyncio.run(shoot((width, height), args.out, args.text))
    return 0


if __name__ == "__main__":
    sys.exit(main())
