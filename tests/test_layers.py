"""The layer contracts of docs/architecture.md, checked statically by import-linter (`[tool.importlinter]` in
pyproject.toml): every import, deferred ones included, follows cli > commands > tui > themes | export > pipeline >
probes | traces > collectors > budget > helpers; budget and traces use the standard library only; textual stays in
tui and themes; torch stays in the probe ranks."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def _lint(pythonpath: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    if not LINT_IMPORTS.exists():
        pytest.skip("import-linter is not installed (the test extra installs it)")
    env = {**os.environ, "PYTHONPATH": str(pythonpath)}
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache"], check=False, cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )


def test_the_code_keeps_every_layer_contract() -> None:
    out = _lint(ROOT / "src", ROOT)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    assert "0 broken" in out.stdout


@pytest.mark.parametrize(
    ("module", "planted", "contract"),
    [
        ("budget/roofline.py", "import decodetop.commands.budget", "layers"),
        ("probes/results.py", "import decodetop.pipeline.composition", "layers"),
        ("pipeline/composition.py", "import decodetop.export.schedule", "layers"),
        ("pipeline/context.py", "import textual", "textual only"),
        ("collectors/pci.py", "import decodetop.tui", "layers"),
        ("traces/reader.py", "import psutil", "standard library only"),
        ("export/prometheus/rendering.py", "import textual", "textual only"),
        ("collectors/serving.py", "import torch", "torch only"),
    ],
)
def test_a_planted_import_breaks_its_contract(tmp_path: Path, module: str, planted: str, contract: str) -> None:
    """The contracts are not vacuous: one wrong import in a copy of the package breaks the named contract."""
    src = tmp_path / "src"
    shutil.copytree(ROOT / "src" / "decodetop", src / "decodetop", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    target = src / "decodetop" / module
    target.write_text(target.read_text(encoding="utf-8") + f"\n{planted}  # planted\n", encoding="utf-8")
    out = _lint(src, tmp_path)
    assert out.returncode != 0
    broken = out.stdout.split("Broken contracts", 1)[-1]
    assert contract in broken, out.stdout[-3000:]
