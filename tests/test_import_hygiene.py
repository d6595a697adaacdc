"""Layering rules of docs/architecture.md, proven at run time: a fresh interpreter imports one module and we
inspect sys.modules. Only a run-time check proves that a deferred import really is deferred (harlequin's
test_import_hygiene does the same)."""

from __future__ import annotations

import json
import pkgutil
import subprocess
import sys

import pytest

import decodetop


def _loaded_after(statement: str) -> set[str]:
    code = f"import sys, json\n{statement}\nprint(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    return {name.split(".")[0] for name in json.loads(out.stdout.strip().splitlines()[-1])}


def _all_modules() -> list[str]:
    return sorted(
        info.name
        for info in pkgutil.walk_packages(decodetop.__path__, prefix="decodetop.")
        if "__main__" not in info.name
    )


def _is_ui(name: str) -> bool:
    return name.startswith(("decodetop.tui", "decodetop.themes"))


def _is_probe_worker(name: str) -> bool:
    return name.startswith("decodetop.probes.worker")


@pytest.mark.parametrize("module", [m for m in _all_modules() if not _is_probe_worker(m)])
def test_module_loads_without_torch(module: str) -> None:
    """Everything outside the probe worker imports without torch (the UI process never touches CUDA)."""
    assert "torch" not in _loaded_after(f"import {module}")


@pytest.mark.parametrize("module", [m for m in _all_modules() if not _is_ui(m)])
def test_module_loads_without_textual(module: str) -> None:
    """Nothing outside tui/ and themes/ loads textual, so the headless commands run where it is not installed."""
    loaded = _loaded_after(f"import {module}")
    assert "textual" not in loaded
    assert "rich" not in loaded


def test_cli_parser_loads_without_textual_or_torch() -> None:
    """Building the CLI parser (every subcommand's flags) loads neither textual nor torch."""
    loaded = _loaded_after("from decodetop.cli import build_parser; build_parser()")
    assert "textual" not in loaded
    assert "torch" not in loaded
