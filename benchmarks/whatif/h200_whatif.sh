#!/usr/bin/env bash
# What-if acceptance on one H200, in one call under 8 minutes: the full GLM-5 plan at TP 2 with its curves, timed
# (docs/benchmarks.md: under 60 s), its results kept for decodetop whatif; a plan with its curves at TP 1 / batch 1 /
# 4K for Llama-3.1-70B and Mixtral-8x7B (4 layers each, BF16), then a direct plan at batch 8, batch 32, context 32K,
# the TP-2 and TP-4 shard shapes, batch 8 + TP 2 + 16K, FP8 KV and (Mixtral) EP 2, each against its prediction from
# the base plan's curves; after Llama's base plan, the independent serving-form step (serving_step.py, plain torch)
# at three other batch / context / shard shapes against the prediction.
#
#   OUT=/tmp/out bash benchmarks/whatif/h200_whatif.sh
#   WHATIF_ARGS="--device cpu --tiny --layers 1 --context 64" OUT=/tmp/w bash benchmarks/whatif/h200_whatif.sh  # CPU
#
# Files under $OUT: whatif.json (everything, written after each part), glm5_results.json (the GLM-5 plan's results,
# probe --json form), <preset>_base.json.gz (each model's base-plan results), serving.json (the serving-form step),
# whatif.log (progress), whatif.txt, whatif_env.txt; the table (predicted vs direct, 80 % range, inside,
# leave-one-out per family) prints last. One deadline for the whole
# run (T_WHATIF, default 450 s). Never changes GPU settings; NVLink multicast off.
set -u
cd "$(dirname "$0")/../.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 DECODETOP_STATE_DIR=${DECODETOP_STATE_DIR:-/tmp/decodetop-state}
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
OUT=${OUT:-/tmp/whatif}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
{
  date -u
  nvidia-smi --query-gpu=index,name,driver_version,memory.total,memory.used,clocks.sm,clocks.max.sm --format=csv 2>&1
  "$PY" -c 'import platform, torch; print("python", platform.python_version(), "torch", torch.__version__)'
} >"$OUT/whatif_env.txt" 2>&1
t0=$SECONDS
timeout -k 10 "${T_WHATIF:-450}" "$PY" benchmarks/whatif/whatif.py --glm5-plan --json "$OUT/whatif.json" \
  --glm5-results "$OUT/glm5_results.json" --serving-json "$OUT/serving.json" --results-dir "$OUT" \
  ${WHATIF_ARGS:-} >"$OUT/whatif.txt" 2>"$OUT/whatif.log"
rc=$?
echo "whatif rc=$rc in $((SECONDS - t0)) s" | tee -a "$OUT/whatif.log"
cat "$OUT/whatif_env.txt"
tail -n 5 "$OUT/whatif.log"
cat "$OUT/whatif.txt"
exit $rc
