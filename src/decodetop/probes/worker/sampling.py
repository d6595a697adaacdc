"""Provides the `sampling` probe: the vocab-parallel lm_head and sampling, and the all-gather of the logits.

- budget point per key (`sampling:tokens=…,vocab_shard=…,hidden=…,dtype=…`): lm_head GEMM on this rank's vocab
  shard (weights rotated above 2× L2) with fp32 logits, then greedy sampling (argmax);
- diagnostic: the same lm_head followed by top-p sampling (T=0.7, p=0.9: softmax, sort, cumsum, mask,
  multinomial), what temperature sampling costs on top;
- collective points for `allgather_bytes` (planrun: the plan's `allreduce:collective=all_gather,…` keys): one
  all-gather of exactly that many bytes per rank over the group, keyed as an AllreduceKey with ranks = the group
  size, timed with the same counts on every rank (CUDA graph and eager events on GPUs, host clock on gloo).
  UnsupportedError on a one-rank group.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from decodetop.budget.keys import AllreduceKey, SamplingKey, parse_key_id
from decodetop.probes.results import RankMeasurement, RankOutput
from decodetop.probes.worker.context import ProbeContext
from decodetop.probes.worker.shapes import (
    TimingOptions,
    collective_runner,
    key_list,
    not_run,
    point,
    sampling_runner,
    time_runner,
)
from decodetop.probes.worker.shapes import measure as measure_point


def run(ctx: ProbeContext, params: dict[str, Any]) -> RankOutput:
    """Each key (greedy, then top-p), then each all-gather key."""
    opts = TimingOptions.from_params(ctx, params)
    keys = key_list(params, "sampling")
    gathers = [AllreduceKey("all_gather", int(b), ctx.world_size, "bf16") for b in params["allgather_bytes"]]
    out: list[RankMeasurement] = []
    device = ctx.device.type
    total = len(keys) + len(gathers)
    for index, kid in enumerate(keys):
        key = parse_key_id(kid)
        assert isinstance(key, SamplingKey)
        ctx.progress(f"key {index + 1}/{total} {kid}", index, total)
        for sampler in ("greedy", "top_p"):
            role = "budget" if sampler == "greedy" else "diagnostic"
            pt: dict[str, Any] = {"what": "sampling", "key": kid, "sampler": sampler, "role": role, "device": device}
            out.append(
                measure_point(
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
                timing = time_runner(
                    ctx,
                    runner,
                    budget_ms=opts.budget_ms,
                    max_samples=opts.max_samples,
                    min_samples=opts.min_samples,
                    graph=mode == "graph",
                    collective=True,
                )
                out.append(point(name, pt, runner, timing))
            except Exception as exc:
                out.append(not_run(name, pt, exc))
    ctx.progress("done", total, total)
    return RankOutput(measurements=tuple(out))
