"""What-if accuracy (H200 acceptance of the curve engine): scenarios predicted from one plan's curves, against a
direct plan at each scenario on the same GPU.

For each model (default: Llama-3.1-70B and Mixtral-8x7B shapes, reduced to 4 layers, BF16):

1. the base plan (TP 1, batch 1, context 4096, KV BF16) runs with its curve plan (`decodetop.budget.plan.
   build_curve_plan`: the other TP shards' GEMMs, attention over batch × context × KV dtype, routed experts at each
   EP degree's local experts, norms / lm_head / KV writes over tokens), through one `ProbeController`;
2. every scenario — batch 8, batch 32, context × 8 (32K), the TP-2 and TP-4 shard shapes, batch 8 + TP 2 + context
   × 4 (16K), FP8 KV, and for MoE models EP 2 (with TP 2: EP divides TP) — is predicted from the base results alone
   (`decodetop.pipeline.composition.compose`: the one composition, its curve engine), then measured by a
   direct plan of that scenario (its own keys only, no curves) on the same group;
3. the compute part (every row but the all-reduce, which one GPU cannot measure and is shown apart) is compared:
   error, the predicted 80 % range (`decodetop.budget.uncertainty.combine` over the rows' ranges) and whether the
   direct figure lies inside it; the base plan's own leave-one-out errors per curve family are printed beside.

Targets (the issue's acceptance): compute within 7 % median / 12 % worst; the direct figure inside the 80 % range
in ≥ 80 % of the cases; leave-one-out GEMM ≤ 5 % / ≤ 15 %, attention ≤ 2 % / ≤ 8 % (median / p90).
`--glm5-plan` also times the full GLM-5 plan at TP 2 with its curves (docs/benchmarks.md keeps it under 60 s), first,
and `--glm5-results PATH` keeps its results (`decodetop whatif --model glm-5 --results PATH`). `--serving-json PATH`
times the independent serving-form step (serving_step.py: plain torch, its own process) at `SERVING_SHAPES` of the
dense model after its base plan, against the compute part predicted there.

    PYTHONPATH=src python3 benchmarks/whatif/whatif.py --json /tmp/whatif.json          # one H200
    PYTHONPATH=src python3 benchmarks/whatif/whatif.py --device cpu --tiny --context 64  # CPU smoke
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import json
import math
import statistics
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from decodetop.atomic import write_bytes_atomic, write_text_atomic
from decodetop.budget.compose import Budget
from decodetop.budget.deployment import Deployment
from decodetop.budget.inventory import build_inventory
from decodetop.budget.scenario import Scenario
from decodetop.budget.segment import segments_range
from decodetop.budget.spec import ModelSpec, load_preset
from decodetop.errors import UserInputError

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fidelity"))
import fidelity  # the reduced configs of the fidelity proof (benchmarks/fidelity/fidelity.py)

DEFAULT_MODELS = ("llama-3.1-70b", "mixtral-8x7b")
#: The plan's probes: all but `layer` (its composition check is a separate figure) and the all-reduce (one GPU).
PROBES = (
    "launch",
    "gemm",
    "moe",
    "routing",
    "attention",
    "kvcast",
    "norms",
    "sampling",
)
TARGET_MEDIAN, TARGET_WORST, TARGET_COVERAGE = 0.07, 0.12, 0.80
TARGET_LOO = {"gemm": (5.0, 15.0), "attention": (2.0, 8.0)}
COMMUNICATION = "communication"


@dataclasses.dataclass(frozen=True)
class WhatIf:
    """One what-if: a name and the deployment it changes (context as a multiple of the base context)."""

    name: str
    changes: Mapping[str, Any]
    context_factor: int = 1
    moe_only: bool = False

    def deployment(self, base: Deployment) -> Deployment:
        changes = dict(self.changes)
        if self.context_factor != 1:
            changes["context_len"] = base.context_len * self.context_factor
        return dataclasses.replace(base, **changes)


SCENARIOS = (
    WhatIf("batch 8", {"batch": 8}),
    WhatIf("batch 32", {"batch": 32}),
    WhatIf("context ×8", {}, context_factor=8),
    WhatIf("TP-2 shard", {"tp": 2}),
    WhatIf("TP-4 shard", {"tp": 4}),
    WhatIf("batch 8 + TP 2 + context ×4", {"batch": 8, "tp": 2}, context_factor=4),
    WhatIf("FP8 KV", {"kv_dtype": "fp8"}),
    WhatIf("EP 2 (TP 2)", {"tp": 2, "ep": 2}, moe_only=True),
)


SERVING_SHAPES = ((1, 16, 2, 1), (4, 4, 16, 1), (2, 24, 1, 2))
"""(TP, batch, context × num / den of the base context) of the independent serving-form step (serving_step.py) of
the dense model: shapes none of the scenarios above uses (at the base 4K: batch 16 at 8K, batch 4 at 64K on the
TP-4 shard, batch 24 at 2K on the TP-2 shard)."""
SERVING_TIMEOUT_S = 180.0
"""Deadline of the serving-form step's process (three shapes, each captured and replayed)."""


