"""Provides `ProbeRegistry`: the probes a controller can run, by name (no torch).

The built-ins are `decodetop.probes.specs.BUILTIN_PROBES` (one spec module per probe, see
`decodetop.probes.probe_spec`).
Parameters are checked against a spec's defaults before anything is spawned: an unknown key or a value of the
wrong type is a one-line `UserInputError`.

Extra probes (test-only probes, or experiments) come from modules named in the `DECODETOP_PROBE_MODULES`
environment variable (comma-separated) or the `extra_modules` argument: each such module has a `PROBES` sequence
of `ProbeSpec` and must import without torch. They are hidden from listings unless their spec says otherwise.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterable, Sequence

from decodetop.errors import UserInputError
from decodetop.probes.probe_spec import ProbeSpec
from decodetop.probes.specs import BUILTIN_PROBES

__all__ = ["BUILTIN_PROBES", "EXTRA_MODULES_ENV", "ProbeRegistry", "ProbeSpec", "builtin_probes"]

#: Environment variable naming extra probe modules (comma-separated), e.g. the tests' raising and hanging probes.
EXTRA_MODULES_ENV = "DECODETOP_PROBE_MODULES"


def builtin_probes() -> tuple[ProbeSpec, ...]:
    """The built-in probes, in listing order (`decodetop.probes.specs`)."""
    return BUILTIN_PROBES


class ProbeRegistry:
    """The probes a controller can run: the built-ins plus any extra modules' `PROBES`."""

    def __init__(self, specs: Iterable[ProbeSpec] | None = None, extra_modules: Sequence[str] | None = None):
        self._specs: dict[str, ProbeSpec] = {}
        for spec in builtin_probes() if specs is None else specs:
            self._add(spec)
        if extra_modules is None:
            extra_modules = extra_modules_from_env()
        self.extra_modules: tuple[str, ...] = tuple(extra_modules)
        for module_name in self.extra_modules:
            try:
                module = importlib.import_module(module_name)
            except ImportError as exc:
                raise UserInputError(
                    f"{EXTRA_MODULES_ENV}: cannot import probe module {module_name!r}: {exc}"
                ) from None
            probes = getattr(module, "PROBES", None)
            if not isinstance(probes, (list, tuple)) or not all(isinstance(p, ProbeSpec) for p in probes):
                raise UserInputError(f"probe module {module_name!r} has no PROBES sequence of ProbeSpec")
            for spec in probes:
                self._add(spec)

    def _add(self, spec: ProbeSpec) -> None:
        if spec.name in self._specs:
            raise ValueError(f"probe {spec.name!r} registered twice")
        self._specs[spec.name] = spec

    def get(self, name: str) -> ProbeSpec:
        """The spec named `name`; a one-line `UserInputError` listing the known probes otherwise."""
        try:
            return self._specs[name]
        except KeyError:
            raise UserInputError(f"unknown probe {name!r} (known: {', '.join(self.names())})") from None

    def names(self, include_hidden: bool = False) -> list[str]:
        """Names in registration order (hidden test-only probes left out unless asked)."""
        return [n for n, s in self._specs.items() if include_hidden or not s.hidden]

    def specs(self, include_hidden: bool = False) -> list[ProbeSpec]:
        """Specs in registration order (hidden test-only probes left out unless asked)."""
        return [s for s in self._specs.values() if include_hidden or not s.hidden]

    def __contains__(self, name: object) -> bool:
        return name in self._specs


def extra_modules_from_env() -> tuple[str, ...]:
    """Module names from `DECODETOP_PROBE_MODULES` (empty when unset)."""
    raw = os.environ.get(EXTRA_MODULES_ENV, "")
    return tuple(part.strip() for part in raw.split(",") if part.strip())
