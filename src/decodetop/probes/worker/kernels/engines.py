"""Provides the serving engines' own kernels where they are importable in the probe rank (torch side): which
package, version and function, and an adapter that calls it on the probe's tensors.

Detection is by import, here in the probe rank only (the UI process never imports an engine): for each op, the
candidates in order, the first whose package imports and has the function wins (a function named
`torch.ops.<namespace>.<op>` is the custom op the module registers when imported). The adapters call the functions
as those packages publish them:

- fused residual-add + RMSNorm, in place on (input, residual): FlashInfer `flashinfer.norm.fused_add_rmsnorm(input,
  residual, weight, eps)`, SGLang `sgl_kernel.fused_add_rmsnorm(input, residual, weight, eps)`, vLLM
  `vllm._custom_ops.fused_add_rms_norm(input, residual, weight, epsilon)`;
- RMSNorm: `flashinfer.norm.rmsnorm(input, weight, eps)`, `sgl_kernel.rmsnorm(input, weight, eps)`, vLLM
  `vllm._custom_ops.rms_norm(out, input, weight, epsilon)`;
- SiLU-and-mul of the gate_up output (input [T, 2I] → out [T, I]): FlashInfer `flashinfer.activation.silu_and_mul(
  input, out=None, enable_pdl=None)` (https://docs.flashinfer.ai/api/activation.html), SGLang
  `sgl_kernel.silu_and_mul(input, out=None)`
  (https://github.com/sgl-project/sglang/blob/main/sgl-kernel/python/sgl_kernel/elementwise.py), vLLM
  `torch.ops._C.silu_and_mul(out, input)`, registered by importing `vllm._C`, the op its `SiluAndMul` layer calls
  (https://github.com/vllm-project/vllm/blob/main/vllm/model_executor/layers/activation.py);
- the routed experts of a MoE layer: vLLM `vllm.model_executor.layers.fused_moe.fused_experts(hidden_states, w1, w2,
  topk_weights, topk_ids)` and SGLang `sglang.srt.layers.moe.fused_moe_triton.fused_experts(...)` (w1 [E, 2I, H],
  w2 [E, H, I], the layout the probe allocates);
- GQA decode of one sequence: FlashInfer `flashinfer.decode.single_decode_with_kv_cache(q [H, D], k [Hkv, L, D],
  v, kv_layout="HND")`.

Every adapter's output is checked against the torch form once before it is timed (`common.check_close`); an engine
kernel that raises or disagrees is passed over with the reason in the point's note. `DECODETOP_ENGINE_KERNELS=0`
turns detection off (the probe then times decodetop's own kernels).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from decodetop.budget.kernels import KernelClass
from decodetop.probes.worker.context import UnsupportedError

#: Where a candidate's function is a custom op the module registers on import, not one of its attributes.
TORCH_OPS_PREFIX = "torch.ops."

#: op → (package, module, function) candidates, best first.
CANDIDATES: dict[str, tuple[tuple[str, str, str], ...]] = {
    "add_rmsnorm": (
        ("flashinfer", "flashinfer.norm", "fused_add_rmsnorm"),
        ("sgl_kernel", "sgl_kernel", "fused_add_rmsnorm"),
        ("vllm", "vllm._custom_ops", "fused_add_rms_norm"),
    ),
    "rmsnorm": (
        ("flashinfer", "flashinfer.norm", "rmsnorm"),
        ("sgl_kernel", "sgl_kernel", "rmsnorm"),
        ("vllm", "vllm._custom_ops", "rms_norm"),
    ),
    "silu_mul": (
        ("flashinfer", "flashinfer.activation", "silu_and_mul"),
        ("sgl_kernel", "sgl_kernel", "silu_and_mul"),
        ("vllm", "vllm._C", "torch.ops._C.silu_and_mul"),
    ),
    "moe": (
        ("vllm", "vllm.model_executor.layers.fused_moe", "fused_experts"),
        ("sglang", "sglang.srt.layers.moe.fused_moe_triton", "fused_experts"),
    ),
    "gqa_decode": (("flashinfer", "flashinfer.decode", "single_decode_with_kv_cache"),),
}


@dataclass(frozen=True)
class EngineKernel:
    """An importable engine function and its class label."""

    op: str
    kernel: KernelClass
    fn: Callable[..., Any]


def engines_enabled() -> bool:
    """False when DECODETOP_ENGINE_KERNELS=0 asks for decodetop's own kernels only."""
    return os.environ.get("DECODETOP_ENGINE_KERNELS", "1") != "0"


def _version(package: str) -> str:
    """The installed distribution's version, else the package's `__version__`."""
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return str(getattr(importlib.import_module(package), "__version__", "unknown version"))


def _resolve(module_name: str, function: str) -> Any:
    """The module's attribute `function`, or (`torch.ops.<namespace>.<op>`) the custom op importing it registered."""
    module = importlib.import_module(module_name)
    if not function.startswith(TORCH_OPS_PREFIX):
        return getattr(module, function)
    import torch  # the probe rank's; only a torch.ops candidate needs it here

    namespace, op = function.removeprefix(TORCH_OPS_PREFIX).split(".")
    return getattr(getattr(torch.ops, namespace), op)


_FOUND: dict[str, EngineKernel | str] = {}


def find(op: str) -> EngineKernel:
    """The first importable engine kernel for `op`; UnsupportedError naming the packages tried when none is."""
    if not engines_enabled():
        raise UnsupportedError("engine kernels off (DECODETOP_ENGINE_KERNELS=0)")
    cached = _FOUND.get(op)
    if isinstance(cached, EngineKernel):
        return cached
    if isinstance(cached, str):
        raise UnsupportedError(cached)
    tried: list[str] = []
    for package, module_name, function in CANDIDATES.get(op, ()):
        tried.append(package)
        if importlib.util.find_spec(package) is None:
            continue
        try:
            fn = _resolve(module_name, function)
        except Exception:  # noqa: S112 - an engine that does not import here is simply not a candidate
            continue
        if callable(fn):
            name = function if function.startswith(TORCH_OPS_PREFIX) else f"{module_name}.{function}"
            kernel = KernelClass("engine", name, package, _version(package))
            found = EngineKernel(op, kernel, fn)
            _FOUND[op] = found
            return found
    reason = f"no engine kernel importable ({', '.join(dict.fromkeys(tried))})" if tried else "no engine kernel known"
    _FOUND[op] = reason
    raise UnsupportedError(reason)


def forget() -> None:
    """Drop what `find` remembered (tests put a fake engine on the path and take it away again)."""
    _FOUND.clear()
