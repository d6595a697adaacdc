# Sourced by the GPU-machine campaign scripts (h200x2_primitives.sh, h200x2_proof.sh): the environment every run
# needs, and `want`/`step`. The caller sets OUT, TGZ, W (work folder), STEPS and LOG before calling `step`.
# Never changes GPU settings; NVLink multicast stays off (KINDS.md).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 DECODETOP_STATE_DIR=/tmp/decodetop-state

want() {  # want NAME: is NAME among $STEPS?
  case " $STEPS " in *" $1 "*) return 0 ;; esac
  return 1
}

step() {  # step NAME TIMEOUT CMD...: run CMD with a deadline into $W/NAME.txt; re-pack $TGZ after every step
  local name=$1 limit=$2
  shift 2
  echo "=== $name (deadline ${limit}s) $(date -u +%T)" | tee -a "$LOG"
  local t0=$SECONDS
  timeout -k 10 "$limit" "$@" >"$W/$name.txt" 2>&1
  echo "=== $name rc=$? in $((SECONDS - t0)) s" | tee -a "$LOG"
  tar czf "$TGZ" -C "$W" .  # what finished survives a cut-off call
}

reduced_config() {  # reduced_config DIR MODEL LAYERS: MODEL with LAYERS layers (benchmarks/fidelity's reduced config)
  python3 - "$@" <<'PY'
import json, sys
from pathlib import Path
sys.path.insert(0, "benchmarks/fidelity")
from fidelity import reduced_config
out = Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)
(out / "config.json").write_text(json.dumps(reduced_config(sys.argv[2], int(sys.argv[3])), indent=1))
PY
}
