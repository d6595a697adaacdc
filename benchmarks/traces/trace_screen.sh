#!/usr/bin/env bash
# The live UI with a traced directory loaded, in a real tmux pane, captured as text (for docs): the probed bar of
# the traced model's budget (roofline, no probes) above the traced bar of its per-rank traces.
# Run here (textual is installed) on the traces benchmarks/traces/trace_gpu_tp2.sh brought back from the GPU machine:
#     bash benchmarks/traces/trace_screen.sh OUT/traces/graph OUT/traces/config.json [160x48] [TP] > screen.txt
set -eu
DIR=${1:?trace directory}
CONFIG=${2:?the traced model\'s config.json}
SIZE=${3:-160x48}
TP=${4:-2}
COLS=${SIZE%x*}
ROWS=${SIZE#*x}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
SESSION="decodetop-trace-screen-$$"
STATE=$(mktemp -d)
trap 'tmux kill-session -t "$SESSION" 2>/dev/null || true; rm -rf "$STATE"' EXIT
tmux new-session -d -s "$SESSION" -x "$COLS" -y "$ROWS" \
    "DECODETOP_STATE_DIR=$STATE DECODETOP_CONFIG_DIR=$STATE $ROOT/.venv/bin/decodetop --demo --no-probes \
     --config $CONFIG --tp $TP --trace $DIR"
for _ in $(seq 1 120); do  # up to 60 s for the trace to be read
    if tmux capture-pane -p -t "$SESSION" | grep -q "traced step"; then
        sleep 1
        tmux capture-pane -p -t "$SESSION"
        exit 0
    fi
    sleep 0.5
done
echo "the traced bar did not appear within 60 s; the pane:" >&2
tmux capture-pane -p -t "$SESSION" >&2
exit 1
