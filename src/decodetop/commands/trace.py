"""Provides `decodetop trace`: attribute a serving engine's profiler trace (a file, or one captured from a live
SGLang/vLLM server) to the budget's components, and set it beside the probe-composed budget.

    decodetop trace FILE [--model NAME | --config PATH | --budget BUDGET.json] [--results PATH] [--tp N] [--json]
    decodetop trace --server URL [--steps N] [--output-dir DIR | --trace-dir DIR] [--engine auto|sglang|vllm]

With --model or --config the budget is the one every surface composes (`decodetop.pipeline.composition.compose`):
the same scenario flags and defaults as `decodetop budget` (TP: --tp, else the ranks the results ran on, else the
ranks the trace holds; the launch mode: --launch-mode, else the trace's), measured where `--results` holds probe
results, roofline estimates elsewhere; the trace's decode steps are its observed step (the one rule:
`decodetop.pipeline.observed`).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from decodetop.argtypes import positive_int, server_url
from decodetop.budget.components import Component
from decodetop.budget.compose import Budget, ObservedStep
from decodetop.budget.gpus import GPUS, find_gpu
from decodetop.commands._scenario_args import add_scenario_arguments, flags_from_args
from decodetop.errors import UserInputError
from decodetop.quantity import TIMEOUT_S
from decodetop.textfmt import fit_text, format_duration_us, shorten, table

if TYPE_CHECKING:
    # types only: the trace readers and analysis load at run time, so decodetop --help stays light
    from decodetop.traces.capture import CaptureResult
    from decodetop.traces.mismatch import ModelShape
    from decodetop.traces.ranks import TraceSet
    from decodetop.traces.trace_report import BucketTime, Comparison, TraceReport
    from decodetop.traces.traced import TracedView


TRACE_HELPS = {
    "tp": "tensor-parallel degree (default: the ranks --results ran on, else the ranks the trace holds)",
    "launch_mode": "kernel launches (default: the trace's — eager where the GPU idles more than it works)",
}
"""The scenario flags whose defaults `trace` takes from the trace."""


@dataclass(frozen=True)
class _ModelBudget:
    """What --model/--config gives a trace: the model's budget on this deployment, what its step holds (for the
    mismatch check), its vocabulary and GEMM weight shapes (attribution hints), a note saying what the budget is, and
    its decoder layers."""

    budget: Budget
    shape: ModelShape
    vocab_size: int
    gemm_shapes: dict[tuple[int, int], Component]
    note: str
    layers: int


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register this command's flags."""
    parser.add_argument(
        "file", nargs="?", help="a PyTorch profiler trace (.json or .json.gz), or a directory of per-rank traces"
    )
    parser.add_argument(
        "--server", type=server_url, metavar="URL", help="capture a trace from a live SGLang/vLLM server instead"
    )
    parser.add_argument(
        "--steps", type=positive_int, default=5, help="decode steps to profile with --server (default 5)"
    )
    parser.add_argument("--engine", default="auto", choices=("auto", "sglang", "vllm"), help="server kind")
    parser.add_argument(
        "--output-dir",
        "--trace-dir",
        dest="output_dir",
        metavar="DIR",
        help="where the server writes traces (SGLang: sent as output_dir; vLLM: its VLLM_TORCH_PROFILER_DIR)",
    )
    parser.add_argument(
        "--timeout", type=TIMEOUT_S.arg, default=120.0, help="seconds to wait for the trace (default 120)"
    )
    parser.add_argument(
        "--duration", type=TIMEOUT_S.arg, default=3.0, help="vLLM: seconds between start and stop (default 3)"
    )
    src = parser.add_mutually_exclusive_group()
    src.add_argument("--budget", metavar="JSON", help="a budget JSON (decodetop budget --json, or {component: ms})")
    # the scenario flags every command shares (--model/--config beside --budget: one way to name the budget)
    add_scenario_arguments(parser, model_group=src, helps=TRACE_HELPS)
    parser.add_argument(
        "--results",
        metavar="PATH",
        help="compose the --model/--config budget from the probe results in PATH (a decodetop probe --json file) "
        "instead of roofline estimates alone; TP defaults to the ranks those results ran on",
    )
    parser.add_argument("--gpu", metavar="NAME", help="GPU row for the budget's roofline (default: from the trace)")
    parser.add_argument("--device", type=int, help="GPU index inside the trace (default: the busiest)")
    parser.add_argument("--vocab-size", type=int, help="vocabulary size: GEMMs with this dimension are lm_head")
    parser.add_argument("--rules", metavar="JSON", help="a kernel-rules file replacing the built-in table")
    parser.add_argument(
        "--all-steps", action="store_true", help="keep steps whose kernel count differs from the usual (prefills)"
    )
    parser.add_argument("--top", type=int, default=15, help="top kernels to list (default 15)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")


