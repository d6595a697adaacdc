"""Provides `decodetop budget`: a model's decode-step inventory, roofline and (roofline-only) budget on a
deployment, with no GPU needed; `--diff OLD NEW` compares the budgets of two earlier `--json` outputs instead.
Imports neither torch nor textual; NVML is asked only for what the flags leave open (GPU count for --tp, the GPU's
name and memory bus for the bandwidth).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from typing import Any

from decodetop.errors import UserInputError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register this command's flags."""
    src = parser.add_mutually_exclusive_group()
    src.add_argument("--model", metavar="NAME", help="built-in preset (default glm-5-nvfp4; --list-models)")
    src.add_argument(
        "--config", metavar="PATH", help="a local checkpoint directory or its config.json (weights are never read)"
    )
    src.add_argument(
        "--diff",
        nargs=2,
        metavar=("OLD", "NEW"),
        help="compare the budgets of two earlier --json outputs (decodetop probe --model M --json, decodetop budget "
        "--json) per component: which one moved beyond its noise; runs nothing",
    )
    parser.add_argument("--list-models", action="store_true", help="list the built-in presets and exit")
    parser.add_argument("--tp", type=int, help="tensor-parallel degree (default: number of GPUs, else 8)")
    parser.add_argument("--ep", type=int, default=1, help="expert-parallel degree (default 1)")
    parser.add_argument("--batch", type=int, default=1, help="concurrent sequences (default 1)")
    parser.add_argument("--context", type=int, default=4096, help="tokens in each KV cache (default 4096)")
    parser.add_argument(
        "--kv-dtype", default="auto", choices=("auto", "bf16", "fp16", "fp8"), help="KV-cache dtype (default auto)"
    )
    parser.add_argument("--accept-length", type=float, help="speculative decoding (MTP): tokens accepted per step")
    parser.add_argument("--draft-tokens", type=int, help="draft tokens per step (default: from --accept-length)")
    parser.add_argument(
        "--launch-mode", default="graph", choices=("graph", "eager"), help="kernel launches (default graph)"
    )
    parser.add_argument("--gpu", metavar="NAME", help="GPU table row: rtx-pro-6000, h100, h200, b200, a100, ...")
    parser.add_argument("--bandwidth-tbps", type=float, help="measured memory bandwidth, TB/s")
    parser.add_argument("--allreduce-us", type=float, help="measured small-message all-reduce latency, µs")
    parser.add_argument("--observed-ms", type=float, default=95.0, help="observed step time, ms (default 95)")
    parser.add_argument("--target-tps", type=float, default=309.0, help="target tok/s per sequence (default 309)")
    parser.add_argument("--plan", action="store_true", help="also print the probe plan (the measurements needed)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")


class _GpuFacts:
    """What NVML says about this host, asked lazily and at most once."""

    def __init__(self) -> None:
        self._nvml: Any = None
        self._ready = False

    def _get(self) -> Any:
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

    def gpu0(self) -> tuple[str, int, int] | None:
        """(name, bus width bits, max memory clock MHz) of GPU 0, or None."""
        nvml = self._get()
        if nvml is None or nvml.device_count() < 1:
            return None
        from decodetop.collectors.nvml import GpuRef

        name = nvml.query("nvmlDeviceGetName", GpuRef(0))
        width = nvml.query("nvmlDeviceGetMemoryBusWidth", GpuRef(0))
        clock = nvml.query("nvmlDeviceGetMaxClockInfo", GpuRef(0), 2)  # NVML_CLOCK_MEM = 2 (nvml.h)
        if not isinstance(name, str) or not isinstance(width, int) or not isinstance(clock, int):
            return None
        return name, width, clock


def _positive(value: float | None, flag: str) -> None:
    if value is not None and not (0 < value < 1e6):
        raise UserInputError(f"{flag}: {value} must be a positive number")


