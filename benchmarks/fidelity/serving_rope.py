"""Provides the fused rotary embedding of a serving engine's decode step, for the fidelity reference.

transformers' Llama-form attention rotates the query and key heads with its modeling module's
`apply_rotary_pos_emb`: per tensor a multiply, `rotate_half` (two slices, a negation, a cat), a second multiply and
an add — about ten kernels per layer. Engines rotate both in one kernel (vLLM's `rotary_embedding` custom op,
FlashInfer's `apply_rope`; SGLang and TensorRT-LLM fuse it with the KV-cache write as well). `ServingRope` points
the modeling module's `apply_rotary_pos_emb` at this file's own Triton kernel, written apart from decodetop's
`kernels.rope`: one launch for q and k, one program per (token, head) row, `x·cos + rotate_half(x)·sin` in fp32,
rounded once to the input's dtype. Shapes it does not cover (partial rotary: cos narrower than the head) go to the
module's own function. On CPU without Triton's interpreter the same arithmetic runs as torch ops (`rope_torch`),
which the CPU tests check against the stock model.
"""

from __future__ import annotations

import inspect
import os
import sys
from typing import Any

try:
    import triton
    import triton.language as tl

    HAVE_TRITON = True
except ImportError:
    HAVE_TRITON = False

if HAVE_TRITON:

    @triton.jit
    def _rope_qk(  # noqa: PLR0917 - pointers and strides
        q_ptr,
        k_ptr,
        cos_ptr,
        sin_ptr,
        qo_ptr,
        ko_ptr,
        heads_q,
        heads_k,
        tokens,
        sqb,
        sqh,
        sqt,
        skb,
        skh,
        skt,
        scb,
        sct,
        HALF: tl.constexpr,  # noqa: N803
        BLOCK: tl.constexpr,  # noqa: N803
    ):
        bt = tl.program_id(0)
        h = tl.program_id(1)
        b = bt // tokens
        t = bt % tokens
        hk = h - heads_q
        o = tl.arange(0, BLOCK)
        m = o < HALF
        is_q = (o * 0 + h) < heads_q  # as vectors: the interpreter takes no scalar in a mask
        is_k = ~is_q
        src_q = q_ptr + b * sqb + h * sqh + t * sqt
        src_k = k_ptr + b * skb + hk * skh + t * skt
        x1 = tl.where(
            is_q, tl.load(src_q + o, mask=m & is_q, other=0.0), tl.load(src_k + o, mask=m & is_k, other=0.0)
        ).to(tl.float32)
        x2 = tl.where(
            is_q,
            tl.load(src_q + HALF + o, mask=m & is_q, other=0.0),
            tl.load(src_k + HALF + o, mask=m & is_k, other=0.0),
        ).to(tl.float32)
        c = cos_ptr + b * scb + t * sct
        s = sin_ptr + b * scb + t * sct
        c1 = tl.load(c + o, mask=m, other=0.0).to(tl.float32)
        c2 = tl.load(c + HALF + o, mask=m, other=0.0).to(tl.float32)
        s1 = tl.load(s + o, mask=m, other=0.0).to(tl.float32)
        s2 = tl.load(s + HALF + o, mask=m, other=0.0).to(tl.float32)
        y1 = x1 * c1 - x2 * s1
        y2 = x2 * c2 + x1 * s2
        row_q = qo_ptr + ((b * heads_q + h) * tokens + t) * 2 * HALF
        row_k = ko_ptr + ((b * heads_k + hk) * tokens + t) * 2 * HALF
        tl.store(row_q + o, y1.to(qo_ptr.dtype.element_ty), mask=m & is_q)
        tl.store(row_q + HALF + o, y2.to(qo_ptr.dtype.element_ty), mask=m & is_q)
        tl.store(row_k + o, y1.to(ko_ptr.dtype.element_ty), mask=m & is_k)
        tl.store(row_k + HALF + o, y2.to(ko_ptr.dtype.element_ty), mask=m & is_k)


def rope_torch(q: Any, k: Any, cos: Any, sin: Any) -> tuple[Any, Any]:
    """transformers' arithmetic (q, k [B, H, T, D]; cos, sin [B, T, D]) as torch ops."""
    import torch

    c, s = cos.unsqueeze(1), sin.unsqueeze(1)

    def rotate_half(x: Any) -> Any:
        half = x.shape[-1] // 2
        return torch.cat((-x[..., half:], x[..., :half]), dim=-1)

    return q * c + rotate_half(q) * s, k * c + rotate_half(k) * s


