"""Diagnosis (H200 proof, part 3): plant a slowdown, run the probe plan clean and planted, see which component moves.

Plants (none changes the GPU's settings):

- `launch_blocking`: `CUDA_LAUNCH_BLOCKING=1` in the probe ranks' environment. Every eager launch then waits for
  the kernel; graph replays are one launch each. Expected: the launch component of the **eager** budget moves most;
  graph-mode budgets barely move (a finding in itself: a CUDA-graph server is immune to this plant).
- `kv_whole_cast`: the attention path reads an FP8 KV cache by casting the **whole** cache to BF16 every step
  (`k8.to(bf16)`, `v8.to(bf16)` before SDPA). Planted by running the `attention` probe through this module's
  `run` (a wrapper around `decodetop.probes.worker.attention.run` that patches SDPA in the rank only).
  Expected: attention moves most, in both modes.
- `nccl_simple_ring`: `NCCL_PROTO=Simple NCCL_ALGO=Ring` for the ranks; needs ≥ 2 GPUs (a one-rank all-reduce
  exchanges nothing). Expected: communication moves most **in the graph-mode budget**, the one decodetop shows by
  default and the one a CUDA-graph server lives in. In the eager budget each small all-reduce costs torch's host
  path (~40 µs on 2 × H200, docs/benchmarks.md), which hides the protocol's few µs: there the plant is invisible by
  construction, and the table says so rather than calling it a miss. Skipped with a message on one GPU.

For each plant the budget per component is compared with the clean one (same model, same group size): the
component with the largest increase must be the expected one. Model: Llama-3.1-70B-shaped, 4 layers (GQA, so SDPA
is the attention kernel the plant wraps), TP = the group size, context 4096, batch 1.

    PYTHONPATH=src python3 benchmarks/diagnosis/diagnosis.py --json /tmp/proof_diagnosis.json
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from decodetop.probes.protocol import RANK_ENV_DEFAULTS

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fidelity"))

from fidelity import FIDELITY_PROBES, dump_json, inventory_for, model_overrides, reduced_spec, run_plans

#: Environment variable the planted attention wrapper reads in the rank (set through the controller's rank_env).
PLANT_ENV = "DECODETOP_DIAGNOSIS_PLANT"
#: Note the planted attention probe adds to each of its measurements (so a planted result is never mistaken).
PLANT_NOTE = "PLANTED: whole-cache FP8→BF16 cast before SDPA (benchmarks/diagnosis/diagnosis.py)"
#: What each plant should move.
EXPECTED = {
    "launch_blocking": "launch",
    "kv_whole_cast": "attention",
    "nccl_simple_ring": "communication",
}
#: The budget mode in which each plant is judged: graph (decodetop's default), except launch blocking, which only
#: acts on eager launches.
JUDGE_MODE = {"launch_blocking": "eager", "kv_whole_cast": "graph", "nccl_simple_ring": "graph"}


# ----------------------------------------------------------------------------------------------- rank side


def run(ctx: Any, params: dict[str, Any]) -> Any:
    """The planted `attention` probe (runs in a probe rank): SDPA reads an FP8 copy of K and V cast whole to BF16."""
    import torch
    import torch.nn.functional as F  # noqa: N812

    from decodetop.probes.worker import attention

    real = F.scaled_dot_product_attention
    shadows: dict[tuple[int, int], tuple[Any, Any]] = {}

    def planted(q: Any, k: Any, v: Any, *args: Any, **kwargs: Any) -> Any:
        key = (k.data_ptr(), v.data_ptr())
        pair = shadows.get(key)
        if pair is None:  # the FP8 cache this step "stores" (made once per cache copy, outside the timed region)
            pair = (k.to(torch.float8_e4m3fn), v.to(torch.float8_e4m3fn))
            shadows[key] = pair
        k8, v8 = pair
        return real(q, k8.to(k.dtype), v8.to(v.dtype), *args, **kwargs)  # the whole-cache cast, every step

    F.scaled_dot_product_attention = planted
    try:
        output = attention.run(ctx, params)
        marked = tuple(
            dataclasses.replace(m, note=(m.note + "; " if m.note else "") + PLANT_NOTE) for m in output.measurements
        )
        return dataclasses.replace(output, measurements=marked)
    finally:
        F.scaled_dot_product_attention = real
        shadows.clear()


# ----------------------------------------------------------------------------------------------- controller side


def planted_registry() -> Any:
    """The probe registry with `attention` served by this module's `run`."""
    from decodetop.probes.registry import ProbeRegistry

    base = ProbeRegistry()
    specs = [
        dataclasses.replace(s, module=__name__ if __name__ != "__main__" else "diagnosis")
        if s.name == "attention"
        else s
        for s in base.specs(include_hidden=True)
    ]
    return ProbeRegistry(specs=specs, extra_modules=())


