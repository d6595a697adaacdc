"""Provides `decodetop budget`: a model's decode-step inventory, roofline and (roofline-only) budget on a
deployment, with no GPU needed; `--diff OLD NEW` compares the budgets of two earlier `--json` outputs instead.
Imports neither torch nor textual; NVML is asked only for what the flags leave open (GPU count for --tp, the GPU's
name and memory bus for the bandwidth).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any

from decodetop.budget.diff import diff_budget_files, format_budget_diff
from decodetop.budget.inventory import StepInventory
from decodetop.budget.plan import ProbePlan, build_plan
from decodetop.budget.scenario import Scenario
from decodetop.budget.spec import preset_names
from decodetop.budget.text import format_budget_table
from decodetop.commands._scenario_args import (
    add_scenario_arguments,
    observed_from_args,
    scenario_from_args,
    target_from_args,
)
from decodetop.defaults import DEFAULT_MODEL
from decodetop.errors import UserInputError
from decodetop.textfmt import fit_text, format_bytes, format_number, reserved_columns, table

if TYPE_CHECKING:
    from decodetop.collectors.nvml import Nvml
    from decodetop.pipeline.composition import Composition


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register this command's flags."""
    add_scenario_arguments(parser, default_model=DEFAULT_MODEL)
    parser.add_argument(
        "--diff",
        nargs=2,
        metavar=("OLD", "NEW"),
        help="compare the budgets of two earlier --json outputs (decodetop probe --model M --json, decodetop budget "
        "--json) per component: which one moved beyond its noise; runs nothing",
    )
    parser.add_argument(
        "--results",
        metavar="PATH",
        help="compose from the probe results in PATH (a decodetop probe --json file) instead of roofline estimates "
        "alone; TP defaults to the ranks those results ran on",
    )
    parser.add_argument("--list-models", action="store_true", help="list the built-in presets and exit")
    parser.add_argument("--gpu", metavar="NAME", help="GPU table row: rtx-pro-6000, h100, h200, b200, a100, ...")
    parser.add_argument("--bandwidth-tbps", type=float, help="measured memory bandwidth, TB/s")
    parser.add_argument("--allreduce-us", type=float, help="measured small-message all-reduce latency, µs")
    parser.add_argument("--plan", action="store_true", help="also print the probe plan (the measurements needed)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")


class _GpuFacts:
    """What NVML says about this host, asked lazily and at most once."""

    def __init__(self) -> None:
        self._nvml: Nvml | None = None
        self._ready = False

    def _get(self) -> Nvml | None:
        if not self._ready:
            self._ready = True
            try:
                from decodetop.collectors.nvml import Nvml

                nvml = Nvml()
                self._nvml = nvml if nvml.available else None
            except Exception:  # no NVML is a normal state here
                self._nvml = None
        return self._nvml

    def count(self) -> int:
        nvml = self._get()
        return int(nvml.device_count()) if nvml is not None else 0

    def gpu0_name(self) -> str | None:
        """NVML's name of GPU 0, or None."""
        nvml = self._get()
        if nvml is None or nvml.device_count() < 1:
            return None
        from decodetop.collectors.nvml import GpuRef

        name = nvml.query("nvmlDeviceGetName", GpuRef(0))
        return name if isinstance(name, str) and name else None


def _positive(value: float | None, flag: str) -> None:
    if value is not None and not (0 < value < 1e6):
        raise UserInputError(f"{flag}: {value} must be a positive number")


