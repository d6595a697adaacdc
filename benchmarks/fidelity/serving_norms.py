"""Provides the fused residual-add + RMSNorm of a serving engine's decode step, for the fidelity reference.

Engines run each decoder layer's two residual adds inside the RMSNorm that follows them: one kernel reads the
sublayer's output and the running residual, writes the new residual and its RMSNorm (vLLM's `fused_add_rms_norm`,
SGLang's and FlashInfer's `fused_add_rmsnorm`), the residual carried from layer to layer beside the hidden state.
transformers' decoder layer adds `residual + hidden_states` as its own op and normalises afterwards. `ServingNorms`
re-routes every decoder layer of the Llama form (input_layernorm → self_attn → post_attention_layernorm → mlp, plain
RMSNorms, two residual adds) the engines' way: layer ℓ returns its MLP output without the add and keeps the residual
in a holder; layer ℓ + 1 fuses that add into its input norm, every layer fuses the post-attention add into its second
norm, and the model's final norm fuses the last add. The first layer's input norm has no add (plain RMSNorm).

The kernel is this file's own (written apart from decodetop's `kernels.norms`): one program per row, the sum in
fp32 rounded to the residual's dtype before the norm (as transformers' add then norm round it), the RMSNorm in fp32,
`weight · x̂` rounded as transformers' Llama RMSNorm rounds it. On CPU without Triton's interpreter the same
arithmetic runs as torch ops (`add_rmsnorm_torch`), which the CPU tests check against the stock model.
"""

from __future__ import annotations

import inspect
import os
import types
from typing import Any

from fidelity import is_plain_rmsnorm

try:
    import triton
    import triton.language as tl

    HAVE_TRITON = True
except ImportError:
    HAVE_TRITON = False

if HAVE_TRITON:

    @triton.jit
    def _add_rmsnorm(x_ptr, r_ptr, w_ptr, y_ptr, r_out_ptr, n, eps, HAS_RES: tl.constexpr, BLOCK: tl.constexpr):  # noqa: N803, PLR0917
        row = tl.program_id(0)
        o = tl.arange(0, BLOCK)
        m = o < n
        x = tl.load(x_ptr + row * n + o, mask=m, other=0.0).to(tl.float32)
        if HAS_RES:
            x = x + tl.load(r_ptr + row * n + o, mask=m, other=0.0).to(tl.float32)
            x = x.to(r_out_ptr.dtype.element_ty)
            tl.store(r_out_ptr + row * n + o, x, mask=m)
            x = x.to(tl.float32)
        inv = tl.rsqrt(tl.sum(x * x, 0) / n + eps)
        w = tl.load(w_ptr + o, mask=m, other=0.0)
        y = w * (x * inv).to(y_ptr.dtype.element_ty)
        tl.store(y_ptr + row * n + o, y.to(y_ptr.dtype.element_ty), mask=m)


def add_rmsnorm_torch(x: Any, residual: Any | None, weight: Any, eps: float) -> tuple[Any, Any]:
    """(RMSNorm of x + residual, x + residual) in the kernel's arithmetic, as torch ops (CPU path)."""
    import torch

    s = (x.float() + residual.float()).to(x.dtype) if residual is not None else x
    h = s.float()
    y = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * y.to(x.dtype), s


