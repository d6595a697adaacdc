"""Provides decodetop's fused rope + KV-cache write kernel (torch side): rotary embedding on the new tokens' queries
(in place) and keys, and the keys and values cast into the cache at their slots, in one launch.

Engines fuse these (vLLM's rotary_embedding + reshape_and_cache, FlashInfer's rope + cache append; SGLang's MLA
path ropes k_pe and writes the latent row together). One program takes one head of one token: a query head is
rotated where it lies; a KV head is rotated, cast (BF16, or FP8 E4M3 with a fixed scale, or FP8 with a dynamic
scale per head row as DSA's index keys are stored) and written to `cache[slot]`, its value row beside it. Rotary
is the NeoX form (rotate-half) over `rot` dims starting at a per-tensor offset: 0 for GQA heads, `kv_lora_rank` for
MLA's latent row `[c_kv | k_pe]`. The same kernel with no query heads is the plain KV write, and with no KV heads
the plain rotary.

`rot` is any even number of dims that fits in its row, as the engines' kernels take (vLLM's rotary_embedding,
FlashInfer's apply_rope): Phi-3's 96 of 96, heads of 80, partial rotary (GLM-4.5's partial_rotary_factor 0.5: 64 of
128, docs/reference/models.md). A program's lanes are its row padded to the next power of two (Triton's blocks
are): lanes past the row load 0 and are never stored, and which lanes rotate, with which partner `rot / 2` away,
is a comparison against the constexpr `rot` — nothing rounds `rot` itself up, so the rotary half needs no padding of
its own and a power-of-two row compiles as it always has. Odd `rot` and rotary dims past the row are refused with
one line (`check_rope`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from decodetop.probes.worker.context import UnsupportedError
from decodetop.probes.worker.kernels.common import (
    HAVE_TRITON,
    interpreted,
    launch,
    next_pow2,
    tl,
    to_e4m3,
    triton,
    triton_unavailable,
)
from decodetop.probes.worker.tensors import FP8_E4M3_MAX

if HAVE_TRITON:

    @triton.jit  # type: ignore[misc,untyped-decorator,unused-ignore]
    def _rope_row(base, width, cos_ptr, sin_ptr, pos, ROT_OFF: tl.constexpr, ROT: tl.constexpr, BLOCK: tl.constexpr):  # type: ignore[no-untyped-def,unused-ignore]
        """One row of `width` values with rotate-half rotary on [ROT_OFF, ROT_OFF + ROT); (values fp32, offsets)."""
        offs = tl.arange(0, BLOCK)
        mask = offs < width
        x = tl.load(base + offs, mask=mask, other=0.0).to(tl.float32)
        if ROT > 0:
            half: tl.constexpr = ROT // 2
            rel = offs - ROT_OFF
            in_rot = mask & (rel >= 0) & (rel < ROT)
            first = rel < half
            partner = tl.where(first, offs + half, offs - half)
            xp = tl.load(base + partner, mask=in_rot, other=0.0).to(tl.float32)
            i = tl.where(first, rel, rel - half)
            c = tl.load(cos_ptr + pos * half + i, mask=in_rot, other=1.0)
            s = tl.load(sin_ptr + pos * half + i, mask=in_rot, other=0.0)
            x = tl.where(in_rot, tl.where(first, x * c - xp * s, x * c + xp * s), x)
        return x, offs, mask

    @triton.jit  # type: ignore[misc,untyped-decorator,unused-ignore]
    def _rope_kv_kernel(  # type: ignore[no-untyped-def,unused-ignore]
        q_ptr,
        k_ptr,
        v_ptr,
        cos_ptr,
        sin_ptr,
        pos_ptr,
        slot_ptr,
        kc_ptr,
        vc_ptr,
        scale_ptr,
        q_heads,
        stride_qt,
        stride_kt,
        stride_vt,
        stride_kc,
        stride_vc,
        QD: tl.constexpr,
        KD: tl.constexpr,
        VD: tl.constexpr,
        ROT: tl.constexpr,
        ROT_OFF_Q: tl.constexpr,
        ROT_OFF_K: tl.constexpr,
        ROT_K: tl.constexpr,
        SCALE_MODE: tl.constexpr,
        BLOCK_Q: tl.constexpr,
        BLOCK_K: tl.constexpr,
        BLOCK_V: tl.constexpr,
        PRE_ROUND: tl.constexpr,
    ):
        t = tl.program_id(0)
        h = tl.program_id(1)
        pos = tl.load(pos_ptr + t).to(tl.int64)
        if h < q_heads:
            base = q_ptr + t * stride_qt + h * QD
            y, offs, mask = _rope_row(base, QD, cos_ptr, sin_ptr, pos, ROT_OFF_Q, ROT, BLOCK_Q)
            tl.store(base + offs, y.to(q_ptr.dtype.element_ty), mask=mask)
        else:
            j = h - q_heads
            slot = tl.load(slot_ptr + t).to(tl.int64)
            # names apart from the query branch's: a branch's values must have one type on both sides
            k_row = k_ptr + t * stride_kt + j * KD
            yk, offs_k, mask_k = _rope_row(k_row, KD, cos_ptr, sin_ptr, pos, ROT_OFF_K, ROT_K, BLOCK_K)
            dst = kc_ptr + slot * stride_kc + j * KD + offs_k
            if SCALE_MODE == 0:  # the cache's own dtype (bf16)
                tl.store(dst, yk.to(kc_ptr.dtype.element_ty), mask=mask_k)
            elif SCALE_MODE == 1:  # FP8 with fixed scales [k_scale, v_scale]
                ks = tl.load(scale_ptr)
                tl.store(
                    dst, to_e4m3(tl.clamp(yk / ks, -448.0, 448.0), kc_ptr.dtype.element_ty, PRE_ROUND), mask=mask_k
                )
            else:  # FP8 with a dynamic scale per head row, stored at scale_ptr[slot, j]
                amax = tl.max(tl.where(mask_k, tl.abs(yk), 0.0), 0)
                ds = tl.maximum(amax, 1e-6) / 448.0
                tl.store(
                    dst, to_e4m3(tl.clamp(yk / ds, -448.0, 448.0), kc_ptr.dtype.element_ty, PRE_ROUND), mask=mask_k
                )
                tl.store(scale_ptr + slot * (stride_kc // KD) + j, ds)
            if VD > 0:
                offs_v = tl.arange(0, BLOCK_V)
                mask_v = offs_v < VD
                v = tl.load(v_ptr + t * stride_vt + j * VD + offs_v, mask=mask_v, other=0.0).to(tl.float32)
                dst_v = vc_ptr + slot * stride_vc + j * VD + offs_v
                if SCALE_MODE == 1:
                    vs = tl.load(scale_ptr + 1)
                    v8 = to_e4m3(tl.clamp(v / vs, -448.0, 448.0), vc_ptr.dtype.element_ty, PRE_ROUND)
                    tl.store(dst_v, v8, mask=mask_v)
                else:
                    tl.store(dst_v, v.to(vc_ptr.dtype.element_ty), mask=mask_v)


@dataclass(frozen=True)
class RopeSpec:
    """Where rotary applies: `rot` dims (0: none) from `offset_q` in each query head and `offset_k` in each key
    row; cos/sin tables [positions, rot / 2] fp32."""

    rot: int
    offset_q: int = 0
    offset_k: int = 0


def check_rope(rope: RopeSpec, q_dim: int, k_dim: int, cos: torch.Tensor, sin: torch.Tensor) -> None:
    """ValueError, one line, where `rope_kv_write` cannot take `rope` over query heads of `q_dim` and key rows of
    `k_dim` values (0: none): odd or negative rotary dims (rotate-half pairs dim i with i + rot / 2), rotary dims
    past the row, or cos/sin tables that are not [positions, rot / 2]."""
    rot = rope.rot
    if rot < 0 or rot % 2:
        raise ValueError(f"rotary dims must be even and not negative (rotate-half pairs), got {rot}")
    if rot == 0:
        return
    for what, dim, offset in (("query head", q_dim, rope.offset_q), ("key row", k_dim, rope.offset_k)):
        if dim and (offset < 0 or offset + rot > dim):
            raise ValueError(f"rotary dims [{offset}, {offset + rot}) do not fit in a {what} of {dim} values")
    if cos.dim() != 2 or cos.shape[1] != rot // 2 or sin.shape != cos.shape:
        got = f"{tuple(cos.shape)} and {tuple(sin.shape)}"
        raise ValueError(f"cos/sin tables must be [positions, {rot // 2}] for {rot} rotary dims, got {got}")


def rope_kv_write(
    q: torch.Tensor | None,
    k: torch.Tensor | None,
    v: torch.Tensor | None,
    *,
    rope: RopeSpec,
    cos: torch.Tensor,
    sin: torch.Tensor,
    positions: torch.Tensor,
    slots: torch.Tensor | None = None,
    k_cache: torch.Tensor | None = None,
    v_cache: torch.Tensor | None = None,
    scales: torch.Tensor | None = None,
    dynamic_scale: bool = False,
) -> None:
    """Rotary on q [T, Hq, Dq] in place (None: no queries) and on k [T, Hkv, Dk], then k (roped) and v [T, Hkv, Dv]
    (None: no values, as MLA's latent row) written to k_cache/v_cache [S, Hkv, D] at `slots` [T]. An FP8 cache takes
    `scales` [k_scale, v_scale], or with `dynamic_scale` one scale per row written to `scales` [S, Hkv]."""
    if not HAVE_TRITON:
        raise UnsupportedError(triton_unavailable(positions.device))
    ref = q if q is not None else k
    if ref is None:
        raise ValueError("rope_kv_write needs queries or keys")
    tokens = ref.shape[0]
    q_heads, qd = (q.shape[1], q.shape[2]) if q is not None else (0, 1)
    kv_heads, kd = (k.shape[1], k.shape[2]) if k is not None else (0, 1)
    vd = v.shape[2] if v is not None else 0
    if k is not None and (k_cache is None or slots is None):
        raise ValueError("keys need a cache and slots to be written to")
    check_rope(rope, qd if q is not None else 0, kd if k is not None else 0, cos, sin)
    fp8 = k_cache is not None and k_cache.dtype == torch.float8_e4m3fn
    mode = (2 if dynamic_scale else 1) if fp8 else 0
    if mode and scales is None:
        raise ValueError("an FP8 cache needs its scales")
    dummy = positions
    launch(
        _rope_kv_kernel,
        (tokens, q_heads + kv_heads),
        q if q is not None else dummy,
        k if k is not None else dummy,
        v if v is not None else dummy,
        cos,
        sin,
        positions,
        slots if slots is not None else dummy,
        k_cache if k_cache is not None else dummy,
        v_cache if v_cache is not None else dummy,
        scales if scales is not None else cos,
        q_heads,
        q.stride(0) if q is not None else 0,
        k.stride(0) if k is not None else 0,
        v.stride(0) if v is not None else 0,
        k_cache.stride(0) if k_cache is not None else 0,
        v_cache.stride(0) if v_cache is not None else 0,
        QD=qd,
        KD=kd,
        VD=vd,
        ROT=rope.rot,
        ROT_OFF_Q=rope.offset_q,
        ROT_OFF_K=rope.offset_k,
        ROT_K=rope.rot if k is not None else 0,
        SCALE_MODE=mode,
        BLOCK_Q=next_pow2(qd),
        BLOCK_K=next_pow2(kd),
        BLOCK_V=next_pow2(max(1, vd)),
        PRE_ROUND=interpreted(),
    )


def rotate_half(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, offset: int, rot: int) -> torch.Tensor:
    """The torch form of NeoX rotary on dims [offset, offset + rot) of x [..., D] (cos/sin broadcast [..., rot/2])."""
    if rot == 0:
        return x
    half = rot // 2
    xf = x.float()
    x1 = xf[..., offset : offset + half]
    x2 = xf[..., offset + half : offset + rot]
    rotated = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
    return torch.cat((xf[..., :offset], rotated, xf[..., offset + rot :]), dim=-1).to(x.dtype)


def reference_rope_kv_write(
    q: torch.Tensor | None,
    k: torch.Tensor | None,
    v: torch.Tensor | None,
    rope: RopeSpec,
    cos: torch.Tensor,
    sin: torch.Tensor,
    positions: torch.Tensor,
    slots: torch.Tensor | None,
    k_cache: torch.Tensor | None,
    v_cache: torch.Tensor | None,
    scales: torch.Tensor | None = None,
    dynamic_scale: bool = False,
) -> None:
    """The torch form of `rope_kv_write` (several kernels: rotary by cat, casts, index_copy_ into the cache)."""
    c = cos[positions].unsqueeze(1)
    s = sin[positions].unsqueeze(1)
    if q is not None:
        q.copy_(rotate_half(q, c, s, rope.offset_q, rope.rot))
    if k is None or k_cache is None or slots is None:
        return
    kr = rotate_half(k, c, s, rope.offset_k, rope.rot).float()
    fp8 = k_cache.dtype == torch.float8_e4m3fn
    if fp8 and dynamic_scale and scales is not None:
        ds = kr.abs().amax(dim=-1).clamp(min=1e-6) / FP8_E4M3_MAX
        scales.view(k_cache.shape[0], -1)[slots] = ds
        kr = kr / ds.unsqueeze(-1)
    elif fp8 and scales is not None:
        kr = kr / scales[0]  # a tensor op, not float(): the torch form is captured into a CUDA graph
    raw = k_cache.view(torch.uint8) if fp8 else k_cache  # index_copy_ has no Float8 kernel on CPU
    kq = kr.clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX).to(k_cache.dtype) if fp8 else kr.to(k_cache.dtype)
    raw.index_copy_(0, slots, kq.view(torch.uint8) if fp8 else kq)
    if v is not None and v_cache is not None:
        vf = v.float() / scales[1] if fp8 and scales is not None and not dynamic_scale else v.float()
        vq = vf.clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX).to(v_cache.dtype) if fp8 else vf.to(v_cache.dtype)
        (v_cache.view(torch.uint8) if fp8 else v_cache).index_copy_(0, slots, vq.view(torch.uint8) if fp8 else vq)
