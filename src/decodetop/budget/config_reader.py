"""Provides `ConfigReader`: typed, bounded access to a model's config.json, where every failure is a `ConfigError`
naming the file and the key (exit code 2 in the CLI). The model spec and every model family read through it."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from decodetop.budget.quant import ConfigError

# Plausibility bounds: larger values are typos or garbage, not models (the largest published configs are far below).
MAX_LAYERS = 4096
MAX_WIDTH = 1 << 20
MAX_VOCAB = 1 << 24
MAX_HEADS = 1 << 14
MAX_EXPERTS = 1 << 16

_MISSING = object()


def short(value: object) -> str:
    """A config value quoted for a message, cut to 40 characters."""
    text = json.dumps(value) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


class ConfigReader:
    """Typed, bounded access to a config dict; every failure is a ConfigError naming file and key."""

    def __init__(self, cfg: Mapping[str, Any], file: str, prefix: str = "") -> None:
        self.cfg = cfg
        self.file = file
        self.prefix = prefix

    def error(self, key: str, problem: str) -> ConfigError:
        return ConfigError(self.file, self.prefix + key, problem)

    def has(self, key: str) -> bool:
        return self.cfg.get(key) is not None

    def int_(self, key: str, default: object = _MISSING, lo: int = 1, hi: int = MAX_WIDTH) -> int:
        value = self.cfg.get(key)
        if value is None:
            if default is _MISSING:
                raise self.error(key, "missing (required for this model_type)")
            assert isinstance(default, int)
            return default
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self.error(key, f"expected an integer, got {type(value).__name__} {short(value)}")
        if isinstance(value, float):
            if not math.isfinite(value) or value != int(value):
                raise self.error(key, f"expected an integer, got {short(value)}")
            value = int(value)
        if not lo <= value <= hi:
            raise self.error(key, f"{value} is out of range ({lo}..{hi})")
        return int(value)

    def float_(self, key: str, default: float, lo: float, hi: float) -> float:
        value = self.cfg.get(key)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise self.error(key, f"expected a number, got {short(value)}")
        if not lo <= value <= hi:
            raise self.error(key, f"{value} is out of range ({lo}..{hi})")
        return float(value)

    def bool_(self, key: str, default: bool) -> bool:
        value = self.cfg.get(key)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise self.error(key, f"expected true or false, got {short(value)}")
        return value

    def str_(self, key: str, default: str, allowed: tuple[str, ...]) -> str:
        value = self.cfg.get(key)
        if value is None:
            return default
        if not isinstance(value, str) or value not in allowed:
            raise self.error(key, f"expected one of {', '.join(allowed)}, got {short(value)}")
        return value

    def int_list(self, key: str, hi: int) -> tuple[int, ...]:
        value = self.cfg.get(key)
        if value is None:
            return ()
        if not isinstance(value, list) or not all(
            isinstance(v, int) and not isinstance(v, bool) and 0 <= v < hi for v in value
        ):
            raise self.error(key, f"expected a list of layer indices below {hi}")
        return tuple(value)

    def layer_types(self, key: str, n_layers: int) -> list[str] | None:
        """A per-layer list of type strings (`layer_types`, `mlp_layer_types`), or None where the config has none."""
        types = self.cfg.get(key)
        if types is None:
            return None
        if not isinstance(types, list) or len(types) != n_layers or not all(isinstance(t, str) for t in types):
            raise self.error(key, f"expected {n_layers} layer type strings")
        return types