def run(args: argparse.Namespace) -> int:
    """Run the command."""
    from decodetop.budget.compose import compose_budget
    from decodetop.budget.deployment import DEFAULT_TP, Deployment
    from decodetop.budget.gpus import GPUS, find_gpu, nvml_bandwidth_gbps
    from decodetop.budget.inventory import build_inventory
    from decodetop.budget.plan import build_plan
    from decodetop.budget.roofline import hardware_for, roofline
    from decodetop.budget.spec import load_config, load_preset, preset_names

    if args.list_models:
        for name in preset_names():
            print(name)
        return 0
    if args.diff:
        return _diff(args.diff[0], args.diff[1], as_json=args.json)
    for value, flag in (
        (args.bandwidth_tbps, "--bandwidth-tbps"),
        (args.allreduce_us, "--allreduce-us"),
        (args.observed_ms, "--observed-ms"),
        (args.target_tps, "--target-tps"),
    ):
        _positive(value, flag)
    spec = load_config(args.config) if args.config else load_preset(args.model or "glm-5-nvfp4")
    facts = _GpuFacts()
    tp_source = "--tp"
    tp = args.tp
    if tp is None:
        count = facts.count()
        tp, tp_source = (count, "GPUs seen by NVML") if count > 0 else (DEFAULT_TP, "default (no GPU count)")
    dep = Deployment(
        tp=tp,
        ep=args.ep,
        batch=args.batch,
        context_len=args.context,
        kv_dtype=args.kv_dtype,
        accept_length=args.accept_length,
        draft_tokens=args.draft_tokens,
        launch_mode=args.launch_mode,
    )
    inv = build_inventory(spec, dep)

    gpu = None
    gpu_name = None
    assumed = False
    bandwidth = args.bandwidth_tbps * 1000 if args.bandwidth_tbps else None
    bw_source = "measured (--bandwidth-tbps)"
    if args.gpu:
        gpu = find_gpu(args.gpu)
        if gpu is None:
            raise UserInputError(f"--gpu: unknown GPU {args.gpu!r} (known: {', '.join(GPUS)})")
    elif bandwidth is None:
        seen = facts.gpu0()
        if seen is not None:
            name, width, clock = seen
            gpu, gpu_name = find_gpu(name), name
            bandwidth = nvml_bandwidth_gbps(width, clock)
            bw_source = f"NVML: {name}, {width}-bit bus × {clock} MHz × 2"
        else:
            gpu, assumed = GPUS["rtx-pro-6000"], True  # the seed host's GPU (probes.md §0)
    hw = hardware_for(
        gpu,
        bandwidth_gbps=bandwidth,
        bandwidth_source=bw_source,
        allreduce_latency_us=args.allreduce_us,
        latency_source="measured (--allreduce-us)",
        gpu_name=gpu_name,
    )
    if assumed:
        hw = dataclasses.replace(
            hw,
            bandwidth_source="assumed, no --gpu and no NVML; " + hw.bandwidth_source,
            gpu_name=hw.gpu_name + " (assumed)",
        )
    roof = roofline(inv, hw)
    budget = compose_budget(
        inv, {}, observed_ms=args.observed_ms, target_tps=args.target_tps, roofline=roof, estimate=hw
    )
    plan = build_plan(inv) if args.plan else None
    if args.json:
        print(json.dumps(_as_json(spec, inv, roof=roof, budget=budget, plan=plan, tp_source=tp_source), indent=1))
    else:
        sys.stdout.write(
            _as_text(
                spec,
                inv,
                roof=roof,
                budget=budget,
                plan=plan,
                tp_source=tp_source,
                gpu_memory_gib=gpu.memory_gib if gpu is not None and gpu_name is None else None,
            )
        )
    return 0


def _diff(old: str, new: str, *, as_json: bool) -> int:
    """`decodetop budget --diff OLD NEW`: the per-component table (or JSON) and the component that moved most."""
    from decodetop.budget.diff import diff_budget_files, format_budget_diff

    diff = diff_budget_files(old, new)
    if as_json:
        print(json.dumps({"baseline_path": old, "current_path": new, **diff.to_dict()}, indent=1, allow_nan=False))
    else:
        sys.stdout.write(format_budget_diff(diff, old))
    return 0


# --- output --------------------------------------------------------------------------------------------------


def _gb(n: float) -> str:
    return f"{n / 1e9:.3g} GB" if n >= 1e8 else f"{n / 1e6:.3g} MB"


def _as_json(spec: Any, inv: Any, *, roof: Any, budget: Any, plan: Any, tp_source: str) -> dict[str, Any]:
    dep = inv.deployment
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
            "tp_source": tp_source,
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
        "roofline": {
            "gpu": roof.hardware.gpu_name,
            "mem_bandwidth_gbps": roof.hardware.mem_bandwidth_gbps,
            "bandwidth_source": roof.hardware.bandwidth_source,
            "allreduce_latency_us": roof.hardware.allreduce_latency_us,
            "latency_source": roof.hardware.latency_source,
            "step_ms": roof.step_ms,
            "ms_per_token": roof.ms_per_token,
            "tokens_per_s": roof.tokens_per_s,
            "tokens_per_s_total": roof.tokens_per_s_total,
            "terms": [{"name": t.name, "ms": t.ms, "detail": t.detail} for t in roof.terms],
        },
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


