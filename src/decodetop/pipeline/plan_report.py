"""Provides a model plan run as a document: the JSON `decodetop probe --json` writes (a results file
`probes.results.load_results` reads back, with the plan, the budget and its inputs) and the text `decodetop probe
--budget` prints (stdlib only).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from decodetop.budget.contention import contention_error
from decodetop.budget.text import format_budget_table
from decodetop.pipeline.plan_runner import PlanRun
from decodetop.probes.results import RESULTS_FORMAT_VERSION
from decodetop.textfmt import format_number


def plan_run_to_dict(run: PlanRun, baseline_diff: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The JSON document of a plan run: a `decodetop probe --json` results file (readable by `load_results`) with
    the plan, the budget, the measured key times, the layer composition errors and the notes added; with
    `baseline_diff` (`BudgetDiff.to_dict()` and the baseline's path, from `--baseline`) under "baseline_diff"."""
    m = run.measured
    return {
        "decodetop_probe_results": RESULTS_FORMAT_VERSION,
        "results": [r.to_dict() for r in run.results],
        "plan": run.plan.to_dict(),
        "budget": run.budget.to_dict(),
        "measured": {
            k: {
                "median_ms": t.median_ms,
                "p10_ms": t.p10_ms,
                "p90_ms": t.p90_ms,
                "mean_ms": t.mean,
                "std_ms": t.std_ms,
                "source": t.source,
            }
            for k, t in sorted(m.times.items())
        },
        "gemm_curves": {c: [list(p) for p in cv.points] for c, cv in sorted(m.gemm_curves.items())},
        "allreduce_curves": {c: [list(p) for p in cv.points] for c, cv in sorted(m.allreduce_curves.items())},
        "layers": [
            {
                "layer": lc.layer,
                "mode": lc.mode,
                "sum_parts_us": lc.sum_parts_us,
                "layer_us": lc.layer_us,
                "error_pct": lc.error_pct,
                "error_text": contention_error(lc.error_pct, run.budget.contention),
                "eager_us": lc.eager_us,
                "note": lc.note,
            }
            for lc in m.layers
        ],
        "copy_gbps": m.copy_gbps,
        "peak_tflops": m.peak_tflops,
        "notes": list(run.notes),
        **({"baseline_diff": dict(baseline_diff)} if baseline_diff is not None else {}),
    }


def plan_run_to_json(run: PlanRun, baseline_diff: Mapping[str, Any] | None = None) -> str:
    """`plan_run_to_dict` as JSON text."""
    return json.dumps(plan_run_to_dict(run, baseline_diff), indent=1, allow_nan=False) + "\n"


def format_budget(run: PlanRun) -> str:
    """The budget as text (`decodetop.budget.text.format_budget_table`, as `decodetop budget` prints it); then the
    layer composition errors and the notes."""

    b = run.budget
    tp = f" (TP: {b.tp_source})" if b.tp_source else ""
    where = "CPU rank" if b.device_kind == "cpu" else "GPU"
    lines = [f"Budget: {b.model}, {b.deployment}{tp} — ms per decode step on the busiest {where}"]
    lines.extend(format_budget_table(b))
    lines.append(f"composed {format_number(b.total_ms)} ms/step ({b.kernels} kernels, launch {b.launch_mode})")
    if run.measured.layers:
        lines.append("Layer composition (Σ parts vs the whole layer, same kernels):")
        for lc in run.measured.layers:
            extra = f", eager {format_number(lc.eager_us)} µs" if lc.eager_us is not None else ""
            lines.append(
                f"  {lc.layer} layer [{lc.mode}]: parts {format_number(lc.sum_parts_us)} µs vs layer "
                f"{format_number(lc.layer_us)} µs → error {contention_error(lc.error_pct, b.contention)}{extra}"
                + (f" ({lc.note})" if lc.note else "")
            )
    for note in run.notes:
        lines.append(f"note: {note}")
    return "\n".join(lines) + "\n"