def run(args: argparse.Namespace) -> int:
    """Run the command."""
    from decodetop.traces.compare import budget_ms, budget_sources, compare, load_budget_json
    from decodetop.traces.mismatch import mismatch_line, trace_mismatches
    from decodetop.traces.traced import traced_view

    if bool(args.file) == bool(args.server):
        raise UserInputError("trace: give a trace FILE or --server URL (one of them)")
    if args.top < 1:
        raise UserInputError(f"--top: {args.top} must be at least 1")
    if args.results and not (args.model or args.config):
        raise UserInputError("--results: give --model or --config too (the budget they compose is the model's)")
    file_budget = load_budget_json(args.budget) if args.budget else None  # a bad file fails before any capture
    captured = _capture(args) if args.server else None
    traces, model = _read_traces(args, captured)
    report = traces.report
    budget: Budget | Mapping[str, object] | None = model.budget if model is not None else file_budget
    budget_note = model.note if model is not None else f"budget from {args.budget}" if args.budget else ""
    mismatches = trace_mismatches(traces, model.shape) if model is not None else ()
    sources = budget_sources(budget) if budget is not None else None
    comparison = compare(report, budget, sources) if budget is not None else None
    observed = _observed(args, report, model)
    view = traced_view(
        traces,
        budget_ms(budget) if budget is not None else None,
        observed_ms=observed.ms if budget is not None else None,
        layers=model.layers if model is not None else None,
        observed_is_trace=observed.source == "trace",
        sources=sources,
        mismatch=mismatch_line(model.shape, mismatches) if model is not None else "",
    )
    if not args.json:
        sys.stdout.write(fit_text(render_text(report, comparison, budget_note, view, observed.text)))  # lines wrap
        return 0
    out: dict[str, Any] = {"trace": report.to_json(), "traced": _view_json(view), "ranks": _ranks_json(traces)}
    out["observed"] = observed.to_dict()
    if model is not None:
        out["mismatch"] = {"line": view.mismatch, "found": [{"what": m.what, "text": m.text} for m in mismatches]}
    if comparison is not None:
        out["comparison"] = comparison.to_json()
        out["budget_source"] = budget_note
    if model is not None:  # the model's budget, as `decodetop budget --json` prints it
        out["budget"] = model.budget.to_dict()
    if captured is not None:
        out["captured"] = {"path": str(captured.path), "engine": captured.engine}
    print(json.dumps(finite(out), indent=1, allow_nan=False))
    return 0


def _observed(args: argparse.Namespace, report: TraceReport, model: _ModelBudget | None) -> ObservedStep:
    """The observed step by the one rule (`decodetop.pipeline.observed`): the model's budget's (--observed-ms, else
    the trace's decode steps); beside a --budget file or no budget, the same rule over the trace. The default, said
    as assumed, only where the trace holds no decode step."""
    if model is not None:
        return model.budget.observed_step
    from decodetop.pipeline.observed import observed_step, trace_written_s, traced_step

    traced = traced_step(report, written_s=trace_written_s(report.path))
    return observed_step(flag_ms=flags_from_args(args).observed_flag_ms(), trace=traced, now_s=time.time())


def _read_traces(args: argparse.Namespace, captured: CaptureResult | None) -> tuple[TraceSet, _ModelBudget | None]:
    """Every rank's file read and attributed; with --model/--config, the model's budget (the first rank's is every
    rank's: same model, same deployment) and its GEMM shapes and vocabulary as attribution hints."""
    from decodetop.traces.analysis import analyze
    from decodetop.traces.classify import load_rules
    from decodetop.traces.ranks import load_traces, trace_files
    from decodetop.traces.reader import read_trace

    options = {"rules": load_rules(args.rules), "device": args.device, "top_n": args.top, "all_steps": args.all_steps}
    path = Path(str(captured.path) if captured is not None else args.file)
    files = [path, *captured.other_files] if captured is not None else path  # every rank's file
    n_ranks = len(files) if isinstance(files, list) else len(trace_files(path))
    model: list[_ModelBudget] = []

    def analyze_file(file: Path) -> TraceReport:
        trace = read_trace(file)
        report = analyze(trace, vocab_size=args.vocab_size, **options)
        if args.model or args.config:
            model[:] = model or [_budget_for(args, report, n_ranks=n_ranks)]
            found = model[0]
            # GEMMs without context: the model's weight shapes, then its vocabulary, decide
            report = analyze(
                trace, vocab_size=args.vocab_size or found.vocab_size, gemm_shapes=found.gemm_shapes, **options
            )
        return report

    return load_traces(files, analyze_file), (model[0] if model else None)