def timing_methods(plan_run: Mapping[str, Any]) -> dict[str, int]:
    """How the plan's points were timed (graph / events / host): a plant that breaks graph capture shows here."""
    out: dict[str, int] = {}
    for r in plan_run.get("results", []):
        for m in r.get("measurements", []):
            method = (m.get("params") or {}).get("method")
            if method:
                out[str(method)] = out.get(str(method), 0) + 1
    return out


def moves(clean: Mapping[str, float | None], planted: Mapping[str, float | None]) -> list[dict[str, Any]]:
    """Per component: clean ms, planted ms, delta ms and ratio; largest increase first."""
    rows = []
    for comp in clean.keys() | planted.keys():
        a, b = clean.get(comp), planted.get(comp)
        delta = b - a if a is not None and b is not None else None
        rows.append(
            {
                "component": comp,
                "clean_ms": a,
                "planted_ms": b,
                "delta_ms": delta,
                "ratio": (b / a) if a and b is not None else None,
            }
        )
    rows.sort(key=lambda r: -(r["delta_ms"] if r["delta_ms"] is not None else -1e9))
    return rows


def judge(plant: str, result: Mapping[str, Any]) -> dict[str, Any]:
    """Which component moved most in the judged mode, and whether that is the expected one."""
    mode = JUDGE_MODE[plant]
    rows = result[f"moves_{mode}"]
    top = rows[0] if rows else None
    return {
        "plant": plant,
        "mode": mode,
        "expected": EXPECTED[plant],
        "top": top["component"] if top else None,
        "top_delta_ms": top["delta_ms"] if top else None,
        "ok": bool(top and top["component"] == EXPECTED[plant] and (top["delta_ms"] or 0) > 0),
        "clean_total_ms": result[f"clean_{mode}_ms"],
        "planted_total_ms": result[f"planted_{mode}_ms"],
    }


def diff_verdict(plant: str, clean_budget: Mapping[str, Any], planted_budget: Mapping[str, Any]) -> dict[str, Any]:
    """What decodetop's own baseline diff (`decodetop.budget.diff`, as `decodetop budget --diff` prints it) says
    moved most, beyond the noise of both runs, in the plant's judged mode."""
    from decodetop.budget.diff import diff_budgets

    diff = diff_budgets(clean_budget, planted_budget)
    top = diff.moved_most
    return {
        "diff": diff.to_dict(),
        "diff_moved_most": top.component if top else None,
        "diff_delta_ms": top.delta_ms if top else None,
        "diff_ok": bool(top and top.component == EXPECTED[plant]),
        "diff_moved": [d.component for d in diff.moved],
    }


