"""Shared test configuration."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

REQUIRE_TOOLS = os.environ.get("DECODETOP_REQUIRE_TOOLS") == "1"
"""Set by .ci/run, which has scripts/test fetch the tools first: there a missing tool fails the test."""
TOOL_CACHE = Path(__file__).resolve().parents[1] / ".cache" / "tools" / "bin"
"""Where scripts/fetch-tools puts tmux and promtool (no root, nothing system-wide)."""


def require_tool(name: str) -> str:
    """Path of an external tool (PATH, then the project's tool cache). Missing: the test skips with the reason,
    or fails when DECODETOP_REQUIRE_TOOLS=1. Nothing is ever installed from here."""
    path = shutil.which(name) or shutil.which(name, path=str(TOOL_CACHE))
    if path is None:
        hint = "`bash scripts/fetch-tools` puts it in .cache/tools without root"
        if REQUIRE_TOOLS:
            pytest.fail(f"{name} is not installed and was not fetched (DECODETOP_REQUIRE_TOOLS=1); {hint}")
        pytest.skip(f"{name} is not installed; {hint}")
    return path
