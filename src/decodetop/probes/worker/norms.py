"""Provides the `norms` probe: the elementwise ops of a decode step at the model's sizes.

Per key (`norms:op=…,tokens=…,width=…,dtype=…`): RMSNorm, residual add + RMSNorm, LayerNorm, SiLU-and-mul (width
= the output width), rotary embedding (width = heads × rotary dims) and the embedding lookup, each in eager torch
(`torch.nn.functional`). Engines fuse some of these into one kernel; torch may launch several, so these times are
an upper bound on a fused kernel's (the note says so).
"""

from __future__ import annotations

from functools import partial
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812 - the conventional name

from decodetop.budget.keys import NormKey, parse_key_id
from decodetop.probes.results import RankMeasurement, RankOutput
from decodetop.probes.worker.context import ProbeContext, UnsupportedError
from decodetop.probes.worker.ops import OpRunner, TimingOptions, each_key, key_list, measure
from decodetop.probes.worker.tensors import DTYPES, randn

#: Rows of the embedding table the `embedding` norm op looks up from (the key carries no vocab size; lookups
#: touch `tokens` rows whatever the table size).
EMBEDDING_ROWS = 32768
#: ... capped at this many bytes (a lookup reads `tokens` rows; a larger table only costs setup time).
EMBEDDING_TABLE_BYTES = 256 * 1024**2


def norm_runner(key: NormKey, ctx: ProbeContext) -> OpRunner:
    """One elementwise op over [tokens × width] in eager torch (several small kernels where engines fuse one)."""
    device = ctx.device
    dt = DTYPES.get(key.dtype, torch.bfloat16)
    t, w = key.tokens, key.width
    x = randn((t, w), dt, device, std=1.0)
    eps = 1e-6
    io = t * w * dt.itemsize
    if key.op == "rmsnorm":
        weight = randn((w,), dt, device, std=1.0)
        return OpRunner(lambda: F.rms_norm(x, (w,), weight, eps), 2 * io + w * 2, 4.0 * t * w)
    if key.op == "add_rmsnorm":
        weight = randn((w,), dt, device, std=1.0)
        res = randn((t, w), dt, device, std=1.0)

        def add_rms() -> torch.Tensor:
            r = x + res
            return F.rms_norm(r, (w,), weight, eps)

        return OpRunner(add_rms, 4 * io, 5.0 * t * w)
    if key.op == "layernorm":
        weight = randn((w,), dt, device, std=1.0)
        bias = randn((w,), dt, device, std=1.0)
        return OpRunner(lambda: F.layer_norm(x, (w,), weight, bias, eps), 2 * io, 6.0 * t * w)
    if key.op == "silu_mul":
        gate_up = randn((t, 2 * w), dt, device, std=1.0)
        return OpRunner(lambda: F.silu(gate_up[:, :w]) * gate_up[:, w:], 3 * io, 5.0 * t * w)
    if key.op == "rotary":
        half = max(1, w // 2)
        xr = randn((t, 2 * half), dt, device, std=1.0)
        cos = randn((t, half), dt, device, std=1.0)
        sin = randn((t, half), dt, device, std=1.0)

        def rotary() -> torch.Tensor:
            x1, x2 = xr[:, :half], xr[:, half:]
            return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)

        return OpRunner(rotary, 3 * io, 3.0 * t * w)
    if key.op == "embedding":
        rows = max(t, min(EMBEDDING_ROWS, EMBEDDING_TABLE_BYTES // (w * dt.itemsize)))
        table = randn((rows, w), dt, device, std=1.0)
        ids = torch.randint(0, rows, (t,), device=device)
        return OpRunner(lambda: F.embedding(ids, table), 2 * io, 0.0)
    raise UnsupportedError(f"norm op {key.op!r} is not rmsnorm, add_rmsnorm, layernorm, silu_mul, rotary or embedding")


def op_runner(key_id: str, ctx: ProbeContext, *, rotate: bool) -> OpRunner:
    """A layer's elementwise op (small: never rotated)."""
    key = parse_key_id(key_id)
    assert isinstance(key, NormKey)
    return norm_runner(key, ctx)


def run(ctx: ProbeContext, params: dict[str, Any]) -> RankOutput:
    """Each key."""
    opts = TimingOptions.from_params(ctx, params)
    keys = key_list(params, "norms")
    out: list[RankMeasurement] = []
    for kid, key in each_key(ctx, keys, NormKey):
        pt = {"what": key.op, "key": kid, "role": "budget", "device": ctx.device.type}
        out.append(measure(ctx, opts, kid, pt, partial(norm_runner, key, ctx), note="eager torch (unfused)"))
    ctx.progress("done", len(keys), len(keys))
    return RankOutput(measurements=tuple(out))
