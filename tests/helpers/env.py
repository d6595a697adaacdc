"""Where tests may write: HOME, the XDG base directories and decodetop's own config and state dirs, all under one
temporary root, in this process (the session fixture in tests/conftest.py) and in every subprocess a test starts."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"
"""The checkout's package sources, first on a subprocess's PYTHONPATH."""

ISOLATED_VARS: tuple[str, ...] = (
    "HOME",
    "XDG_CONFIG_HOME",
    "XDG_STATE_HOME",
    "XDG_DATA_HOME",
    "XDG_CACHE_HOME",
    "DECODETOP_CONFIG_DIR",
    "DECODETOP_STATE_DIR",
)
"""Every variable that decides where decodetop (platformdirs, paths.py) or a library it runs writes per user."""

PASSED_VARS: tuple[str, ...] = ("PATH", "LANG", "LC_ALL", "TMPDIR", "SYSTEMROOT", "VIRTUAL_ENV")
"""What a subprocess keeps of the caller's environment: enough to find programs and temp space, nothing that
changes what decodetop does (no CUDA_VISIBLE_DEVICES, NCCL_*, DECODETOP_* of the person running the tests)."""


def isolated_dirs(root: Path) -> dict[str, str]:
    """HOME and the per-user directories, all under `root` (made)."""
    home = root / "home"
    dirs = {
        "HOME": home,
        "XDG_CONFIG_HOME": home / ".config",
        "XDG_STATE_HOME": home / ".local" / "state",
        "XDG_DATA_HOME": home / ".local" / "share",
        "XDG_CACHE_HOME": home / ".cache",
        "DECODETOP_CONFIG_DIR": root / "decodetop-config",
        "DECODETOP_STATE_DIR": root / "decodetop-state",
    }
    for path in dirs.values():
        path.mkdir(parents=True, exist_ok=True)
    return {name: str(path) for name, path in dirs.items()}


def subprocess_env(*, pythonpath: tuple[Path, ...] = (), **extra: str) -> dict[str, str]:
    """The environment for a subprocess a test starts: the isolated dirs the session set (tests/conftest.py), the
    few variables in PASSED_VARS, the checkout's src (then `pythonpath`) on PYTHONPATH, and `extra` on top."""
    env = _kept(os.environ, PASSED_VARS + ISOLATED_VARS)
    missing = [name for name in ISOLATED_VARS if name not in env]
    if missing:
        raise RuntimeError(f"not isolated (tests/conftest.py sets these for the session): {', '.join(missing)}")
    env["PYTHONPATH"] = os.pathsep.join(str(p) for p in (SRC, *pythonpath))
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env.update(extra)
    return env


def _kept(environ: Mapping[str, str], names: tuple[str, ...]) -> dict[str, str]:
    return {name: environ[name] for name in names if name in environ}
