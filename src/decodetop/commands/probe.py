"""Provides `decodetop probe`: run probes on every GPU (or on CPU ranks), print tables, write JSON.

Module level imports nothing heavy: torch is only imported by the spawned ranks, or by this process itself under
`--launcher torchrun` (where this process *is* a rank).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TextIO

from decodetop.argtypes import check_cpu_ranks, output_path, positive_int
from decodetop.atomic import write_text_atomic
from decodetop.budget.diff import (
    BudgetIdentity,
    diff_budgets,
    find_budget,
    format_budget_diff,
    load_budget_document,
    not_comparable,
    not_comparable_line,
)
from decodetop.budget.inventory import StepInventory
from decodetop.budget.plan import build_plan
from decodetop.commands._scenario_args import (
    add_gpus_argument,
    add_scenario_arguments,
    gpus_from_args,
    observed_from_args,
    scenario_from_args,
    target_from_args,
)
from decodetop.errors import UserInputError
from decodetop.quantity import TIMEOUT_S
from decodetop.textfmt import fit_text, parse_size

if TYPE_CHECKING:
    from decodetop.pipeline.gpu_guard import GpuGuard
    from decodetop.pipeline.plan_runner import PlanRun
    from decodetop.probes.controller import GroupLayout
    from decodetop.probes.protocol import Progress
    from decodetop.probes.registry import ProbeRegistry
    from decodetop.probes.results import ProbeResult

MiB = 1024 * 1024


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register this command's flags."""
    parser.add_argument("names", nargs="*", metavar="NAME", help="probes to run (default: all); e.g. allreduce launch")
    parser.add_argument(
        "--json", type=output_path, metavar="PATH", help="write full results as JSON to PATH ('-' for stdout)"
    )
    add_gpus_argument(parser)
    parser.add_argument(
        "--cpu-ranks", type=positive_int, metavar="N", help="CPU ranks (gloo) where there is no GPU (default 2)"
    )
    parser.add_argument(
        "--device", choices=("auto", "cpu", "cuda"), default="auto", help="force CPU ranks or GPUs (default auto)"
    )
    parser.add_argument("--sizes", metavar="LIST", help="all-reduce sizes replacing the default sweep, e.g. 8,4K,1M")
    parser.add_argument("--add-sizes", metavar="LIST", help="all-reduce sizes added to the sweep, e.g. 12K,96K")
    parser.add_argument(
        "--timeout", type=TIMEOUT_S.arg, metavar="S", help="deadline per probe in seconds (default per probe)"
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="PROBE.KEY=VALUE",
        help="override a probe parameter (VALUE as JSON, or a comma list), e.g. allreduce.samples=10",
    )
    parser.add_argument("--force", action="store_true", help="probe GPUs even where other processes hold memory")
    parser.add_argument(
        "--launcher",
        choices=("spawn", "torchrun"),
        default="spawn",
        help="spawn ranks here (default), or be one rank under torchrun (env:// rendezvous)",
    )
    parser.add_argument("--list", action="store_true", help="list the probes and their default parameters, then exit")
    plan = parser.add_argument_group("model plan: measure a model's decode step at its exact shapes")
    add_scenario_arguments(plan)
    plan.add_argument("--budget", action="store_true", help="print the composed per-step budget")
    plan.add_argument(
        "--baseline",
        metavar="PATH",
        help="an earlier --json output with a budget: after the budget, show which component moved since",
    )


def parse_size_list(text: str, flag: str) -> list[int]:
    """'8,4K,1M' → [8, 4096, 1048576]; one-line UserInputError naming the flag otherwise."""
    items = [p.strip() for p in text.split(",") if p.strip()]
    if not items:
        raise UserInputError(f"{flag}: no sizes given")
    sizes = []
    for item in items:
        try:
            sizes.append(parse_size(item))
        except ValueError as exc:
            raise UserInputError(f"{flag}: {exc}") from None
    return sizes


def _parse_value(raw: str) -> Any:
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        pass
    if "," in raw:
        return [_parse_value(p.strip()) for p in raw.split(",") if p.strip()]
    return raw


