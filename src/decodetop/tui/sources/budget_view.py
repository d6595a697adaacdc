"""Provides the budget's view type: a composed `Budget` as the bar, legend and header the UI draws."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from decodetop.budget.compose import Budget
from decodetop.inert import inert, inert_data, inert_lines
from decodetop.tui.model import BudgetSegment, BudgetView


def budget_view(budget: Budget, title: str, measured_s: Mapping[str, float], tp_text: str = "") -> BudgetView:
    """A composed `Budget` as the bar's view: every figure with its provenance, the header, the observed step's
    origin and the roofline verdict, as the CLI prints them. `measured_s`: probe → when its result was taken (the age
    shown beside a measured figure)."""
    segments = []
    for seg in budget.segments:
        ages = [measured_s[p] for p in seg.probes if p in measured_s]
        measured = seg.provenance_kind.startswith("measured")
        segments.append(
            BudgetSegment(
                key=seg.component,
                label=seg.label,
                ms=seg.ms or 0.0,
                status=seg.status,
                measured_at_s=min(ages) if ages and measured else None,
                p10_ms=seg.p10_ms,
                p90_ms=seg.p90_ms,
                provenance=seg.provenance,
                kernels=seg.kernel_text,
                provenance_kind=seg.provenance_kind,
            )
        )
    estimates = any(s.estimated for s in budget.segments)
    summary = budget.summary() + (f" (≈ for {budget.hardware_text})" if estimates else "")
    lines = [
        f"{tp_text} · {budget.kernels} kernels/step, {budget.launch_mode} launch" if tp_text else "",
        summary,
        # the engine's all-reduce path where a rule or the flag chose it (as measured otherwise: said in the CLI)
        *dict.fromkeys(f"all-reduce: {s.path_text}" for s in budget.segments if s.path_rule and s.path_text),
    ]
    obs = budget.observed_step
    # GPU names (a replay's), the observed step's origin (a server's) and the labels are outside text: inert, the
    # header's and note's own newlines kept
    view = BudgetView(
        title=title,
        segments=inert_data(tuple(segments)),
        observed_ms=budget.observed_ms,
        target_ms=budget.target_ms,
        roofline_ms=budget.roofline_ms,
        note=inert_lines("\n".join(line for line in lines if line)),
        header=inert_lines(budget.header),
        observed_assumed=obs.assumed,
        observed_text=obs.text,
        observed_source=obs.source,
        verdict=budget.verdict,
        hardware_text=budget.hardware_text,
        ranks_text=budget.ranks.short_line() if budget.ranks is not None else "",
        straggler=budget.ranks.straggler.text if budget.ranks is not None and budget.ranks.straggler else "",
        contention=budget.contention.line() if budget.contention else "",
        warnings=budget.warnings,
    )
    return dataclasses.replace(
        view,
        title=inert(view.title),
        observed_text=inert(view.observed_text),
        hardware_text=inert(view.hardware_text),
        ranks_text=inert(view.ranks_text),
        straggler=inert(view.straggler),
    )
