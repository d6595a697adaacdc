"""Provides decodetop's fused-MoE decode kernel: a grouped GEMV in Triton that reads only the routed experts' weights,
the `fused` variant of the `moe` probe (torch side).

Serving engines run decode MoE layers as one fused Triton kernel per projection that indexes the expert weights
with the router's ids on the device (vLLM `fused_moe` / SGLang `fused_moe_triton`); the torch path of the `moe`
probe (sort, grouped GEMM, SiLU-and-mul, grouped GEMM, combine) launches a dozen kernels around two grouped GEMMs
built for large M. At batch 1 the layer is a weight stream, so what matters is reading each routed expert once at
full bandwidth. Three kernels do the whole routed-expert op:

1. `gate_up`: one program per (token, routed slot) × block of the intermediate width: reads the expert id from the
   device, streams that expert's gate and up rows against the token's activation (fp32 accumulation) and writes
   SiLU(gate) · up;
2. `down`: one program per routed slot × block of the hidden width: streams that expert's down-projection rows
   against the slot's activation and writes the product, scaled by the router weight, as an fp32 row;
3. `combine`: each token's top-k rows summed into its output (no atomics, deterministic; a few KB per token).

Expert ids and weights are tensors on the device, so the three are CUDA-graph replayable with any routing. Weights
are `[E, 2·I, H]` (gate rows, then up rows) and `[E, H, I]`, as `nn.Linear` stores them and as the torch path
allocates them. `reference_moe` is the same computation in plain torch (CPU-testable); the runner checks the kernel
against it once per key before timing.

Triton ships with torch's Linux CUDA wheels; where it is missing, or on CPU ranks, the variant is `unsupported`
with the reason. Triton's interpreter (`TRITON_INTERPRET=1`) runs the same kernels on CPU tensors, which the
tests use where Triton is installed.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.nn.functional as F  # noqa: N812 - the conventional name

from decodetop.budget.keys import MoeKey
from decodetop.probes.worker.context import ProbeContext, UnsupportedError
from decodetop.probes.worker.ops import OpRunner
from decodetop.probes.worker.tensors import DTYPES, copies_for, first_line, randn, require_free, sm_tag
from decodetop.probes.worker.timing import Rotation

try:
    import triton  # type: ignore[import-not-found,unused-ignore]
    import triton.language as tl  # type: ignore[import-not-found,unused-ignore]

    HAVE_TRITON = True
except ImportError:  # CPU-only torch wheels ship no Triton
    HAVE_TRITON = False

#: Weight elements each program streams per step along the reduction: 256 bf16 = 512 B per row, whole 128-B
#: sectors, as vLLM's fused_moe configs pick BLOCK_SIZE_K 64–256 for small M
#: (https://github.com/vllm-project/vllm/tree/main/vllm/model_executor/layers/fused_moe/configs).
BLOCK_K = 256
#: Output rows per program, from the largest down: the largest that still gives every SM `PROGRAMS_PER_SM` programs
#: (a batch-1 layer is a weight stream: enough programs in flight keep HBM busy; fewer, larger blocks cost less
#: per program where there is plenty of work, as Mixtral's 7168-wide gate_up).
BLOCK_N_CHOICES = (32, 16, 8)
#: Elements per program of the combine kernel (sums each token's top-k fp32 rows; a few KB per token).
COMBINE_BLOCK = 1024
#: Programs per SM wanted in flight (H200: 132 SMs → 528 programs).
PROGRAMS_PER_SM = 4
#: Relative tolerance of the one-time check against `reference_moe` (bf16 output: 8 significant bits ≈ 0.4 %;
#: fp32 accumulation order differs from torch's, so allow a few ulps over the output's scale).
CHECK_RTOL = 0.05
#: Weight formats the kernel reads (fp8 E4M3 weights are dequantised in registers: weight-only, w8a16).
KERNEL_DTYPES = ("bf16", "fp16", "fp32", "fp8")

if HAVE_TRITON:

    @triton.jit  # type: ignore[misc,untyped-decorator,unused-ignore]
    def _gate_up_kernel(  # type: ignore[no-untyped-def,unused-ignore]  # noqa: PLR0917 - pointers, strides
        x_ptr,
        w13_ptr,
        ids_ptr,
        act_ptr,
        hidden,
        inter,
        stride_we,
        stride_wn,
        top_k: tl.constexpr,
        block_n: tl.constexpr,
        block_k: tl.constexpr,
    ):
        slot = tl.program_id(0)  # token · top_k + k
        nb = tl.program_id(1)
        token = slot // top_k
        expert = tl.load(ids_ptr + slot).to(tl.int64)
        offs_n = nb * block_n + tl.arange(0, block_n)
        mask_n = offs_n < inter
        w_gate = w13_ptr + expert * stride_we + offs_n[:, None].to(tl.int64) * stride_wn
        w_up = w_gate + inter * stride_wn
        acc_g = tl.zeros([block_n], dtype=tl.float32)
        acc_u = tl.zeros([block_n], dtype=tl.float32)
        for k0 in range(0, hidden, block_k):
            offs_k = k0 + tl.arange(0, block_k)
            mask_k = offs_k < hidden
            xv = tl.load(x_ptr + token * hidden + offs_k, mask=mask_k, other=0.0).to(tl.float32)
            mask = mask_n[:, None] & mask_k[None, :]
            wg = tl.load(w_gate + offs_k[None, :], mask=mask, other=0.0).to(tl.float32)
            wu = tl.load(w_up + offs_k[None, :], mask=mask, other=0.0).to(tl.float32)
            acc_g += tl.sum(wg * xv[None, :], axis=1)
            acc_u += tl.sum(wu * xv[None, :], axis=1)
        act = acc_g / (1.0 + tl.exp(-acc_g)) * acc_u
        tl.store(act_ptr + slot * inter + offs_n, act.to(act_ptr.dtype.element_ty), mask=mask_n)

    @triton.jit  # type: ignore[misc,untyped-decorator,unused-ignore]
    def _down_kernel(  # type: ignore[no-untyped-def,unused-ignore]  # noqa: PLR0917 - pointers, strides
        act_ptr,
        w2_ptr,
        ids_ptr,
        wts_ptr,
        ys_ptr,
        hidden,
        inter,
        stride_we,
        stride_wn,
        block_n: tl.constexpr,
        block_k: tl.constexpr,
    ):
        slot = tl.program_id(0)
        nb = tl.program_id(1)
        offs_n = nb * block_n + tl.arange(0, block_n)
        mask_n = offs_n < hidden
        expert = tl.load(ids_ptr + slot).to(tl.int64)
        weight = tl.load(wts_ptr + slot).to(tl.float32)
        w_rows = w2_ptr + expert * stride_we + offs_n[:, None].to(tl.int64) * stride_wn
        acc = tl.zeros([block_n], dtype=tl.float32)
        for k0 in range(0, inter, block_k):
            offs_k = k0 + tl.arange(0, block_k)
            mask_k = offs_k < inter
            av = tl.load(act_ptr + slot * inter + offs_k, mask=mask_k, other=0.0).to(tl.float32)
            w = tl.load(w_rows + offs_k[None, :], mask=mask_n[:, None] & mask_k[None, :], other=0.0)
            acc += tl.sum(w.to(tl.float32) * av[None, :], axis=1)
        tl.store(ys_ptr + slot * hidden + offs_n, weight * acc, mask=mask_n)

    @triton.jit  # type: ignore[misc,untyped-decorator,unused-ignore]
    def _combine_kernel(ys_ptr, out_ptr, hidden, top_k: tl.constexpr, block: tl.constexpr):  # type: ignore[no-untyped-def,unused-ignore]
        token = tl.program_id(0)
        offs = tl.program_id(1) * block + tl.arange(0, block)
        mask = offs < hidden
        acc = tl.zeros([block], dtype=tl.float32)
        for j in tl.static_range(top_k):
            acc += tl.load(ys_ptr + (token * top_k + j) * hidden + offs, mask=mask, other=0.0)
        tl.store(out_ptr + token * hidden + offs, acc.to(out_ptr.dtype.element_ty), mask=mask)


def triton_unavailable(device: torch.device) -> str:
    """Why the Triton kernel cannot run on `device` ('' when it can). Triton's interpreter runs it on CPU tensors."""
    interpreted = os.environ.get("TRITON_INTERPRET") == "1"
    if not HAVE_TRITON:
        return f"Triton is not installed beside torch {torch.__version__} (it ships with torch's Linux CUDA wheels)"
    if device.type != "cuda" and not interpreted:
        return "the Triton fused-MoE kernel needs a CUDA GPU (CPU ranks time the torch path only)"
    return ""


