"""Provides the `norms` probe: the elementwise ops of a decode step at the model's sizes.

Per key (`norms:op=…,tokens=…,width=…,dtype=…`): RMSNorm, residual add + RMSNorm, LayerNorm, SiLU-and-mul (width
= the output width), rotary embedding (width = heads × rotary dims) and the embedding lookup. Each key's budget
point times the best kernel this rank runs (`kernels.common.best_runner`): the engine's own kernel where one is
importable (FlashInfer, SGLang or vLLM RMSNorm, fused add + RMSNorm and SiLU-and-mul), else decodetop's fused Triton
kernel (`kernels.norms` for RMSNorm, add + RMSNorm and SiLU-and-mul in one launch, `kernels.rope` for rotary on the
query and key heads in place), else the torch form (`torch.nn.functional`, several small kernels where engines
launch one). Where
the best is not the torch form, the torch form is timed too, as an `alternative` point of the same key ("torch ops
would take X µs"). Each point carries its kernel class.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812 - the conventional name

from decodetop.budget.keys import NormKey, parse_key_id
from decodetop.probes.results import RankMeasurement, RankOutput
from decodetop.probes.worker.context import ProbeContext, UnsupportedError
from decodetop.probes.worker.kernels import engines
from decodetop.probes.worker.kernels import norms as fused_norms
from decodetop.probes.worker.kernels.common import (
    best_runner,
    check_close,
    torch_kernel,
    triton_kernel,
    triton_unavailable,
)
from decodetop.probes.worker.kernels.rope import RopeSpec, rope_kv_write, rotate_half
from decodetop.probes.worker.ops import OpRunner, TimingOptions, each_key, key_list, measure
from decodetop.probes.worker.tensors import DTYPES, randn

#: Rows of the embedding table the `embedding` norm op looks up from (the key carries no vocab size; lookups
#: touch `tokens` rows whatever the table size).
EMBEDDING_ROWS = 32768
#: ... capped at this many bytes (a lookup reads `tokens` rows; a larger table only costs setup time).
EMBEDDING_TABLE_BYTES = 256 * 1024**2
#: RMSNorm epsilon of the probe's ops (Llama's 1e-5 and DeepSeek's 1e-6 cost the same).
EPS = 1e-6
#: Rotary dims per head the `rotary` key's width is split into (the key carries heads × rotary dims; 64 is
#: DeepSeek's and GLM-5's qk_rope_head_dim and Llama's half head; a width it does not divide uses the whole row).
ROPE_HEAD_DIMS = 64
#: Positions of the rotary tables the probe's ops look up from.
ROPE_POSITIONS = 4096

_TORCH_OPS = {
    "rmsnorm": "F.rms_norm",
    "add_rmsnorm": "add, F.rms_norm",
    "layernorm": "F.layer_norm",
    "silu_mul": "F.silu, mul",
    "rotary": "mul, sub, add, cat",
    "embedding": "F.embedding",
}


def norm_runner(key: NormKey, ctx: ProbeContext) -> OpRunner:
    """The best kernel of the key's op this rank runs: the engine's (RMSNorm, add + RMSNorm, SiLU-and-mul), else
    decodetop's Triton kernel (RMSNorm, add + RMSNorm, SiLU-and-mul, rotary), else the torch form."""
    return best_runner(
        [
            ("engine kernel", lambda: engine_norm_runner(key, ctx)),
            ("decodetop Triton", lambda: triton_norm_runner(key, ctx)),
            ("torch", lambda: torch_norm_runner(key, ctx)),
        ]
    ).runner


