"""The host-tree generator (tests/fixtures/hosts/build_fixtures.py) as a module, and its scenario names.

The trees are generated, not committed: the generator is deterministic and the golden findings beside it pin it.
tests/collectors/conftest.py builds them once per session (`hosts`).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

HOST_FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "hosts"
"""The generator and the committed golden findings (`<scenario>/expected.json`)."""


def load_generator() -> ModuleType:
    """build_fixtures.py as a module (registered in sys.modules first: its dataclasses look their module up)."""
    name = "build_fixtures"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, HOST_FIXTURES / "build_fixtures.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


SCENARIOS: tuple[str, ...] = tuple(sorted(load_generator().SCENARIOS))
