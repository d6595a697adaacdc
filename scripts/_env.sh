# Shared by scripts/run and scripts/test: make .venv (once) and install decodetop into it.
# Sourced, not run; then call `decodetop_env [EXTRA]`. The extra is an explicit argument, so the caller's own
# arguments (`scripts/run --demo`) never become a pip extra.
#
# Which torch: when the interpreter (DECODETOP_PYTHON, default python3) already has torch, as a serving
# environment does, .venv sees that environment's site packages (a .pth file: what --system-site-packages does, but
# it also works when the interpreter is itself a venv) and uses its torch as it is: nothing is installed over it.
# Otherwise torch goes into .venv: DECODETOP_TORCH (a pip requirement) when set; else, on a machine with no
# NVIDIA driver, the CPU build (torch==2.13.0+cpu, from pip's configured sources or else PyTorch's CPU index);
# else torch==2.13.0 from the registry (the CUDA build). Every setup says which torch it uses.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
venv="$root/.venv"
export PIP_CACHE_DIR="${PIP_CACHE_DIR:-$root/.cache/pip}"  # pip's downloads stay in the project too
TORCH_VERSION="2.13.0"
TORCH_CPU_INDEX="https://download.pytorch.org/whl/cpu"

_say() { echo "decodetop: $*" >&2; }

_has_nvidia_driver() {
    # The loaded NVIDIA kernel module publishes this file (read-only check; nothing is opened on the GPU).
    [ -e /proc/driver/nvidia/version ]
}

_install_torch() {
    local pip=("$venv/bin/python" -m pip install -q)
    if [ -n "${DECODETOP_TORCH:-}" ]; then
        _say "installing ${DECODETOP_TORCH} (DECODETOP_TORCH) into $venv"
        "${pip[@]}" "$DECODETOP_TORCH" >&2
    elif _has_nvidia_driver; then
        _say "installing torch==$TORCH_VERSION (CUDA build) into $venv"
        "${pip[@]}" "torch==$TORCH_VERSION" >&2
    else
        _say "no NVIDIA driver here: installing the CPU build torch==$TORCH_VERSION+cpu into $venv"
        "${pip[@]}" "torch==$TORCH_VERSION+cpu" >/dev/null 2>&1 \
            || "${pip[@]}" --extra-index-url "$TORCH_CPU_INDEX" "torch==$TORCH_VERSION+cpu" >&2 \
            || {
                _say "could not install torch==$TORCH_VERSION+cpu (not in pip's sources, $TORCH_CPU_INDEX not"
                _say "reachable): set DECODETOP_TORCH=<pip requirement> or DECODETOP_PYTHON=<a python with torch>"
                return 1
            }
    fi
}

_torch_in() {
    # "VERSION at PATH" of the torch that interpreter $1 imports, or nothing.
    "$1" -c "import torch, os; print(torch.__version__, 'at', os.path.dirname(torch.__file__))" 2>/dev/null || true
}

decodetop_env() {
    local extra="${1:-}" py="${DECODETOP_PYTHON:-python3}" fresh=0 found
    if [ ! -x "$venv/bin/python" ]; then
        fresh=1
        found="$(_torch_in "$py")"
        _say "creating $venv"
        # ensurepip drops PIP_* settings; XDG_CACHE_HOME keeps its pip cache in the project too.
        XDG_CACHE_HOME="$root/.cache" "$py" -m venv "$venv"
        if [ -n "$found" ]; then
            local pth
            pth="$("$venv/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")/_decodetop_host_env.pth"
            "$py" -c "import os, site, torch; d = [*site.getsitepackages(), os.path.dirname(os.path.dirname(torch.__file__))]; print(*dict.fromkeys(d), sep=chr(10))" >"$pth"
            _say "$py has torch $found: $venv uses it through $pth"
        fi
        "$venv/bin/python" -m pip install -q --upgrade pip >&2
    fi
    found="$(_torch_in "$venv/bin/python")"
    if [ -z "$found" ]; then
        fresh=1
        _install_torch
        found="$(_torch_in "$venv/bin/python")"
    fi
    local stamp="$venv/.decodetop-installed${extra:+-$extra}"
    if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
        fresh=1
        _say "installing decodetop${extra:+[$extra]} (editable); torch is left as it is"
        "$venv/bin/python" -m pip install -q -e ".${extra:+[$extra]}" >&2
        touch "$stamp"
    fi
    if [ "$fresh" = 1 ]; then
        _say "using torch ${found:-(none importable)}"
    fi
}
