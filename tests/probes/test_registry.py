"""Unit tests for the probe registry: built-ins, parameter checks, extra (test-only) modules."""

from __future__ import annotations

import itertools

import pytest

from decodetop.errors import UserInputError
from decodetop.probes.registry import EXTRA_MODULES_ENV, ProbeRegistry
from decodetop.probes.specs.allreduce import default_allreduce_sizes
from decodetop.probes.worker.allreduce import bus_factor, metrics_for


def test_builtins_listed_and_test_probes_hidden() -> None:
    reg = ProbeRegistry(extra_modules=["fake_probes"])
    assert reg.names()[:3] == ["allreduce", "launch", "membw"]
    assert "test_hang" not in reg.names()
    assert "test_hang" in reg.names(include_hidden=True)
    assert reg.get("test_hang").module == "fake_probes"


def test_extra_modules_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(EXTRA_MODULES_ENV, "fake_probes")
    assert "test_raise" in ProbeRegistry()
    monkeypatch.setenv(EXTRA_MODULES_ENV, "no_such_module_xyz")
    with pytest.raises(UserInputError, match="no_such_module_xyz"):
        ProbeRegistry()


def test_unknown_probe_is_one_line() -> None:
    with pytest.raises(UserInputError, match=r"unknown probe 'nope' \(known: allreduce, launch, membw"):
        ProbeRegistry(extra_modules=[]).get("nope")


def test_default_sweep_is_8B_to_256MiB_by_four() -> None:
    sizes = default_allreduce_sizes()
    assert sizes[0] == 8 and sizes[-1] == 256 * 1024 * 1024
    assert all(b == 4 * a for a, b in itertools.pairwise(sizes[:-1]))


def test_resolve_params_checks_names_and_types() -> None:
    spec = ProbeRegistry(extra_modules=[]).get("allreduce")
    p = spec.resolve_params({"sizes": [8, 16], "budget_ms": 10})
    assert p["sizes"] == [8, 16] and p["budget_ms"] == 10.0 and p["modes"] == ["pipelined", "graph", "synced"]
    assert spec.default_params["sizes"] != [8, 16]  # defaults untouched
    with pytest.raises(UserInputError, match="has no parameter 'nope'"):
        spec.resolve_params({"nope": 1})
    with pytest.raises(UserInputError, match="must be an integer"):
        spec.resolve_params({"sizes": ["8"]})
    with pytest.raises(UserInputError, match="must be a list"):
        spec.resolve_params({"modes": "graph"})
    assert spec.resolve_params({"extra_sizes": [12288]})["extra_sizes"] == [12288]


def test_busbw_formula() -> None:
    assert bus_factor(2) == 1.0
    assert bus_factor(8) == pytest.approx(1.75)
    m = metrics_for(1_000_000, 10.0, 4)  # 1 MB in 10 µs = 100 GB/s algbw, x1.5 for 4 ranks
    assert m["algbw_gbps"] == pytest.approx(100.0) and m["busbw_gbps"] == pytest.approx(150.0)
