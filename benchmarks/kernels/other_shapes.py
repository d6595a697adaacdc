"""decodetop's probes at other models' shapes than the ones its kernels were tuned on: every point's kernel class
(engine, decodetop Triton, torch, CPU), its time and, where a better kernel did not run, why.

Each case runs `python -m decodetop probe <probes> --config/--model … --tp N --context C --json …` as a user would,
in a child process with its own deadline, and reads the results back. On a GPU every Triton kernel's runner checks
itself against its torch form at the shape before it is timed, so a case whose points all say "decodetop Triton" is
also a correctness check of the kernels at that model's shapes; a point that fell back to the torch form says so in
its note (the reason) and is counted in the table. The configs not among decodetop's presets lie in
benchmarks/kernels/configs (their models' config.json fields; phi-3-mini's head dim 96 is not a power of two,
qwen2.5-7b's query groups are 7 heads, qwen3-30b-a3b has 128 experts of 768, deepseek-v2-lite is MLA without a q
LoRA over 64 experts, deepseek-v3.2-exp is DSA with 64 index heads at 16 query heads a TP-8 rank).

    NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 \
        DECODETOP_STATE_DIR=/tmp/dts PYTHONPATH=src python3 benchmarks/kernels/other_shapes.py --json $OUT/shapes.json

`--only` keeps the cases whose label holds one of its comma-separated parts; `--device cpu` runs them on CPU ranks
(the paths only: every point is the torch form, labelled CPU).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = Path(__file__).resolve().parent / "configs"
#: Seconds one case may run (its child process is killed past it).
CASE_DEADLINE_S = 240.0


@dataclass(frozen=True)
class Case:
    """One probe run: a model (a preset name or a config file), its deployment and the probes."""

    label: str
    model: str
    tp: int
    context: int
    probes: tuple[str, ...] = ("attention", "moe")
    kv_dtype: str = "auto"

    def argv(self, json_path: Path, device: str) -> list[str]:
        model = ["--config", str(CONFIGS / self.model)] if self.model.endswith(".json") else ["--model", self.model]
        return [
            sys.executable, "-m", "decodetop", "probe", *self.probes, *model, "--tp", str(self.tp),
            "--context", str(self.context), "--kv-dtype", self.kv_dtype, "--device", device, "--force",
            "--json", str(json_path),
        ]  # fmt: skip


CASES = (
    Case("phi-3-mini TP1 (head dim 96)", "phi-3-mini.json", 1, 32768, ("attention", "norms")),
    Case("qwen2.5-7b TP1 (groups of 7)", "qwen2.5-7b.json", 1, 32768, ("attention", "norms")),
    Case("qwen3-30b-a3b TP2 (128 experts of 768)", "qwen3-30b-a3b.json", 2, 32768),
    Case("deepseek-v2-lite TP1 (MLA, 64 experts)", "deepseek-v2-lite.json", 1, 32768),
    Case("deepseek-v3.2-exp TP8 (DSA, 64 index heads)", "deepseek-v3.2-exp.json", 8, 65536, ("attention",)),
    Case("gpt-oss-120b TP2 (head dim 64, windows)", "gpt-oss-120b", 2, 32768),
    Case("glm-4.5 TP8", "glm-4.5", 8, 32768),
    Case("kimi-k2 TP8 (MLA, 384 experts)", "kimi-k2", 8, 32768),
    Case("llama-3.1-405b TP8 FP8 KV", "llama-3.1-405b", 8, 65536, ("attention", "norms"), "fp8"),
)


def run_case(case: Case, device: str) -> dict[str, Any]:
    """The case's points: key, status, kernel kind and function, median µs, note."""
    with tempfile.TemporaryDirectory(prefix="decodetop-shapes-") as tmp:
        out = Path(tmp) / "probe.json"
        env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
        t0 = time.monotonic()
        try:
            proc = subprocess.run(
                case.argv(out, device), env=env, capture_output=True, text=True, timeout=CASE_DEADLINE_S, check=False
            )
        except subprocess.TimeoutExpired:
            return {"case": case.label, "error": f"past its {CASE_DEADLINE_S:.0f} s deadline"}
        row: dict[str, Any] = {"case": case.label, "rc": proc.returncode, "s": round(time.monotonic() - t0, 1)}
        if not out.exists():
            row["error"] = (proc.stderr.strip().splitlines() or ["no results written"])[-1][:300]
            return row
        doc = json.loads(out.read_text())
    points = []
    for result in doc.get("results", []):
        if result.get("error"):
            points.append({"probe": result.get("probe"), "status": "error", "note": str(result["error"])[:300]})
        for m in result.get("measurements", []):
            kernel = m.get("kernel") or {}
            points.append({
                "name": m.get("name", "")[:160],
                "status": m.get("status"),
                "kernel": kernel.get("kind", ""),
                "function": kernel.get("function", "")[:120],
                "us": (m.get("stats") or {}).get("median"),
                "note": m.get("note", "")[:240],
            })  # fmt: skip
    row["points"] = points
    row["kinds"] = dict(Counter(p.get("kernel", "") or p.get("status", "") for p in points))
    return row


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| case | points by kernel class | unsupported or failed |", "|---|---|---|"]
    for row in rows:
        if "error" in row:
            lines.append(f"| {row['case']} | error: {row['error'][:100]} | |")
            continue
        kinds = ", ".join(f"{k or '?'} {n}" for k, n in sorted(row["kinds"].items()))
        bad = [p for p in row["points"] if p.get("status") != "ok"]
        lines.append(f"| {row['case']} | {kinds} | {len(bad)} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path, required=True, help="write the cases here as each finishes")
    ap.add_argument("--only", default="", help="comma-separated parts of case labels: only those")
    ap.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto", help="the probes' --device")
    args = ap.parse_args(argv)
    only = tuple(filter(None, args.only.split(",")))
    rows: list[dict[str, Any]] = []
    for case in CASES:
        if only and not any(part in case.label for part in only):
            continue
        row = run_case(case, args.device)
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "points"}), flush=True)
        for p in row.get("points", []):
            if p.get("kernel") not in ("triton", "engine") or p.get("status") != "ok":
                print(f"  {p.get('status')} {p.get('kernel')} {p.get('name', '')[:90]}: {p.get('note', '')[:160]}")
        args.json.write_text(json.dumps({"cases": rows}, indent=1))
    print(table(rows))
    return 0 if all("error" not in r for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
