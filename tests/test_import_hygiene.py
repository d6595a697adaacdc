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


def _culprits(modules: list[str], package: str) -> list[str]:
    """Which of `modules` load `package` on their own (run only when the joint import did, to name them)."""
    return [m for m in modules if package in _loaded_after(f"import {m}")]


def _check_boundary(modules: list[str], forbidden: tuple[str, ...]) -> None:
    """One interpreter imports every module of the boundary: if the union loads none of `forbidden`, no single
    module does (sys.modules only grows). On a failure each module is tried alone to name the offender."""
    assert modules
    loaded = _loaded_after("\n".join(f"import {m}" for m in modules))
    for package in forbidden:
        if package in loaded:
            pytest.fail(f"{package} is loaded by importing: {', '.join(_culprits(modules, package))}")


def test_every_module_outside_the_probe_ranks_loads_without_torch() -> None:
    """Everything outside the probe worker imports without torch (the UI process never touches CUDA)."""
    _check_boundary([m for m in _all_modules() if not _is_probe_worker(m)], ("torch", "triton"))


def test_every_module_outside_the_ui_loads_without_textual() -> None:
    """Nothing outside tui/ and themes/ loads textual, so the headless commands run where it is not installed."""
    _check_boundary([m for m in _all_modules() if not _is_ui(m)], ("textual", "rich"))


def test_the_boundaries_are_not_vacuous() -> None:
    """The joint import really does see a module that loads a forbidden package."""
    assert "textual" in _loaded_after("import decodetop.tui.app")
    assert any(_is_probe_worker(m) for m in _all_modules())


def test_cli_parser_loads_without_textual_or_torch() -> None:
    """Building the CLI parser (every subcommand's flags) loads neither textual nor torch."""
    loaded = _loaded_after("from decodetop.cli import build_parser; build_parser()")
    assert "textual" not in loaded
    assert "torch" not in loaded
