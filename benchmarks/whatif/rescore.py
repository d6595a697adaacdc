"""The what-if campaign's predictions re-made on any machine from its stored files, against the direct figures the
GPU measured: each model's base-plan results (`<preset>_base.json.gz`; `<preset>_base.json` where a folder holds
them uncompressed) through today's composition and curve engine,
each scenario's compute part against the direct `probe --budget` figure kept in `whatif.json`, the serving-form
shapes against `serving.json`, and the base plans' leave-one-out per family. No GPU, no probe: a change to the
engine is scored on the data the H200 gave.

    .venv/bin/python benchmarks/whatif/rescore.py benchmarks/results/whatif/h200x1
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from decodetop.budget.deployment import Deployment
from decodetop.probes.results import load_results

sys.path.insert(0, str(Path(__file__).resolve().parent))
import whatif  # the campaign's scenarios, comparison and table (benchmarks/whatif/whatif.py)


def rescore_model(preset: str, stored: dict[str, Any], folder: Path, layers: int, context: int) -> dict[str, Any]:
    """One model's scenarios predicted again from its base results, against the stored direct figures."""
    from decodetop.pipeline.composition import compose
    from decodetop.pipeline.context import BudgetContext

    packed = folder / f"{preset}_base.json.gz"
    results = tuple(load_results(packed if packed.exists() else folder / f"{preset}_base.json"))
    spec = whatif.model_spec(preset, layers, tiny=False)
    base = Deployment(tp=1, batch=1, context_len=context, kv_dtype="bf16", launch_mode="graph")
    direct = {r["scenario"]: r for r in stored["rows"] if "direct_ms" in r}
    rows: list[dict[str, Any]] = []
    loo: dict[str, Any] = {}
    for sc in whatif.SCENARIOS:
        if sc.name not in direct:
            continue
        budget = compose(BudgetContext(whatif._scenario(spec, sc.deployment(base)), results, group_kind="cuda")).budget
        loo = loo or whatif.loo_rows(budget)
        ms, lo, hi, complete = whatif.compute_part(budget)
        d_ms = direct[sc.name]["direct_ms"]
        comm = budget.segment(whatif.COMMUNICATION)
        rows.append({
            "scenario": sc.name, "predicted_ms": ms, "range_ms": [lo, hi], "direct_ms": d_ms,
            "error": ms / d_ms - 1, "inside": lo <= d_ms <= hi, "complete": complete,
            "allreduce_predicted_ms": comm.ms if comm is not None else None,
            "allreduce_status": comm.status if comm is not None else "", "weakest": budget.weakest,
        })  # fmt: skip
    serving = [] if spec.is_moe else whatif.serving_predictions(spec, base, results, "cuda")
    return {"model": spec.name, "rows": rows, "loo": loo, "serving": serving}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", nargs="?", default="benchmarks/results/whatif/h200x1", help="the campaign's files")
    ap.add_argument("--json", metavar="PATH", help="write the re-made comparison as JSON")
    args = ap.parse_args(argv)
    folder = Path(args.folder)
    stored = json.loads((folder / "whatif.json").read_text(encoding="utf-8"))
    doc: dict[str, Any] = {"what": "whatif rescored", "from": str(folder), "models": {}}
    for preset, model in stored["models"].items():
        doc["models"][preset] = rescore_model(preset, model, folder, stored["layers"], stored["context"])
    serving_path = folder / "serving.json"
    if serving_path.exists():
        timed = {r["name"]: r for r in json.loads(serving_path.read_text(encoding="utf-8"))["rows"]}
        again = [r for m in doc["models"].values() for r in m["serving"] if r["name"] in timed]
        doc["serving_measured"] = {"rows": [{**r, "measured": timed[r["name"]]["measured"]} for r in again]}
    doc["summary"] = whatif.summary(doc["models"])
    if args.json:
        Path(args.json).write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    print(whatif.table(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