def run(args: argparse.Namespace) -> int:
    """Run the command."""
    from decodetop.pipeline.composition import compose, stored_times
    from decodetop.pipeline.context import BudgetContext, gpu_hint
    from decodetop.probes.results import load_results

    if args.list_models:
        for name in preset_names():
            print(name)
        return 0
    if args.diff:
        if args.model is not None or args.config is not None or args.results is not None:
            raise UserInputError("--diff compares two files: give it without --model, --config or --results")
        return _diff(args.diff[0], args.diff[1], as_json=args.json)
    for value, flag in ((args.bandwidth_tbps, "--bandwidth-tbps"), (args.allreduce_us, "--allreduce-us")):
        _positive(value, flag)
    observed = observed_from_args(args)
    target_tps = target_from_args(args)
    results = list(load_results(args.results)) if args.results else []
    facts = _GpuFacts()
    env = next((r.environment for r in results if r.environment is not None), None)
    group_size: int | None = None
    if env is not None:
        group_size, label = env.world_size, ("GPUs" if env.device_kind == "cuda" else "CPU ranks")
        where = "the results ran on"
    else:
        count = facts.count() if args.tp is None else 0
        group_size, label, where = (count or None), "GPUs", "seen by NVML"
    scenario = scenario_from_args(args, group_size, group_label=label, group_where=where, default_model=DEFAULT_MODEL)
    seen = facts.gpu0_name() if args.gpu is None and env is None else None
    hint = gpu_hint(named=args.gpu, seen=seen, bandwidth_tbps=args.bandwidth_tbps, allreduce_us=args.allreduce_us)
    # results read from a file were measured earlier: each figure says when, where and on what
    ctx = BudgetContext(
        scenario, results, observed=observed, target_tps=target_tps, gpu=hint, stored_at_s=stored_times(results)
    )
    comp = compose(ctx)
    plan = build_plan(scenario.inventory()) if args.plan else None
    if args.json:
        print(json.dumps(_as_json(scenario, comp, plan=plan), indent=1, allow_nan=False))
    else:
        text = _as_text(scenario, comp, plan=plan)
        sys.stdout.write(fit_text(text))  # tables fit already; long notes wrap to the terminal
    return 0


def _diff(old: str, new: str, *, as_json: bool) -> int:
    """`decodetop budget --diff OLD NEW`: the per-component table (or JSON) and the component that moved most.

    Two budgets of different models, TP, hardware or device kinds are not comparable: one line saying what differs
    (the JSON says it under "not_comparable", with no component) and exit 2."""
    diff = diff_budget_files(old, new)
    if as_json:
        print(json.dumps({"baseline_path": old, "current_path": new, **diff.to_dict()}, indent=1, allow_nan=False))
    else:
        sys.stdout.write(fit_text(format_budget_diff(diff, old)))  # long notes wrap to the terminal
    return 0 if diff.comparable else UserInputError.exit_code


# --- output --------------------------------------------------------------------------------------------------


def _gb(n: float) -> str:
    return f"{n / 1e9:.3g} GB" if n >= 1e8 else f"{n / 1e6:.3g} MB"


def _roofline_json(comp: Composition) -> dict[str, Any] | None:
    roof = comp.roofline
    if roof is None:
        return None
    return {
        "gpu": roof.hardware.gpu_name,
        "hardware": comp.budget.hardware_text,
        "mem_bandwidth_gbps": roof.hardware.mem_bandwidth_gbps,
        "bandwidth_source": roof.hardware.bandwidth_source,
        "allreduce_latency_us": roof.hardware.allreduce_latency_us,
        "latency_source": roof.hardware.latency_source,
        "step_ms": roof.step_ms,
        "ms_per_token": roof.ms_per_token,
        "tokens_per_s": roof.tokens_per_s,
        "tokens_per_s_total": roof.tokens_per_s_total,
        "terms": [{"name": t.name, "ms": t.ms, "detail": t.detail} for t in roof.terms],
    }