def rope_qk(q: Any, k: Any, cos: Any, sin: Any) -> tuple[Any, Any]:
    """(rotated q, rotated k): one kernel on a GPU (or under Triton's interpreter), the torch ops elsewhere."""
    import torch

    interpret = os.environ.get("TRITON_INTERPRET") == "1"
    if not HAVE_TRITON or not (q.is_cuda or interpret):
        return rope_torch(q, k, cos, sin)
    batch, heads_q, tokens, dim = q.shape
    heads_k = k.shape[1]
    if q.stride(-1) != 1 or k.stride(-1) != 1:
        q, k = q.contiguous(), k.contiguous()
    cos, sin = cos.contiguous(), sin.contiguous()
    q_out = torch.empty(batch, heads_q, tokens, dim, device=q.device, dtype=q.dtype)
    k_out = torch.empty(batch, heads_k, tokens, dim, device=k.device, dtype=k.dtype)
    half = dim // 2
    _rope_qk[(batch * tokens, heads_q + heads_k)](
        q,
        k,
        cos,
        sin,
        q_out,
        k_out,
        heads_q,
        heads_k,
        tokens,
        q.stride(0),
        q.stride(1),
        q.stride(2),
        k.stride(0),
        k.stride(1),
        k.stride(2),
        cos.stride(0) if cos.shape[0] > 1 else 0,
        cos.stride(1),
        HALF=half,
        BLOCK=triton.next_power_of_2(half),
    )
    return q_out, k_out


def _rope_functions(fn: Any) -> list[Any]:
    """`fn` and the plain functions it wraps: `__wrapped__`, and where the `kernels` package is installed the function
    that transformers' hub-kernel module (`use_kernel_forward_from_hub`, 5.25 on) holds in its `forward`'s closure."""
    found = [fn]
    wrapped = getattr(fn, "__wrapped__", None)
    if wrapped is not None:
        found.append(wrapped)
    forward = getattr(type(fn), "forward", None)
    for cell in getattr(forward, "__closure__", None) or ():
        try:
            inner = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        if inspect.isfunction(inner) and inner.__name__ == "apply_rotary_pos_emb":
            found.append(inner)
    return found


def _is_standard_rope(fn: Any) -> bool:
    """transformers' Llama `apply_rotary_pos_emb` (rotate_half form, cos/sin unsqueezed at dim 1), from its source."""
    for candidate in _rope_functions(fn):
        try:
            src = inspect.getsource(candidate)
        except (OSError, TypeError):
            continue
        if "(q * cos) + (rotate_half(q) * sin)" in src and "(k * cos) + (rotate_half(k) * sin)" in src:
            return True
    return False


def _fused(original: Any) -> Any:
    def apply_rotary_pos_emb(q: Any, k: Any, cos: Any, sin: Any, unsqueeze_dim: int = 1, **kw: Any) -> Any:
        dim = q.shape[-1]
        covered = (
            not kw
            and unsqueeze_dim == 1
            and q.dim() == 4
            and k.dim() == 4
            and cos.dim() == 3
            and cos.shape[-1] == dim
            and k.shape[-1] == dim
            and dim % 2 == 0
        )
        return rope_qk(q, k, cos, sin) if covered else original(q, k, cos, sin, unsqueeze_dim, **kw)

    apply_rotary_pos_emb.__wrapped__ = original  # type: ignore[attr-defined]
    return apply_rotary_pos_emb


class ServingRope:
    """Points every modeling module whose attention uses the standard `apply_rotary_pos_emb` at the fused kernel, and
    back. `reason` says why it does not apply (no such attention module)."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.modules: dict[str, Any] = {}
        self.attention = 0
        for m in model.modules():
            if not type(m).__name__.endswith("Attention"):
                continue
            mod = sys.modules.get(type(m).__module__)
            fn = getattr(mod, "apply_rotary_pos_emb", None)
            if mod is None or fn is None or not _is_standard_rope(fn):
                continue
            try:
                calls = "apply_rotary_pos_emb(query_states, key_states, cos, sin)" in inspect.getsource(type(m).forward)
            except (OSError, TypeError):
                calls = False
            if calls:
                self.modules[mod.__name__] = mod
                self.attention += 1
        self.reason = "" if self.modules else "no attention module of the Llama rotary form"
        self._saved: dict[str, Any] = {}

    def __enter__(self) -> ServingRope:
        if self.reason:
            raise ValueError(f"fused rotary does not apply: {self.reason}")
        for name, mod in self.modules.items():
            self._saved[name] = mod.apply_rotary_pos_emb
            mod.apply_rotary_pos_emb = _fused(mod.apply_rotary_pos_emb)
        return self

    def __exit__(self, *exc: object) -> None:
        for name, fn in self._saved.items():
            self.modules[name].apply_rotary_pos_emb = fn
        self._saved.clear()

    def describe(self) -> str:
        if self.reason:
            return f"rotary: transformers' own ({self.reason})"
        return f"rotary of q and k in one kernel in {self.attention} attention modules"
