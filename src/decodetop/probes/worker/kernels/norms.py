"""Provides decodetop's fused elementwise kernels of a decode step (torch side): RMSNorm, residual-add + RMSNorm and
SiLU-and-mul in one launch each.

Serving engines run the residual add and the next layer's RMSNorm as one kernel (vLLM `fused_add_rms_norm`, SGLang
and FlashInfer `fused_add_rmsnorm`): read x and the residual once, write the new residual and the normed output,
one program per token row. Eager torch launches an add, then rms_norm's own kernels. The sum is rounded to the
activation dtype before the norm, as the engines store the residual.

The dense MLP's activation, out = SiLU(x[:, :I]) · x[:, I:] over the gate_up GEMM's [tokens, 2I] output, is one
kernel in the engines too (vLLM `silu_and_mul`, SGLang and FlashInfer `silu_and_mul`): read [t, 2I] once, write
[t, I]. Eager torch launches SiLU, then a multiply, through an intermediate [t, I]. `silu_and_mul` takes one program
per row and column block, so a wide row (Llama-3.1-405B TP-1: I = 53248) and many tokens both fill the GPU.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F  # noqa: N812 - the conventional name

from decodetop.probes.worker.context import UnsupportedError
from decodetop.probes.worker.kernels.common import (
    HAVE_TRITON,
    launch,
    next_pow2,
    sm_count,
    tl,
    triton,
    triton_unavailable,
)

#: Widest row one program holds in registers (16 warps × 32 threads × 32 values).
MAX_BLOCK = 16384
#: Column blocks of `silu_and_mul`: from 2048 values (8 warps × 32 threads × 8) down to 256 (one warp × 32 × 8) as
#: long as the grid has fewer than `SILU_PROGRAMS_PER_SM` programs per SM. 8 values a thread: one 16-byte load of
#: bf16/fp16 per half row.
SILU_MAX_BLOCK = 2048
SILU_MIN_BLOCK = 256
SILU_VALUES_PER_THREAD = 8
#: Programs per SM the column blocks shrink towards: several resident programs per SM hide the loads' latency (the
#: kernel does one load and one store per value; a decode step's 1-token row is otherwise a handful of programs).
SILU_PROGRAMS_PER_SM = 4

if HAVE_TRITON:

    @triton.jit  # type: ignore[misc,untyped-decorator,unused-ignore]
    def _rmsnorm_kernel(  # type: ignore[no-untyped-def,unused-ignore]
        x_ptr,
        res_ptr,
        w_ptr,
        out_ptr,
        res_out_ptr,
        width,
        eps,
        ADD: tl.constexpr,
        BLOCK: tl.constexpr,
    ):
        row = tl.program_id(0)
        offs = tl.arange(0, BLOCK)
        mask = offs < width
        x = tl.load(x_ptr + row * width + offs, mask=mask, other=0.0)
        if ADD:
            r = tl.load(res_ptr + row * width + offs, mask=mask, other=0.0)
            x = (x.to(tl.float32) + r.to(tl.float32)).to(res_out_ptr.dtype.element_ty)
            tl.store(res_out_ptr + row * width + offs, x, mask=mask)
        xf = x.to(tl.float32)
        rstd = 1.0 / tl.sqrt(tl.sum(xf * xf, 0) / width + eps)
        w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        tl.store(out_ptr + row * width + offs, (xf * rstd * w).to(out_ptr.dtype.element_ty), mask=mask)

    @triton.jit  # type: ignore[misc,untyped-decorator,unused-ignore]
    def _silu_mul_kernel(x_ptr, out_ptr, width, BLOCK: tl.constexpr):  # type: ignore[no-untyped-def,unused-ignore]
        row = tl.program_id(0).to(tl.int64)  # tokens × 2I passes 2^31 at large batches of wide rows
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        mask = cols < width
        gate_row = x_ptr + row * 2 * width
        g = tl.load(gate_row + cols, mask=mask, other=0.0).to(tl.float32)
        u = tl.load(gate_row + width + cols, mask=mask, other=0.0).to(tl.float32)
        y = g / (1.0 + tl.exp(-g)) * u
        tl.store(out_ptr + row * width + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


def _warps(block: int) -> int:
    """4 warps up to 2048 values a row, 8 to 8192, 16 beyond (≤ 32 values a thread)."""
    return 4 if block <= 2048 else (8 if block <= 8192 else 16)


def rmsnorm(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    *,
    residual: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    residual_out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """RMSNorm of x [T, W] (with `residual`: of x + residual, whose sum is written to `residual_out`); returns
    (normed, new residual or None). Inputs are not modified, so a captured graph replays the same work."""
    if not HAVE_TRITON:
        raise UnsupportedError(triton_unavailable(x.device))
    tokens, width = x.shape
    block = next_pow2(width)
    if block > MAX_BLOCK:
        raise UnsupportedError(f"rows of {width} values are wider than the fused norm's {MAX_BLOCK}")
    if not x.is_contiguous() or (residual is not None and not residual.is_contiguous()):
        raise ValueError("the fused norm needs contiguous rows")
    out = torch.empty_like(x) if out is None else out
    add = residual is not None
    if add and residual_out is None:
        residual_out = torch.empty_like(x)
    launch(
        _rmsnorm_kernel,
        (tokens,),
        x,
        residual if add else x,
        weight,
        out,
        residual_out if add else out,
        width,
        eps,
        ADD=add,
        BLOCK=block,
        num_warps=_warps(block),
    )
    return out, residual_out


def reference_rmsnorm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, *, residual: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The torch form: (x + residual) rounded to x's dtype, then F.rms_norm."""
    r = x + residual if residual is not None else None
    src = r if r is not None else x
    return F.rms_norm(src, (x.shape[-1],), weight, eps), r