def _as_json(scenario: Scenario, comp: Composition, *, plan: ProbePlan | None) -> dict[str, Any]:
    spec, inv = scenario.spec, scenario.inventory()
    dep = inv.deployment
    budget = comp.budget
    return {
        "model": {
            "name": spec.name,
            "model_type": spec.model_type,
            "source": spec.source,
            "params_total": spec.params_total,
            "params_active": spec.params_active,
            "params_embedding": spec.params_embedding,
            "params_lm_head": spec.params_lm_head,
            "quantization": spec.quant.describe(),
            "kv_cache_dims_per_token_per_layer": spec.kv_cache_dims,
        },
        "deployment": {
            "tp": dep.tp,
            "tp_source": scenario.tp_source,
            "scenario": scenario.fingerprint_id,
            "ep": dep.ep,
            "batch": dep.batch,
            "context_len": dep.context_len,
            "kv_dtype": inv.kv_dtype,
            "accept_length": dep.accept_length,
            "draft_tokens": dep.n_draft,
            "launch_mode": dep.launch_mode,
        },
        "per_gpu": {
            "resident_weight_bytes": inv.resident_weight_bytes,
            "weight_bytes_per_step": inv.weight_bytes,
            "kv_bytes_per_step": inv.kv_bytes,
            "bytes_per_token": (inv.weight_bytes + inv.kv_bytes) / inv.tokens_per_step,
            "flops_per_step": inv.flops,
            "kernels_per_step": inv.kernels,
            "all_reduce": {str(k): v for k, v in inv.collective_sizes("all_reduce").items()},
            "all_gather": {str(k): v for k, v in inv.collective_sizes("all_gather").items()},
        },
        "roofline": _roofline_json(comp),
        "budget": budget.to_dict(),
        "assumptions": list(inv.assumptions),
        "inventory": [
            {
                "name": op.name,
                "component": op.component.value,
                "kind": op.kind,
                "layers": op.layers,
                "count": op.count,
                "shape": op.shape,
                "dtype": op.dtype,
                "weight_bytes": op.weight_bytes,
                "kv_bytes": op.kv_bytes,
                "read_bytes": op.read_bytes,
                "write_bytes": op.write_bytes,
                "flops": op.flops,
                "kernels": op.kernels,
                "key": op.key.key_id,
            }
            for op in inv.ops
        ],
        **({"plan": plan.to_dict()} if plan is not None else {}),
    }


def _as_text(scenario: Scenario, comp: Composition, *, plan: ProbePlan | None) -> str:
    """The human report: the model and deployment, the roofline, the budget, the assumptions, the inventory by
    component and (with --plan) the probe plan."""
    inv = scenario.inventory()
    lines = _model_lines(scenario, comp)
    lines.append("")
    lines += _roofline_lines(comp)
    lines.append("")
    lines += _budget_lines(comp)
    lines.append("")
    lines.append("Assumptions")
    lines += [f"  - {a}" for a in inv.assumptions]
    lines.append("")
    lines += _inventory_lines(inv)
    if plan is not None:
        lines.append("")
        lines += _plan_lines(plan)
    return "\n".join(lines) + "\n"


def _model_lines(scenario: Scenario, comp: Composition) -> list[str]:
    """The model, its weights, the deployment and what the busiest GPU holds and reads per step."""
    spec, inv = scenario.spec, scenario.inventory()
    lines: list[str] = []
    add = lines.append
    add(f"{spec.name}  ({spec.model_type}; {spec.source})")
    add(
        f"  parameters   {spec.params_total / 1e9:.1f} B total, {spec.params_active / 1e9:.2f} B active per token "
        "(input embedding excluded, lm_head included)"
    )
    add(f"  weights      {spec.quant.describe()}")
    add(f"  deployment   {scenario.describe().split(', ', 1)[1]}")
    per_token = (inv.weight_bytes + inv.kv_bytes) / inv.tokens_per_step
    add(
        f"  busiest GPU  holds {_gb(inv.resident_weight_bytes)} of weights; reads {_gb(inv.weight_bytes)} weights + "
        f"{_gb(inv.kv_bytes)} KV per step = {_gb(per_token)} per token"
    )
    for warning in comp.budget.warnings:
        add(f"  warning      {warning}")
    ar = inv.collective_sizes("all_reduce")
    ag = inv.collective_sizes("all_gather")
    ar_text = ", ".join(f"{n} × {format_bytes(size)}" for size, n in sorted(ar.items())) or "none (TP 1)"
    per_layer = sum(op.count for op in inv.ops if op.kind == "all_reduce" and op.layers not in ("-",))
    add(
        f"  per step     {inv.kernels} kernels; all-reduces {ar_text} ({per_layer} in the layers"
        f"{' + 1 after the embedding' if ar else ''})"
        + (f"; all-gathers {', '.join(f'{n} × {format_bytes(s)}' for s, n in sorted(ag.items()))}" if ag else "")
    )
    return lines


