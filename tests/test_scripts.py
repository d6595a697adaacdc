"""scripts/run and scripts/test over a stand-in interpreter that logs what it is asked to do.

The stand-in answers like a Python with (or without) torch; the tests read its log: the caller's arguments reach
decodetop and never become a pip extra, an interpreter's torch is reused, a torch-less one gets the CPU build, and
scripts/test installs no system package.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

_FAKE_PYTHON = """#!/bin/sh
# Stand-in interpreter: logs every call; answers the torch probe from $FAKE_TORCH ('' = no torch).
echo "$*" >> "$FAKE_LOG"
case "$*" in
  "-m venv "*) mkdir -p "$3/bin" "$3/lib/site-packages"; cp "$0" "$3/bin/python"; exit 0 ;;
  "-c import torch, os;"*) [ -n "$FAKE_TORCH" ] && echo "$FAKE_TORCH at /env/torch" && exit 0; exit 1 ;;
  "-c import sysconfig;"*) echo "$(dirname "$(dirname "$0")")/lib/site-packages"; exit 0 ;;
  "-c import os, site, torch;"*) echo /env/site-packages; exit 0 ;;
  "-m pip install"*"torch=="*) [ -n "$FAKE_PIP_GIVES_TORCH" ] && exit 0; exit 1 ;;
esac
exit 0
"""


def _project(tmp_path: Path) -> Path:
    """A copy of the scripts and pyproject.toml, with no .venv."""
    project = tmp_path / "project"
    shutil.copytree(ROOT / "scripts", project / "scripts")
    shutil.copy(ROOT / "pyproject.toml", project / "pyproject.toml")
    return project


def _fake_python(tmp_path: Path) -> Path:
    path = tmp_path / "python-stand-in"
    path.write_text(_FAKE_PYTHON)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def _run(project: Path, python: Path, log: Path, *args: str, torch: str = "") -> subprocess.CompletedProcess[str]:
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(project / "home"),
        "DECODETOP_PYTHON": str(python),
        "FAKE_LOG": str(log),
        "FAKE_TORCH": torch,
    }
    return subprocess.run(
        ["bash", *args], cwd=project, env=env, capture_output=True, text=True, timeout=60, check=False
    )


def test_run_passes_a_first_flag_to_decodetop_not_to_pip(tmp_path: Path) -> None:
    project, python, log = _project(tmp_path), _fake_python(tmp_path), tmp_path / "calls.log"
    proc = _run(project, python, log, "scripts/run", "--demo", torch="2.4.0a0+3bcc3cddb5")
    assert proc.returncode == 0, proc.stderr
    calls = log.read_text().splitlines()
    assert "-m pip install -q -e ." in calls  # no extra: the caller's '--demo' is not one
    assert not any("--demo]" in c for c in calls)
    assert calls[-1] == "-m decodetop --demo"
    # The interpreter's torch is used as it is, through a .pth, and nothing installs torch.
    assert not any("torch==" in c for c in calls)
    pth = project / ".venv/lib/site-packages/_decodetop_host_env.pth"
    assert pth.read_text() == "/env/site-packages\n"
    assert "has torch 2.4.0a0+3bcc3cddb5" in proc.stderr and "using torch 2.4.0a0+3bcc3cddb5" in proc.stderr


def test_run_without_torch_and_without_a_driver_asks_for_the_cpu_build(tmp_path: Path) -> None:
    if Path("/proc/driver/nvidia/version").exists():
        pytest.skip("an NVIDIA driver is loaded here: the CUDA build is asked for instead")
    project, python, log = _project(tmp_path), _fake_python(tmp_path), tmp_path / "calls.log"
    proc = _run(project, python, log, "scripts/run", "check")
    calls = log.read_text().splitlines()
    assert "-m pip install -q torch==2.13.0+cpu" in calls
    assert any(c.startswith("-m pip install -q --extra-index-url https://download.pytorch.org/whl/cpu") for c in calls)
    # The stand-in installs nothing, so setup stops and says what to set instead of running decodetop.
    assert proc.returncode != 0 and "DECODETOP_TORCH=" in proc.stderr
    assert "-m decodetop check" not in calls


def test_test_script_installs_no_system_package() -> None:
    text = (ROOT / "scripts/test").read_text() + (ROOT / "scripts/_env.sh").read_text()
    assert "apt-get" not in text and "sudo" not in text
    fetch = (ROOT / "scripts/fetch-tools").read_text()
    assert "apt-get install" not in fetch and "dpkg -i" not in fetch  # download and unpack into .cache only
