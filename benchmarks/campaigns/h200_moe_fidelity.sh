#!/usr/bin/env bash
# MoE budget fidelity on one H200: the 4-layer MoE models (Mixtral-8x7B, Qwen3-235B-A22B, DeepSeek-V3, GLM-4.5; TP 1,
# context 4096, random BF16 weights) against four reference forms of a real transformers decode step — stock, serving
# attention, + fused RMSNorm, + serving MoE (every MoE block's routed experts through the grouped Triton kernel of
# benchmarks/engine/moe_routed.py) — eager and CUDA graph, and decodetop's composed budget from the probe plan run on
# the same GPU. The acceptance: the graph-mode budget within 15 % of the serving-MoE step.
#
#   OUT=/tmp/out bash benchmarks/campaigns/h200_moe_fidelity.sh
#   FIDELITY_ARGS="--tiny --device cpu --context 64 --steps 2 --samples 1" ...   # CPU smoke of the same path
#
# Files under $OUT: moe_fidelity.json (everything, written as each model finishes), moe_fidelity.log (progress and
# tracebacks), moe_fidelity_env.txt; the summary table and the serving-MoE rows print last. One deadline for the
# whole run (T_FIDELITY, default 450 s, inside an 8-minute call). Never changes GPU settings; NVLink multicast off.
set -u
cd "$(dirname "$0")/../.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 DECODETOP_STATE_DIR=/tmp/decodetop-state
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
OUT=${OUT:-/tmp/moe_fidelity}
MODELS=${MODELS:-mixtral-8x7b,qwen3-235b-a22b,deepseek-v3,glm-4.5}
mkdir -p "$OUT"
{
  date -u
  nvidia-smi --query-gpu=index,name,driver_version,memory.total,memory.used,clocks.sm,clocks.max.sm --format=csv
  python3 -c 'import platform, torch, triton, transformers; print("python", platform.python_version(), "torch",
torch.__version__, "triton", triton.__version__, "transformers", transformers.__version__)'
} >"$OUT/moe_fidelity_env.txt" 2>&1
t0=$SECONDS
timeout -k 10 "${T_FIDELITY:-450}" python3 benchmarks/fidelity/fidelity.py --models "$MODELS" --samples 3 \
  --json "$OUT/moe_fidelity.json" ${FIDELITY_ARGS:-} >"$OUT/moe_fidelity.log" 2>&1
echo "fidelity rc=$? in $((SECONDS - t0)) s" | tee -a "$OUT/moe_fidelity.log"
cat "$OUT/moe_fidelity_env.txt"
python3 - "$OUT/moe_fidelity.json" <<'EOF'
import json, sys
try:
    doc = json.load(open(sys.argv[1]))
except (OSError, ValueError) as exc:
    sys.exit(f"no result: {exc}")
print(doc.get("summary", ""))
print("\n## serving MoE form (the acceptance row: graph, ≤ 15 %)")
for name, m in doc.get("models", {}).items():
    t = m.get("measured", {}).get("serving_moe", {})
    b = m.get("budget", {})
    err = m.get("error_graph_serving_moe")
    print(f"{name}: budget {b.get('graph_ms')} ms, serving-MoE step {t.get('graph_ms')} ms, error "
          f"{'-' if err is None else f'{err * 100:+.1f} %'}; backend {t.get('backend')}; check {t.get('check')}; "
          f"{t.get('error') or t.get('skipped') or t.get('graph_error') or ''}")
    rows = b.get("graph_rows", {})
    print("  budget rows ms: " + ", ".join(f"{k} {v:.3f}" for k, v in rows.items() if isinstance(v, float)))
    for seg in m.get("budget_graph", {}).get("segments", []):
        if "routed" in str(seg.get("component")):
            print(f"  routed experts assumed: {seg.get('sources')}")
EOF
