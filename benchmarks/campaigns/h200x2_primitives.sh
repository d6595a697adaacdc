#!/usr/bin/env bash
# The 2-GPU runs (primitives, model plans, the H200 proof) in one call on a 2 × H200 machine (device kind nvidia-h200-x2).
#
#   bash benchmarks/campaigns/h200x2_primitives.sh        # everything lands in $OUT/x2.tgz (+ a summary printed last)
#
# Each step has its own deadline so one hanging step cannot eat the others' time. Never changes GPU settings;
# NVLink multicast stays off (KINDS.md).
set -u
source "$(dirname "$0")/campaign_lib.sh"
OUT=${OUT:-/tmp/x2out}
TGZ=$OUT/x2.tgz
W=/tmp/x2work
STEPS=${STEPS:-"primitives plans allreduce_vs_dist record_nvml proof"}
rm -rf "$W" && mkdir -p "$W" "$OUT"
LOG=$W/campaign_log.txt
nvidia-smi topo -m >"$W/topo.txt" 2>&1
want primitives && step primitives 150 python3 -m decodetop probe allreduce launch membw --json "$W/probe_h200x2.json"
want plans && for model in llama-3.1-70b deepseek-v3 glm-5; do
  step "plan_$model" 80 python3 -m decodetop probe --model "$model" --tp 2 --budget --json "$W/plan_${model}-tp2-h200x2.json"
done
want allreduce_vs_dist && step allreduce_vs_dist 100 python3 benchmarks/accuracy/allreduce_vs_dist.py --rounds 3 --json "$W/probe_allreduce_vs_dist_h200x2.json"
want record_nvml && step record_nvml 45 python3 benchmarks/recorders/record_nvml.py --out "$W" --label h200x2
want proof && step proof 175 env OUT="$W" PARTS="accuracy diagnosis" T_ACCURACY=70 T_DIAGNOSIS=90 \
  bash benchmarks/campaigns/h200_proof.sh
cat "$LOG"
cat "$W"/proof.txt 2>/dev/null | tail -40
grep -E "busbw|^ *(8 B|256 MiB)|total|unexplained|composition error|rc=" "$W"/primitives.txt "$W"/plan_*.txt 2>/dev/null | head -40