def model_spec(preset: str, layers: int, *, tiny: bool) -> ModelSpec:
    """The preset reduced to `layers` layers, BF16 (as the fidelity proof builds it); tiny widths for CPU smoke."""
    return fidelity.reduced_spec(preset, layers, fidelity.model_overrides(preset, tiny))


def compute_part(budget: Budget) -> tuple[float, float, float, bool]:
    """(ms, 80 % p10, p90, complete) of every row but the all-reduce."""
    segs = [s for s in budget.segments if s.component != COMMUNICATION]
    total = segments_range(segs)
    return (
        sum(s.ms or 0.0 for s in segs),
        total.p10_ms,
        total.p90_ms,
        all(s.status != "missing" for s in segs),
    )


def scenario_row(name: str, predicted: Budget, direct: Budget) -> dict[str, Any]:
    """One scenario's comparison: compute part, error, range and inside, the all-reduce apart, the labels."""
    p_ms, lo, hi, p_complete = compute_part(predicted)
    d_ms, _dlo, _dhi, d_complete = compute_part(direct)
    comm = predicted.segment(COMMUNICATION)
    return {
        "scenario": name,
        "deployment": predicted.deployment,
        "predicted_ms": p_ms,
        "range_ms": [lo, hi],
        "direct_ms": d_ms,
        "error": p_ms / d_ms - 1 if d_ms > 0 else None,
        "inside": lo <= d_ms <= hi,
        "complete": p_complete and d_complete,
        "allreduce_predicted_ms": comm.ms if comm is not None else None,
        "allreduce_status": comm.status if comm is not None else "",
        "weakest": predicted.weakest,
        "dominant": predicted.dominant,
        "rows": {
            s.component: {"predicted_ms": s.ms, "status": s.status, "label": s.curve_label,
                          "direct_ms": (direct.segment(s.component) or s).ms if direct.segment(s.component) else None}
            for s in predicted.segments
        },
    }  # fmt: skip


def loo_rows(budget: Budget) -> dict[str, Any]:
    """The base plan's self-check per family (median / p90 %, count) from a predicted budget."""
    if budget.self_check is None:
        return {}
    return {f.probe: f.to_dict() for f in budget.self_check.families}


def _scenario(spec: ModelSpec, deployment: Deployment) -> Scenario:
    """The one path's scenario of the reduced (in-memory) model on `deployment` (benchmarks/fidelity's rule)."""
    return fidelity.scenario_of(build_inventory(spec, deployment), deployment.launch_mode)