def _capture(args: argparse.Namespace) -> CaptureResult:
    """A trace from the live --server (every rank's file), said on stderr."""
    from decodetop.traces.capture import capture

    captured = capture(
        args.server,
        steps=args.steps,
        output_dir=args.output_dir,
        engine=args.engine,
        timeout_s=args.timeout,
        duration_s=args.duration,
    )
    print(
        f"captured {captured.path} from {args.server} ({captured.engine}, {captured.waited_s:.1f} s)", file=sys.stderr
    )
    return captured


def finite(value: Any) -> Any:
    """`value` with every NaN or infinite float replaced by None, so the JSON printed is valid JSON."""
    import math

    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


def _view_json(view: TracedView) -> dict[str, Any]:
    from dataclasses import asdict

    data = asdict(view)
    data["header"] = view.header()
    data["accounted_ms"] = view.accounted_ms
    data["unexplained_ms"] = view.unexplained_ms
    return data


def _ranks_json(traces: TraceSet) -> dict[str, Any]:
    from dataclasses import asdict

    return {
        "ranks": [asdict(r) for r in traces.ranks],
        "spread_ms": traces.spread_ms,
        "standing_out": list(traces.standing_out),
    }


def _budget_for(args: argparse.Namespace, report: TraceReport, *, n_ranks: int) -> _ModelBudget:
    """The model's budget on this deployment by the one composition (`decodetop.pipeline.composition.compose`,
    module docstring), with its vocabulary, the GEMM weight shapes of its inventory, a note and its decoder
    layers."""
    from decodetop.pipeline.composition import compose, stored_times
    from decodetop.pipeline.context import BudgetContext, gpu_hint
    from decodetop.pipeline.observed import observed_step, trace_written_s, traced_step
    from decodetop.probes.results import load_results
    from decodetop.traces.analysis import gemm_shapes_from_inventory
    from decodetop.traces.mismatch import ModelShape

    results = list(load_results(args.results)) if args.results else []
    env = next((r.environment for r in results if r.environment is not None), None)
    if env is not None:
        group = (env.world_size, "GPUs" if env.device_kind == "cuda" else "CPU ranks", "the results ran on")
    else:
        group = (n_ranks, "ranks", "the trace holds")
    mode = "eager" if report.gpu_idle_us_mean > report.gpu_busy_us_mean else "graph"  # under --launch-mode
    flags = flags_from_args(args)
    scenario = flags.scenario(group[0], group_label=group[1], group_where=group[2], defaults={"launch_mode": mode})
    seen = report.gpu_name if report.gpu_name and find_gpu(report.gpu_name) is not None else None
    if args.gpu is None and seen is None and env is None:
        raise UserInputError(
            f"the trace does not name a known GPU ({report.gpu_name or 'no deviceProperties'}): pass --gpu "
            f"({', '.join(GPUS)}) for the budget's roofline"
        )
    now = time.time()
    traced = traced_step(report, written_s=trace_written_s(report.path))
    ctx = BudgetContext(
        scenario,
        results,
        observed=observed_step(flag_ms=flags.observed_flag_ms(), trace=traced, now_s=now),
        target_tps=flags.target_tps_or_default(),
        gpu=gpu_hint(named=args.gpu, seen=seen, seen_how="named by the trace"),
        stored_at_s=stored_times(results),
        now_s=now,
    )
    budget = compose(ctx).budget
    inv = scenario.inventory()
    where = f"{scenario.deployment.describe(scenario.spec)}) on {budget.hardware_text}"
    how = f"{budget.summary()}, from {args.results}" if results else "roofline-estimated; run probes for measured"
    note = f"budget of {scenario.spec.name} ({where}: {how}"
    spec = scenario.spec
    shape = ModelShape.of(inv)
    return _ModelBudget(budget, shape, spec.vocab_size, gemm_shapes_from_inventory(inv.ops), note, spec.n_layers)