def _roofline_lines(comp: Composition) -> list[str]:
    """The budget's header and the roofline's terms with where its bandwidth and latency come from."""
    roof, budget = comp.roofline, comp.budget
    lines: list[str] = []
    add = lines.append
    if budget.header:
        add(budget.header)
    if roof is None:
        add(f"Roofline: {budget.hardware_text}")
        return lines
    hw = roof.hardware
    add(
        f"Roofline on {budget.hardware_text}, {hw.mem_bandwidth_gbps:g} GB/s, all-reduce {hw.allreduce_latency_us:g} µs"
    )
    add(f"  bandwidth: {hw.bandwidth_source}")
    add(f"  latency:   {hw.latency_source}")
    rows = [[t.name, round(t.ms, 3), t.detail] for t in roof.terms]
    add(table(["term", "ms", "detail"], rows, indent=2))
    add(
        f"  = {format_number(roof.step_ms)} ms per step, {format_number(roof.ms_per_token)} ms per token, "
        f"{format_number(roof.tokens_per_s)} tok/s per sequence "
        f"({format_number(roof.tokens_per_s_total)} tok/s total)"
    )
    return lines


def _budget_lines(comp: Composition) -> list[str]:
    """The budget table (titled as estimates where nothing was measured) and its notes."""
    budget = comp.budget
    measured_any = any(seg.provenance_kind.startswith("measured") for seg in budget.segments)
    title = "Budget" if measured_any else "Budget (roofline estimates: no probe results)"
    with reserved_columns(2):  # the budget table is indented below
        budget_lines = format_budget_table(budget, bars=False)
    return [
        f"{title}, ms per step",
        _indent("\n".join(line for line in budget_lines if line not in (budget.header, *budget.warnings))),
        *(f"  note: {note}" for note in budget.notes),
    ]


def _inventory_lines(inv: StepInventory) -> list[str]:
    """The step's ops by component: per component its totals, then one table row per op."""
    lines = ["Inventory by component (busiest GPU, one decode step)"]
    for component, ops in inv.by_component().items():
        wsum = sum(op.total_weight_bytes for op in ops)
        ksum = sum(op.total_kernels for op in ops)
        lines.append(f"  {component.label}: {len(ops)} ops, {_gb(wsum)} weights, {ksum} kernels")
        orows = [
            [
                op.name,
                op.layers,
                op.count,
                op.shape,
                op.dtype,
                round(op.total_weight_bytes / 1e6, 2),
                round(op.total_kv_bytes / 1e6, 2),
                op.total_kernels,
            ]
            for op in ops
        ]
        lines.append(table(["op", "layers", "×", "shape", "dtype", "weights MB", "KV MB", "kernels"], orows, indent=4))
    return lines


def _plan_lines(plan: ProbePlan) -> list[str]:
    """The probe plan: each probe's distinct measurements and the ops that use each."""
    lines = [
        f"Probe plan: {len(plan.key_ids())} distinct measurements, {len(plan.gemm_sweeps)} GEMM sweeps, "
        f"{len(plan.allreduce_sweep_bytes)} all-reduce sizes"
    ]
    for probe, keys in plan.groups:
        lines.append(f"  {probe} ({len(keys)})")
        lines += [f"    {key.key_id}   ← {', '.join(plan.ops_using(key.key_id))}" for key in keys]
    return lines


def _indent(text: str, n: int = 2) -> str:
    return "\n".join(" " * n + line for line in text.splitlines())
