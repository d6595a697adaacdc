"""Provides the list of probes: name, description, default deadline, worker module and default parameters (no torch).

Adding a probe = one worker module `decodetop.probes.worker.<name>` exposing `run(ctx, params) -> RankOutput`, plus
one `ProbeSpec` in `BUILTIN_PROBES` below. Parameters are checked against the defaults here before anything is
spawned: an unknown key or a value of the wrong type is a one-line `UserInputError`.

Extra probes (test-only probes, or experiments) come from modules named in the `DECODETOP_PROBE_MODULES`
environment variable (comma-separated) or the `extra_modules` argument: each such module has a `PROBES` sequence
of `ProbeSpec` and must import without torch. They are hidden from listings unless their spec says otherwise.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from decodetop.errors import UserInputError

#: Environment variable naming extra probe modules (comma-separated), e.g. the tests' raising and hanging probes.
EXTRA_MODULES_ENV = "DECODETOP_PROBE_MODULES"

MiB = 1024 * 1024


def default_allreduce_sizes() -> list[int]:
    """8 B ... 128 MiB in ×4 steps, then 256 MiB (the issue's default sweep; probes.md §7.2 wants a wide sweep)."""
    sizes = []
    size = 8
    while size <= 128 * MiB:
        sizes.append(size)
        size *= 4
    sizes.append(256 * MiB)
    return sizes


@dataclass(frozen=True)
class ProbeSpec:
    """One probe: `module.run(ctx, params)` runs on every rank of the group."""

    name: str
    description: str
    module: str
    default_timeout_s: float
    default_params: Mapping[str, Any] = field(default_factory=dict)
    collective: bool = False  # needs every rank (all-reduce); per-GPU probes run on each rank independently
    hidden: bool = False  # test-only probes: runnable by name, never listed
    table_columns: tuple[str, ...] = ()  # measurement params shown as table columns instead of the name

    def resolve_params(self, given: Mapping[str, Any] | None) -> dict[str, Any]:
        """Defaults overlaid with `given`; unknown keys and wrong types are a one-line `UserInputError`."""
        params = {k: _copy(v) for k, v in self.default_params.items()}
        for key, value in (given or {}).items():
            if key not in self.default_params:
                known = ", ".join(sorted(self.default_params)) or "none"
                raise UserInputError(f"probe {self.name!r} has no parameter {key!r} (known: {known})")
            params[key] = _check_type(self.name, key, self.default_params[key], value)
        return params


def _copy(value: Any) -> Any:
    return list(value) if isinstance(value, (list, tuple)) else value


def _check_type(probe: str, key: str, default: Any, value: Any) -> Any:
    where = f"probe {probe!r} parameter {key!r}"
    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise UserInputError(f"{where} must be true or false, got {value!r}")
        return value
    if isinstance(default, int):
        if isinstance(value, bool) or not isinstance(value, int):
            raise UserInputError(f"{where} must be an integer, got {value!r}")
        return value
    if isinstance(default, float):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise UserInputError(f"{where} must be a number, got {value!r}")
        return float(value)
    if isinstance(default, str):
        if not isinstance(value, str):
            raise UserInputError(f"{where} must be a string, got {value!r}")
        return value
    if isinstance(default, (list, tuple)):
        if not isinstance(value, (list, tuple)):
            raise UserInputError(f"{where} must be a list, got {value!r}")
        items = list(value)
        # An empty default list takes integers (sizes, counts): the only kind of list parameter so far.
        sample = default[0] if default else 0
        return [_check_type(probe, key, sample, v) for v in items]
    return value


BUILTIN_PROBES: tuple[ProbeSpec, ...] = (
    ProbeSpec(
        name="allreduce",
        description="all-reduce latency and bus bandwidth per size: pipelined, CUDA-graph and synced modes",
        module="decodetop.probes.worker.allreduce",
        default_timeout_s=300.0,
        collective=True,
        table_columns=("size_bytes", "mode"),
        default_params={
            "sizes": default_allreduce_sizes(),
            "extra_sizes": [],  # sizes the caller adds (e.g. a model's exact message sizes), bytes
            "modes": ["pipelined", "graph", "synced"],
            "ops_per_sample": 20,  # N back-to-back ops per timed sample (nccl-tests default -n 20: probes.md §1)
            "samples": 25,  # timed samples per size and mode (upper bound; large sizes take fewer)
            "min_samples": 5,
            "synced_ops": 200,  # synced mode: individually synchronized ops, for p50/p99
            "warmup_ops": 5,  # nccl-tests -w 5 on the H200 machine (h200-machine.md)
            "budget_ms": 250.0,  # target time per size and mode; large sizes scale the counts down to fit
        },
    ),
    ProbeSpec(
        name="launch",
        description="kernel-launch cost: host enqueue, launch+sync, CUDA-graph replay a+b·N, eager torch op",
        module="decodetop.probes.worker.launch",
        default_timeout_s=120.0,
        default_params={
            "ops_per_sample": 100,
            "samples": 30,
            "graph_nodes": [1, 8, 32, 128, 512],
            "warmup_ops": 50,
        },
    ),
    ProbeSpec(
        name="membw",
        description="memory bandwidth: device copy, pinned H2D/D2H, and P2P bandwidth and latency per GPU pair",
        module="decodetop.probes.worker.membw",
        default_timeout_s=180.0,
        collective=True,
        default_params={
            "copy_bytes": 256 * MiB,  # h200-machine.md: 256 MiB copies gave 4.1 TB/s D2D and 55 GB/s pinned H2D
            "samples": 20,
            "warmup": 3,
            "latency_ops": 100,
            "budget_ms": 500.0,
        },
    ),
)


def builtin_probes() -> tuple[ProbeSpec, ...]:
    """`BUILTIN_PROBES` plus the decode-component probes of `decodetop.probes.components` (imported here, lazily:
    that module imports `ProbeSpec` from this one)."""
    from decodetop.probes.components import COMPONENT_PROBES

    return BUILTIN_PROBES + COMPONENT_PROBES


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
        return [s for s in self._specs.values() if include_hidden or not s.hidden]

    def __contains__(self, name: object) -> bool:
        return name in self._specs


def extra_modules_from_env() -> tuple[str, ...]:
    """Module names from `DECODETOP_PROBE_MODULES` (empty when unset)."""
    raw = os.environ.get(EXTRA_MODULES_ENV, "")
    return tuple(part.strip() for part in raw.split(",") if part.strip())