def silu_mul_block(tokens: int, width: int, sms: int) -> int:
    """`silu_and_mul`'s column block: the widest power of two in [SILU_MIN_BLOCK, SILU_MAX_BLOCK] (and no wider than
    the row) whose grid still has `SILU_PROGRAMS_PER_SM` programs per SM, else the narrowest."""
    block = min(SILU_MAX_BLOCK, max(SILU_MIN_BLOCK, next_pow2(width)))
    want = SILU_PROGRAMS_PER_SM * max(1, sms)
    while block > SILU_MIN_BLOCK and tokens * -(-width // block) < want:
        block //= 2
    return block


def silu_and_mul(x: torch.Tensor, *, out: torch.Tensor | None = None, block: int | None = None) -> torch.Tensor:
    """SiLU(x[:, :I]) · x[:, I:] of the gate_up output x [T, 2I] into out [T, I] (x's dtype), in one launch: math in
    fp32, rounded once. `block` overrides the column block (`silu_mul_block`)."""
    if not HAVE_TRITON:
        raise UnsupportedError(triton_unavailable(x.device))
    if x.dim() != 2 or x.shape[1] % 2:
        raise ValueError(f"SiLU-and-mul needs [tokens, 2 × width] input, got {tuple(x.shape)}")
    tokens, width = x.shape[0], x.shape[1] // 2
    out = torch.empty((tokens, width), dtype=x.dtype, device=x.device) if out is None else out
    if tuple(out.shape) != (tokens, width) or out.dtype != x.dtype:
        raise ValueError(f"SiLU-and-mul writes [{tokens}, {width}] {x.dtype}, not {tuple(out.shape)} {out.dtype}")
    if not x.is_contiguous() or not out.is_contiguous():
        raise ValueError("SiLU-and-mul needs contiguous rows")
    block = block or silu_mul_block(tokens, width, sm_count(x.device))
    if block & (block - 1):
        raise ValueError(f"SiLU-and-mul's column block must be a power of two, not {block}")
    warps = max(1, min(block, SILU_MAX_BLOCK) // (32 * SILU_VALUES_PER_THREAD))
    launch(_silu_mul_kernel, (tokens, -(-width // block)), x, out, width, BLOCK=block, num_warps=warps)
    return out


def reference_silu_mul(x: torch.Tensor) -> torch.Tensor:
    """The torch form: F.silu of the gate half times the up half (each rounded to x's dtype, as eager torch does)."""
    width = x.shape[-1] // 2
    return F.silu(x[..., :width]) * x[..., width:]
