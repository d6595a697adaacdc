#!/usr/bin/env bash
# One call on 1 or 2 H200s for the live screen's proofs; everything lands in $OUT/session.tgz:
#   surfaces  the one composition on every surface over a real plan run (benchmarks/surfaces/budget_surfaces.py)
#   record    NVML recordings, idle and under load (benchmarks/recorders/record_nvml.py), for the README screens
#   traces    real eager and CUDA-graph decode steps of a small Llama, one trace per rank on every GPU here
#             (benchmarks/traces/trace_gpu_tp2.py under torchrun), then `decodetop trace` on each
#   tui       the live UI in tmux over the real GPUs, and with the graph traces loaded (benchmarks/ui/tui_on_gpu.sh;
#             carry .whl and .debs)
#
#   OUT=/tmp/out STEPS="surfaces record traces tui" bash benchmarks/campaigns/h200_session.sh
#
# Never changes GPU settings; NVLink multicast stays off (campaign_lib.sh).
set -u
cd "$(dirname "$0")/../.."
source benchmarks/campaigns/campaign_lib.sh
OUT=${OUT:-/tmp/session}
TGZ=$OUT/session.tgz
W=/tmp/session_work
STEPS=${STEPS:-"surfaces record traces tui"}
MODEL=${MODEL:-llama-3.1-70b}
rm -rf "$W" && mkdir -p "$W" "$OUT"
LOG=$W/log.txt
NGPU=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
LABEL=h200x$NGPU
nvidia-smi --query-gpu=index,name,pci.bus_id,memory.used --format=csv >"$W/env.txt" 2>&1
want surfaces && step surfaces 200 python3 benchmarks/surfaces/budget_surfaces.py --model "$MODEL" --out "$W/surfaces"
want record && step record 90 python3 benchmarks/recorders/record_nvml.py --out "$W/recordings" --label "$LABEL"
want traces && step traces 240 python3 -m torch.distributed.run --standalone --nproc-per-node "$NGPU" \
  benchmarks/traces/trace_gpu_tp2.py --out "$W/traces" --steps 6 --modes eager,graph
if want traces; then
  for mode in eager graph; do
    [ -d "$W/traces/$mode" ] && step "trace_$mode" 60 python3 -m decodetop trace "$W/traces/$mode"
  done
fi
want tui && step tui 150 env OUT="$W" MODEL="$MODEL" WAIT=50 TRACE="$W/traces/graph" bash benchmarks/ui/tui_on_gpu.sh
cat "$LOG"
for f in surfaces trace_eager trace_graph; do [ -f "$W/$f.txt" ] && { echo "## $f"; tail -25 "$W/$f.txt"; }; done
[ -f "$W/tui.txt" ] && { echo "## tui"; head -60 "$W/tui.txt"; }
