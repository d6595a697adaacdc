#!/usr/bin/env bash
# Engine kernels on 2 × H200 (device kind nvidia-h200-x2), one entry point; everything lands under $OUT:
#   allreduce  (a) the custom all-reduce segment (probe, one-shot, graph) vs an independent one-shot timing,
#                  8 B–1 MiB, 2 alternated rounds                                            ~1.5 min
#   moe        (b) the routed-experts segment vs an independent grouped kernel over every expert, Mixtral,
#                  Qwen3-MoE and DeepSeek-V3 (4 layers, TP-2 widths), GPU 0                   ~2 min
#   plants     (c) five plants × 2 runs + 3 clean runs, each diffed with `decodetop budget --diff`  ~6–7 min
#
#   OUT=/tmp/out STEPS="allreduce moe" bash benchmarks/engine/run_all.sh      # (a) and (b): one call
#   OUT=/tmp/out STEPS="plants" bash benchmarks/engine/run_all.sh             # (c): a second call
#
# Each step has its own deadline; $OUT/engine.tgz is rewritten after every step, so a cut-off call keeps what
# finished. Short tables are printed last. Never changes GPU settings; NVLink multicast stays off (campaign_lib.sh).
set -u
cd "$(dirname "$0")/../.."
source benchmarks/campaigns/campaign_lib.sh
OUT=${OUT:-/tmp/engine}
TGZ=$OUT/engine.tgz
W=$OUT/engine
STEPS=${STEPS:-"allreduce moe plants"}
mkdir -p "$W"
LOG=$W/log.txt
{
  date -u
  nvidia-smi --query-gpu=index,name,pci.bus_id,clocks.sm,clocks.max.sm --format=csv 2>&1
  nvidia-smi topo -m 2>&1
  python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"
  python3 -c "import triton; print('triton', triton.__version__)" 2>&1 | tail -1
} >"$W/env.txt" 2>&1
want allreduce && step allreduce "${T_ALLREDUCE:-150}" python3 benchmarks/engine/allreduce_oneshot.py --rounds 2 \
  --json "$W/engine_allreduce_oneshot_h200x2.json"
want moe && step moe "${T_MOE:-200}" env CUDA_VISIBLE_DEVICES=0 python3 benchmarks/engine/moe_routed.py \
  --json "$W/engine_moe_routed_h200x1.json"
want plants && step plants "${T_PLANTS:-570}" env OUT="$W" bash benchmarks/engine/plants.sh
cat "$LOG"
for f in allreduce moe plants; do
  [ -f "$W/$f.txt" ] && { echo "## $f"; grep -E '^\|' "$W/$f.txt" | head -30; }
done
