"""Per-rank composition on real gloo ranks: one rank slowed by the test-only delay is named the straggler, on every
surface that reads the budget (JSON, text, the diff against a clean run)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from decodetop.budget.diff import diff_budgets, format_budget_diff
from decodetop.budget.plan import build_plan
from decodetop.budget.text import format_budget_table
from decodetop.pipeline.composition import compose
from decodetop.pipeline.context import BudgetContext
from decodetop.probes.controller import ProbeController
from decodetop.probes.plan_hooks import plan_requests
from decodetop.probes.registry import ProbeRegistry
from decodetop.probes.results import Measurement, ProbeResult, ProbeStatus
from tests.probes.test_plan_hooks import tiny_inventory, tiny_scenario

ENV = "DECODETOP_TEST_SLOW_RANK"
"""The delay tests/probes/slow_rank.py plants in one CPU rank ("RANK:MS")."""
SLOW_RANK = 1
DELAY_MS = 2.0
"""Per op on rank 1: far above a CPU norm of the tiny model (tens of µs), so the rank stands out on a busy host."""


def _run_norms(tmp_path: Path) -> list[ProbeResult]:
    inv = tiny_inventory(tmp_path)
    requests, _ = plan_requests(build_plan(inv), inv, world_size=2, device_kind="cpu")
    req = next(r for r in requests if r.probe == "norms")
    registry = ProbeRegistry(extra_modules=["slow_rank"])  # a no-op in the ranks unless ENV names one
    with ProbeController(device="cpu", cpu_ranks=2, registry=registry, rank_log=tmp_path / "ranks.log") as pc:
        res = pc.run("norms", {**dict(req.params), "cpu_samples": 3}, timeout_s=120)
    assert res.status is ProbeStatus.OK, (res.message, res.traceback)
    return [res]


@pytest.fixture(scope="module")
def slowed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[ProbeResult]]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(ENV, f"{SLOW_RANK}:{DELAY_MS}")
        yield _run_norms(tmp_path_factory.mktemp("slow"))


def test_slowed_rank_is_named_with_its_totals(slowed: list[ProbeResult], tmp_path: Path) -> None:
    budget = compose(BudgetContext(tiny_scenario(tmp_path), tuple(slowed), group_kind="cpu")).budget
    spread = budget.ranks
    assert spread is not None
    assert [r.rank for r in spread.ranks] == [0, 1]
    slow, fast = spread.ranks[1], spread.ranks[0]
    assert slow.total_ms > fast.total_ms + DELAY_MS / 1e3  # at least one delayed op instance more
    assert spread.straggler is not None
    assert spread.straggler.label == "CPU rank 1"
    assert spread.straggler.slowest_component == "norms & elementwise"  # the only component measured here
    assert spread.step_bound_ms >= slow.total_ms
    doc = budget.to_dict()
    assert doc["ranks"]["straggler"]["rank"] == SLOW_RANK
    text = "\n".join(format_budget_table(budget))
    assert "per rank (ms, medians): CPU rank 0" in text
    assert "straggler: CPU rank 1" in text


def _even(m: Measurement) -> Measurement:
    first = [r for r in m.per_rank if r.rank == 0]
    return dataclasses.replace(m, per_rank=(*first, *(dataclasses.replace(r, rank=1) for r in first)))


def test_diff_names_the_straggler_that_appeared(slowed: list[ProbeResult], tmp_path: Path) -> None:
    scenario = tiny_scenario(tmp_path)
    new = compose(BudgetContext(scenario, tuple(slowed), group_kind="cpu")).budget
    # the baseline: the same run with rank 0's series on both ranks (a clean, even group)
    even = [dataclasses.replace(res, measurements=tuple(_even(m) for m in res.measurements)) for res in slowed]
    old = compose(BudgetContext(scenario, tuple(even), group_kind="cpu")).budget
    assert old.ranks is not None and old.ranks.straggler is None
    diff = diff_budgets(json.loads(json.dumps(old.to_dict())), json.loads(json.dumps(new.to_dict())))
    assert diff.straggler.startswith("straggler: CPU rank 1")
    assert "straggler: CPU rank 1" in format_budget_diff(diff, "clean.json")