def _plan(
    runner: Any,
    pc: Any,
    scenario: Scenario,
    *,
    sweeps: bool,
    log: Callable[[str], None],
) -> Any:
    """A model plan of `scenario` on the group (`decodetop.pipeline.plan_runner.run_model_plan`)."""
    from decodetop.pipeline.context import BudgetContext
    from decodetop.pipeline.plan_runner import run_model_plan

    return run_model_plan(
        runner, BudgetContext(scenario), world_size=pc.world_size, device_kind=pc.layout.kind, sweeps=sweeps,
        only=PROBES, on_progress=lambda p: log(f"  {scenario.spec.name}: {p.line()}"),
    )  # fmt: skip


def run_model(
    runner: Any,
    pc: Any,
    preset: str,
    args: argparse.Namespace,
    *,
    log: Callable[[str], None],
    on_update: Callable[[dict[str, Any]], None] = lambda _doc: None,
) -> dict[str, Any]:
    """The base plan with its curves (and the serving-form shapes predicted from it), then every scenario predicted
    and measured; `on_update` gets the model's document after the base plan and after each scenario."""
    from decodetop.pipeline.composition import compose
    from decodetop.pipeline.context import BudgetContext

    spec = model_spec(preset, args.layers, tiny=args.tiny)
    mode = "graph" if pc.layout.kind == "cuda" else "eager"  # CPU ranks time the eager launch, not a graph node
    base_dep = Deployment(tp=1, batch=1, context_len=args.context, kv_dtype="bf16", launch_mode=mode)
    t0 = time.monotonic()
    run = _plan(runner, pc, _scenario(spec, base_dep), sweeps=True, log=log)
    if args.results_dir:  # the base plan's results: predictions can be re-made from them on any machine
        from decodetop.probes.results import results_to_json

        packed = gzip.compress(results_to_json(run.results).encode(), mtime=0)  # 1.6 MB of JSON → ~0.15 MB
        write_bytes_atomic(Path(args.results_dir) / f"{preset}_base.json.gz", packed)
    rows: list[dict[str, Any]] = []
    out: dict[str, Any] = {
        "model": spec.name,
        "serving": [] if spec.is_moe else serving_predictions(spec, base_dep, run.results, pc.layout.kind),
        "base_plan_s": round(time.monotonic() - t0, 2),
        "base_points": len(run.measured.curve_points),
        "base_budget": run.budget.to_dict(),
        "rows": rows,
        "loo": {},
        "notes": list(run.notes),
    }
    on_update(out)
    for sc in SCENARIOS:
        if sc.moe_only and not spec.is_moe:
            continue
        try:
            scenario = _scenario(spec, sc.deployment(base_dep))
        except UserInputError as exc:
            rows.append({"scenario": sc.name, "skipped": str(exc)})
            continue
        predicted = compose(BudgetContext(scenario, run.results, group_kind=pc.layout.kind)).budget
        out["loo"] = out["loo"] or loo_rows(predicted)
        direct = _plan(runner, pc, scenario, sweeps=False, log=log)
        row = scenario_row(sc.name, predicted, direct.budget)
        rows.append(row)
        log(f"  {preset} {sc.name}: predicted {row['predicted_ms']:.3f} ms, direct {row['direct_ms']:.3f} ms")
        on_update(out)
    return out


