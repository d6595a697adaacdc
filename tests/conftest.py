"""Shared test configuration."""

from __future__ import annotations

import os
import shutil

import pytest

IN_CI = os.environ.get("CI", "").lower() in {"1", "true", "yes"}


def require_tool(name: str) -> str:
    """Path of an external tool; in CI its absence fails the test (CI installs it), elsewhere it skips."""
    path = shutil.which(name)
    if path is None:
        if IN_CI:
            pytest.fail(f"{name} is not installed; scripts/test installs it with apt-get on CI")
        pytest.skip(f"{name} is not installed")
    return path