def engine_norm_runner(key: NormKey, ctx: ProbeContext) -> OpRunner:
    """RMSNorm, add + RMSNorm (in place on fresh copies) or SiLU-and-mul through the engine's kernel (checked
    once)."""
    if key.op not in ("rmsnorm", "add_rmsnorm", "silu_mul"):
        raise UnsupportedError(f"no engine kernel is looked for {key.op}")
    found = engines.find(key.op)
    if key.op == "silu_mul":
        return _engine_silu_mul(key, ctx, found)
    dt = DTYPES.get(key.dtype, torch.bfloat16)
    t, w = key.tokens, key.width
    x = randn((t, w), dt, ctx.device, std=1.0)
    weight = randn((w,), dt, ctx.device, std=1.0)
    io = t * w * dt.itemsize
    if key.op == "add_rmsnorm":
        res = randn((t, w), dt, ctx.device, std=1.0)
        want, _ = fused_norms.reference_rmsnorm(x, weight, EPS, residual=res)
        xc, rc = x.clone(), res.clone()
        found.fn(xc, rc, weight, EPS)  # in place: rc ← x + res, xc ← rmsnorm(rc)
        check_close(xc, want, found.kernel.text)

        def add_rms() -> None:
            found.fn(x, res, weight, EPS)

        return OpRunner(add_rms, 4 * io + w * 2, 5.0 * t * w, kernel=found.kernel)
    want, _ = fused_norms.reference_rmsnorm(x, weight, EPS)
    out = torch.empty_like(x)
    if found.kernel.package == "vllm":

        def rms() -> object:
            return found.fn(out, x, weight, EPS)

    else:

        def rms() -> object:
            return found.fn(x, weight, EPS)

    got = rms()
    check_close(out if found.kernel.package == "vllm" else got, want, found.kernel.text)  # type: ignore[arg-type]
    return OpRunner(rms, 2 * io + w * 2, 4.0 * t * w, kernel=found.kernel)


def _engine_silu_mul(key: NormKey, ctx: ProbeContext, found: engines.EngineKernel) -> OpRunner:
    """SiLU-and-mul of [tokens, 2 × width] into [tokens, width] through the engine's kernel, called as its package
    publishes it (`kernels.engines`: vLLM's op takes the output first)."""
    dt = DTYPES.get(key.dtype, torch.bfloat16)
    t, w = key.tokens, key.width
    gate_up = randn((t, 2 * w), dt, ctx.device, std=1.0)
    out = torch.full((t, w), float("nan"), dtype=dt, device=ctx.device)
    calls: dict[str, Callable[[], object]] = {
        "vllm": lambda: found.fn(out, gate_up),  # torch.ops._C.silu_and_mul(out, input)
        "sgl_kernel": lambda: found.fn(gate_up, out),  # sgl_kernel.silu_and_mul(input, out)
        "flashinfer": lambda: found.fn(gate_up, out=out),  # flashinfer.activation.silu_and_mul(input, out=...)
    }
    silu_mul = calls[found.kernel.package]
    silu_mul()
    check_close(out, fused_norms.reference_silu_mul(gate_up), found.kernel.text)
    return OpRunner(silu_mul, 3 * t * w * dt.itemsize, 5.0 * t * w, kernel=found.kernel)


def triton_norm_runner(key: NormKey, ctx: ProbeContext) -> OpRunner:
    """decodetop's fused Triton kernel of the op (RMSNorm, add + RMSNorm, SiLU-and-mul, rotary), checked once
    against the torch form; UnsupportedError for the other ops or where Triton does not run."""
    if key.op not in ("rmsnorm", "add_rmsnorm", "silu_mul", "rotary"):
        raise UnsupportedError(f"no fused kernel for {key.op}")
    reason = triton_unavailable(ctx.device)
    if reason:
        raise UnsupportedError(reason)
    if key.op == "rotary":
        return _triton_rotary(key, ctx)
    if key.op == "silu_mul":
        return _triton_silu_mul(key, ctx)
    dt = DTYPES.get(key.dtype, torch.bfloat16)
    t, w = key.tokens, key.width
    x = randn((t, w), dt, ctx.device, std=1.0)
    weight = randn((w,), dt, ctx.device, std=1.0)
    io = t * w * dt.itemsize
    res = randn((t, w), dt, ctx.device, std=1.0) if key.op == "add_rmsnorm" else None
    out = torch.full_like(x, float("nan"))
    res_out = torch.full_like(x, float("nan")) if res is not None else None
    fused_norms.rmsnorm(x, weight, EPS, residual=res, out=out, residual_out=res_out)
    want, _ = fused_norms.reference_rmsnorm(x, weight, EPS, residual=res)
    check_close(out, want, f"Triton {key.op}")

    def run_norm() -> torch.Tensor:
        return fused_norms.rmsnorm(x, weight, EPS, residual=res, out=out, residual_out=res_out)[0]

    name = "fused add + RMSNorm (one launch)" if res is not None else "RMSNorm (one launch)"
    moved = (4 if res is not None else 2) * io + w * 2
    return OpRunner(run_norm, moved, 5.0 * t * w, kernel=triton_kernel(name))


