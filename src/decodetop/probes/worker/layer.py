"""Provides the `layer` probe: one whole decoder layer built from the component kernels, against the sum of its parts.

Params `dense_ops` and `moe_ops` list one layer's ops in execution order as `COUNT*KEY_ID` strings (its spec takes
them from the step inventory: norms, projections, rotary, KV write, attention, all-reduces, MLP or routing + routed
experts + shared experts). For each non-empty layer the probe:

1. builds every op with the same kernels the component probes time (`ops.op_runner_for`: the `op_runner` of the
   worker module of the key's probe); an op that cannot run
   here is left out and named in the note (an all-reduce when the group has fewer ranks than the plan's TP);
2. times each op alone (CUDA-graph replay on GPUs, host clock on CPU ranks): the parts;
3. times the whole layer back to back, as one CUDA graph (`graph`) and eagerly with CUDA events (`eager`; the
   host clock on CPU ranks);
4. reports the composition error = (Σ count × part − layer) / layer, in graph mode on GPUs (eager on CPU ranks),
   and the eager − graph gap (host launch overhead of this layer).

Every rank runs the same ops with agreed counts, so the all-reduces inside the layer pair up across ranks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from decodetop.budget.keys import AllreduceKey, parse_key_id
from decodetop.probes.results import MeasurementStatus, RankMeasurement, RankOutput
from decodetop.probes.worker.context import ProbeContext, UnsupportedError
from decodetop.probes.worker.ops import OpRunner, TimingOptions, free_memory, not_run, op_runner_for, point

#: Most rotated copies of a whole layer captured in one graph (each op rotates its own inputs).
MAX_LAYER_ROTATION = 8


def parse_ops(items: list[str]) -> list[tuple[int, str]]:
    """['2*norms:op=…', 'gemm:…'] → [(2, 'norms:op=…'), (1, 'gemm:…')]; the key ids are checked."""
    out = []
    for item in items:
        count_text, star, kid = str(item).partition("*")
        if not star:
            count_text, kid = "1", str(item)
        count = int(count_text)
        if count < 1:
            raise ValueError(f"layer: op count must be positive in {item!r}")
        out.append((count, parse_key_id(kid).key_id))
    return out


def run(ctx: ProbeContext, params: dict[str, Any]) -> RankOutput:
    """Each non-empty layer variant: parts, whole layer (graph and eager), composition error."""
    opts = TimingOptions.from_params(ctx, params)
    variants = [(name, parse_ops(list(params[f"{name}_ops"]))) for name in ("dense", "moe")]
    variants = [(n, ops) for n, ops in variants if ops]
    out: list[RankMeasurement] = []
    for index, (variant, ops) in enumerate(variants):
        ctx.progress(f"key {index + 1}/{len(variants)} {variant} layer ({len(ops)} ops)", index, len(variants))
        out.extend(_one_layer(ctx, opts, variant, ops))
        free_memory(ctx)
    ctx.progress("done", len(variants), len(variants))
    return RankOutput(measurements=tuple(out))


@dataclass(frozen=True)
class _Op:
    """One op of the layer, built: how many times a layer runs it, its key, its runner, whether it is a collective."""

    count: int
    key_id: str
    runner: OpRunner
    collective: bool


def _one_layer(
    ctx: ProbeContext, opts: TimingOptions, variant: str, ops: list[tuple[int, str]]
) -> list[RankMeasurement]:
    """Parts, whole layer in each mode, composition error."""
    built, left_out = _build(ctx, opts, ops)
    out, parts_us, failed_parts = _time_parts(ctx, opts, variant, built)
    notes = _notes(left_out, failed_parts)
    whole_points, layer_us = _time_whole(ctx, opts, variant, built, "; ".join(notes))
    out.extend(whole_points)
    out.append(_composition(ctx, variant, layer_us, parts_us if built else None, notes))
    return out


def _build(
    ctx: ProbeContext, opts: TimingOptions, ops: list[tuple[int, str]]
) -> tuple[list[_Op], list[tuple[str, str]]]:
    """Each op's runner from its probe's kernels; (key, reason) of those that cannot run here."""
    built: list[_Op] = []
    left_out: list[tuple[str, str]] = []
    for count, kid in ops:
        try:
            runner = op_runner_for(kid, ctx, rotate=opts.rotate)
        except UnsupportedError as exc:
            left_out.append((kid, str(exc)))
            continue
        built.append(_Op(count, kid, runner, isinstance(parse_key_id(kid), AllreduceKey)))
    return built, left_out


def _time_parts(
    ctx: ProbeContext, opts: TimingOptions, variant: str, built: list[_Op]
) -> tuple[list[RankMeasurement], float, list[str]]:
    """Each op alone: (points, Σ count × median µs, keys that failed to time)."""
    out: list[RankMeasurement] = []
    parts_us = 0.0
    failed: list[str] = []
    for op in built:
        pt = {
            "what": "part",
            "layer": variant,
            "key": op.key_id,
            "count": op.count,
            "role": "part",
            "device": ctx.device.type,
        }
        name = f"{variant} part ×{op.count} {op.key_id}"
        try:
            timing = opts.time(ctx, op.runner, collective=op.collective)
        except Exception as exc:
            out.append(not_run(name, pt, exc))
            failed.append(op.key_id)
            continue
        parts_us += op.count * timing.median_us
        out.append(point(name, pt, op.runner, timing))
    return out, parts_us, failed


def _notes(left_out: list[tuple[str, str]], failed_parts: list[str]) -> list[str]:
    """What the layer lacks: ops left out (grouped by reason) and parts that failed to time."""
    notes = []
    if left_out:
        by_reason: dict[str, list[str]] = {}
        for kid, reason in left_out:
            by_reason.setdefault(reason, []).append(kid)
        notes.append(
            "left out: " + "; ".join(f"{len(ks)} op(s) ({reason}): {', '.join(ks)}" for reason, ks in by_reason.items())
        )
    if failed_parts:
        notes.append("parts that failed to time: " + ", ".join(failed_parts))
    return notes


def _time_whole(
    ctx: ProbeContext, opts: TimingOptions, variant: str, built: list[_Op], note: str
) -> tuple[list[RankMeasurement], dict[str, float]]:
    """The whole layer back to back, as one CUDA graph and eagerly (eagerly only on CPU ranks): (points, mode → µs)."""

    def layer() -> None:
        for op in built:
            for _ in range(op.count):
                op.runner.fn()

    whole = OpRunner(
        layer,
        sum(op.count * op.runner.moved_bytes for op in built),
        sum(op.count * op.runner.flops for op in built),
        min(MAX_LAYER_ROTATION, max((op.runner.rotation for op in built), default=1)),
    )
    collective = any(op.collective for op in built)
    out: list[RankMeasurement] = []
    layer_us: dict[str, float] = {}
    for mode in ("graph", "eager") if ctx.is_cuda else ("eager",):
        pt = {
            "what": "layer",
            "layer": variant,
            "mode": mode,
            "ops": len(built),
            "role": "layer",
            "device": ctx.device.type,
        }
        name = f"{variant} layer [{mode}]"
        try:
            ctx.host_barrier()
            timing = opts.time(ctx, whole, graph=mode == "graph", collective=collective, budget_scale=2.0)
        except Exception as exc:
            out.append(not_run(name, pt, exc))
            continue
        if mode != "graph" or timing.method == "graph":  # a graph that fell back to events is no graph figure
            layer_us[mode] = timing.median_us
        out.append(point(name, pt, whole, timing, note=note))
    return out, layer_us


def _composition(
    ctx: ProbeContext, variant: str, layer_us: dict[str, float], parts_us: float | None, notes: list[str]
) -> RankMeasurement:
    """(Σ parts − layer) / layer in graph mode (eager where there is no graph figure); failed without a layer."""
    basis = "graph" if "graph" in layer_us else "eager"
    summary = {"what": "composition", "layer": variant, "mode": basis, "role": "composition", "device": ctx.device.type}
    name = f"{variant} layer composition error ({basis})"
    if basis not in layer_us or parts_us is None:
        note = "; ".join([*notes, "the whole layer could not be timed"])
        return RankMeasurement(name, summary, "us", status=MeasurementStatus.FAILED, note=note)
    whole_us = layer_us[basis]
    metrics = {
        "sum_parts_us": parts_us,
        "layer_us": whole_us,
        "error_pct": 100.0 * (parts_us - whole_us) / whole_us,
    }
    if "eager" in layer_us and "graph" in layer_us:
        metrics["eager_us"] = layer_us["eager"]
        metrics["eager_gap_us"] = layer_us["eager"] - layer_us["graph"]
    return RankMeasurement(name, summary, "us", metrics=metrics, note="; ".join(notes))
