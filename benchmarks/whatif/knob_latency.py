"""How long one knob change takes to re-compose a what-if (`decodetop.pipeline.whatif.predict`): the TUI's what-if
screen calls it per key press (target: under 100 ms on a 2-core machine). Reads a recorded H200 plan, warms the
caches with the current deployment, then times each variant: its first composition (a knob turned to a new value)
and the median of `--repeat` more (turned back to it).

    .venv/bin/python benchmarks/whatif/knob_latency.py [--results PATH] [--model glm-5] [--tp 2]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from decodetop.budget.deployment import Deployment
from decodetop.budget.scenario import Scenario, model_source
from decodetop.budget.spec import load_preset
from decodetop.pipeline.context import BudgetContext
from decodetop.pipeline.whatif import predict
from decodetop.probes.results import load_results

PLANS = Path(__file__).resolve().parents[1] / "results" / "plans"
KNOBS = ({"tp": "4"}, {"batch": "8"}, {"context": "32768"}, {"kv": "fp8"}, {"weights": "fp8"}, {"accept": "2"})


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", default=str(PLANS / "plan_glm-5-tp2-h200x2.json"))
    ap.add_argument("--model", default="glm-5")
    ap.add_argument("--tp", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args(argv)
    scenario = Scenario(model_source(args.model, None), load_preset(args.model), Deployment(tp=args.tp), "--tp")
    ctx = BudgetContext(scenario, tuple(load_results(args.results)))
    t0 = time.perf_counter()
    predict(ctx, {})
    first = 1e3 * (time.perf_counter() - t0)
    print(f"first composition (reads the results, builds the engine, self-check): {first:.0f} ms")
    for knobs in KNOBS:
        times = []
        for _ in range(args.repeat):
            t = time.perf_counter()
            v = predict(ctx, knobs)
            times.append(1e3 * (time.perf_counter() - t))
        label = " ".join(f"{k}={x}" for k, x in knobs.items())
        print(
            f"{label:>16}: first {times[0]:6.1f} ms (a new deployment: its inventory, plan and reading), again "
            f"{statistics.median(times[1:] or times):5.1f} ms (step {v.step_ms or 0:.3g} ms)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
