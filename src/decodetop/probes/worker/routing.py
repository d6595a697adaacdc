"""Provides the `routing` probe: the MoE router at the model's shape, and the permute/unpermute around the experts.

Per key (`routing:tokens=…,hidden=…,n_experts=…,scoring=…,n_group=…,topk_group=…,top_k=…,dtype=…`):

- budget point: router GEMM [tokens×hidden]·[hidden×n_experts] with fp32 logits, scoring (softmax, or sigmoid with
  the correction bias of DeepSeek's noaux_tc), group-limited top-k where n_group > 1 (top-2 sum per group, keep
  topk_group groups), top-k and weight normalisation — what the budget's routing key means;
- diagnostics: `permute` (gather the tokens into expert order, tokens·top_k rows) and `unpermute` (weighted
  scatter-add back), the dispatch and combine halves that the `moe` key's time already includes.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from decodetop.budget.keys import RoutingKey, parse_key_id
from decodetop.probes.results import RankMeasurement, RankOutput
from decodetop.probes.worker.context import ProbeContext
from decodetop.probes.worker.shapes import OpRunner, TimingOptions, key_list, measure, permute_runners, routing_runner


def _permute(key: RoutingKey, ctx: ProbeContext, which: int) -> OpRunner:
    return permute_runners(key.tokens, key.hidden, key.top_k, ctx)[which]


def run(ctx: ProbeContext, params: dict[str, Any]) -> RankOutput:
    """Each key, then its permute/unpermute diagnostics."""
    opts = TimingOptions.from_params(ctx, params)
    keys = key_list(params, "routing")
    out: list[RankMeasurement] = []
    device = ctx.device.type
    for index, kid in enumerate(keys):
        key = parse_key_id(kid)
        assert isinstance(key, RoutingKey)
        ctx.progress(f"key {index + 1}/{len(keys)} {kid}", index, len(keys))
        pt = {"what": "routing", "key": kid, "role": "budget", "device": device}
        out.append(measure(ctx, opts, kid, pt, partial(routing_runner, key, ctx, rotate=opts.rotate)))
        if params["permute"]:
            for which in (0, 1):
                what = ("permute", "unpermute")[which]
                dpt = {"what": what, "key": kid, "role": "diagnostic", "device": device}
                out.append(
                    measure(
                        ctx,
                        opts,
                        f"{what} {key.tokens}×{key.top_k} rows × {key.hidden}",
                        dpt,
                        partial(_permute, key, ctx, which),
                    )
                )
    ctx.progress("done", len(keys), len(keys))
    return RankOutput(measurements=tuple(out))
