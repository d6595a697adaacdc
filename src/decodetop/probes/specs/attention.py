"""Provides the `attention` probe's spec (no torch): decode attention against the KV cache.

Plan: the plan's attention keys and, when sweeps are wanted, the curve plan's grid as `curve_keys` (batch × context
× KV dtype at the scenario's shard, a coarser grid at the other TP shards' heads: `decodetop.budget.plan.
build_curve_plan`), timed with the best kernel only (no torch form beside them, no context sweep); a plan without
that grid (sweeps on, but nothing to add) keeps the context sweep on GPUs. Read: each key's time (the fastest
kernel class), and each grid and context-sweep point as a curve point at its own context; a GQA split-K point's
launch (shape and SM count: its metrics, or in results written before them its note's launch label and the
results' SM count) goes with it, so the curve engine can tell the kernel's launch regimes apart.
"""

from __future__ import annotations

import dataclasses

from decodetop.budget.gqa_launch import GqaLaunchFacts, facts_from_metrics, facts_from_note
from decodetop.budget.keys import AttentionKey, parse_key_id
from decodetop.probes.hooks import (
    MeasuredSetBuilder,
    PlanContext,
    Planned,
    ProbeRequest,
    alternative_point,
    budget_point,
    busiest,
    ok_measurements,
    with_source,
)
from decodetop.probes.probe_spec import ProbeSpec
from decodetop.probes.results import Measurement, ProbeResult
from decodetop.probes.specs.defaults import COMPONENT_TIMING, SMALL_GQA

#: Attention context sweep on GPUs (docs/reference/probes.md §7.8: KV GB/s at 0, 16k, 32k, 64k, 128k).
ATTENTION_CONTEXTS_GPU = (0, 16384, 32768, 65536, 131072)


def plan(ctx: PlanContext) -> Planned:
    """The plan's keys and the curve grid; the context sweep on GPUs where there is no grid."""
    ids = ctx.key_ids()
    if not ids:
        return Planned()
    grid = ctx.curve_key_ids()
    sweep = list(ATTENTION_CONTEXTS_GPU) if ctx.cuda and ctx.sweeps and not grid else []
    params = {"keys": list(ids), "context_sweep": sweep, "curve_keys": list(grid)}
    return Planned(ProbeRequest("attention", params, ids))


def read(result: ProbeResult, into: MeasuredSetBuilder) -> None:
    """Budget points give their key's time (the fastest kernel class, the others kept beside it); a context-sweep
    point is a curve point of its key at its context."""
    for m in ok_measurements(result):
        found = budget_point(result, m) or alternative_point(result, m)
        if found is not None:
            into.offer(*found)
            _offer_launch(result, m, found[0], into)
            continue
        kid, context, t = m.params.get("key"), m.params.get("context"), busiest(m)
        role = m.params.get("role")
        if role not in ("diagnostic", "curve") or not isinstance(kid, str) or t is None:
            continue
        key = parse_key_id(kid)
        if isinstance(key, AttentionKey) and isinstance(context, int) and context >= 0:
            source = "attention probe (grid)" if role == "curve" else "attention probe (sweep)"
            timed = dataclasses.replace(with_source(t, source), kernel=m.kernel)
            at = dataclasses.replace(key, context=context)
            into.offer_curve(at, timed)
            _offer_launch(result, m, at.key_id, into)


GQA_SPLIT_K = "GQA decode split-K"
"""The function name decodetop's GQA split-K kernel's points carry (`probes.worker.attention`)."""


def _offer_launch(result: ProbeResult, m: Measurement, key_id: str, into: MeasuredSetBuilder) -> None:
    """The launch of a GQA split-K point, where its results say it (`launch_facts`)."""
    key = parse_key_id(key_id)
    if isinstance(key, AttentionKey):
        facts = launch_facts(result, m, key)
        if facts is not None:
            into.offer_launch(key_id, facts)


def launch_facts(result: ProbeResult, m: Measurement, key: AttentionKey) -> GqaLaunchFacts | None:
    """The launch a GQA split-K measurement ran: its recorded launch metrics (checked against today's split rule),
    else, in results written before those, its note's launch label and the results' SM count."""
    if key.kind != "gqa" or m.kernel is None or not m.kernel.function.startswith(GQA_SPLIT_K):
        return None
    metrics = m.metrics or next((r.metrics for r in m.per_rank if r.metrics), {})
    if any(name.startswith("launch_") for name in metrics):
        return facts_from_metrics(metrics, key)
    extra = result.environment.extra if result.environment is not None else {}
    sms = extra.get("multiprocessors")
    return facts_from_note(m.note, sms) if isinstance(sms, int) else None


SPEC = ProbeSpec(
    name="attention",
    description="decode attention against the KV cache: GQA (SDPA), absorbed MLA, DSA indexer + sparse MLA; KV GB/s",
    module="decodetop.probes.worker.attention",
    default_timeout_s=300.0,
    default_params={"keys": [SMALL_GQA], "context_sweep": [], "curve_keys": [], **COMPONENT_TIMING},
    plan=plan,
    read=read,
    plan_order=500,
    string_lists=("curve_keys",),
)
