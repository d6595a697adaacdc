#!/usr/bin/env bash
# Checks on the GPU machine after a restructure, one call on 1 or 2 H200s; everything lands in $OUT/checks.tgz:
#   gpu_tests  the tests marked gpu (a real CUDA GPU: probes, the fused-MoE kernel against its reference)
#   plan_tp1   `decodetop probe --model llama-3.1-70b --tp 1 --budget` (every component probe on one GPU)
#   plan_moe   `decodetop probe --model qwen3-235b-a22b --tp 2 --budget` on the GPUs there (the fused MoE variant)
#   same       the one composition on two surfaces: `probe --budget --json` then `budget --results` of that file
#
#   OUT=/tmp/out STEPS="gpu_tests plan_tp1" bash benchmarks/campaigns/h200_checks.sh
#
# Never changes GPU settings; NVLink multicast stays off (campaign_lib.sh).
set -u
cd "$(dirname "$0")/../.."
source benchmarks/campaigns/campaign_lib.sh
OUT=${OUT:-/tmp/checks}
TGZ=$OUT/checks.tgz
W=$OUT/checks
STEPS=${STEPS:-"gpu_tests plan_tp1 plan_moe same"}
mkdir -p "$W"
LOG=$W/log.txt
nvidia-smi --query-gpu=index,name,pci.bus_id,memory.used --format=csv >"$W/env.txt" 2>&1
want gpu_tests && step gpu_tests 240 python3 -m pytest -q -p no:cacheprovider -o addopts="" -m gpu \
  tests/probes/test_gpu.py tests/probes/test_engine_fused_moe.py
want plan_tp1 && step plan_tp1 150 python3 -m decodetop probe --model llama-3.1-70b --tp 1 --budget \
  --json "$W/plan_llama-3.1-70b-tp1.json"
want plan_moe && step plan_moe 180 python3 -m decodetop probe --model qwen3-235b-a22b --tp 2 --budget \
  --json "$W/plan_qwen3-235b-a22b-tp2.json"
want same && step same 60 python3 -m decodetop budget --model llama-3.1-70b --tp 1 \
  --results "$W/plan_llama-3.1-70b-tp1.json"
cat "$LOG"
for f in plan_tp1 plan_moe same; do
  [ -f "$W/$f.txt" ] && { echo "## $f"; grep -iE "^(component|attention|dense|routed|shared|routing|norms|lm_head|kernel|all-reduce|total|unexplained|observed|roofline)|CPU|error|Traceback" "$W/$f.txt" | head -24; }
done
[ -f "$W/gpu_tests.txt" ] && tail -5 "$W/gpu_tests.txt"
