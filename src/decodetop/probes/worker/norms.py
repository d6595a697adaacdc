"""Provides the `norms` probe: the elementwise ops of a decode step at the model's sizes.

Per key (`norms:op=…,tokens=…,width=…,dtype=…`): RMSNorm, residual add + RMSNorm, LayerNorm, SiLU-and-mul (width
= the output width), rotary embedding (width = heads × rotary dims) and the embedding lookup, each in eager torch
(`torch.nn.functional`). Engines fuse some of these into one kernel; torch may launch several, so these times are
an upper bound on a fused kernel's (the note says so).
"""

from __future__ import annotations

from functools import partial
from typing import Any

from decodetop.budget.keys import NormKey, parse_key_id
from decodetop.probes.results import RankMeasurement, RankOutput
from decodetop.probes.worker.context import ProbeContext
from decodetop.probes.worker.shapes import TimingOptions, key_list, measure, norm_runner


def run(ctx: ProbeContext, params: dict[str, Any]) -> RankOutput:
    """Each key."""
    opts = TimingOptions.from_params(ctx, params)
    keys = key_list(params, "norms")
    out: list[RankMeasurement] = []
    for index, kid in enumerate(keys):
        key = parse_key_id(kid)
        assert isinstance(key, NormKey)
        ctx.progress(f"key {index + 1}/{len(keys)} {kid}", index, len(keys))
        pt = {"what": key.op, "key": kid, "role": "budget", "device": ctx.device.type}
        out.append(measure(ctx, opts, kid, pt, partial(norm_runner, key, ctx), note="eager torch (unfused)"))
    ctx.progress("done", len(keys), len(keys))
    return RankOutput(measurements=tuple(out))
