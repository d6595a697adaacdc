"""Host-tree fixtures for the check tests, built once per session by tests/fixtures/hosts/build_fixtures.py.

`hosts` is the folder holding `<scenario>/root` (shared: never change it); tests that change a tree take a private
copy with `copy_host`.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from host_trees import load_generator


@pytest.fixture(scope="session")
def hosts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every scenario built once for the session: `hosts / name / "root"`."""
    dest = tmp_path_factory.mktemp("hosts")
    load_generator().build_all(dest)
    return dest


@pytest.fixture()
def copy_host(hosts: Path, tmp_path: Path) -> Callable[[str], Path]:
    """A private copy of scenario `name`'s tree, for tests that change files in it."""

    def copy(name: str) -> Path:
        dest = tmp_path / name
        shutil.copytree(hosts / name / "root", dest, symlinks=True)
        return dest

    return copy
