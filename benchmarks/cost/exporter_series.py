"""Count of the exporter's series at N GPUs (default 8): what one scrape of `decodetop exporter` holds with the fake
NVML replaying the H200 recording on every GPU, the GPU checks for those GPUs, the probe results of a full model
plan (GLM-5 at TP 2 on 2 × H200, benchmarks/results/plans), that plan's budget composed as the exporter composes
it, and a live server's step. Counting is deterministic (no timing): it is the text exposition's sample lines.

Targets: at most 150 series per GPU (telemetry and checks) plus 400 for the probe plan.

    .venv/bin/python benchmarks/cost/exporter_series.py [--gpus 8] [--plan PATH]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))

from prometheus_client.parser import text_string_to_metric_families  # noqa: E402 - after the source path is set

from decodetop.budget.compose import default_observed  # noqa: E402
from decodetop.budget.scenario import ModelSource, TpChoice, build_scenario  # noqa: E402
from decodetop.collectors.checks.gpu import gpu_checks  # noqa: E402
from decodetop.collectors.fake_nvml import FakeNvmlBackend, load_recording  # noqa: E402
from decodetop.collectors.nvml import Nvml  # noqa: E402
from decodetop.collectors.serving import ServerStep  # noqa: E402
from decodetop.collectors.telemetry import TelemetrySampler  # noqa: E402
from decodetop.export.prometheus import PARTS, ExportState, render_exposition  # noqa: E402
from decodetop.export.schedule import BudgetComposer  # noqa: E402
from decodetop.probes.results import load_results  # noqa: E402

PLAN = ROOT / "benchmarks" / "results" / "plans" / "plan_glm-5-tp2-h200x2.json"
RECORDING = "h200x1-load"


def count(text: str) -> int:
    """Sample lines of an exposition."""
    return sum(len(family.samples) for family in text_string_to_metric_families(text))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--plan", type=Path, default=PLAN)
    args = parser.parse_args()
    backend = FakeNvmlBackend(load_recording(RECORDING), replicate_to=args.gpus, clock=None)
    sampler = TelemetrySampler(Nvml(backend))
    sampler.sample()
    backend.advance()
    snapshot = sampler.sample()
    checks = tuple(
        gpu_checks(None, Nvml(FakeNvmlBackend(load_recording(RECORDING), replicate_to=args.gpus)), window_s=0)
    )
    results = tuple(load_results(args.plan))
    scenario = build_scenario(ModelSource("preset", "glm-5"), TpChoice(2, "--tp"))
    step = ServerStep(
        19.2,
        19.2,
        "sglang",
        "sglang:inter_token_latency_seconds",
        500,
        30.0,
        1.0,
        "none",
        "http://127.0.0.1:30000/metrics",
        taken_unix_s=time.time(),
    )
    budget = BudgetComposer(scenario, default_observed(), 309.0, "cuda")(results, step, snapshot)
    state = ExportState(
        telemetry=snapshot,
        probe_results=results,
        budget=budget,
        checks=checks,
        checks_unix_s=time.time(),
        observed=step,
        probe_interval_s=600.0,
    )
    total = count(render_exposition(state))
    empty = ExportState(probe_interval_s=state.probe_interval_s)  # the exporter's own series, per part
    by_part = {
        part: count(render_exposition(state, parts=(part,))) - count(render_exposition(empty, parts=(part,)))
        for part in PARTS
    }
    by_part["exporter"] = count(render_exposition(empty))
    per_gpu = (by_part["telemetry"] + by_part["checks"]) / args.gpus
    points = sum(len(r.measurements) for r in results)
    print(
        f"{args.gpus} fake GPUs ({RECORDING}), {len(checks)} GPU checks, {len(results)} probe results "
        f"({points} points, {args.plan.name}), {len(budget.segments)} budget components, a server step"
    )
    print(f"{'part':<10} {'series':>7}")
    for part, n in by_part.items():
        print(f"{part:<10} {n:>7}")
    print(f"{'total':<10} {total:>7}   per GPU (telemetry + checks) {per_gpu:.0f}, probe plan {by_part['probes']}")
    ok = per_gpu <= 150 and by_part["probes"] <= 400
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
