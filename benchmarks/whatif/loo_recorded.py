"""The curve engine's self-check on the H200 plans recorded in benchmarks/results/plans/: leave-one-out error per
family (inside the grid, per extrapolated octave, a shape left out) as the markdown table of docs/benchmarks.md.

    .venv/bin/python benchmarks/whatif/loo_recorded.py
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from decodetop.budget.gpus import GPUS
from decodetop.budget.roofline import hardware_for
from decodetop.budget.selfcheck import ErrorStat
from decodetop.probes.plan_hooks import measured_from_results
from decodetop.probes.results import load_results

PLANS = Path(__file__).resolve().parents[1] / "results" / "plans"


def cell(stat: ErrorStat | None) -> str:
    return "–" if stat is None else f"{stat.median_pct:.1f} / {stat.p90_pct:.1f} ({stat.n})"


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)
    hw = hardware_for(GPUS["h200"])
    print("| plan | GEMM inside | GEMM per octave | GEMM shape left out | attention inside | attention per octave "
          "| all-reduce inside |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for path in sorted(PLANS.glob("*h200x*.json")):
        check = measured_from_results(load_results(path)).engine(hw).self_check()
        g, a, ar = check.family("gemm"), check.family("attention"), check.family("allreduce")
        row = [
            cell(g.interior if g else None),
            cell(g.per_octave if g else None),
            cell(g.transfer if g else None),
            cell(a.interior if a else None),
            cell(a.per_octave if a else None),
            cell(ar.interior if ar else None),
        ]
        print(f"| {path.stem} | " + " | ".join(row) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