def add_rmsnorm(x: Any, residual: Any | None, norm: Any) -> tuple[Any, Any]:
    """(RMSNorm of x + residual with `norm`'s weight and epsilon, x + residual): one kernel on a GPU (or under
    Triton's interpreter), the torch ops elsewhere. Without a residual: the plain RMSNorm and x itself."""
    import torch

    eps = float(norm.variance_epsilon)
    interpret = os.environ.get("TRITON_INTERPRET") == "1"
    if not HAVE_TRITON or not (x.is_cuda or interpret):
        return add_rmsnorm_torch(x, residual, norm.weight, eps)
    width = x.shape[-1]
    xc = x.contiguous()
    y = torch.empty_like(xc)
    r_out = torch.empty_like(xc) if residual is not None else xc
    r_in = residual.contiguous() if residual is not None else xc
    _add_rmsnorm[(xc.numel() // width,)](
        xc, r_in, norm.weight, y, r_out, width, eps, HAS_RES=residual is not None, BLOCK=triton.next_power_of_2(width)
    )
    return y, r_out


class _Residual:
    """The residual carried between the layers of one forward (None before the first layer)."""

    def __init__(self) -> None:
        self.value: Any | None = None


def fused_layer_forward(self: Any, hidden_states: Any, **kwargs: Any) -> Any:
    """A Llama-form decoder layer with both residual adds fused into the following RMSNorms; returns the MLP output
    without the add (the next layer's input norm, or the model's final norm, adds it)."""
    held = self._decodetop_residual
    h, residual = add_rmsnorm(hidden_states, held.value, self.input_layernorm)
    out = self.self_attn(hidden_states=h, **kwargs)
    h = out[0] if isinstance(out, tuple) else out
    h, residual = add_rmsnorm(h, residual, self.post_attention_layernorm)
    h = self.mlp(h)
    h = h[0] if isinstance(h, tuple) else h
    held.value = residual
    return h


def fused_final_norm_forward(self: Any, hidden_states: Any) -> Any:
    """The model's final RMSNorm with the last layer's residual add fused in."""
    held = self._decodetop_residual
    y, _ = add_rmsnorm(hidden_states, held.value, self)
    held.value = None
    return y


def is_llama_form_layer(layer: Any) -> bool:
    """input_layernorm → self_attn → post_attention_layernorm → mlp with two residual adds and no other norm."""
    norms = [n for n, _ in layer.named_children() if "norm" in n.lower()]
    if sorted(norms) != ["input_layernorm", "post_attention_layernorm"] or not hasattr(layer, "mlp"):
        return False
    if not all(is_plain_rmsnorm(getattr(layer, n)) for n in norms) or not hasattr(layer, "self_attn"):
        return False
    try:
        src = inspect.getsource(type(layer).forward)
    except (OSError, TypeError):
        return False
    return src.count("residual + hidden_states") == 2


class ServingNorms:
    """Switches every decoder layer of a transformers model to the fused add + RMSNorm form, and back. Applies when
    every layer is of the Llama form and the final norm is a plain RMSNorm (else `reason` says why not)."""

    def __init__(self, model: Any) -> None:
        self.model = model
        base = getattr(model, "model", None)
        self.layers = list(getattr(base, "layers", []) or [])
        self.final = getattr(base, "norm", None)
        self.reason = ""
        if not self.layers:
            self.reason = "no decoder layers found"
        elif not all(is_llama_form_layer(layer) for layer in self.layers):
            self.reason = f"{type(self.layers[0]).__name__} is not of the Llama form (two norms, two residual adds)"
        elif not is_plain_rmsnorm(self.final):
            self.reason = "the final norm is not a plain RMSNorm"
        self._held = _Residual()
        self._hook: Any = None

    def __enter__(self) -> ServingNorms:
        if self.reason:
            raise ValueError(f"fused add + RMSNorm does not apply: {self.reason}")
        for m in (*self.layers, self.final):
            m._decodetop_residual = self._held
        for layer in self.layers:
            layer.forward = types.MethodType(fused_layer_forward, layer)
        self.final.forward = types.MethodType(fused_final_norm_forward, self.final)

        def reset(*_: Any) -> None:
            self._held.value = None

        self._hook = self.model.model.register_forward_pre_hook(reset)
        return self

    def __exit__(self, *exc: object) -> None:
        for m in (*self.layers, self.final):
            m.__dict__.pop("forward", None)
            m.__dict__.pop("_decodetop_residual", None)
        if self._hook is not None:
            self._hook.remove()
            self._hook = None

    def describe(self) -> str:
        if self.reason:
            return f"norms: transformers' own ({self.reason})"
        return f"{2 * len(self.layers)} residual adds fused into the following RMSNorm (one kernel each)"
