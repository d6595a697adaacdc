"""Every benchmark script is at least started by a test: each Python script answers `--help` (its imports and its
command line hold on a CPU machine), the one without a command line is run for real on a committed result, the
module other scripts import is imported, and each shell driver parses and names only files that exist.

The scripts' own figures are measured on the GPU machine (docs/benchmarks.md); tests/benchmarks/
test_benchmark_scripts.py runs the proof scripts' logic at tiny sizes on CPU.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.env import subprocess_env

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks"


def _scripts(suffix: str) -> list[Path]:
    return sorted(p for p in BENCH.rglob(f"*{suffix}") if "results" not in p.relative_to(BENCH).parts)


IMPORTED_ONLY = {
    "fidelity/serving_moe.py",
    "fidelity/serving_norms.py",
    "fidelity/serving_rope.py",
    "fidelity/serving_linears.py",
}
"""Modules other scripts import (no command line of their own)."""
RUN_FOR_REAL = {
    "reports/probe_summary.py": ["benchmarks/results/primitives/h200x1.json"],
}
"""Scripts without options, run on a committed input instead of `--help`."""
PY_SCRIPTS = [p.relative_to(BENCH).as_posix() for p in _scripts(".py")]
SH_SCRIPTS = [p.relative_to(BENCH).as_posix() for p in _scripts(".sh")]
PATH_IN_SCRIPT = re.compile(r"(?<![\w/.$])((?:benchmarks|scripts)/[\w./-]+\.(?:py|sh))")
"""A repository path a shell driver runs or sources (benchmarks/… or scripts/…)."""


def _run(script: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(BENCH / script), *args],
        cwd=ROOT,
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        stdin=subprocess.DEVNULL,
    )


def test_the_lists_name_scripts_that_exist() -> None:
    assert len(PY_SCRIPTS) + len(SH_SCRIPTS) >= 38
    assert set(PY_SCRIPTS) >= IMPORTED_ONLY and set(RUN_FOR_REAL) <= set(PY_SCRIPTS)


@pytest.mark.parametrize("script", [s for s in PY_SCRIPTS if s not in IMPORTED_ONLY | set(RUN_FOR_REAL)])
def test_script_answers_help(script: str) -> None:
    done = _run(script, "--help")
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("usage: "), done.stdout[:500]


@pytest.mark.parametrize("script", sorted(RUN_FOR_REAL))
def test_script_without_options_runs_on_a_committed_input(script: str) -> None:
    done = _run(script, *RUN_FOR_REAL[script])
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.count("|") > 10  # Markdown tables


@pytest.mark.parametrize("script", sorted(IMPORTED_ONLY))
def test_module_imports(script: str) -> None:
    path = BENCH / script
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(path.parent))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(path.parent))
    assert module.__doc__


@pytest.mark.parametrize("script", SH_SCRIPTS)
def test_shell_driver_parses_and_names_files_that_exist(script: str) -> None:
    path = BENCH / script
    done = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    missing = sorted({p for p in PATH_IN_SCRIPT.findall(path.read_text()) if not (ROOT / p).exists()})
    assert not missing, f"{script} names files that do not exist: {', '.join(missing)}"
