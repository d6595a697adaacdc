"""Provides the per-rank composition of a budget from probe results (stdlib only, no torch): every rank's budget
from its own times, their spread and step bound (`decodetop.budget.ranks`), and the straggler with its likely causes
(`decodetop.probes.rankbudget.rank_causes`).

    spread = compose_ranks(inventory, results, launch_mode="graph", plan=plan, estimate=hw, device_kind="cuda")
    spread.straggler.text       # 'straggler: GPU 1 (+2.4 ms, +35 % …; likely: another process on GPU 1 …)'

How: each result is narrowed to one rank (`rank_view`: every measurement keeps only that rank's series, stats and
metrics) and read through the same per-probe read hooks as the budget (`probes.plan_hooks.measured_from_results`),
then composed by the same `compose_budget`; so a rank's figure is the budget it would have alone.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence

from decodetop.budget.components import Component
from decodetop.budget.compose import compose_budget
from decodetop.budget.inventory import StepInventory
from decodetop.budget.plan import ProbePlan
from decodetop.budget.ranks import RankSpread, RankTotal, rank_spread
from decodetop.budget.roofline import Hardware
from decodetop.probes.plan_hooks import measured_from_results
from decodetop.probes.rankbudget import rank_causes, rank_label
from decodetop.probes.results import Measurement, ProbeResult


def result_ranks(results: Iterable[ProbeResult]) -> tuple[int, ...]:
    """The ranks that reported a series with stats in any of `results`."""
    found = {r.rank for res in results for m in res.measurements for r in m.per_rank if r.stats is not None}
    return tuple(sorted(found))


def _narrow(m: Measurement, rank: int) -> Measurement:
    series = [r for r in m.per_rank if r.rank == rank]
    if not series:
        return dataclasses.replace(m, per_rank=(), stats=None)
    own = series[0]
    return dataclasses.replace(m, per_rank=(own,), stats=own.stats, metrics={**dict(m.metrics), **dict(own.metrics)})


def rank_view(results: Iterable[ProbeResult], rank: int) -> list[ProbeResult]:
    """`results` as `rank` alone measured them: every measurement keeps only that rank's series (its stats, and its
    own metrics over the averaged ones); a measurement that rank did not report keeps no figure."""
    return [dataclasses.replace(res, measurements=tuple(_narrow(m, rank) for m in res.measurements)) for res in results]


def compose_ranks(
    inventory: StepInventory,
    results: Sequence[ProbeResult],
    *,
    launch_mode: str,
    plan: ProbePlan | None,
    estimate: Hardware | None,
    device_kind: str,
    allreduce: str = "auto",
) -> RankSpread | None:
    """Every rank's own budget total, their spread, step bound and straggler (with likely causes); None for fewer
    than two ranks with series."""
    ranks = result_ranks(results)
    if len(ranks) < 2:
        return None
    collective = Component.COMMUNICATION.value
    totals: list[RankTotal] = []
    for rank in ranks:
        measured = measured_from_results(
            rank_view(results, rank), launch_mode=launch_mode, plan=plan, allreduce=allreduce
        )
        b = compose_budget(
            inventory,
            measured.times,
            curves=measured.engine(estimate, checked=False),
            launch_mode=launch_mode,
            estimate=estimate,
            self_check=False,
        )
        known = [s for s in b.segments if s.ms is not None]
        totals.append(
            RankTotal(
                rank=rank,
                label=rank_label(rank, device_kind),
                total_ms=b.total_ms,
                mean_ms=b.mean_total_ms,
                p10_ms=sum(s.p10_ms if s.p10_ms is not None else s.ms or 0.0 for s in known),
                p90_ms=sum(s.p90_ms if s.p90_ms is not None else s.ms or 0.0 for s in known),
                collective_ms=sum(s.ms or 0.0 for s in known if s.component == collective),
                components={s.component: s.ms or 0.0 for s in known},
            )
        )
    intervals = sum(op.count for op in inventory.ops if op.kind == "all_reduce")
    envs = [r.environment for r in results if r.environment is not None]
    causes = rank_causes(envs, ranks, device_kind)
    return rank_spread(totals, intervals=intervals, causes=causes)