def _triton_silu_mul(key: NormKey, ctx: ProbeContext) -> OpRunner:
    """SiLU-and-mul of [tokens, 2 × width] into [tokens, width] in one launch (checked once against the torch
    form): moves the gate_up row once and the output once, 3 × width values a token."""
    dt = DTYPES.get(key.dtype, torch.bfloat16)
    t, w = key.tokens, key.width
    gate_up = randn((t, 2 * w), dt, ctx.device, std=1.0)
    out = torch.full((t, w), float("nan"), dtype=dt, device=ctx.device)
    fused_norms.silu_and_mul(gate_up, out=out)
    check_close(out, fused_norms.reference_silu_mul(gate_up), "Triton silu_mul")

    def silu_mul() -> torch.Tensor:
        return fused_norms.silu_and_mul(gate_up, out=out)

    moved = (2 * w + w) * t * dt.itemsize
    return OpRunner(silu_mul, moved, 5.0 * t * w, kernel=triton_kernel("SiLU-and-mul (one launch)"))


def _triton_rotary(key: NormKey, ctx: ProbeContext) -> OpRunner:
    """Rotary on the key's heads × rotary dims in place (one launch; checked once against the torch form)."""
    dt = DTYPES.get(key.dtype, torch.bfloat16)
    rot = ROPE_HEAD_DIMS if key.width % ROPE_HEAD_DIMS == 0 else key.width
    if rot % 2:  # rotate-half pairs dim i with i + rot / 2 (`kernels.rope.check_rope`)
        raise UnsupportedError(f"rotary over rows of {key.width}: odd, not 64-dim heads nor rotate-half pairs")
    heads = key.width // rot
    q = randn((key.tokens, heads, rot), dt, ctx.device, std=1.0)
    cos = torch.rand(ROPE_POSITIONS, rot // 2, device=ctx.device)
    sin = torch.rand(ROPE_POSITIONS, rot // 2, device=ctx.device)
    pos = torch.randint(0, ROPE_POSITIONS, (key.tokens,), device=ctx.device)
    spec = RopeSpec(rot)
    want = rotate_half(q, cos[pos].unsqueeze(1), sin[pos].unsqueeze(1), 0, rot)
    got = q.clone()
    rope_kv_write(got, None, None, rope=spec, cos=cos, sin=sin, positions=pos)
    check_close(got, want, "Triton rotary")

    def rotary() -> None:
        rope_kv_write(q, None, None, rope=spec, cos=cos, sin=sin, positions=pos)

    io = key.tokens * key.width * dt.itemsize
    return OpRunner(rotary, 2 * io, 3.0 * key.tokens * key.width, kernel=triton_kernel("rotary in place (one launch)"))


def torch_norm_runner(key: NormKey, ctx: ProbeContext) -> OpRunner:
    """One elementwise op over [tokens × width] in eager torch (several small kernels where engines fuse one)."""
    runner = _torch_norm(key, ctx)
    runner.kernel = torch_kernel(ctx, _TORCH_OPS.get(key.op, key.op))
    return runner


def _torch_norm(key: NormKey, ctx: ProbeContext) -> OpRunner:
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
        return OpRunner(lambda: fused_norms.reference_silu_mul(gate_up), 3 * io, 5.0 * t * w)
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
    """Each key: the best kernel's budget point, then the torch form as an alternative where the best is not it."""
    opts = TimingOptions.from_params(ctx, params)
    keys = key_list(params, "norms")
    out: list[RankMeasurement] = []
    for kid, key in each_key(ctx, keys, NormKey):
        pt = {"what": key.op, "key": kid, "role": "budget", "device": ctx.device.type}
        best = measure(ctx, opts, kid, pt, partial(norm_runner, key, ctx))
        out.append(best)
        if best.kernel is not None and best.kernel.kind not in ("torch", "cpu"):
            apt = {**pt, "role": "alternative", "variant": "torch"}
            out.append(measure(ctx, opts, f"{kid} [torch]", apt, partial(torch_norm_runner, key, ctx)))
    ctx.progress("done", len(keys), len(keys))
    return RankOutput(measurements=tuple(out))
