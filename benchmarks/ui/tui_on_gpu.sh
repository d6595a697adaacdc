#!/usr/bin/env bash
# The live UI on the GPU machine, in a real terminal (tmux), captured as text under $OUT: the probed budget over
# the real GPUs, and (with TRACE=DIR) the traced bar of a recorded decode step beside it.
# The GPU machine has no textual and no tmux: carry the wheels (.whl) and Debian's tmux packages (.debs):
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 … -d .whl textual==8.2.8 …
#   (cd .debs && apt-get download tmux libevent-core-2.1-7 libutempter0)
#   OUT=/tmp/out MODEL=llama-3.1-70b WAIT=60 [TRACE=DIR] bash benchmarks/ui/tui_on_gpu.sh
# Never changes GPU settings; NVLink multicast stays off.
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:?set OUT}
MODEL=${MODEL:-llama-3.1-70b}
WAIT=${WAIT:-60}
SIZE=${SIZE:-160x48}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  || { echo "wheels did not install"; exit 1; }
mkdir -p /tmp/tmuxroot && for f in .debs/*.deb; do dpkg -x "$f" /tmp/tmuxroot; done
export PATH=/tmp/tmuxroot/usr/bin:$PATH LD_LIBRARY_PATH=/tmp/tmuxroot/usr/lib/x86_64-linux-gnu
export PYTHONPATH=src:/tmp/site DECODETOP_STATE_DIR=${DECODETOP_STATE_DIR:-/tmp/decodetop-state}
export XDG_CONFIG_HOME=/tmp/decodetop-config TERM=xterm-256color
tmux -V >"$OUT/tui_env.txt" 2>&1
cols=${SIZE%x*}; rows=${SIZE#*x}
shot() {  # shot NAME WAIT CMD...: run CMD in a fresh tmux pane, wait, capture the screen as text, quit with q
  local name=$1 wait_s=$2; shift 2
  tmux kill-server 2>/dev/null
  tmux new-session -d -s ui -x "$cols" -y "$rows" "$*; echo exit=\$? >$OUT/${name}_rc.txt; sleep 5"
  sleep "$wait_s"
  tmux capture-pane -p -t ui >"$OUT/$name.txt"
  tmux send-keys -t ui q
  local t0=$SECONDS
  while tmux has-session -t ui 2>/dev/null && [ ! -s "$OUT/${name}_rc.txt" ] && [ $((SECONDS - t0)) -lt 20 ]; do sleep 0.2; done
  echo "$name: quit took $((SECONDS - t0)) s after q" >>"$OUT/tui_env.txt"
  tmux kill-server 2>/dev/null
}
shot live "$WAIT" python3 -m decodetop --model "$MODEL"
if [ -n "${TRACE:-}" ]; then
  shot traced 25 python3 -m decodetop --model "$MODEL" --no-probes --trace "$TRACE"
fi
for f in live traced; do [ -f "$OUT/$f.txt" ] && { echo "## $f"; cat "$OUT/$f.txt"; }; done
cat "$OUT/tui_env.txt"
