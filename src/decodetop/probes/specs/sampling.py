"""Provides the `sampling` probe's spec (no torch): vocab-parallel lm_head and sampling, and the logits' all-gather.

Plan: the plan's sampling keys and the curve plan's (other vocabulary shards and token counts); on a group of the
plan's TP ranks also the plan's all-gather sizes (its `allreduce:collective=all_gather,…` keys). Read: each key's
time (greedy sampling), and each all-gather key's time in the launch mode's collective mode (graph replay for graph,
pipelined for eager) where that mode was measured.
"""

from __future__ import annotations

from decodetop.budget.keys import AllreduceKey
from decodetop.probes.hooks import (
    MeasuredSetBuilder,
    PlanContext,
    Planned,
    ProbeRequest,
    budget_point,
    ok_measurements,
)
from decodetop.probes.probe_spec import ProbeSpec
from decodetop.probes.results import ProbeResult
from decodetop.probes.specs.defaults import COMPONENT_TIMING


def plan(ctx: PlanContext) -> Planned:
    """The plan's keys, and the all-gathers when the group fits the plan's TP."""
    ids = ctx.key_ids()
    if not ids:
        return Planned()
    gathers: list[AllreduceKey] = []
    if ctx.group_fits_collectives:
        gathers = [
            k for k in ctx.plan.by_probe("allreduce") if isinstance(k, AllreduceKey) and k.collective == "all_gather"
        ]
    params = {"keys": [*ids, *ctx.curve_key_ids()], "allgather_bytes": sorted({k.bytes for k in gathers})}
    return Planned(ProbeRequest("sampling", params, ids + tuple(k.key_id for k in gathers)))


def read(result: ProbeResult, into: MeasuredSetBuilder) -> None:
    """Sampling keys: the fastest sampler point (greedy is the budget's); all-gathers: the wanted mode's."""
    ok = ok_measurements(result)
    want = into.collective_mode
    for m in ok:
        found = budget_point(result, m)
        if found is None:
            continue
        key, t = found
        if m.params.get("what") != "all_gather":
            into.offer(key, t)
            continue
        if m.params.get("mode") != want and any(
            x.params.get("key") == key and x.params.get("mode") == want for x in ok
        ):
            continue
        into.times[key] = t  # a curve point too (MeasuredSetBuilder.build)


SPEC = ProbeSpec(
    name="sampling",
    description="vocab-parallel lm_head + greedy and top-p sampling; all-gather of the logits",
    module="decodetop.probes.worker.sampling",
    default_timeout_s=300.0,
    collective=True,
    default_params={
        "keys": ["sampling:tokens=1,vocab_shard=32000,hidden=4096,dtype=bf16"],
        "allgather_bytes": [],  # logits bytes per rank to all-gather (probes.plan_hooks: the plan's all_gather keys)
        **COMPONENT_TIMING,
    },
    plan=plan,
    read=read,
    plan_order=800,
)
