"""Provides the `sampling` probe: the vocab-parallel lm_head and sampling, and the all-gather of the logits.

- budget point per key (`sampling:tokens=…,vocab_shard=…,hidden=…,dtype=…`): lm_head GEMM on this rank's vocab
  shard (weights rotated above 2× L2) with fp32 logits, then greedy sampling (argmax);
- diagnostic: the same lm_head followed by top-p sampling (T=0.7, p=0.9: softmax, sort, cumsum, mask,
  multinomial), what temperature sampling costs on top;
- collective points for `allgather_bytes` (probes.plan_hooks: the plan's `allreduce:collective=all_gather,…` keys): one
  all-gather of exactly that many bytes per rank over the group, keyed as an AllreduceKey with ranks = the group
  size, timed with the same counts on every rank (CUDA graph and eager events on GPUs, host clock on gloo).
  UnsupportedError on a one-rank group.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812 - the conventional name

from decodetop.budget.keys import AllreduceKey, SamplingKey, parse_key_id
from decodetop.probes.results import RankMeasurement, RankOutput
from decodetop.probes.worker.allreduce import collective_runner
from decodetop.probes.worker.context import ProbeContext, UnsupportedError
from decodetop.probes.worker.ops import OpRunner, TimingOptions, each_key, key_list, measure, not_run, point
from decodetop.probes.worker.tensors import DTYPES, copies_for, randn, require_free
from decodetop.probes.worker.timing import Rotation


def sampling_runner(key: SamplingKey, ctx: ProbeContext, *, rotate: bool, sampler: str) -> OpRunner:
    """lm_head on this rank's vocab shard (fp32 logits), then greedy (argmax) or top-p (p=0.9, T=0.7: softmax, sort,
    cumsum, mask, exponential-race draw) sampling."""
    device = ctx.device
    if key.dtype not in DTYPES:
        raise UnsupportedError(f"lm_head dtype {key.dtype!r} is not bf16/fp16/fp32")
    dt = DTYPES[key.dtype]
    t, v, h = key.tokens, key.vocab_shard, key.hidden
    w_bytes = v * h * dt.itemsize
    copies = copies_for(ctx, w_bytes, rotate)
    require_free(ctx, copies * w_bytes + 6 * t * v * 4, f"lm_head shard {key.key_id}")
    heads = Rotation([randn((v, h), dt, device) for _ in range(copies)])
    x = randn((t, h), dt, device, std=1.0)
    top_p, temperature = 0.9, 0.7

    def greedy() -> torch.Tensor:
        return F.linear(x, heads.next()).float().argmax(dim=-1)

    def nucleus() -> torch.Tensor:
        logits = F.linear(x, heads.next()).float()
        probs = (logits / temperature).softmax(dim=-1)
        sorted_p, order = probs.sort(dim=-1, descending=True)
        cum = sorted_p.cumsum(dim=-1)
        sorted_p = sorted_p.masked_fill(cum - sorted_p > top_p, 0.0)
        # Sample ∝ p as argmax(p / Exp(1)) (the exponential race vLLM uses; graph-safe, unlike multinomial).
        pick = (sorted_p / torch.empty_like(sorted_p).exponential_()).argmax(dim=-1, keepdim=True)
        return order.gather(1, pick)

    if sampler not in ("greedy", "top_p"):
        raise ValueError(f"unknown sampler {sampler!r}")
    fn = greedy if sampler == "greedy" else nucleus
    moved = w_bytes + t * h * dt.itemsize + t * v * 4 * (1 if sampler == "greedy" else 4)
    return OpRunner(fn, moved, 2.0 * t * v * h, copies, weight_bytes=w_bytes)


def op_runner(key_id: str, ctx: ProbeContext, *, rotate: bool) -> OpRunner:
    """lm_head and greedy sampling."""
    key = parse_key_id(key_id)
    assert isinstance(key, SamplingKey)
    return sampling_runner(key, ctx, rotate=rotate, sampler="greedy")


def run(ctx: ProbeContext, params: dict[str, Any]) -> RankOutput:
    """Each key (greedy, then top-p), then each all-gather key."""
    opts = TimingOptions.from_params(ctx, params)
    keys = key_list(params, "sampling")
    gathers = [AllreduceKey("all_gather", int(b), ctx.world_size, "bf16") for b in params["allgather_bytes"]]
    out: list[RankMeasurement] = []
    device = ctx.device.type
    total = len(keys) + len(gathers)
    for kid, key in each_key(ctx, keys, SamplingKey, total=total):
        for sampler in ("greedy", "top_p"):
            role = "budget" if sampler == "greedy" else "diagnostic"
            pt: dict[str, Any] = {"what": "sampling", "key": kid, "sampler": sampler, "role": role, "device": device}
            out.append(
                measure(
                    ctx,
                    opts,
                    f"{kid} [{sampler}]",
                    pt,
                    partial(sampling_runner, key, ctx, rotate=opts.rotate, sampler=sampler),
                )
            )
    for j, gkey in enumerate(gathers):
        ctx.progress(f"key {len(keys) + j + 1}/{total} {gkey.key_id}", len(keys) + j, total)
        modes = ("graph", "pipelined") if ctx.is_cuda else ("pipelined",)
        for mode in modes:
            pt = {
                "what": "all_gather",
                "key": gkey.key_id,
                "mode": mode,
                "size_bytes": gkey.bytes,
                "role": "budget",
                "device": device,
            }
            name = f"{gkey.key_id} [{mode}]"
            try:
                runner = collective_runner(gkey, ctx)
                ctx.host_barrier()
                timing = opts.time(ctx, runner, graph=mode == "graph", collective=True)
                out.append(point(name, pt, runner, timing))
            except Exception as exc:
                out.append(not_run(name, pt, exc))
    ctx.progress("done", total, total)
    return RankOutput(measurements=tuple(out))