def render_text(
    report: TraceReport,
    comparison: Comparison | None = None,
    budget_note: str = "",
    view: TracedView | None = None,
    observed: str = "",
) -> str:
    """The headless report: steps, per-component bar, top kernels, the comparison when there is one, and the
    traced bar as the live UI shows it (the same `traced_view`); `observed` is the observed step in words."""
    from decodetop.traces.compare import VIA_CHARS, short_name
    from decodetop.traces.trace_report import LAUNCH_KEY

    lines: list[str] = []
    add = lines.append
    add(f"trace    {report.path}  ({report.events_total} events, {report.source}, {report.device})")
    if view is not None and view.mismatch:
        add(f"mismatch {view.mismatch}")
    add(f"steps    {len(report.steps)} decode steps; segmentation: {report.segmentation}")
    busy, idle = report.gpu_busy_us_mean, report.gpu_idle_us_mean
    frac = idle / (busy + idle) if busy + idle else 0.0
    add(
        f"per step {format_duration_us(report.step_wall_us_mean)} wall, GPU busy {format_duration_us(busy)}, "
        f"GPU idle inside the step {format_duration_us(idle)} ({frac:.0%}: host overhead), "
        f"{report.kernels_per_step_mean:.0f} kernels"
    )
    if comparison is not None and observed:
        add(f"observed {observed}")
    add("")
    add("per component, per step")
    rows: list[tuple[object, ...]] = [
        (b.label, b.time_us_per_step / 1000, f"{b.share:.0%}", round(b.kernels_per_step, 1), _top(b, short_name))
        for b in report.buckets
    ]
    rows.append(("GPU idle in step (host-bound) → launch", idle / 1000, "-", "-", "gaps between kernels"))
    add(table(("component", "ms", "share", "kernels", "largest kernel (via)"), rows, align="lrrrl"))
    add("")
    add(f"top {len(report.top_kernels)} kernels")
    krows = [
        (
            i + 1,
            short_name(k.name, 56),
            k.bucket,
            round(k.count_per_step, 1),
            k.mean_us,
            k.time_us_per_step,
            f"{k.share:.0%}",
            shorten(k.via, VIA_CHARS) if k.via else "-",
        )
        for i, k in enumerate(report.top_kernels)
    ]
    add(table(("#", "kernel", "component", "n/step", "mean µs", "µs/step", "share", "via"), krows))
    if report.unclassified_names:
        add("")
        add("unclassified kernels (no rule matched; add one to traces/kernel_rules.json):")
        lines.extend(f"  {short_name(n, 100)}" for n in report.unclassified_names[:10])
    if report.notes:
        add("")
        lines.extend(f"note: {n}" for n in report.notes)
    if comparison is not None:
        add("")
        word = comparison.source
        add(f"{word} vs trace ({budget_note})" if budget_note else f"{word} vs trace")
        mixed = word == "budget"  # figures of several sources: each row says its own
        crow = [
            (r.label + (" (idle)" if r.key == LAUNCH_KEY else ""), r.probed_ms, r.traced_ms, r.delta_ms)
            + ((r.source or "-",) if mixed else ())
            for r in comparison.rows
        ]
        head = ("component", f"{word} ms", "traced ms", "Δ ms") + (("from",) if mixed else ())
        add(table(head, crow, align="lrrr" + ("l" if mixed else "")))
        add("")
        for r in sorted(comparison.rows, key=lambda r: -abs(r.delta_ms if r.delta_ms is not None else r.traced_ms)):
            add(f"  {r.finding}")
        lines.extend(f"note: {n}" for n in comparison.notes)
    if view is not None:
        lines.extend(["", *render_traced(view)])
    return "\n".join(lines) + "\n"


def render_traced(view: TracedView) -> list[str]:
    """The traced bar in text: header, per segment probed (should cost) / traced (does cost), the largest gap."""
    lines = [f"traced bar: {view.header()}"]
    rows = [
        (
            s.label,
            "-" if s.probed_ms is None else round(s.probed_ms, 4),
            round(s.traced_ms, 4),
            round(s.kernels_per_step, 1),
        )
        for s in view.segments
    ]
    cost = "should cost ms" + (f" ({view.budget_source})" if view.budget_source != "budget" else "")
    lines.append(table(("segment", cost, "does cost ms", "kernels"), rows, align="lrrr"))
    if view.gap_text:
        lines.append(f"largest gap: {view.gap_text}")
    lines.append(view.attribution_text)
    if view.ranks_text:
        lines.append(view.ranks_text)
    lines.extend(f"note: {n}" for n in view.notes)
    return lines


def _top(bucket: BucketTime, short_name: Callable[[str, int], str]) -> str:
    from decodetop.traces.compare import VIA_CHARS

    if not bucket.top:
        return ""
    k = bucket.top[0]
    return str(short_name(k.name, 52)) + (f" ({shorten(k.via, VIA_CHARS)})" if k.via else "")
