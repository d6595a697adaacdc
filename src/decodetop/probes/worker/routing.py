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

import torch
import torch.nn.functional as F  # noqa: N812 - the conventional name

from decodetop.budget.keys import RoutingKey, parse_key_id
from decodetop.probes.results import RankMeasurement, RankOutput
from decodetop.probes.worker.context import ProbeContext, UnsupportedError
from decodetop.probes.worker.ops import OpRunner, TimingOptions, each_key, key_list, measure
from decodetop.probes.worker.tensors import DTYPES, copies_for, randn
from decodetop.probes.worker.timing import Rotation


def routing_runner(key: RoutingKey, ctx: ProbeContext, *, rotate: bool) -> OpRunner:
    """Router GEMM (fp32 logits), softmax or sigmoid scoring (+ correction bias for sigmoid: DeepSeek noaux_tc),
    group-limited top-k when n_group > 1 (top-2 sum per group, keep topk_group groups), top-k, normalised weights."""
    device = ctx.device
    t, h, e = key.tokens, key.hidden, key.n_experts
    if key.scoring not in ("softmax", "sigmoid"):
        raise UnsupportedError(f"scoring {key.scoring!r} is not softmax or sigmoid")
    wdtype = DTYPES.get(key.dtype, torch.bfloat16)
    w_bytes = e * h * wdtype.itemsize
    copies = copies_for(ctx, w_bytes, rotate)
    routers = Rotation([randn((e, h), wdtype, device) for _ in range(copies)])
    x = randn((t, h), wdtype, device, std=1.0)
    bias = torch.randn(e, device=device) * 0.01
    groups = key.n_group if key.n_group > 1 and e % key.n_group == 0 else 1
    top_k = min(key.top_k, e)

    def route() -> tuple[torch.Tensor, torch.Tensor]:
        logits = F.linear(x, routers.next()).float()
        if key.scoring == "softmax":
            scores = logits.softmax(dim=-1)
            choice = scores
        else:
            scores = logits.sigmoid()
            choice = scores + bias
        if groups > 1:
            per_group = choice.view(t, groups, e // groups)
            group_score = per_group.topk(min(2, e // groups), dim=-1).values.sum(dim=-1)
            keep = group_score.topk(min(key.topk_group, groups), dim=-1).indices
            mask = torch.zeros(t, groups, device=device, dtype=torch.bool).scatter_(1, keep, True)
            full = mask.unsqueeze(-1).expand(t, groups, e // groups).reshape(t, e)  # no host sync (graph-safe)
            choice = choice.masked_fill(~full, float("-inf"))
        ids = choice.topk(top_k, dim=-1).indices
        w = scores.gather(1, ids)
        if key.scoring == "sigmoid":
            w = w / w.sum(dim=-1, keepdim=True)
        return w, ids

    moved = w_bytes + t * h * wdtype.itemsize + t * e * 4
    return OpRunner(route, moved, 2.0 * t * h * e, copies, weight_bytes=w_bytes)


def permute_runners(tokens: int, hidden: int, top_k: int, ctx: ProbeContext) -> tuple[OpRunner, OpRunner]:
    """(permute, unpermute): gather tokens into expert order ([tokens·top_k × hidden]), and the weighted scatter-add
    back — the dispatch and combine halves of a fused MoE, timed on their own."""
    device = ctx.device
    x = randn((tokens, hidden), torch.bfloat16, device, std=1.0)
    ids = torch.randint(0, 256, (tokens * top_k,), device=device)
    y = randn((tokens * top_k, hidden), torch.bfloat16, device, std=1.0)
    w = torch.rand(tokens * top_k, 1, device=device) + 0.1

    def permute() -> torch.Tensor:
        order = torch.argsort(ids, stable=True)
        return x.index_select(0, order // top_k)

    order0 = torch.argsort(ids, stable=True) // top_k

    def unpermute() -> torch.Tensor:
        out = torch.zeros(tokens, hidden, device=device, dtype=torch.float32)
        return out.index_add_(0, order0, y.float() * w).to(torch.bfloat16)

    rows = tokens * top_k * hidden * 2
    return OpRunner(permute, tokens * hidden * 2 + rows, 0.0), OpRunner(unpermute, 2 * rows, 2.0 * rows / 2)


def op_runner(key_id: str, ctx: ProbeContext, *, rotate: bool) -> OpRunner:
    """A layer's router: GEMM, scoring and top-k."""
    key = parse_key_id(key_id)
    assert isinstance(key, RoutingKey)
    return routing_runner(key, ctx, rotate=rotate)


def _permute(key: RoutingKey, ctx: ProbeContext, which: int) -> OpRunner:
    return permute_runners(key.tokens, key.hidden, key.top_k, ctx)[which]


def run(ctx: ProbeContext, params: dict[str, Any]) -> RankOutput:
    """Each key, then its permute/unpermute diagnostics."""
    opts = TimingOptions.from_params(ctx, params)
    keys = key_list(params, "routing")
    out: list[RankMeasurement] = []
    device = ctx.device.type
    for kid, key in each_key(ctx, keys, RoutingKey):
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
