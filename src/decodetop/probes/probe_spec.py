"""Provides `ProbeSpec`: one probe's name, description, default deadline, worker module, parameters with their
defaults, and its hooks into a model's plan run (no torch).

A probe is two modules: its worker module `decodetop.probes.worker.<name>` (kernels and `run(ctx, params)`, torch,
imported only in the spawned ranks) and its spec module `decodetop.probes.specs.<name>` (this `ProbeSpec`, with
the `plan` hook that turns a model's plan into the probe's parameters and the `read` hook that turns its results
into budget inputs; stdlib only, so the UI process and the controller can import it).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from decodetop.errors import UserInputError
from decodetop.probes.hooks import MeasuredSetBuilder, PlanContext, Planned, read_keyed_points
from decodetop.probes.results import ProbeResult

#: A probe's plan hook: its run for a model's plan on this group (or none), and notes.
PlanHook = Callable[[PlanContext], Planned]
#: A probe's read hook: one of its results into the budget inputs being built.
ReadHook = Callable[[ProbeResult, MeasuredSetBuilder], None]
#: Plan position of a probe that does not say: after the per-GPU components, before collectives and the layer.
DEFAULT_PLAN_ORDER = 850


@dataclass(frozen=True)
class ProbeSpec:
    """One probe: `module.run(ctx, params)` runs on every rank of the group (the worker module, torch side);
    `plan` and `read` are this probe's part of a model's plan run (torch-free)."""

    name: str
    description: str
    module: str
    default_timeout_s: float
    default_params: Mapping[str, Any] = field(default_factory=dict)
    collective: bool = False  # needs every rank (all-reduce); per-GPU probes run on each rank independently
    hidden: bool = False  # test-only probes: runnable by name, never listed
    table_columns: tuple[str, ...] = ()  # measurement params shown as table columns instead of the name
    plan: PlanHook | None = None
    """What the probe runs for a model's plan (None: never part of a plan). `hooks.plan_keys` runs it on the
    plan's keys of this probe."""
    read: ReadHook = read_keyed_points
    """How its results become budget inputs (default: every `role` "budget" point gives its `key`'s time)."""
    plan_order: int = DEFAULT_PLAN_ORDER
    """Position in a plan run: cheap, global probes first (launch), the layer last (it reuses every kernel)."""
    string_lists: tuple[str, ...] = ()
    """List parameters whose default is empty but whose items are strings (an empty default list takes integers)."""
    latency_sensitive: bool = True
    """Its timings are µs-scale, so telemetry makes no costly NVML call (process lists, which hold the driver's
    lock for milliseconds: docs/reference/peers.md §3.8) while it runs, on every surface; False for a probe whose
    timed work is long enough not to notice (the `membw` probe's 256 MiB copies)."""

    def resolve_params(self, given: Mapping[str, Any] | None) -> dict[str, Any]:
        """Defaults overlaid with `given`; unknown keys and wrong types are a one-line `UserInputError`."""
        params = {k: _copy(v) for k, v in self.default_params.items()}
        for key, value in (given or {}).items():
            if key not in self.default_params:
                known = ", ".join(sorted(self.default_params)) or "none"
                raise UserInputError(f"probe {self.name!r} has no parameter {key!r} (known: {known})")
            default = self.default_params[key]
            if key in self.string_lists and not default:
                default = [""]
            params[key] = _check_type(self.name, key, default, value)
        return params


def _copy(value: object) -> object:
    return list(value) if isinstance(value, (list, tuple)) else value


def _check_type(probe: str, key: str, default: object, value: object) -> object:
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
