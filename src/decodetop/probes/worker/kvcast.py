"""Provides the `kvcast` probe: writing a layer's new KV-cache entries, and reading an FP8 cache as BF16 two ways.

- budget point per key (`kvcast:layout=…,tokens=…,width=…,context=…,kv_dtype=…`): cast the step's new K/V (or
  latent, or DSA index-key) entries to the cache dtype and copy them into a cache of `context` slots — what the
  budget's kvcast key means;
- diagnostics, over `read_contexts` (plus the key's own context): an FP8 cache of the key's width read as BF16
  by **whole-cache cast** (`cache.to(bf16)` of every cached token each step: the motivating case's culprit) and by
  **gather-then-cast** (gather the `gather_tokens` tokens a step needs — a DSA top-k, in 64-token blocks — then
  cast those). The first grows linearly with context; the second stays flat once context exceeds `gather_tokens`.
  Each diagnostic's params carry `mode` and `context`, so the trend can be read back (and a test checks it).
"""

from __future__ import annotations

from functools import partial
from typing import Any

from decodetop.budget.keys import KvcastKey, parse_key_id
from decodetop.probes.results import RankMeasurement, RankOutput
from decodetop.probes.worker.context import ProbeContext
from decodetop.probes.worker.shapes import (
    OpRunner,
    TimingOptions,
    key_list,
    kvcast_read_runners,
    kvcast_write_runner,
    measure,
)


def _read(width: int, context: int, gather_tokens: int, ctx: ProbeContext, which: int) -> OpRunner:
    return kvcast_read_runners(width, context, gather_tokens, ctx)[which]


def run(ctx: ProbeContext, params: dict[str, Any]) -> RankOutput:
    """Each key's write, then the two read modes at every context of the sweep."""
    opts = TimingOptions.from_params(ctx, params)
    keys = key_list(params, "kvcast")
    gather_tokens = int(params["gather_tokens"])
    if gather_tokens < 1:
        raise ValueError(f"kvcast: gather_tokens must be positive, got {gather_tokens}")
    out: list[RankMeasurement] = []
    device = ctx.device.type
    widths_done: set[int] = set()
    for index, kid in enumerate(keys):
        key = parse_key_id(kid)
        assert isinstance(key, KvcastKey)
        ctx.progress(f"key {index + 1}/{len(keys)} {kid}", index, len(keys))
        pt = {"what": "write", "key": kid, "role": "budget", "device": device}
        out.append(measure(ctx, opts, f"{kid} write", pt, partial(kvcast_write_runner, key, ctx), note="write"))
        if not params["read_modes"] or key.width in widths_done:
            continue
        widths_done.add(key.width)
        contexts = sorted({int(c) for c in params["read_contexts"]} | {key.context})
        for context in contexts:
            if context < 1:
                continue
            for which, mode in enumerate(("whole_cast", "gather_cast")):
                dpt = {
                    "what": "read",
                    "mode": mode,
                    "key": kid,
                    "context": context,
                    "width": key.width,
                    "gather_tokens": gather_tokens,
                    "role": "diagnostic",
                    "device": device,
                }
                label = "whole-cache cast" if which == 0 else f"gather {gather_tokens} then cast"
                out.append(
                    measure(
                        ctx,
                        opts,
                        f"fp8→bf16 {label}, width {key.width}, context {context}",
                        dpt,
                        partial(_read, key.width, context, gather_tokens, ctx, which),
                    )
                )
    ctx.progress("done", len(keys), len(keys))
    return RankOutput(measurements=tuple(out))
