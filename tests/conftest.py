"""Shared test configuration."""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

import pytest

from tests.helpers.env import ISOLATED_VARS, isolated_dirs
from tests.helpers.signals import interruptible_children

pytest_plugins = ["pytester", "tests.helpers.nvml_strict"]
"""pytester for tests of the suite's own fixtures; the strict fake NVML (a call no recording holds fails the test)."""

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


def require_module(name: str, why: str) -> None:
    """Skip when Python module `name` is not importable here, with the reason, or fail when
    DECODETOP_REQUIRE_TOOLS=1 (CI): there a test that cannot run is a failure, never a silent skip."""
    if importlib.util.find_spec(name) is not None:
        return
    if REQUIRE_TOOLS:
        pytest.fail(f"{name} is not installed (DECODETOP_REQUIRE_TOOLS=1): {why}")
    pytest.skip(f"{name} is not installed: {why}")


HOST_FIXTURES = Path(__file__).resolve().parent / "fixtures" / "hosts"
"""The host-tree generator (build_fixtures.py) and each scenario's committed golden findings (`<name>/expected.json`).
The trees themselves are generated, not committed: the generator is deterministic and the golden files pin it."""


def load_host_generator() -> ModuleType:
    """tests/fixtures/hosts/build_fixtures.py as a module (registered first: its dataclasses look their module up)."""
    name = "build_fixtures"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, HOST_FIXTURES / "build_fixtures.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


HOST_SCENARIOS: tuple[str, ...] = tuple(sorted(load_host_generator().SCENARIOS))


def pytest_configure(config: pytest.Config) -> None:
    """Children take Ctrl-C even where the suite was started with SIGINT ignored (tests/helpers/signals.py)."""
    interruptible_children()


@pytest.fixture(scope="session")
def hosts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every host scenario built once per session: `hosts / name / "root"` (shared: never change it)."""
    dest = tmp_path_factory.mktemp("hosts")
    load_host_generator().build_all(dest)
    return dest


@pytest.fixture()
def copy_host(hosts: Path, tmp_path: Path) -> Callable[[str], Path]:
    """A private copy of host scenario `name`'s tree, for tests that change files in it."""

    def copy(name: str) -> Path:
        dest = tmp_path / name
        shutil.copytree(hosts / name / "root", dest, symlinks=True)
        return dest

    return copy


@pytest.fixture(autouse=True)
def _no_inherited_terminal_width(monkeypatch: pytest.MonkeyPatch) -> None:
    """CLI tables fit ``COLUMNS`` when it is set, and pytest-xdist sets it (to 80) in its workers: every test starts
    without it, as CI's pipe does, and the tests about widths set it themselves."""
    monkeypatch.delenv("COLUMNS", raising=False)
    monkeypatch.delenv("LINES", raising=False)


@pytest.fixture(scope="session", autouse=True)
def _isolated_session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """HOME, the XDG dirs and decodetop's config and state dirs point under a session temp dir before any other
    fixture runs (module-scoped probe groups included), in os.environ itself, so that every subprocess a test
    starts inherits them: no test reads or writes the user's settings, history or rank logs."""
    saved = {name: os.environ.get(name) for name in ISOLATED_VARS}
    os.environ.update(isolated_dirs(tmp_path_factory.mktemp("isolated")))
    yield
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@pytest.fixture(autouse=True)
def _private_state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test its own decodetop config and state dirs (settings, history, baselines, rank logs): one test's
    records never reach another's."""
    monkeypatch.setenv("DECODETOP_CONFIG_DIR", str(tmp_path / "config"))
    monkeypatch.setenv("DECODETOP_STATE_DIR", str(tmp_path / "state"))