def _as_text(
    spec: Any, inv: Any, *, roof: Any, budget: Any, plan: Any, tp_source: str, gpu_memory_gib: float | None = None
) -> str:
    from decodetop.textfmt import format_bytes, format_number, table

    dep = inv.deployment
    lines: list[str] = []
    add = lines.append
    add(f"{spec.name}  ({spec.model_type}; {spec.source})")
    add(
        f"  parameters   {spec.params_total / 1e9:.1f} B total, {spec.params_active / 1e9:.2f} B active per token "
        "(input embedding excluded, lm_head included)"
    )
    add(f"  weights      {spec.quant.describe()}")
    add(f"  deployment   {dep.describe(spec)}  (TP from {tp_source})")
    per_token = (inv.weight_bytes + inv.kv_bytes) / inv.tokens_per_step
    add(
        f"  busiest GPU  holds {_gb(inv.resident_weight_bytes)} of weights; reads {_gb(inv.weight_bytes)} weights + "
        f"{_gb(inv.kv_bytes)} KV per step = {_gb(per_token)} per token"
    )
    if gpu_memory_gib is not None and inv.resident_weight_bytes > gpu_memory_gib * 2**30:
        add(
            f"  warning      {_gb(inv.resident_weight_bytes)} of weights per GPU do not fit in the "
            f"{gpu_memory_gib:g} GiB of a {roof.hardware.gpu_name} (before any KV cache): use more GPUs or fewer bits"
        )
    ar = inv.collective_sizes("all_reduce")
    ag = inv.collective_sizes("all_gather")
    ar_text = ", ".join(f"{n} × {format_bytes(size)}" for size, n in sorted(ar.items())) or "none (TP 1)"
    per_layer = sum(op.count for op in inv.ops if op.kind == "all_reduce" and op.layers not in ("-",))
    add(
        f"  per step     {inv.kernels} kernels; all-reduces {ar_text} ({per_layer} in the layers"
        f"{' + 1 after the embedding' if ar else ''})"
        + (f"; all-gathers {', '.join(f'{n} × {format_bytes(s)}' for s, n in sorted(ag.items()))}" if ag else "")
    )
    hw = roof.hardware
    add("")
    add(f"Roofline on {hw.gpu_name}, {hw.mem_bandwidth_gbps:g} GB/s, all-reduce {hw.allreduce_latency_us:g} µs")
    add(f"  bandwidth: {hw.bandwidth_source}")
    add(f"  latency:   {hw.latency_source}")
    rows = [[t.name, round(t.ms, 3), t.detail] for t in roof.terms]
    add(_indent(table(["term", "ms", "detail"], rows)))
    add(
        f"  = {format_number(roof.step_ms)} ms per step, {format_number(roof.ms_per_token)} ms per token, "
        f"{format_number(roof.tokens_per_s)} tok/s per sequence ({format_number(roof.tokens_per_s_total)} tok/s total)"
    )
    add("")
    estimated_only = all(seg.status == "estimated" for seg in budget.segments)
    title = "Budget (roofline estimates: no probe results)" if estimated_only else "Budget"
    add(f"{title}, ms per step")
    brows = []
    for seg in budget.segments:
        share = f"{seg.ms / budget.observed_ms * 100:.1f}%" if seg.ms is not None else "-"
        brows.append([seg.label, round(seg.ms, 3) if seg.ms is not None else None, share, seg.status, seg.reason])
    brows.append(["total", round(budget.total_ms, 3), f"{budget.total_ms / budget.observed_ms * 100:.1f}%", "", ""])
    un = budget.unexplained
    brows.append(
        [
            "unexplained",
            round(un.ms or 0.0, 3),
            f"{(un.ms or 0.0) / budget.observed_ms * 100:.1f}%",
            un.status,
            un.reason,
        ]
    )
    add(_indent(table(["component", "ms", "of observed", "status", "note"], brows, align="lrrll")))
    observed_tps = 1000 / budget.per_token_ms(budget.observed_ms)
    add(
        f"  observed {format_number(budget.observed_ms)} ms/step ({format_number(observed_tps)} tok/s)"
        f" | target {format_number(budget.target_tps)} tok/s = {format_number(budget.target_ms)} ms/step"
        f" | roofline {format_number(roof.step_ms)} ms/step"
    )
    if budget.target_ms < roof.step_ms:
        add(
            f"  the target is below this deployment's roofline ({format_number(roof.step_ms)} ms): no kernel tuning "
            "reaches it; it needs fewer bytes per GPU (more GPUs, lower precision, speculative decoding)"
        )
    add("")
    add("Assumptions")
    for a in inv.assumptions:
        add(f"  - {a}")
    add("")
    add("Inventory by component (busiest GPU, one decode step)")
    for comp, ops in inv.by_component().items():
        wsum = sum(op.total_weight_bytes for op in ops)
        ksum = sum(op.total_kernels for op in ops)
        add(f"  {comp.label}: {len(ops)} ops, {_gb(wsum)} weights, {ksum} kernels")
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
        add(_indent(table(["op", "layers", "×", "shape", "dtype", "weights MB", "KV MB", "kernels"], orows), 4))
    if plan is not None:
        add("")
        add(
            f"Probe plan: {len(plan.key_ids())} distinct measurements, {len(plan.gemm_sweeps)} GEMM sweeps, "
            f"{len(plan.allreduce_sweep_bytes)} all-reduce sizes"
        )
        for probe, keys in plan.groups:
            add(f"  {probe} ({len(keys)})")
            for key in keys:
                add(f"    {key.key_id}   ← {', '.join(plan.ops_using(key.key_id))}")
    return "\n".join(lines) + "\n"


def _indent(text: str, n: int = 2) -> str:
    return "\n".join(" " * n + line for line in text.splitlines())
