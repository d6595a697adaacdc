"""Provides the `layer` probe's spec (no torch): one whole decoder layer from the component kernels, against the
sum of its parts.

Plan: the ops of the main model's last dense layer and last MoE layer (layer 0's input norm differs), as
`COUNT*KEY_ID` strings in inventory order. Read: the composition error per layer kind (`LayerComposition`s,
reported beside the budget; they add no time to it).
"""

from __future__ import annotations

import re

from decodetop.budget.inventory import StepInventory
from decodetop.probes.hooks import (
    LayerComposition,
    MeasuredSetBuilder,
    PlanContext,
    Planned,
    ProbeRequest,
    ok_measurements,
)
from decodetop.probes.probe_spec import ProbeSpec
from decodetop.probes.results import ProbeResult
from decodetop.probes.specs.defaults import COMPONENT_TIMING, SMALL_GQA, SMALL_MOE


def _layer_span(label: str) -> set[int]:
    """'0-2,5' → {0, 1, 2, 5}; '-' and 'mtp' → empty."""
    out: set[int] = set()
    for part in label.split(","):
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", part.strip())
        if m:
            lo = int(m.group(1))
            hi = int(m.group(2) or lo)
            out.update(range(lo, hi + 1))
    return out


def layer_ops(inventory: StepInventory, layer: int) -> list[str]:
    """One decoder layer's ops as `COUNT*KEY_ID` (the `layer` probe's `dense_ops`/`moe_ops`), in inventory order."""
    out = []
    for op in inventory.ops:
        span = _layer_span(op.layers)
        if layer not in span:
            continue
        per_layer = op.count // len(span) if op.count % len(span) == 0 else max(1, round(op.count / len(span)))
        out.append(f"{per_layer}*{op.key.key_id}")
    return out


def representative_layers(inventory: StepInventory) -> tuple[int | None, int | None]:
    """(a dense layer, a MoE layer) of the main model, the last of each kind (layer 0's input norm differs)."""
    spec = inventory.spec
    moe = set(spec.moe_layers)
    dense = [i for i in range(spec.n_layers) if i not in moe]
    return (dense[-1] if dense else None), (max(moe) if moe else None)


def plan(ctx: PlanContext) -> Planned:
    """A dense and a MoE layer's ops, where the model has them."""
    dense_i, moe_i = representative_layers(ctx.inventory)
    dense_ops = layer_ops(ctx.inventory, dense_i) if dense_i is not None else []
    moe_ops = layer_ops(ctx.inventory, moe_i) if moe_i is not None else []
    if not dense_ops and not moe_ops:
        return Planned()
    return Planned(ProbeRequest("layer", {"dense_ops": dense_ops, "moe_ops": moe_ops}, ()))


def read(result: ProbeResult, into: MeasuredSetBuilder) -> None:
    """One `LayerComposition` per composition point."""
    for m in ok_measurements(result):
        if m.params.get("what") != "composition" or "error_pct" not in m.metrics:
            continue
        mt = m.metrics
        into.layers.append(
            LayerComposition(
                str(m.params.get("layer")),
                str(m.params.get("mode")),
                mt["sum_parts_us"],
                mt["layer_us"],
                mt["error_pct"],
                mt.get("eager_us"),
                m.note,
            )
        )


SPEC = ProbeSpec(
    name="layer",
    description="one whole decoder layer (dense / MoE) from the component kernels, graph and eager, against "
    "the sum of its parts: the composition error",
    module="decodetop.probes.worker.layer",
    default_timeout_s=600.0,
    collective=True,
    default_params={
        "dense_ops": [
            "norms:op=rmsnorm,tokens=1,width=4096,dtype=bf16",
            "gemm:m=1,n=6144,k=4096,batch=1,dtype=bf16",
            SMALL_GQA,
            "gemm:m=1,n=4096,k=4096,batch=1,dtype=bf16",
            "norms:op=add_rmsnorm,tokens=1,width=4096,dtype=bf16",
            "gemm:m=1,n=28672,k=4096,batch=1,dtype=bf16",
            "norms:op=silu_mul,tokens=1,width=14336,dtype=bf16",
            "gemm:m=1,n=4096,k=14336,batch=1,dtype=bf16",
        ],
        "moe_ops": [
            "norms:op=add_rmsnorm,tokens=1,width=2048,dtype=bf16",
            "routing:tokens=1,hidden=2048,n_experts=64,scoring=softmax,n_group=1,topk_group=1,top_k=8,dtype=bf16",
            SMALL_MOE,
        ],
        **COMPONENT_TIMING,
    },
    plan=plan,
    read=read,
    plan_order=1000,
)
