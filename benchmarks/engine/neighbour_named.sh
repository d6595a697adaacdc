#!/usr/bin/env bash
# A neighbour on the probed GPU is named (pid, name, GPU, SM share) as the likely cause on every surface of
# `decodetop probe --budget --force --baseline`: the budget, the baseline diff, the layer check and the JSON.
#
#   OUT=/tmp/out bash benchmarks/engine/neighbour_named.sh
#
# Llama-3.1-70B with 4 layers (benchmarks/fidelity's reduced config) at TP 1 on GPU 0, probes "$NAMES":
#   1. clean.json / clean.txt     the baseline, nothing else on the GPU
#   2. neighbour.json / .txt      while benchmarks/engine/neighbour.py loops 8192³ BF16 GEMMs on GPU 0 from another
#                                 process: `probe … --budget --force --baseline clean.json`
#   3. diff.txt                   `decodetop budget --diff clean.json neighbour.json` (the files alone)
#   4. summary.txt                the neighbour's pid and every output line that names it
# Never changes GPU settings; NVLink multicast stays off (campaign_lib.sh); the neighbour is ended by its PID.
set -u
cd "$(dirname "$0")/../.."
source benchmarks/campaigns/campaign_lib.sh
OUT=${OUT:-/tmp/neighbour_named}
mkdir -p "$OUT"
NAMES=${NAMES:-"launch gemm norms allreduce layer"}
T_RUN=${T_RUN:-100}
CFG=$OUT/llama-3.1-70b-4l
reduced_config "$CFG" llama-3.1-70b 4

probe() {  # probe NAME [ARGS...]: one plan run into $OUT/NAME.json and NAME.txt
  local name=$1 t0=$SECONDS
  shift
  # shellcheck disable=SC2086 # NAMES is a word list
  timeout -k 10 "$T_RUN" python3 -m decodetop probe $NAMES --config "$CFG" --tp 1 --budget --json "$OUT/$name.json" \
    "$@" >"$OUT/$name.txt" 2>&1
  echo "run $name rc=$? $((SECONDS - t0)) s" | tee -a "$OUT/log.txt"
}

probe clean --force  # --force: the GPU guard of each run sees the ranks of the run before it
ready=$OUT/neighbour.ready
python3 benchmarks/engine/neighbour.py gemm --gpu 0 --seconds $((T_RUN + 30)) --ready "$ready" >"$OUT/neighbour.log" 2>&1 &
pid=$!
for _ in $(seq 1 120); do [ -f "$ready" ] && break; sleep 0.5; done
probe neighbour --force --baseline "$OUT/clean.json"
kill "$pid" 2>/dev/null
wait "$pid" 2>/dev/null
python3 -m decodetop budget --diff "$OUT/clean.json" "$OUT/neighbour.json" >"$OUT/diff.txt" 2>&1
echo "diff rc=$?" | tee -a "$OUT/log.txt"
{
  echo "neighbour: pid $pid (benchmarks/engine/neighbour.py gemm --gpu 0)"
  echo "--- lines of neighbour.txt naming pid $pid"
  grep -n "pid $pid" "$OUT/neighbour.txt"
  echo "--- lines of diff.txt naming pid $pid"
  grep -n "pid $pid" "$OUT/diff.txt"
  echo "--- the JSON: budget.contention, baseline_diff.likely_cause"
  python3 - "$OUT/neighbour.json" <<'EOF'
import json, sys
doc = json.load(open(sys.argv[1]))
print(json.dumps(doc["budget"].get("contention"), indent=1))
print("baseline_diff.likely_cause:", doc.get("baseline_diff", {}).get("likely_cause"))
EOF
  echo "--- the layer check, clean then with the neighbour"
  grep -h "layer \[" "$OUT/clean.txt" "$OUT/neighbour.txt"
} | tee "$OUT/summary.txt"
