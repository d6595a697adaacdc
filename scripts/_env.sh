# Shared by scripts/run and scripts/test: make .venv (once) and install decodetop into it.
# Sourced, not run. Honours DECODETOP_PYTHON (interpreter) and DECODETOP_TORCH (pip spec used only when the
# interpreter has no torch yet; an existing torch, e.g. a serving environment's, is never replaced).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
py="${DECODETOP_PYTHON:-python3}"
venv="$root/.venv"
extra="${1:-}"
if [ ! -x "$venv/bin/python" ]; then
    echo "decodetop: creating $venv" >&2
    "$py" -m venv "$venv"
    "$venv/bin/python" -m pip install -q --upgrade pip >&2
fi
if ! "$venv/bin/python" -c "import torch" >/dev/null 2>&1; then
    # Install torch before the project, so pip does not pick a build for us; the CPU build where one is offered.
    echo "decodetop: installing ${DECODETOP_TORCH:-torch==2.13.0}" >&2
    "$venv/bin/python" -m pip install -q "${DECODETOP_TORCH:-torch==2.13.0}" >&2
fi
stamp="$venv/.decodetop-installed${extra:+-$extra}"
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
    echo "decodetop: installing decodetop${extra:+[$extra]} (editable)" >&2
    "$venv/bin/python" -m pip install -q -e ".${extra:+[$extra]}" >&2
    touch "$stamp"
fi
