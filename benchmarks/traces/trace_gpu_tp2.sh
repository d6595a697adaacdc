#!/usr/bin/env bash
# Trace a real eager and a real CUDA-graph decode step of a small transformers Llama on 2 GPUs (TP 2, one trace per
# rank), then read each directory with `decodetop trace` (the figures the live UI's --trace DIR shows).
# Run from the repository root on the 2-GPU machine (python3.12, torch 2.11, transformers, no textual):
#     OUT=/path/to/out bash benchmarks/traces/trace_gpu_tp2.sh
# Writes under $OUT: traces/<mode>/decode-TP-<rank>.trace.json.gz, trace_<mode>.txt and .json, trace_gpu_tp2.log;
# prints a short table last.
set -u
OUT=${OUT:?set OUT to the output directory}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH=src
PY=${PYTHON:-python3}
mkdir -p "$OUT/traces"
LOG="$OUT/trace_gpu_tp2.log"
nvidia-smi -L >"$LOG" 2>&1 || true
"$PY" -m torch.distributed.run --standalone --nproc-per-node 2 benchmarks/traces/trace_gpu_tp2.py \
    --out "$OUT/traces" --steps 6 --modes eager,graph >>"$LOG" 2>&1
echo "recording exit code $?" >>"$LOG"
for mode in eager graph; do
    dir="$OUT/traces/$mode"
    if ls "$dir"/*.trace.json.gz >/dev/null 2>&1; then
        "$PY" -m decodetop trace "$dir" >"$OUT/trace_$mode.txt" 2>>"$LOG"
        "$PY" -m decodetop trace "$dir" --json >"$OUT/trace_$mode.json" 2>>"$LOG"
        "$PY" -m decodetop trace "$dir" --config "$OUT/traces/config.json" --tp 2 --context 128 \
            --launch-mode "$mode" >"$OUT/trace_${mode}_vs_budget.txt" 2>>"$LOG"
    fi
done
"$PY" - "$OUT" <<'PY'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
print(f"{'mode':<6} {'ranks':>5} {'step ms':>8} {'busy ms':>8} {'idle ms':>8} {'graph k/step':>12} {'attributed':>10}  spread / largest gap")
for mode in ("eager", "graph"):
    path = out / f"trace_{mode}.json"
    if not path.is_file() or not path.read_text().strip():
        summary = out / "traces" / mode / "summary.json"
        print(f"{mode:<6} no trace: {summary.read_text()[:200] if summary.is_file() else 'see trace_gpu_tp2.log'}")
        continue
    d = json.loads(path.read_text())
    t, v, r = d["trace"], d["traced"], d["ranks"]
    share = sum(a["share"] for a in t["attribution"] if not a["rule"].startswith(("unattributed", "no rule")))
    print(
        f"{mode:<6} {len(r['ranks']):>5} {t['step_wall_us_mean'] / 1000:>8.3f} {t['gpu_busy_us_mean'] / 1000:>8.3f} "
        f"{t['gpu_idle_us_mean'] / 1000:>8.3f} {t['graph_kernels_per_step']:>12.0f} {share:>10.0%}  "
        f"spread {r['spread_ms']:.3f} ms; {v['gap_text'][:90]}"
    )
PY
