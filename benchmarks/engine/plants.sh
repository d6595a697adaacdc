#!/usr/bin/env bash
# Plants that need no change to GPU settings (engine kernels, part c), each run twice and compared with a clean run
# by `decodetop budget --diff`:
#   gemm_neighbour     another process looping 8192³ BF16 GEMMs on GPU $PLANT_GPU (benchmarks/engine/neighbour.py)
#   cpu_neighbour      one busy process per core of GPU $PLANT_GPU's NUMA node (neighbour.py cpu)
#   nccl_p2p_disable   NCCL_P2P_DISABLE=1 (NCCL goes through host memory; the custom P2P kernels say they cannot run)
#   nccl_proto_simple  NCCL_PROTO=Simple
#   launch_blocking    CUDA_LAUNCH_BLOCKING=1, judged in the eager budget (graph replays are one launch each)
# Model: Llama-3.1-70B with 4 layers (benchmarks/fidelity's reduced config), TP = the GPUs seen, probes
# "$NAMES". Every run: `decodetop probe $NAMES --config DIR --tp N --budget --json RUN.json --force`
# (--force: a neighbour holds memory on a GPU). Clean runs: clean1, clean2 (noise control: clean2 vs clean1 should
# name nothing), clean_eager (the launch-blocking baseline). The verdicts: benchmarks/engine/judge_plants.py (where the
# budget's all-reduce takes the custom P2P path, NCCL_PROTO=Simple leaves the engine's step alone by construction and
# is named by the probe's own NCCL points instead).
#
#   OUT=/tmp/out bash benchmarks/engine/plants.sh                    # all plants, twice: ~13 runs
#   PLANTS="gemm_neighbour nccl_p2p_disable" REPEATS=2 OUT=/tmp/out bash benchmarks/engine/plants.sh
#
# Never changes GPU settings; NVLink multicast stays off (campaign_lib.sh). Neighbours are ended by their PID.
set -u
cd "$(dirname "$0")/../.."
source benchmarks/campaigns/campaign_lib.sh
OUT=${OUT:-/tmp/engine}
W=$OUT/plants
mkdir -p "$W"
PLANTS=${PLANTS:-"gemm_neighbour cpu_neighbour nccl_p2p_disable nccl_proto_simple launch_blocking"}
REPEATS=${REPEATS:-2}
PLANT_GPU=${PLANT_GPU:-1}
NAMES=${NAMES:-"launch gemm norms allreduce"}
T_RUN=${T_RUN:-150}
GPUS=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
TP=${TP:-$((GPUS > 1 ? GPUS : 1))}
CFG=$W/llama-3.1-70b-4l
reduced_config "$CFG" llama-3.1-70b 4

run() {  # run NAME MODE [ENV=VALUE...]: one plan run into $W/NAME.json and NAME.txt
  local name=$1 mode=$2
  shift 2
  local t0=$SECONDS
  # shellcheck disable=SC2086 # NAMES is a word list
  timeout -k 10 "$T_RUN" env "$@" python3 -m decodetop probe $NAMES --config "$CFG" --tp "$TP" \
    --launch-mode "$mode" --budget --force --json "$W/$name.json" >"$W/$name.txt" 2>&1
  echo "run $name rc=$? $((SECONDS - t0)) s" | tee -a "$W/log.txt"
}

with_neighbour() {  # with_neighbour KIND NAME MODE: run NAME while neighbour KIND loads GPU $PLANT_GPU
  local kind=$1 name=$2 mode=$3 ready=$W/$2.ready
  rm -f "$ready"
  python3 benchmarks/engine/neighbour.py "$kind" --gpu "$PLANT_GPU" --seconds $((T_RUN + 60)) --ready "$ready" \
    >"$W/$name.neighbour.txt" 2>&1 &
  local pid=$!
  for _ in $(seq 1 120); do [ -f "$ready" ] && break; sleep 0.5; done
  run "$name" "$mode"
  kill "$pid" 2>/dev/null
  wait "$pid" 2>/dev/null
}

run clean1 graph
run clean2 graph
case " $PLANTS " in *" launch_blocking "*) run clean_eager eager ;; esac
for r in $(seq 1 "$REPEATS"); do
  for plant in $PLANTS; do
    case $plant in
      gemm_neighbour) with_neighbour gemm "${plant}_$r" graph ;;
      cpu_neighbour) with_neighbour cpu "${plant}_$r" graph ;;
      nccl_p2p_disable) run "${plant}_$r" graph NCCL_P2P_DISABLE=1 ;;
      nccl_proto_simple) run "${plant}_$r" graph NCCL_PROTO=Simple ;;
      launch_blocking) run "${plant}_$r" eager CUDA_LAUNCH_BLOCKING=1 ;;
      *) echo "unknown plant $plant" | tee -a "$W/log.txt" ;;
    esac
  done
done

for f in "$W"/*.json; do  # every run against its clean baseline: RUN.diff.txt
  name=$(basename "$f" .json)
  case $name in clean1 | clean_eager | plants_verdicts) continue ;; esac
  base=clean1
  case $name in launch_blocking_*) base=clean_eager ;; esac
  python3 -m decodetop budget --diff "$W/$base.json" "$f" >"$W/$name.diff.txt" 2>&1
done
python3 benchmarks/engine/judge_plants.py "$W" --plants "$PLANTS" --repeats "$REPEATS" --gpu "$PLANT_GPU" |
  tee "$W/plants_table.md"
