"""Provides decodetop's fused norm kernels (torch side): RMSNorm and residual-add + RMSNorm in one launch each.

Serving engines run the residual add and the next layer's RMSNorm as one kernel (vLLM `fused_add_rms_norm`, SGLang
and FlashInfer `fused_add_rmsnorm`): read x and the residual once, write the new residual and the normed output,
one program per token row. Eager torch launches an add, then rms_norm's own kernels. The sum is rounded to the
activation dtype before the norm, as the engines store the residual.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F  # noqa: N812 - the conventional name

from decodetop.probes.worker.context import UnsupportedError
from decodetop.probes.worker.kernels.common import HAVE_TRITON, launch, next_pow2, tl, triton, triton_unavailable

#: Widest row one program holds in registers (16 warps × 32 threads × 32 values).
MAX_BLOCK = 16384

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
