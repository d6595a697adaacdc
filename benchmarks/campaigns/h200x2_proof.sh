#!/usr/bin/env bash
# The H200 proof's second round on 2 × H200 (device kind nvidia-h200-x2), one call:
#   variance   small all-reduce: the probe against independent loops, fresh processes, alternated (3 rounds)
#   accuracy   benchmarks/accuracy/accuracy.py (probe vs host loop / graph replay / do_bench / CuPy)
#   diagnosis  the three plants at TP 2; plan runs kept for `decodetop budget --diff`
#   fidelity   4-layer transformers models on GPU 0 only (TP 1), stock and serving-form attention
#   plans      `decodetop probe --model M --tp 2 --budget` for Llama-3.1-70B, DeepSeek-V3, GLM-5
#   cost       benchmarks/cost/cost.py on both GPUs (plan wall time at TP 2 and 1, tick, polling effect); cost1: GPU 0
#
#   STEPS="variance diagnosis" bash benchmarks/campaigns/h200x2_proof.sh    # everything lands in $OUT/proof2.tgz
#
# Each step has its own deadline; the archive is rewritten after every step, so a cut-off call keeps what finished.
# Never changes GPU settings; NVLink multicast stays off (KINDS.md).
set -u
source "$(dirname "$0")/campaign_lib.sh"
OUT=${OUT:-/tmp/proof2}
TGZ=$OUT/proof2.tgz
W=/tmp/proof2_work
STEPS=${STEPS:-"variance diagnosis fidelity accuracy"}
rm -rf "$W" && mkdir -p "$W" "$OUT"
LOG=$W/log.txt
{
  date -u
  nvidia-smi --query-gpu=index,name,clocks.sm,clocks.max.sm,power.limit --format=csv 2>&1
  python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
} >"$W/env.txt" 2>&1
want variance && step variance "${T_VARIANCE:-200}" python3 benchmarks/accuracy/allreduce_variance.py --rounds 3 \
  --json "$W/allreduce_variance_h200x2.json"
want diagnosis && step diagnosis "${T_DIAGNOSIS:-100}" python3 benchmarks/diagnosis/diagnosis.py \
  --json "$W/proof_diagnosis_h200x2.json" --plans-dir "$W/plans"
want fidelity && step fidelity "${T_FIDELITY:-150}" env CUDA_VISIBLE_DEVICES=0 python3 benchmarks/fidelity/fidelity.py \
  --samples 3 --json "$W/proof_fidelity_h200x1.json"
want accuracy && step accuracy "${T_ACCURACY:-70}" python3 benchmarks/accuracy/accuracy.py --json "$W/proof_accuracy_h200x2.json"
want plans && for model in llama-3.1-70b deepseek-v3 glm-5; do
  step "plan_$model" 90 python3 -m decodetop probe --model "$model" --tp 2 --budget --json "$W/plan_${model}-tp2-h200x2.json"
done
want cost && step cost "${T_COST:-150}" python3 benchmarks/cost/cost.py --rounds 2 --json "$W/proof_cost_h200x2.json"
want cost1 && step cost1 "${T_COST1:-90}" env CUDA_VISIBLE_DEVICES=0 python3 benchmarks/cost/cost.py --parts plan --tp 2 \
  --json "$W/proof_cost_h200x1.json"
cat "$LOG"
grep -E "composition error|^total" "$W"/plan_*.txt 2>/dev/null | cut -c1-160
for f in variance diagnosis fidelity accuracy cost cost1; do
  [ -f "$W/$f.txt" ] && { echo "## $f"; grep -E '^\|' "$W/$f.txt" | head -40; }
done