def table(judgements: Sequence[Mapping[str, Any]], skipped: Mapping[str, str]) -> str:
    """Markdown: plant, judged mode, expected component, top mover, its delta, totals, the baseline diff's verdict."""
    out = [
        "| plant | budget mode | expected | moved most | Δ ms | step ms clean → planted | right? | baseline diff "
        "(beyond noise) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    f = lambda v: "-" if v is None else f"{v:.3g}"  # noqa: E731
    for j in judgements:
        verdict = "-"
        if "diff_ok" in j:
            moved = ", ".join(j["diff_moved"]) or "nothing"
            verdict = f"{j['diff_moved_most']} {'✓' if j['diff_ok'] else '✗'} (moved: {moved})"
        out.append(
            f"| {j['plant']} | {j['mode']} | {j['expected']} | {j['top']} | {f(j['top_delta_ms'])} | "
            f"{f(j['clean_total_ms'])} → {f(j['planted_total_ms'])} | {'yes' if j['ok'] else 'NO'} | {verdict} |"
        )
    for plant, why in skipped.items():
        out.append(f"| {plant} | - | {EXPECTED[plant]} | not run: {why} | | | | |")
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    """Clean plan, then one plan per plant; per-component budget differences; JSON and a table."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="llama-3.1-70b")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--plants", default=",".join(EXPECTED), help="comma-separated")
    ap.add_argument("--tiny", action="store_true", help="tiny widths (CPU smoke test)")
    ap.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    ap.add_argument("--cpu-ranks", type=int, default=1, help="CPU ranks where there is no GPU")
    ap.add_argument("--probe-timeout", type=float, default=None)
    ap.add_argument("--json", metavar="PATH")
    ap.add_argument("--plans-dir", metavar="DIR", help="where the plan runs go (default: next to --json)")
    args = ap.parse_args(argv)
    from decodetop.probes.controller import resolve_layout

    layout = resolve_layout(None, args.cpu_ranks, args.device)
    world = layout.world_size
    spec = reduced_spec(args.model, args.layers, model_overrides(args.model, args.tiny))
    inv = inventory_for(spec, tp=world, context=args.context)
    plants = [p.strip() for p in args.plants.split(",") if p.strip()]
    unknown = [p for p in plants if p not in EXPECTED]
    if unknown:
        raise SystemExit(f"diagnosis: unknown plant(s) {', '.join(unknown)} (known: {', '.join(EXPECTED)})")
    only = FIDELITY_PROBES
    name = args.model
    doc: dict[str, Any] = {
        "what": "H200 proof part 3: diagnosis",
        "model": spec.name,
        "tp": world,
        "device_kind": layout.kind,
        "context": args.context,
        "plants": {},
        "skipped": {},
    }

    def plan(rank_env: Mapping[str, str] | None = None, registry: Any = None) -> dict[str, Any]:
        t0 = time.monotonic()
        got = run_plans(
            {name: inv},
            device=args.device,
            timeout_s=args.probe_timeout,
            only=only,
            rank_env=rank_env,
            registry=registry,
            progress=False,
        )[name]
        got["wall_s"] = round(time.monotonic() - t0, 2)
        return got

    plan_dir = Path(args.plans_dir) if args.plans_dir else (Path(args.json).parent if args.json else None)

    def keep_plan(label: str, got: Mapping[str, Any]) -> None:
        """The plan run as `decodetop probe --json` writes it (graph budget), and a copy with the eager budget:
        `decodetop budget --diff diagnosis_clean.plan.json diagnosis_<plant>.plan.json` shows what moved."""
        if plan_dir is None:
            return
        plan_dir.mkdir(parents=True, exist_ok=True)
        dump_json(got["plan_run"], str(plan_dir / f"diagnosis_{label}.plan.json"))
        eager_doc = {**got["plan_run"], "budget": got["budget_eager"]}
        dump_json(eager_doc, str(plan_dir / f"diagnosis_{label}.eager.plan.json"))

    print(f"diagnosis: clean plan ({spec.name}, TP {world})", file=sys.stderr, flush=True)
    clean = plan()
    keep_plan("clean", clean)
    doc["clean"] = {k: clean[k] for k in ("graph_ms", "eager_ms", "graph_rows", "eager_rows", "wall_s", "notes")}
    doc["clean"]["measured_keys"] = clean["plan_run"]["measured"]
    dump_json(doc, args.json)
    judgements = []
    for plant in plants:
        if plant == "nccl_simple_ring" and world < 2:
            doc["skipped"][plant] = (
                f"needs ≥ 2 GPUs/ranks (this group has {world}: a one-rank all-reduce sends nothing)"
            )
            continue
        print(f"diagnosis: planted plan: {plant}", file=sys.stderr, flush=True)
        if plant == "launch_blocking":
            got = plan(rank_env={"CUDA_LAUNCH_BLOCKING": "1"})
        elif plant == "kv_whole_cast":
            got = plan(rank_env={PLANT_ENV: plant}, registry=planted_registry())
        else:
            got = plan(rank_env={"NCCL_PROTO": "Simple", "NCCL_ALGO": "Ring"})
        keep_plan(plant, got)
        res = {
            "planted_graph_ms": got["graph_ms"],
            "planted_eager_ms": got["eager_ms"],
            "clean_graph_ms": clean["graph_ms"],
            "clean_eager_ms": clean["eager_ms"],
            "moves_graph": moves(clean["graph_rows"], got["graph_rows"]),
            "moves_eager": moves(clean["eager_rows"], got["eager_rows"]),
            "wall_s": got["wall_s"],
            "notes": got["notes"],
            "timing_methods": timing_methods(got["plan_run"]),
            "clean_timing_methods": timing_methods(clean["plan_run"]),
            "planted_measured_keys": got["plan_run"]["measured"],
        }
        res["judgement"] = judge(plant, res)
        mode = JUDGE_MODE[plant]
        verdict = diff_verdict(plant, clean[f"budget_{mode}"], got[f"budget_{mode}"])
        res["baseline_diff"] = verdict.pop("diff")
        res["judgement"].update(verdict)
        judgements.append(res["judgement"])
        doc["plants"][plant] = res
        doc["table"] = table(judgements, doc["skipped"])
        dump_json(doc, args.json)
    doc["table"] = table(judgements, doc["skipped"])
    dump_json(doc, args.json)
    if args.json:
        print(f"diagnosis: wrote {args.json}", file=sys.stderr)
    print(doc["table"])
    return 0


if __name__ == "__main__":
    for key, value in RANK_ENV_DEFAULTS.items():  # NVLink multicast off, as the probe ranks
        os.environ.setdefault(key, value)
    sys.exit(main())
