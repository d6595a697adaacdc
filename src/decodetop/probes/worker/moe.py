"""Provides the `moe` probe: one MoE layer's routed experts on this rank, for the top-k active experts.

Per key (`moe:tokens=…,top_k=…,experts_local=…,experts_active=…,hidden=…,intermediate=…,dtype=…`) it times the
whole routed-expert op the budget's key means — sort tokens by expert, gate_up GEMM, SiLU-and-mul, down GEMM,
weighted combine — two ways, both reported:

- `grouped`: one grouped GEMM per projection (`torch.nn.functional.grouped_mm` / `torch._grouped_mm`; FP8 through
  `torch._scaled_grouped_mm`), as fused-MoE kernels do (probes.md §7.7);
- `loop`: a per-expert loop of plain GEMMs (`_scaled_mm` for FP8), what a naive implementation launches.

Only the active experts' weights are allocated (× rotation copies above 2× L2); metrics include the bytes of the
active experts per step. The budget takes the faster supported variant. The shared experts are dense MLP GEMMs in
the step inventory and are measured by the `gemm` probe at their own shapes.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from decodetop.budget.keys import MoeKey, parse_key_id
from decodetop.probes.results import RankMeasurement, RankOutput
from decodetop.probes.worker.context import ProbeContext
from decodetop.probes.worker.shapes import MOE_VARIANTS, TimingOptions, key_list, measure, moe_runner


def run(ctx: ProbeContext, params: dict[str, Any]) -> RankOutput:
    """Each key in each variant."""
    opts = TimingOptions.from_params(ctx, params)
    keys = key_list(params, "moe")
    variants = [str(v) for v in params["variants"]]
    bad = [v for v in variants if v not in MOE_VARIANTS]
    if bad:
        raise ValueError(f"moe: unknown variant(s) {bad} (known: {', '.join(MOE_VARIANTS)})")
    out: list[RankMeasurement] = []
    for index, kid in enumerate(keys):
        key = parse_key_id(kid)
        assert isinstance(key, MoeKey)
        ctx.progress(f"key {index + 1}/{len(keys)} {kid}", index, len(keys))
        for variant in variants:
            pt = {"what": "moe", "key": kid, "variant": variant, "role": "budget", "device": ctx.device.type}
            out.append(
                measure(
                    ctx,
                    opts,
                    f"{kid} [{variant}]",
                    pt,
                    partial(moe_runner, key, ctx, rotate=opts.rotate, variant=variant),
                )
            )
    ctx.progress("done", len(keys), len(keys))
    return RankOutput(measurements=tuple(out))