def serving_predictions(
    spec: ModelSpec, base_dep: Deployment, results: Sequence[Any], group_kind: str
) -> list[dict[str, Any]]:
    """The compute part predicted from the base plan at each of `SERVING_SHAPES`, with the shape the independent
    serving-form step builds (serving_step.py reads the model's widths from here, never decodetop's code)."""
    from decodetop.pipeline.composition import compose
    from decodetop.pipeline.context import BudgetContext

    out = []
    for tp, batch, num, den in SERVING_SHAPES:
        dep = dataclasses.replace(base_dep, tp=tp, batch=batch, context_len=base_dep.context_len * num // den)
        budget = compose(BudgetContext(_scenario(spec, dep), tuple(results), group_kind=group_kind)).budget
        ms, lo, hi, complete = compute_part(budget)
        shape = {"layers": spec.n_layers, "hidden": spec.d_model, "heads": spec.n_heads, "kv_heads": spec.n_kv_heads,
                 "head_dim": spec.head_dim, "intermediate": spec.ffn_dense, "vocab": spec.vocab_size, "tp": tp,
                 "batch": batch, "context": dep.context_len}  # fmt: skip
        out.append({
            "name": f"{spec.name}: batch {batch}, context {dep.context_len}, TP-{tp} shard",
            "shape": shape, "predicted_ms": ms, "range_ms": [lo, hi], "complete": complete,
            "weakest": budget.weakest,
        })  # fmt: skip
    return out


def run_serving(
    doc: Mapping[str, Any],
    json_path: str,
    out_path: str,
    device: str,
    log: Callable[[str], None],
) -> Any:
    """The independent serving-form step (serving_step.py, its own process) at the shapes predicted in `doc`."""
    import subprocess

    script = Path(__file__).resolve().with_name("serving_step.py")
    cmd = [
        sys.executable,
        str(script),
        "--predicted",
        json_path,
        "--json",
        out_path,
        "--device",
        device,
    ]
    if device == "cpu":
        cmd += ["--replays", "2", "--repeats", "3"]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=SERVING_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        log(f"serving-form step: no result within {SERVING_TIMEOUT_S:.0f} s")
        return None
    log(done.stderr.rstrip())
    if done.returncode != 0:
        log(f"serving-form step: exit {done.returncode}")
        return None
    return json.loads(Path(out_path).read_text(encoding="utf-8"))


def glm5_plan(runner: Any, pc: Any, results_path: str | None, *, log: Callable[[str], None]) -> dict[str, Any]:
    """The full GLM-5 plan at TP 2 (one rank: the shard's shapes) with its curves: wall time and point count; its
    results written to `results_path` (as `decodetop probe --json` writes them: `decodetop whatif --results`)."""
    from decodetop.budget.scenario import model_source
    from decodetop.probes.results import results_to_json

    spec = load_preset("glm-5")
    scenario = Scenario(model_source("glm-5", None), spec, Deployment(tp=2), "the campaign's deployment")
    t0 = time.monotonic()
    run = _plan(runner, pc, scenario, sweeps=True, log=log)
    plan_s = time.monotonic() - t0
    if results_path:
        write_text_atomic(Path(results_path), results_to_json(run.results))
    return {
        "plan_s": round(plan_s, 2),
        "results": results_path,
        "points": len(run.measured.curve_points),
        "per_probe_s": {r.probe: round(r.duration_s, 2) for r in run.results},
        "statuses": {r.probe: r.status.value for r in run.results},
    }


def summary(models: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """Median and worst |error| of the compute part, the coverage of the 80 % ranges, and the LOO figures."""
    rows = [r for m in models.values() for r in m["rows"] if r.get("error") is not None]
    errs = [abs(r["error"]) for r in rows]
    out: dict[str, Any] = {
        "cases": len(rows),
        "median_error": statistics.median(errs) if errs else None,
        "worst_error": max(errs) if errs else None,
        "coverage": sum(1 for r in rows if r["inside"]) / len(rows) if rows else None,
    }
    out["meets"] = bool(
        errs
        and out["median_error"] <= TARGET_MEDIAN
        and out["worst_error"] <= TARGET_WORST
        and out["coverage"] >= TARGET_COVERAGE
    )
    return out


def table(doc: Mapping[str, Any]) -> str:
    """The comparison as a markdown table, the summary and the LOO lines."""
    lines = [
        "| model | scenario | direct ms | predicted ms | error | 80 % range | inside | all-reduce (pred.) | weakest |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for m in doc["models"].values():
        for r in m["rows"]:
            if "skipped" in r:
                lines.append(f"| {m['model']} | {r['scenario']} | skipped: {r['skipped']} | | | | | | |")
                continue
            ar = r["allreduce_predicted_ms"]
            ar_text = "-" if ar is None else f"{ar:.3f} ({r['allreduce_status']})"
            lines.append(
                f"| {m['model']} | {r['scenario']} | {r['direct_ms']:.3f} | {r['predicted_ms']:.3f} | "
                f"{r['error'] * 100:+.1f} % | {r['range_ms'][0]:.3f}–{r['range_ms'][1]:.3f} | "
                f"{'yes' if r['inside'] else 'no'} | {ar_text} | "
                f"{r['weakest'] or '-'} |"
            )
    s = doc["summary"]
    if s["cases"]:
        lines.append(
            f"\ncompute part: median |error| {s['median_error'] * 100:.1f} % (target ≤ {TARGET_MEDIAN * 100:.0f} %), "
            f"worst {s['worst_error'] * 100:.1f} % (≤ {TARGET_WORST * 100:.0f} %), direct inside the 80 % range in "
            f"{s['coverage'] * 100:.0f} % of {s['cases']} cases (≥ {TARGET_COVERAGE * 100:.0f} %): "
            f"{'met' if s['meets'] else 'NOT met'}"
        )
    for m in doc["models"].values():
        for probe, (tmed, tp90) in TARGET_LOO.items():
            fam = m["loo"].get(probe, {})
            stat = fam.get("interior")
            if stat:
                ok = stat["median_pct"] <= tmed and stat["p90_pct"] <= tp90
                lines.append(
                    f"leave-one-out {m['model']} {probe}: {stat['median_pct']:.1f} % median / {stat['p90_pct']:.1f} "
                    f"% p90 ({stat['n']} points; target ≤ {tmed:g} / ≤ {tp90:g}: {'met' if ok else 'NOT met'})"
                    + launch_split(fam)
                )
    lines.extend(serving_lines(doc))
    if "glm5" in doc:
        g = doc["glm5"]
        lines.append(f"GLM-5 full plan at TP 2 with curves: {g['plan_s']} s, {g['points']} points ({g['per_probe_s']})")
    return "\n".join(lines)


def launch_split(fam: Mapping[str, Any]) -> str:
    """'; within one launch regime 2.1 / 8.7 % (14), across a launch change 5.6 / 14.1 % (26)' where the family's
    interior points were told apart by the GQA kernel's launch regimes ('' for other families)."""
    parts = [
        f"{what} {s['median_pct']:.1f} / {s['p90_pct']:.1f} % ({s['n']})"
        for what, s in (("within one launch regime", fam.get("within_launch")), ("across a launch change",
                        fam.get("across_launch")))
        if s
    ]  # fmt: skip
    if fam.get("launch_unknown"):
        parts.append(f"the launch of {fam['launch_unknown']} GQA curves not recorded")
    return "; " + ", ".join(parts) if parts else ""


def serving_lines(doc: Mapping[str, Any]) -> list[str]:
    """The independent serving-form step against the prediction, one line per shape, and the median / worst."""
    measured = (doc.get("serving_measured") or {}).get("rows") or []
    if not measured:
        return []
    head = "| serving-form step (compute of one rank) | independent ms | predicted ms | error | 80 % range | inside |"
    lines = ["\n" + head, "|---|---|---|---|---|---|"]
    errs = []
    for r in measured:
        m, p, (lo, hi) = r["measured"]["ms"], r["predicted_ms"], r["range_ms"]
        errs.append(abs(p / m - 1))
        lines.append(f"| {r['name']} | {m:.3f} | {p:.3f} | {(p / m - 1) * 100:+.1f} % | {lo:.3f}–{hi:.3f} | "
                     f"{'yes' if lo <= m <= hi else 'no'} |")  # fmt: skip
    lines.append(
        f"serving-form step: median |error| {statistics.median(errs) * 100:.1f} %, worst {max(errs) * 100:.1f} %"
    )
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(DEFAULT_MODELS), help="presets, comma-separated")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--context", type=int, default=4096, help="the base plan's context")
    ap.add_argument("--tiny", action="store_true", help="tiny widths (CPU smoke test)")
    ap.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto", help="probe ranks")
    ap.add_argument("--probe-timeout", type=float, default=None, help="deadline per probe, s")
    ap.add_argument(
        "--glm5-plan",
        action="store_true",
        help="also time the full GLM-5 plan at TP 2 with curves",
    )
    ap.add_argument(
        "--glm5-results",
        metavar="PATH",
        help="write the GLM-5 plan's results here (probe --json form)",
    )
    ap.add_argument(
        "--serving-json",
        metavar="PATH",
        help="time the serving-form step too, its JSON here (needs --json)",
    )
    ap.add_argument(
        "--results-dir", metavar="DIR", help="write each model's base-plan results here (<preset>_base.json.gz)"
    )
    ap.add_argument("--json", metavar="PATH", help="write everything as JSON (after each model)")
    ap.add_argument("--quiet", action="store_true", help="no progress on stderr")
    args = ap.parse_args(argv)

    started = time.monotonic()

    def log(text: str) -> None:  # each line with the seconds since the start: where a plan's time goes
        if not args.quiet:
            print(f"[{time.monotonic() - started:7.2f} s] {text}", file=sys.stderr, flush=True)

    doc: dict[str, Any] = {
        "what": "whatif",
        "layers": args.layers,
        "context": args.context,
        "models": {},
    }
    t0 = time.monotonic()
    campaign(args, doc, log)
    doc["summary"] = summary(doc["models"])
    doc["wall_s"] = round(time.monotonic() - t0, 1)
    dump(doc, args.json)
    print(table(doc))
    return 0


def campaign(args: argparse.Namespace, doc: dict[str, Any], log: Callable[[str], None]) -> None:
    """The GLM-5 plan first (bounded, and its results feed `decodetop whatif`), then each model with its scenarios,
    the serving-form step right after the dense model's base plan; each part on ranks of its own (a kernel that
    faults poisons its process's CUDA context, not the next part's); `doc` written after each step."""
    from decodetop.pipeline.plan_runner import PlanRunner
    from decodetop.probes.controller import ProbeController

    def on_update(model_doc: dict[str, Any]) -> None:
        preset = model_doc["preset"]
        doc["models"][preset] = model_doc
        doc["summary"] = summary(doc["models"])
        dump(doc, args.json)
        if model_doc["serving"] and not doc.get("serving") and args.serving_json and args.json:
            doc["serving"] = model_doc["serving"]
            dump(doc, args.json)
            doc["serving_measured"] = run_serving(doc, args.json, args.serving_json, doc["device_kind"], log)
            dump(doc, args.json)

    parts: list[str] = (["glm-5"] if args.glm5_plan else []) + [m for m in args.models.split(",") if m]
    for preset in parts:
        with ProbeController(device=args.device, cpu_ranks=1) as pc:
            runner = PlanRunner(lambda pc=pc: pc, timeout_s=args.probe_timeout)
            doc["device_kind"] = pc.layout.kind
            if preset == "glm-5" and args.glm5_plan:
                if pc.layout.kind != "cuda":
                    log("--glm5-plan: the full GLM-5 plan is timed on a GPU only (skipped on CPU ranks)")
                    continue
                doc["glm5"] = glm5_plan(runner, pc, args.glm5_results, log=log)
                dump(doc, args.json)
                continue

            def update(model_doc: dict[str, Any], preset: str = preset) -> None:
                on_update({**model_doc, "preset": preset})

            run_model(runner, pc, preset, args, log=log, on_update=update)


def dump(doc: Mapping[str, Any], path: str | None) -> None:
    if path:
        write_text_atomic(
            Path(path),
            json.dumps(doc, indent=1, allow_nan=False, default=_finite) + "\n",
        )


def _finite(value: object) -> object:
    return None if isinstance(value, float) and not math.isfinite(value) else str(value)


if __name__ == "__main__":
    sys.exit(main())
