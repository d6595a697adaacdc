#!/usr/bin/env bash
# The H200 proof on the GPU machine: probe accuracy, budget fidelity, diagnosis and cost, in one run.
#
#   bash benchmarks/campaigns/h200_proof.sh                 # every part; logs and JSON under $OUT (default /tmp/proof)
#   PARTS="fidelity cost" bash benchmarks/campaigns/h200_proof.sh
#
# Each part has its own deadline (timeout -k), so one hanging part cannot eat the others' time. Files under $OUT:
# proof_env.txt, proof_log.txt, proof_{accuracy,fidelity,diagnosis,cost}.json; the short tables print last.
# Never changes GPU settings; NVLink multicast stays off (KINDS.md).
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/proof}
PARTS=${PARTS:-"accuracy fidelity diagnosis cost"}
PY=${PY:-python3}
mkdir -p "$OUT"
LOG=$OUT/proof_log.txt
T_ACCURACY=${T_ACCURACY:-80}
T_FIDELITY=${T_FIDELITY:-190}
T_DIAGNOSIS=${T_DIAGNOSIS:-100}
T_COST=${T_COST:-100}

{
  date -u
  nvidia-smi --query-gpu=index,name,driver_version,memory.total,clocks.sm,clocks.max.sm,power.limit --format=csv 2>&1
  nvidia-smi topo -m 2>&1 | head -20
  $PY - <<'EOF' 2>&1
import importlib, platform
print("python", platform.python_version())
for name in ("torch", "triton", "transformers", "cupy", "pynvml"):
    try:
        mod = importlib.import_module(name)
        print(name, getattr(mod, "__version__", "?"))
    except Exception as exc:
        print(name, "missing:", exc)
import torch
print("cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version() if torch.cuda.is_available() else "-",
      "gpus", torch.cuda.device_count())
EOF
  env | grep -E '^(NCCL|CUDA|TORCH_SYMM|NVSHMEM)' | sort
} >"$OUT/proof_env.txt" 2>&1

part() {  # part NAME TIMEOUT ARGS...
  local name=$1 limit=$2
  shift 2
  case " $PARTS " in *" $name "*) ;; *) return 0 ;; esac
  echo "=== $name (deadline ${limit}s) $(date -u +%T)" | tee -a "$LOG"
  local t0=$SECONDS
  timeout -k 10 "$limit" $PY "benchmarks/$name/$name.py" --json "$OUT/proof_$name.json" "$@" >>"$LOG" 2>&1
  local rc=$?
  echo "=== $name rc=$rc in $((SECONDS - t0)) s" | tee -a "$LOG"
}

if [ "${PROOF_TINY:-0}" = 1 ]; then  # CPU smoke run: tiny shapes, no full-size plan
  part accuracy "$T_ACCURACY" --tiny
  part fidelity "$T_FIDELITY" --tiny --context 128 --steps 3 --samples 2
  part diagnosis "$T_DIAGNOSIS" --tiny --context 256
  part cost "$T_COST" --parts tick,effect --rounds 1 --ticks 5
else
  part accuracy "$T_ACCURACY"
  part fidelity "$T_FIDELITY" --samples 3
  part diagnosis "$T_DIAGNOSIS"
  part cost "$T_COST" ${COST_ARGS:---rounds 2}
fi

$PY - "$OUT" <<'EOF'
import json, sys, pathlib
out = pathlib.Path(sys.argv[1])
for name in ("accuracy", "fidelity", "diagnosis", "cost"):
    p = out / f"proof_{name}.json"
    if not p.exists():
        print(f"## {name}: no result"); continue
    d = json.loads(p.read_text())
    print(f"## {name}")
    for key in ("table", "summary", "components"):
        if d.get(key):
            print(d[key])
EOF