def collect_params(args: argparse.Namespace, names: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Per-probe parameter overrides from --sizes, --add-sizes and --set."""
    params: dict[str, dict[str, Any]] = {n: {} for n in names}
    if args.sizes:
        params.setdefault("allreduce", {})["sizes"] = parse_size_list(args.sizes, "--sizes")
    if args.add_sizes:
        params.setdefault("allreduce", {})["extra_sizes"] = parse_size_list(args.add_sizes, "--add-sizes")
    for item in args.set:
        key, sep, raw = item.partition("=")
        probe, dot, name = key.partition(".")
        if not sep or not dot or not probe or not name:
            raise UserInputError(f"--set {item!r}: expected PROBE.KEY=VALUE")
        if name.endswith(("_bytes", "sizes")):
            sizes = parse_size_list(raw, f"--set {key}")
            params.setdefault(probe, {})[name] = sizes if name.endswith("sizes") else sizes[0]
        else:
            params.setdefault(probe, {})[name] = _parse_value(raw)
    return params


def _progress_printer(stream: TextIO) -> Callable[[Progress], None]:
    def show(progress: Progress) -> None:
        print(f"decodetop probe: {progress.line()}", file=stream, flush=True)

    return show


def run(args: argparse.Namespace) -> int:
    """Run the command."""
    from decodetop.probes.registry import ProbeRegistry

    if args.model is not None or args.config is not None:
        return run_plan_from_args(args)
    if args.baseline:
        raise UserInputError(
            "--baseline needs --model or --config (a model's plan run composes the budget it compares)"
        )
    registry = ProbeRegistry()
    if args.list:
        for spec in registry.specs():
            print(f"{spec.name:10s} {spec.description} (deadline {spec.default_timeout_s:g} s)")
        return 0
    names = list(args.names) or registry.names()
    specs = [registry.get(n) for n in names]
    params = collect_params(args, names)
    for probe in params:
        if probe not in names and probe not in registry:
            registry.get(probe)  # raises: unknown probe
    for spec in specs:
        spec.resolve_params(params.get(spec.name))  # bad parameters fail before anything is spawned
    if args.timeout is not None and args.timeout <= 0:
        raise UserInputError(f"--timeout must be positive, got {args.timeout:g}")
    check_cpu_ranks(args.cpu_ranks, force=args.force)
    gpus = list(g) if (g := gpus_from_args(args)) is not None else None
    if args.launcher == "torchrun":
        from decodetop.probes.worker.torchrun import run_under_torchrun

        results = run_under_torchrun(
            names, params, registry=registry, progress=_progress_printer(sys.stderr), device=args.device
        )
        if results is None:  # not rank 0: rank 0 prints and writes
            return 0
        return _report(results, args)
    return _run_spawned(args, names, params, gpus, registry)


def _run_spawned(
    args: argparse.Namespace,
    names: Sequence[str],
    params: dict[str, dict[str, Any]],
    gpus: list[int] | None,
    registry: ProbeRegistry,
) -> int:
    from decodetop.pipeline.plan_runner import PlanRunner
    from decodetop.probes.controller import ProbeController, resolve_layout

    layout = resolve_layout(gpus, args.cpu_ranks, args.device)
    guard = _gpu_guard(layout, force=args.force)  # a GPU others use is refused before any rank spawns
    where = f"{layout.world_size} GPU rank(s)" if layout.kind == "cuda" else f"{layout.world_size} CPU rank(s), gloo"
    print(f"decodetop probe: starting {where}", file=sys.stderr, flush=True)
    results = []
    show = _progress_printer(sys.stderr)
    with ProbeController(layout=layout, registry=registry) as controller:
        runner = PlanRunner(lambda: controller, guard=guard, registry=registry, timeout_s=args.timeout)
        for name in names:
            print(f"decodetop probe: {name} ...", file=sys.stderr, flush=True)
            result = runner.run(name, params.get(name), on_progress=show)
            results.append(result)
            if args.json != "-":
                _print_one(result, registry)
    return _report(results, args, printed=args.json != "-")


def _gpu_guard(layout: GroupLayout, *, force: bool) -> GpuGuard | None:
    """The busy-GPU guard of a GPU group (None for CPU ranks), after its first look: other processes holding the
    group's GPUs refuse the run (exit 2) unless --force."""
    from decodetop.pipeline.gpu_guard import GpuGuard

    if layout.kind != "cuda":
        return None
    guard = GpuGuard(lambda: layout.gpus, forced=force)
    guard.check()
    return guard


def _print_one(result: ProbeResult, registry: ProbeRegistry) -> None:
    from decodetop.probes.report import format_result

    spec = registry.get(result.probe)
    print(format_result(result, spec.table_columns), flush=True)
    print(flush=True)
    if result.traceback:
        print(f"decodetop probe: {result.probe} traceback (rank {result.error_rank}):", file=sys.stderr)
        print(result.traceback.rstrip(), file=sys.stderr, flush=True)


def _report(results: Sequence[ProbeResult], args: argparse.Namespace, printed: bool = False) -> int:
    from pathlib import Path

    from decodetop.probes.registry import ProbeRegistry
    from decodetop.probes.results import ProbeStatus, results_to_json

    if not printed and args.json != "-":
        registry = ProbeRegistry()
        for result in results:
            _print_one(result, registry)
    if args.json:
        text = results_to_json(results)
        if args.json == "-":
            sys.stdout.write(text)
        else:
            write_text_atomic(Path(args.json), text)
            print(f"decodetop probe: wrote {args.json}", file=sys.stderr)
    bad = [r for r in results if r.status in (ProbeStatus.FAILED, ProbeStatus.TIMED_OUT)]
    return 1 if bad else 0


def run_plan_from_args(args: argparse.Namespace) -> int:
    """`decodetop probe --model NAME|--config PATH [--tp N] [--budget] [--baseline PATH] [--json PATH]`: run the
    plan on a spawned group, print each probe's table (and the budget with --budget; the per-component diff
    against an earlier --json output with --baseline), write JSON. Progress goes to stderr as
    'probe i/n NAME: key j/m …'. Exit 1 when a probe failed or timed out."""
    from decodetop.pipeline.context import BudgetContext
    from decodetop.pipeline.plan_runner import PlanProgress, PlanRunner, run_model_plan
    from decodetop.probes.controller import ProbeController, resolve_layout
    from decodetop.probes.plan_hooks import plan_requests
    from decodetop.probes.registry import ProbeRegistry
    from decodetop.probes.results import ProbeStatus

    observed = observed_from_args(args)
    target_tps = target_from_args(args)
    if args.timeout is not None and args.timeout <= 0:
        raise UserInputError(f"--timeout must be positive, got {args.timeout:g}")
    check_cpu_ranks(args.cpu_ranks, force=args.force)
    baseline_path = str(args.baseline or "")
    baseline = load_budget_document(baseline_path) if baseline_path else None  # a bad file fails before any probe
    gpus = gpus_from_args(args)
    layout = resolve_layout(list(gpus) if gpus is not None else None, args.cpu_ranks, args.device)
    label = "GPUs" if layout.kind == "cuda" else "CPU ranks"
    scenario = scenario_from_args(args, layout.world_size, group_label=label)
    inventory = scenario.inventory()
    if baseline is not None:  # what is known before any probe: the model, TP and device kind
        _refuse_incomparable(baseline, baseline_path, inventory, layout.kind)
    plan = build_plan(inventory)
    only = tuple(args.names or ())
    plan_requests(plan, inventory, world_size=layout.world_size, device_kind=layout.kind, only=only)  # checks names
    guard = _gpu_guard(layout, force=args.force)
    where = f"{layout.world_size} GPU rank(s)" if layout.kind == "cuda" else f"{layout.world_size} CPU rank(s), gloo"
    quiet = args.json == "-"
    print(
        f"decodetop probe: {scenario.describe()}: {len(plan.key_ids())} measurements on {where}",
        file=sys.stderr,
        flush=True,
    )
    registry = ProbeRegistry()

    def progress(p: PlanProgress) -> None:
        print(f"decodetop probe: {p.line()}", file=sys.stderr, flush=True)

    show = _result_printer(registry, quiet=quiet)
    ctx = BudgetContext(scenario, observed=observed, target_tps=target_tps, plan=plan)
    with ProbeController(layout=layout, registry=registry) as controller:
        runner = PlanRunner(
            lambda: controller, guard=guard, registry=registry, on_result=[show], timeout_s=args.timeout
        )
        run = run_model_plan(
            runner, ctx, world_size=layout.world_size, device_kind=layout.kind, only=only, on_progress=progress
        )
    if not quiet:
        _print_budget(run, full=bool(args.budget))
    diff_doc = _baseline_diff(run, baseline, baseline_path, quiet=quiet) if baseline is not None else None
    if args.json:
        _write_plan_json(run, diff_doc, args.json)
    bad = [r for r in run.results if r.status in (ProbeStatus.FAILED, ProbeStatus.TIMED_OUT)]
    if diff_doc is not None and not diff_doc["comparable"]:  # the hardware, known once the ranks ran
        return UserInputError.exit_code
    return 1 if bad else 0


def _refuse_incomparable(
    baseline: Mapping[str, Any], baseline_path: str, inventory: StepInventory, device_kind: str
) -> None:
    """--baseline of another model, TP or device kind: one line before any probe runs (exit 2)."""
    planned = BudgetIdentity(inventory.spec.name, inventory.deployment.tp, "", device_kind)
    differs = not_comparable(BudgetIdentity.of(find_budget(baseline, baseline_path)), planned)
    if differs:
        raise UserInputError(f"--baseline {baseline_path}: {not_comparable_line(differs)}")


def _result_printer(registry: ProbeRegistry, *, quiet: bool) -> Callable[[ProbeResult], None]:
    """Prints each probe's result as it comes: a failed rank's traceback to stderr, and (unless quiet) its table."""
    from decodetop.probes.report import format_result

    def show(result: ProbeResult) -> None:
        if result.traceback:
            print(f"decodetop probe: {result.probe} traceback (rank {result.error_rank}):", file=sys.stderr)
            print(result.traceback.rstrip(), file=sys.stderr, flush=True)
        if not quiet:
            spec_ = registry.get(result.probe)
            print(format_result(result, spec_.table_columns), flush=True)
            print(flush=True)

    return show


def _print_budget(run: PlanRun, *, full: bool) -> None:
    """The composed budget: all of it with --budget, else one line of its total."""
    from decodetop.pipeline.plan_report import format_budget

    if full:
        sys.stdout.write(fit_text(format_budget(run)))  # tables fit already; long notes wrap to the terminal
        return
    b = run.budget
    print(
        f"composed {b.total_ms:.3g} ms/step of observed {b.observed_step.text} "
        f"({'complete' if b.complete else 'missing: ' + ', '.join(b.missing)}); --budget shows the breakdown"
    )


def _baseline_diff(run: PlanRun, baseline: Mapping[str, Any], baseline_path: str, *, quiet: bool) -> dict[str, Any]:
    """The per-component diff of this run's budget against --baseline's, printed unless quiet; its JSON document."""
    diff = diff_budgets(baseline, run.budget.to_dict(), baseline_name=baseline_path, current_name="this run")
    if not quiet:
        print()
        sys.stdout.write(fit_text(format_budget_diff(diff, baseline_path)))
    return {"baseline_path": baseline_path, **diff.to_dict()}


def _write_plan_json(run: PlanRun, diff_doc: dict[str, Any] | None, destination: str) -> None:
    """The run as JSON to stdout (`-`) or atomically to a file."""
    from pathlib import Path

    from decodetop.pipeline.plan_report import plan_run_to_json

    text = plan_run_to_json(run, diff_doc)
    if destination == "-":
        sys.stdout.write(text)
    else:
        write_text_atomic(Path(destination), text)
        print(f"decodetop probe: wrote {destination}", file=sys.stderr)
