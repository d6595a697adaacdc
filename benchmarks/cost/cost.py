"""Cost (H200 proof, part 4): what decodetop itself costs on the machine it measures.

1. Wall time of the full default probe plan of a model (default GLM-5 at TP 2: `decodetop probe --model --budget`,
   sweeps and the layer probe included), the probe group's start included. On fewer GPUs than
   the TP degree the plan runs the TP shard's shapes on the GPUs there are and leaves the collectives out (the
   plan's own note says so): the figure is then a lower bound of the TP-2 wall time by the all-reduce sweep.
2. The telemetry collector's tick (`TelemetrySampler.sample()`, real NVML), per GPU: median and p90 over N ticks.
3. How much telemetry polling moves a latency probe: the `launch` probe and a small-message `allreduce` probe run
   with no collector, with a `TelemetryCollector` thread at a 1 s tick and at 0.1 s, interleaved (A B C A B C ...),
   in the same probe group; the medians per condition and their change against "off".

    PYTHONPATH=src python3 benchmarks/cost/cost.py --json /tmp/proof_cost.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from decodetop.probes.protocol import RANK_ENV_DEFAULTS

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fidelity"))

from fidelity import dump_json

#: Telemetry conditions: label → tick interval in seconds (None: no collector).
CONDITIONS: dict[str, float | None] = {"off": None, "1 s tick": 1.0, "0.1 s tick": 0.1}
#: Latency figures read from the probes: (probe, measurement `what`/mode, metric).
LAUNCH_METRICS = (("enqueue", "enqueue_us"), ("launch_sync", "launch_sync_us"), ("eager_op", "eager_op_us"))
AR_SIZES = [8, 4096]
#: Target of the issue for the full plan at TP 2.
PLAN_TARGET_S = 60.0


def plan_wall(model: str, tp: int, device: str, timeout_s: float | None) -> dict[str, Any]:
    """Full default plan of `model` at `tp` as a user runs it: `python -m decodetop probe --model M --tp N
    --budget --json F` in a fresh process; wall seconds (interpreter, imports, group start included), per-probe
    seconds and notes read back from its JSON."""
    import subprocess
    import tempfile

    from decodetop.probes.gpuinfo import visible_gpus

    gpus = [] if device == "cpu" else list(visible_gpus())
    out_json = Path(tempfile.mkdtemp(prefix="proof_plan_")) / "plan.json"
    cmd = [sys.executable, "-m", "decodetop", "probe", "--model", model, "--tp", str(tp), "--budget"]
    if gpus:
        cmd += ["--gpus", ",".join(str(i) for i in range(min(tp, len(gpus))))]
    else:
        cmd += ["--device", "cpu", "--cpu-ranks", str(tp)]
    if timeout_s is not None:
        cmd += ["--timeout", str(timeout_s)]
    cmd += ["--json", str(out_json)]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    wall = time.monotonic() - t0
    row: dict[str, Any] = {
        "model": model,
        "tp": tp,
        "command": " ".join(cmd[1:]),
        "rc": proc.returncode,
        "wall_s": round(wall, 2),
        "world_size": min(tp, len(gpus)) if gpus else tp,
        "device_kind": "cuda" if gpus else "cpu",
        "target_s": PLAN_TARGET_S,
        "stdout_tail": proc.stdout[-3000:],
        "stderr_tail": proc.stderr[-2000:],
    }
    try:
        data = json.loads(out_json.read_text(encoding="utf-8"))
        row["per_probe_s"] = {r["probe"]: r.get("duration_s") for r in data.get("results", [])}
        row["statuses"] = {r["probe"]: r.get("status") for r in data.get("results", [])}
        row["notes"] = data.get("notes", [])
        budget = data.get("budget") or {}
        row["budget_total_ms"] = budget.get("total_ms")
        row["complete"] = budget.get("complete")
    except (OSError, ValueError) as exc:
        row["per_probe_s"] = {}
        row["json_error"] = f"{type(exc).__name__}: {exc}"
    return row


def tick_cost(ticks: int) -> dict[str, Any]:
    """Real NVML ticks back to back (50 ms apart): per-GPU cost, median and p90 (the first tick kept apart)."""
    from decodetop.collectors.nvml import Nvml
    from decodetop.collectors.telemetry import TelemetrySampler

    nvml = Nvml()
    sampler = TelemetrySampler(nvml)
    first = sampler.sample()
    costs, per_gpu, calls = [], [], []
    for _ in range(ticks):
        time.sleep(0.05)
        snap = sampler.sample()
        costs.append(snap.tick_cost_s * 1e3)
        per_gpu.append(snap.tick_cost_per_gpu_s * 1e3)
        calls.append(snap.nvml_calls)
    q = statistics.quantiles(per_gpu, n=10) if len(per_gpu) >= 2 else per_gpu * 9
    return {
        "source": first.source,
        "nvml_available": first.nvml_available,
        "gpus": len(first.gpus),
        "first_tick_ms": (first.tick_cost_s + first.static_cost_s) * 1e3,
        "tick_ms_median": statistics.median(costs),
        "tick_per_gpu_ms_median": statistics.median(per_gpu),
        "tick_per_gpu_ms_p90": q[-1],
        "nvml_calls_median": statistics.median(calls),
        "ticks": ticks,
    }


def _launch_figures(result: Any) -> dict[str, float]:
    out: dict[str, float] = {}
    for m in result.measurements:
        what = m.params.get("what")
        for name, metric in LAUNCH_METRICS:
            if what == name and metric in m.metrics:
                out[metric] = float(m.metrics[metric])
    return out


def _ar_figures(result: Any) -> dict[str, float]:
    out: dict[str, float] = {}
    for m in result.measurements:
        if "time_us" in m.metrics:
            out[f"allreduce {m.params.get('size_bytes')} B {m.params.get('mode')} µs"] = float(m.metrics["time_us"])
    return out


def telemetry_effect(rounds: int, device: str) -> dict[str, Any]:
    """Latency probes with no collector, 1 s and 0.1 s ticks, interleaved; medians per condition."""
    from decodetop.collectors.nvml import Nvml
    from decodetop.collectors.telemetry import TelemetryCollector
    from decodetop.probes.controller import ProbeController

    series: dict[str, dict[str, list[float]]] = {c: {} for c in CONDITIONS}
    ticks: dict[str, int] = dict.fromkeys(CONDITIONS, 0)
    with ProbeController(device=device, cpu_ranks=1) as pc:
        pc.run("launch", {"samples": 5})  # warm-up
        names = list(CONDITIONS)
        for r in range(rounds):
            order = names[r % len(names) :] + names[: r % len(names)]  # rotate the order: no condition always first
            for cond in order:
                interval = CONDITIONS[cond]
                counter = {"n": 0}
                collector = None
                if interval is not None:
                    collector = TelemetryCollector(
                        Nvml(), interval_s=interval, on_snapshot=lambda _s, c=counter: c.__setitem__("n", c["n"] + 1)
                    )
                    collector.start()
                    time.sleep(min(0.3, interval * 2))  # the thread is ticking before the probe starts
                try:
                    figs = _launch_figures(pc.run("launch"))
                    ar_params = {"sizes": AR_SIZES, "modes": ["pipelined", "synced"], "synced_ops": 200}
                    figs.update(_ar_figures(pc.run("allreduce", ar_params)))
                finally:
                    if collector is not None:
                        collector.stop()
                ticks[cond] += counter["n"]
                for k, v in figs.items():
                    series[cond].setdefault(k, []).append(v)
        kind, world = pc.layout.kind, pc.world_size
    medians = {c: {k: statistics.median(v) for k, v in s.items()} for c, s in series.items()}
    change = {
        c: {k: (medians[c][k] / medians["off"][k] - 1) if medians["off"].get(k) else None for k in medians[c]}
        for c in CONDITIONS
        if c != "off"
    }
    return {
        "device_kind": kind,
        "world_size": world,
        "rounds": rounds,
        "series": series,
        "medians": medians,
        "change_vs_off": change,
        "ticks_during": ticks,
    }


def tables(doc: dict[str, Any]) -> str:
    """Markdown tables of the three parts."""
    out = []
    plans = doc.get("plans") or []
    if plans:
        out.append("| plan | ranks | wall s (group start incl.) | target | per probe s |")
        out.append("|---|---|---|---|---|")
    for p in plans:
        if "wall_s" not in p:
            out.append(f"| {p.get('model')} TP {p.get('tp')} | - | failed: {p.get('error')} | | |")
            continue
        per = ", ".join(f"{k} {v:.1f}" for k, v in p.get("per_probe_s", {}).items() if v is not None)
        if p.get("rc"):
            per = f"rc {p['rc']}: {p.get('stderr_tail', '')[-200:]}"
        ok = "✓" if p["wall_s"] <= PLAN_TARGET_S and not p.get("rc") else "✗"
        out.append(
            f"| {p['model']} TP {p['tp']} | {p['world_size']} {p['device_kind']} | {p['wall_s']:.1f} | "
            f"≤ {PLAN_TARGET_S:g} s {ok} | {per} |"
        )
    t = doc.get("tick")
    if isinstance(t, dict) and "tick_per_gpu_ms_median" in t:
        out.append("")
        out.append("| telemetry tick | GPUs | per GPU median ms | per GPU p90 ms | NVML calls | first tick ms |")
        out.append("|---|---|---|---|---|---|")
        out.append(
            f"| {t['source']} | {t['gpus']} | {t['tick_per_gpu_ms_median']:.3g} | "
            f"{t['tick_per_gpu_ms_p90']:.3g} | {t['nvml_calls_median']:.0f} | {t['first_tick_ms']:.3g} |"
        )
    e = doc.get("effect")
    if isinstance(e, dict) and "medians" in e:
        out.append("")
        conds = list(CONDITIONS)
        out.append("| latency figure | " + " | ".join(conds) + " | change at 1 s | change at 0.1 s |")
        out.append("|---|" + "---|" * (len(conds) + 2))
        for k in e["medians"]["off"]:
            vals = " | ".join(f"{e['medians'][c].get(k, float('nan')):.3g}" for c in conds)
            ch = [e["change_vs_off"][c].get(k) for c in conds[1:]]
            chs = " | ".join("-" if v is None else f"{v * 100:+.1f} %" for v in ch)
            out.append(f"| {k} | {vals} | {chs} |")
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the parts asked for; JSON and tables."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="glm-5")
    ap.add_argument("--tp", default="2,1", help="TP degrees of the plan, comma-separated (each one timed)")
    ap.add_argument("--parts", default="plan,tick,effect")
    ap.add_argument("--ticks", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    ap.add_argument("--probe-timeout", type=float, default=None)
    ap.add_argument("--json", metavar="PATH")
    args = ap.parse_args(argv)
    parts = {p.strip() for p in args.parts.split(",") if p.strip()}
    doc: dict[str, Any] = {"what": "H200 proof part 4: cost"}
    if "tick" in parts:
        print("cost: telemetry ticks", file=sys.stderr, flush=True)
        doc["tick"] = tick_cost(args.ticks)
        dump_json(doc, args.json)
    if "effect" in parts:
        print("cost: telemetry vs latency probes", file=sys.stderr, flush=True)
        doc["effect"] = telemetry_effect(args.rounds, args.device)
        doc["table"] = tables(doc)
        dump_json(doc, args.json)
    if "plan" in parts:
        doc["plans"] = []
        for tp in [int(t) for t in args.tp.split(",") if t.strip()]:
            print(f"cost: full default plan {args.model} TP {tp}", file=sys.stderr, flush=True)
            try:
                doc["plans"].append(plan_wall(args.model, tp, args.device, args.probe_timeout))
            except Exception as exc:
                doc["plans"].append({"model": args.model, "tp": tp, "error": f"{type(exc).__name__}: {exc}"})
            doc["table"] = tables(doc)
            dump_json(doc, args.json)
    doc["table"] = tables(doc)
    dump_json(doc, args.json)
    if args.json:
        print(f"cost: wrote {args.json}", file=sys.stderr)
    print(doc["table"])
    return 0


if __name__ == "__main__":
    for key, value in RANK_ENV_DEFAULTS.items():  # NVLink multicast off, as the probe ranks
        os.environ.setdefault(key, value)
    sys.exit(main())
