"""One truth on a GPU machine: runs a model's probe plan once (`decodetop probe --model M --budget --json`), then
composes the budget of those same results as the live UI's budget source (`tui.sources.budget.PresetBudget`, no textual
needed), `decodetop budget --results` and the exporter's composer do, and checks every surface has the same
figure and status for every component (and the same roofline). Writes everything under $OUT; prints a short
table last; exit 1 on any difference.

    NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONPATH=src \\
        python3 benchmarks/surfaces/budget_surfaces.py --model llama-3.1-70b --out "$OUT"

On a machine without a GPU the plan runs on CPU ranks (`--cpu-ranks 2`): the same comparison, CPU rules.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

GPU_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
"""NVLink multicast stays off on the lent GPU machines (benchmarks/campaigns/campaign_lib.sh)."""
REL_TOL = 1e-9
"""Figures are compared as floats read back from JSON: equal up to rounding of the last digit."""


def _run(argv: list[str], log: Path, timeout_s: float) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **GPU_ENV, "PYTHONPATH": "src" + os.pathsep + os.environ.get("PYTHONPATH", "")}
    out = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout_s, check=False)
    log.write_text(f"$ {' '.join(argv)}\n--- stdout\n{out.stdout}\n--- stderr\n{out.stderr}\nrc={out.returncode}\n")
    return out


def _segments(doc: dict[str, Any]) -> dict[str, tuple[float | None, str]]:
    return {s["component"]: (s["ms"], s["status"]) for s in doc["segments"]}


def main() -> int:
    """Run the plan, compose on every surface, compare, print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="llama-3.1-70b")
    parser.add_argument("--out", default=os.environ.get("OUT", "benchmarks/results/surfaces"))
    parser.add_argument("--cpu-ranks", type=int, help="run on CPU ranks instead of GPUs")
    parser.add_argument("--timeout", type=float, default=540.0, help="deadline of the plan run, seconds")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    plan_json = out / "probe_budget.json"
    group = ["--cpu-ranks", str(args.cpu_ranks)] if args.cpu_ranks else []
    started = time.time()
    probe = _run(
        [
            sys.executable,
            "-m",
            "decodetop",
            "probe",
            "--model",
            args.model,
            "--budget",
            "--json",
            str(plan_json),
            *group,
        ],
        out / "probe_budget.txt",
        args.timeout,
    )
    if not plan_json.is_file():
        print(f"probe failed (rc {probe.returncode}); see {out / 'probe_budget.txt'}")
        return 1
    doc = json.loads(plan_json.read_text())
    surfaces: dict[str, dict[str, tuple[float | None, str]]] = {"probe --budget": _segments(doc["budget"])}
    roofs: dict[str, float | None] = {"probe --budget": doc["budget"]["roofline_ms"]}

    budget = _run(
        [sys.executable, "-m", "decodetop", "budget", "--model", args.model, "--results", str(plan_json), "--json"],
        out / "budget_results.txt",
        120,
    )
    bdoc = json.loads(budget.stdout)
    (out / "budget_results.json").write_text(json.dumps(bdoc, indent=1))
    surfaces["budget --results"] = _segments(bdoc["budget"])
    roofs["budget --results"] = bdoc["budget"]["roofline_ms"]

    sys.path.insert(0, "src")
    from decodetop.probes.results import load_results
    from decodetop.settings import Settings
    from decodetop.tui.probe_group import GroupInfo
    from decodetop.tui.sources.budget import PresetBudget

    results = list(load_results(plan_json))
    env = next(r.environment for r in results if r.environment is not None)
    label = "GPUs" if env.device_kind == "cuda" else "CPU ranks"
    source = PresetBudget(
        lambda: env.gpu_names[0] if env.gpu_names else None,
        group=lambda: GroupInfo(env.world_size, env.device_kind, label),
        session_start_s=started,
    )
    view = source.compose(Settings(model=args.model), {r.probe: r for r in results}, time.time())
    surfaces["live UI"] = {s.key: (None if s.status == "missing" else s.ms, s.status) for s in view.components}
    roofs["live UI"] = view.roofline_ms
    try:
        from decodetop.budget.compose import default_observed
        from decodetop.budget.scenario import build_scenario, choose_tp, model_source
        from decodetop.export.schedule import BudgetComposer

        scenario = build_scenario(
            model_source(args.model, None), choose_tp(None, group_size=env.world_size, group_label=label)
        )
        exported = BudgetComposer(scenario, default_observed(), 309.0, group_kind=env.device_kind)(results, None, None)
        surfaces["exporter"] = {s.component: (s.ms, s.status) for s in exported.segments}
        roofs["exporter"] = exported.roofline_ms
    except ImportError as exc:  # prometheus_client is not on every GPU machine
        print(f"exporter not compared: {exc}")

    names = list(surfaces)
    components = list(surfaces["probe --budget"])
    rows = []
    same_all = True
    for comp in components:
        ref = surfaces["probe --budget"][comp]
        cells = [surfaces[n].get(comp) for n in names]
        same = all(
            c is not None
            and c[1] == ref[1]
            and (c[0] == ref[0] or (c[0] is not None and ref[0] is not None and abs(c[0] - ref[0]) <= REL_TOL * ref[0]))
            for c in cells
        )
        same_all &= same
        rows.append((comp, cells, same))
    roof_ref = roofs["probe --budget"]
    roof_same = all(
        (r is None and roof_ref is None) or (r is not None and roof_ref is not None and abs(r - roof_ref) <= 1e-9)
        for r in roofs.values()
    )
    same_all &= roof_same
    (out / "surfaces.json").write_text(
        json.dumps({"model": args.model, "surfaces": surfaces, "roofline_ms": roofs, "same": same_all}, indent=1)
    )
    print(f"{'component':<16}" + "".join(f"{n:>20}" for n in names) + "  same")
    for comp, cells, same in rows:
        text = "".join(f"{'-' if c is None or c[0] is None else f'{c[0]:.4f} {c[1][:4]}':>20}" for c in cells)
        print(f"{comp:<16}{text}  {'yes' if same else 'NO'}")
    print(f"{'roofline':<16}" + "".join(f"{'n/a' if r is None else f'{r:.4f}':>20}" for r in roofs.values()))
    print(f"all surfaces agree: {'yes' if same_all else 'NO'}")
    return 0 if same_all else 1


if __name__ == "__main__":
    sys.exit(main())
