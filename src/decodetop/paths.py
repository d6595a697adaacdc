"""Provides the user's config and state directories (platformdirs where installed, XDG rules otherwise)."""

from __future__ import annotations

import os
from pathlib import Path

APP_NAME = "decodetop"


def _xdg(var: str, default: str) -> Path:
    value = os.environ.get(var, "")
    return Path(value) if value else Path.home() / default


def config_dir() -> Path:
    """Where settings.toml lives; DECODETOP_CONFIG_DIR overrides."""
    override = os.environ.get("DECODETOP_CONFIG_DIR")
    if override:
        return Path(override)
    try:
        import platformdirs
    except ImportError:  # headless use on a serving box that lacks platformdirs
        return _xdg("XDG_CONFIG_HOME", ".config") / APP_NAME
    return Path(platformdirs.user_config_dir(APP_NAME, appauthor=False))


def state_dir() -> Path:
    """Where history and baselines live; DECODETOP_STATE_DIR overrides."""
    override = os.environ.get("DECODETOP_STATE_DIR")
    if override:
        return Path(override)
    try:
        import platformdirs
    except ImportError:
        return _xdg("XDG_STATE_HOME", ".local/state") / APP_NAME
    return Path(platformdirs.user_state_dir(APP_NAME, appauthor=False))