def pick_block_n(rows: int, outer: int, sms: int) -> int:
    """Rows per program for `rows` output rows repeated over `outer` programs (slots or tokens) on `sms` SMs."""
    if min(rows, outer, sms) < 1:
        raise ValueError(f"fused MoE launch needs positive sizes: {rows=}, {outer=}, {sms=}")
    for block_n in BLOCK_N_CHOICES:
        if outer * -(-rows // block_n) >= PROGRAMS_PER_SM * sms:
            return block_n
    return BLOCK_N_CHOICES[-1]


@dataclass(frozen=True)
class Grid:
    """Launch shape of the three kernels for one call: programs per axis and rows per program."""

    gate_up: tuple[int, int]
    down: tuple[int, int]
    combine: tuple[int, int]
    gate_up_block_n: int
    down_block_n: int


def grid_for(tokens: int, top_k: int, hidden: int, inter: int, sms: int = 1) -> Grid:
    """gate_up: (tokens·top_k, ⌈inter/bn⌉); down: (tokens·top_k, ⌈hidden/bn⌉); combine: (tokens,
    ⌈hidden/COMBINE_BLOCK⌉); bn per kernel from `pick_block_n`."""
    if min(tokens, top_k, hidden, inter, sms) < 1:
        raise ValueError(f"fused MoE shapes must be positive: {tokens=}, {top_k=}, {hidden=}, {inter=}, {sms=}")
    slots = tokens * top_k
    bn_up = pick_block_n(inter, slots, sms)
    bn_down = pick_block_n(hidden, slots, sms)
    return Grid(
        (slots, -(-inter // bn_up)),
        (slots, -(-hidden // bn_down)),
        (tokens, -(-hidden // COMBINE_BLOCK)),
        bn_up,
        bn_down,
    )


def fused_moe(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    ids: torch.Tensor,
    weights: torch.Tensor,
    *,
    act: torch.Tensor | None = None,
    ys: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    sms: int | None = None,
) -> torch.Tensor:
    """Routed experts of `x` [T, H]: Σ_k weights[t, k] · down_e(SiLU(gate_e(x_t)) · up_e(x_t)), e = ids[t, k].

    w13 [E, 2I, H], w2 [E, H, I] (contiguous); ids [T, K] int32/int64 and weights [T, K] on x's device. `act`
    [T·K, I], `ys` [T·K, H] fp32 and `out` [T, H] may be passed preallocated so a captured graph allocates
    nothing. `sms`: the SM count the launch shape is sized for (default: the device's; 1 on CPU tensors under
    Triton's interpreter)."""
    if not HAVE_TRITON:
        raise UnsupportedError(triton_unavailable(x.device))
    tokens, hidden = x.shape
    n_exp, two_inter, hidden_w = w13.shape
    inter = two_inter // 2
    top_k = ids.shape[1]
    if hidden_w != hidden or w2.shape != (n_exp, hidden, inter) or tuple(weights.shape) != (tokens, top_k):
        raise ValueError(
            f"fused MoE shapes disagree: x {tuple(x.shape)}, w13 {tuple(w13.shape)}, w2 {tuple(w2.shape)}, "
            f"ids {tuple(ids.shape)}, weights {tuple(weights.shape)}"
        )
    if not (x.is_contiguous() and w13.is_contiguous() and w2.is_contiguous() and ids.is_contiguous()):
        raise ValueError("fused MoE needs contiguous x, w13, w2 and ids")
    if act is None:
        act = torch.empty(tokens * top_k, inter, device=x.device, dtype=x.dtype)
    if ys is None:
        ys = torch.empty(tokens * top_k, hidden, device=x.device, dtype=torch.float32)
    if out is None:
        out = torch.empty(tokens, hidden, device=x.device, dtype=x.dtype)
    if sms is None:
        sms = torch.cuda.get_device_properties(x.device).multi_processor_count if x.is_cuda else 1
    grid = grid_for(tokens, top_k, hidden, inter, sms)
    _gate_up_kernel[grid.gate_up](
        x,
        w13,
        ids,
        act,
        hidden,
        inter,
        w13.stride(0),
        w13.stride(1),
        top_k=top_k,
        block_n=grid.gate_up_block_n,
        block_k=BLOCK_K,
    )
    _down_kernel[grid.down](
        act,
        w2,
        ids,
        weights,
        ys,
        hidden,
        inter,
        w2.stride(0),
        w2.stride(1),
        block_n=grid.down_block_n,
        block_k=BLOCK_K,
    )
    _combine_kernel[grid.combine](ys, out, hidden, top_k=top_k, block=COMBINE_BLOCK)
    return out


def reference_moe(
    x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor
) -> torch.Tensor:
    """The same computation in plain torch, slot by slot: fp32 accumulation, the SiLU-and-mul rounded to x's dtype
    (as the kernel stores it), the weighted sum in fp32, the output in x's dtype."""
    tokens, _hidden = x.shape
    inter = w13.shape[1] // 2
    out = torch.zeros(tokens, w2.shape[1], dtype=torch.float32, device=x.device)
    for t in range(tokens):
        xt = x[t].float()
        for j in range(ids.shape[1]):
            e = int(ids[t, j])
            h = w13[e].float() @ xt
            a = (F.silu(h[:inter]) * h[inter:]).to(x.dtype).float()
            out[t] += float(weights[t, j]) * (w2[e].float() @ a)
    return out.to(x.dtype)


def routed_ids(tokens: int, top_k: int, experts: int, device: torch.device) -> torch.Tensor:
    """Slot (t, j) → expert (t·top_k + j) mod `experts`: distinct experts per token (as a router's top-k are), the
    same assignment the torch path of the probe uses."""
    rows = [[(t * top_k + j) % experts for j in range(top_k)] for t in range(tokens)]
    return torch.tensor(rows, dtype=torch.int32, device=device)


def fused_moe_runner(key: MoeKey, ctx: ProbeContext, *, rotate: bool) -> OpRunner:
    """The `fused` variant at one MoE key: the same active experts, activations and routing as the torch path,
    through the two Triton kernels (checked once against `reference_moe`)."""
    if key.dtype not in KERNEL_DTYPES:
        raise UnsupportedError(f"{key.dtype} experts: the Triton grouped GEMV reads {', '.join(KERNEL_DTYPES)} weights")
    reason = triton_unavailable(ctx.device)
    if reason:
        raise UnsupportedError(reason)
    if key.dtype == "fp8" and ctx.is_cuda and torch.cuda.get_device_capability(ctx.device) < (8, 9):
        raise UnsupportedError(f"fp8 weights need sm_89 or newer; this is {sm_tag(ctx)}")
    device = ctx.device
    t, k_top, h, inter = key.tokens, key.top_k, key.hidden, key.intermediate
    active = max(1, min(key.experts_active, key.experts_local, t * k_top))
    wdtype = torch.float8_e4m3fn if key.dtype == "fp8" else DTYPES.get(key.dtype, torch.bfloat16)
    w_bytes = active * 3 * inter * h * wdtype.itemsize
    copies = copies_for(ctx, w_bytes, rotate)
    require_free(ctx, copies * w_bytes * 1.05, f"MoE expert weights {key.key_id}")  # +5 %: activations
    experts = Rotation(
        [
            (randn((active, 2 * inter, h), wdtype, device), randn((active, h, inter), wdtype, device))
            for _ in range(copies)
        ]
    )
    adtype = torch.bfloat16 if wdtype.itemsize <= 2 else torch.float32
    x = randn((t, h), adtype, device, std=1.0)
    ids = routed_ids(t, k_top, active, device)
    wts = torch.rand(t, k_top, device=device, dtype=torch.float32) + 0.1
    act = torch.empty(t * k_top, inter, device=device, dtype=adtype)
    ys = torch.empty(t * k_top, h, device=device, dtype=torch.float32)
    out = torch.empty(t, h, device=device, dtype=adtype)

    def fused() -> torch.Tensor:
        w13, w2 = experts.next()
        return fused_moe(x, w13, w2, ids, wts, act=act, ys=ys, out=out)

    w13_0, w2_0 = experts.items[0]
    try:
        got = fused_moe(x, w13_0, w2_0, ids, wts, act=act, ys=ys, out=out).float()
    except Exception as exc:
        raise UnsupportedError(
            f"Triton fused-MoE kernel failed on {sm_tag(ctx)}: {type(exc).__name__}: {first_line(exc)}"
        ) from None
    want = reference_moe(x, w13_0, w2_0, ids, wts).float()
    scale = float(want.abs().max()) or 1.0
    err = float((got - want).abs().max())
    if err > CHECK_RTOL * scale:
        raise RuntimeError(
            f"Triton fused-MoE output differs from the torch reference: max |Δ| {err:.3g} of {scale:.3g}"
        )
    rows = t * k_top
    moved = w_bytes + t * h * 2 * 2 + rows * inter * 2 * 2
    note = "Triton grouped GEMV over the routed experts (expert ids read on the device)"
    if key.dtype == "fp8":
        note += "; fp8 weights dequantised in registers (w8a16)"
    return OpRunner(fused, moved, 2.0 * rows * 3 * h * inter, copies, note, weight_bytes=w_bytes)
