"""Provides what a baseline (`s`) stores and what the screen marks against it: the checks whose status or value
changed since (Δ in the health table) and the budget's components that moved beyond their noise (Δ in the legend,
by `decodetop.budget.diff`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from decodetop.budget.diff import diff_budgets
from decodetop.collectors.checks.result import CheckResult
from decodetop.errors import UserInputError
from decodetop.history import HistoryEntry
from decodetop.tui.model import BudgetMove, BudgetView, ProbeView

BASELINE_NAME = "default"
"""The history key of the one baseline the UI keeps (`s` replaces it)."""
DEMO_BASELINE_NAME = "demo"
"""The demo's own baseline: its fake 8-GPU host is never diffed against this host's baseline, nor this host's
against the demo's."""


def baseline_payload(
    checks: list[CheckResult], probes: Mapping[str, ProbeView], budget: BudgetView | None = None
) -> dict[str, Any]:
    """What a baseline stores: each check's status, observed value and facts; each probe's value; the budget's
    components with their spread (what `budget_moves` compares against)."""
    payload: dict[str, Any] = {
        "checks": {
            c.check_id: {"status": c.status.value, "observed": c.observed, "facts": dict(c.facts)} for c in checks
        },
        "probes": {pid: v.value_text for pid, v in probes.items() if v.value_text},
    }
    if budget is not None:
        payload["budget"] = budget.to_budget_dict()
    return payload


def budget_moves(budget: BudgetView, baseline: HistoryEntry | None) -> tuple[BudgetMove, ...]:
    """The components of `budget` that moved beyond their noise since the baseline's budget
    (`decodetop.budget.diff`), largest increase first. None without a stored budget, for another model, or when the
    stored budget does not read (a baseline from before budgets were stored, a hand-edited file)."""
    stored = None if baseline is None else baseline.payload.get("budget")
    if not isinstance(stored, Mapping):
        return ()
    try:
        diff = diff_budgets(stored, budget.to_budget_dict(), baseline_name="baseline", current_name="budget")
    except UserInputError:
        return ()
    if diff.baseline_model != diff.current_model:
        return ()  # another model's budget: its components are not this one's
    return tuple(BudgetMove(d.component, d.delta_ms) for d in diff.moved if d.delta_ms is not None)


def changed_since(checks: list[CheckResult], baseline: HistoryEntry | None) -> frozenset[str]:
    """Ids of checks whose status or observed value differs from the baseline (new checks count as changed)."""
    if baseline is None:
        return frozenset()
    stored = baseline.payload.get("checks", {})
    if not isinstance(stored, dict):
        return frozenset()
    changed = set()
    for check in checks:
        old = stored.get(check.check_id)
        if (
            not isinstance(old, dict)
            or old.get("status") != check.status.value
            or old.get("observed") != check.observed
        ):
            changed.add(check.check_id)
    return frozenset(changed)
