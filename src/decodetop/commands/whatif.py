"""Provides `decodetop whatif`: the current deployment against variants of it (`--vary tp=1,2,4,8 batch=1,8,32
kv=bf16,fp8 accept=1,2,3 allreduce=nccl,custom`, one axis or a grid), each predicted from the curves measured on this
host through the one composition, with its 80 % range, tok/s per sequence and in all, the component that limits it,
the change against now and the weakest figure; `--target-tps` lists the variants that reach the target, best first,
and why the others do not. Results: `--results PATH`, else the stored results of this host (the current scenario's,
else the newest of this model). No GPU is touched; imports neither torch nor textual.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from decodetop.commands._scenario_args import (
    add_scenario_arguments,
    observed_from_args,
    scenario_from_args,
    target_from_args,
)
from decodetop.defaults import DEFAULT_MODEL
from decodetop.errors import UserInputError
from decodetop.textfmt import fit_text, format_number, table

if TYPE_CHECKING:
    from decodetop.pipeline.whatif import Variant, WhatIf
    from decodetop.probes.results import ProbeResult


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register this command's flags."""
    add_scenario_arguments(parser, default_model=DEFAULT_MODEL)
    parser.add_argument(
        "--vary",
        nargs="+",
        metavar="KNOB=V1,V2",
        default=[],
        help="the variants: one axis or a grid of several (knobs: tp, ep, batch, context, kv, weights, launch, "
        "allreduce, accept, draft, gpu), e.g. --vary tp=1,2,4,8 batch=1,8; default: the TP degrees the model "
        "splits by (1, 2, 4, 8) × the weight precisions at or below its own (bf16, fp8, nvfp4) × accept=1,3 where "
        "it has MTP layers",
    )
    parser.add_argument(
        "--results",
        metavar="PATH",
        help="the probe results to predict from (a decodetop probe --json file); default: the stored results of this "
        "host for the current scenario, else the newest of this model",
    )
    parser.add_argument(
        "--gpu",
        metavar="NAME",
        help="the GPU to predict for (h200, rtx-pro-6000, …): where the results were measured on another one, every "
        "figure is carried from their curves, labelled transferred",
    )
    parser.add_argument(
        "--draft-config",
        metavar="PATH",
        help="the draft model of speculative decoding (its config.json, or a directory holding one) for a model "
        "without MTP layers: each step is the model verifying 1 + k tokens plus k steps of the draft model",
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")


def run(args: argparse.Namespace) -> int:
    """Run the command."""
    from decodetop.pipeline.composition import stored_times
    from decodetop.pipeline.context import BudgetContext, gpu_hint
    from decodetop.pipeline.whatif import check_vary, compare, default_axes, parse_vary, vary_grid

    axes = parse_vary(args.vary)
    results, source = _results(args)
    env = next((r.environment for r in results if r.environment is not None), None)
    group = env.world_size if env is not None else None
    label = "GPUs" if env is None or env.device_kind == "cuda" else "CPU ranks"
    scenario = scenario_from_args(
        args, group, group_label=label, group_where="the results ran on", default_model=DEFAULT_MODEL
    )
    if args.draft_config:
        from decodetop.budget.spec import load_config

        draft = load_config(args.draft_config)
        variant = f"draft model={draft.name}"
        scenario = dataclasses.replace(scenario, draft_spec=draft, model_variant=variant)
    check_vary(scenario, axes)  # a value its knob cannot take: one line and exit 2, never an inert row
    hint = gpu_hint(named=args.gpu) if args.gpu else None
    elsewhere = env is not None and bool(env.gpu_names) and hint is not None  # another GPU than the results'
    ctx = BudgetContext(
        scenario,
        tuple(results),
        observed=observed_from_args(args),
        target_tps=target_from_args(args),
        gpu=None if elsewhere else hint,
        stored_at_s=stored_times(results),
        target_gpu=hint if elsewhere else None,
    )
    if not axes:  # the knobs a deployment is usually changed by, said on the output
        axes = default_axes(scenario)
        source += "; variants: the default grid --vary " + " ".join(f"{n}={','.join(v)}" for n, v in axes)
    report = compare(ctx, vary_grid(axes))
    if args.json:
        print(json.dumps(report_dict(report, source), indent=1, allow_nan=False))
    else:
        sys.stdout.write(fit_text(report_text(report, source, axes)))
    return 0


# --- results -----------------------------------------------------------------------------------------------


def _results(args: argparse.Namespace) -> tuple[list[ProbeResult], str]:
    """The results to predict from and where they came from, in words."""
    from decodetop.probes.results import load_results

    if args.results:
        return list(load_results(args.results)), f"the results in {args.results}"
    found, where = stored_results(args)
    if not found:
        raise UserInputError(
            "no probe results to predict from: none stored for this host and this model; run decodetop probe "
            "--model M --budget --json FILE (its plan measures the curves) and pass --results FILE"
        )
    return found, where


def stored_results(args: argparse.Namespace) -> tuple[list[ProbeResult], str]:
    """The newest stored results of this host for the current scenario, else for any scenario of this model."""
    from decodetop.history import KIND_PROBE, History, HistoryUnavailableError, local_host_id
    from decodetop.probes.results import ProbeResult

    scenario = scenario_from_args(args, None, default_model=DEFAULT_MODEL)
    try:
        entries = [e for e in History().entries if e.kind == KIND_PROBE and e.fingerprint is not None]
    except HistoryUnavailableError:
        return [], ""
    mine = [e for e in entries if e.fingerprint is not None and e.fingerprint.host_id == local_host_id()]
    model = f"model={scenario.source.ref};"
    for exact, where in (
        (True, "stored results of this host for this scenario"),
        (False, "stored results of this host for another scenario of this model"),
    ):
        newest: dict[str, Any] = {}
        for e in mine:
            fp = e.fingerprint
            if fp is None or not (fp.scenario == scenario.fingerprint_id if exact else fp.scenario.startswith(model)):
                continue
            if e.key not in newest or e.recorded_at_s >= newest[e.key][0]:
                newest[e.key] = (e.recorded_at_s, e.payload)
        if newest:
            return [ProbeResult.from_dict(p) for _t, p in newest.values()], where
    return [], ""


# --- output ------------------------------------------------------------------------------------------------


def _ms(value: float | None) -> str:
    return format_number(value) if value is not None else "-"


def _row(v: Variant, now: Variant) -> list[object]:
    """One variant's row of the table."""
    if v.budget is None:
        return [v.label, "-", "-", "-", "-", "-", "-", "-", v.refused]
    rng = v.range_ms
    delta = "-"
    if v.step_ms is not None and now.step_ms and v is not now:
        delta = f"{(v.step_ms / now.step_ms - 1) * 100:+.0f} %"
    tps, total = v.tokens_per_s, v.tokens_per_s_total
    label = v.budget.weakest or "measured"
    if not v.fits:
        label = f"{v.fit_text}; {label}"
    return [
        v.label,
        _ms(v.step_ms) if v.step_ms is not None else f"≥ {_ms(v.budget.total_ms)}",
        f"{_ms(rng[0])}–{_ms(rng[1])}" if rng else "-",
        _ms(v.calibrated_ms),
        format_number(tps) if tps else "-",
        format_number(total) if total else "-",
        v.limiting,
        delta,
        label,
    ]


def report_text(report: WhatIf, source: str, axes: Sequence[tuple[str, Sequence[str]]]) -> str:
    """The what-if as text: the current deployment, the table of variants, the target, the accept-length line."""
    now = report.now
    assert now.scenario is not None and now.budget is not None
    b = now.budget
    lines = [f"What-if: {now.scenario.describe()}", f"predicted from {source}"]
    if b.header:
        lines.append(b.header)
    lines.append(report.calibration.text if report.calibration is not None else report.calibration_note)
    headers = ["variant", "step ms", "80 % range", "calibrated", "tok/s/seq", "tok/s total", "limited by", "Δ"]
    rows = [_row(now, now), *(_row(v, now) for v in report.variants)]
    lines.append(table([*headers, "weakest figure"], rows, align="lrrrrrlrl"))
    if any(name == "accept" for name, _ in axes):
        lines.extend(accept_lines(report))
    lines.extend(target_lines(report))
    check = next((v.budget.self_check for v in (now, *report.variants) if v.budget and v.budget.self_check), None)
    if check is not None and check.lines():
        lines.append("self-check (leave-one-out on this host's curves): " + "; ".join(check.lines()))
    return "\n".join(lines) + "\n"


def target_lines(report: WhatIf) -> list[str]:
    """Which variants reach the target tok/s per sequence, best first, and why the others do not."""
    if not report.variants:
        return []
    ok, not_ok = report.reaching()
    target = f"{report.target_tps:g} tok/s per sequence"
    lines = [
        f"reach {target}: " + (", ".join(f"{v.label} ({format_number(v.tokens_per_s or 0)})" for v in ok) or "none")
    ]
    lines.extend(f"  {v.label}: {why}" for v, why in not_ok)
    return lines


def accept_lines(report: WhatIf) -> list[str]:
    """tok/s per sequence over the accept length, one line per setting of the other knobs."""
    lines: dict[str, list[str]] = {}
    for v in report.variants:
        if "accept" not in v.knobs:
            continue
        rest = " ".join(f"{k}={x}" for k, x in v.knobs.items() if k != "accept") or "now"
        tps = v.tokens_per_s
        lines.setdefault(rest, []).append(f"{v.knobs['accept']} → {format_number(tps) if tps else '-'}")
    return [f"tok/s per sequence over the accept length ({rest}): " + ", ".join(parts) for rest, parts in lines.items()]


def variant_dict(v: Variant) -> dict[str, Any]:
    """One variant as JSON."""
    rng = v.range_ms
    return {
        "knobs": dict(v.knobs),
        "label": v.label,
        "refused": v.refused,
        "scenario": v.scenario.fingerprint_id if v.scenario is not None else None,
        "step_ms": v.step_ms,
        "range_ms": list(rng) if rng else None,
        "compute_range_ms": list(v.compute_range_ms) if v.compute_range_ms else None,
        "calibrated_ms": v.calibrated_ms,
        "tokens_per_s": v.tokens_per_s,
        "tokens_per_s_total": v.tokens_per_s_total,
        "limiting": v.limiting,
        "fits": v.fits,
        "fit_text": v.fit_text,
        "budget": v.budget.to_dict() if v.budget is not None else None,
    }


def report_dict(report: WhatIf, source: str) -> dict[str, Any]:
    """The what-if as JSON."""
    ok, not_ok = report.reaching()
    return {
        "source": source,
        "now": variant_dict(report.now),
        "variants": [variant_dict(v) for v in report.variants],
        "calibration": report.calibration.to_dict() if report.calibration is not None else None,
        "calibration_note": report.calibration_note,
        "target_tps": report.target_tps,
        "reaching": [v.label for v in ok],
        "not_reaching": [{"variant": v.label, "why": why} for v, why in not_ok],
    }
