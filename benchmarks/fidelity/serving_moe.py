"""Provides the serving-form MoE block for the fidelity reference: every MoE block's routed experts through the
independent grouped Triton kernel of `benchmarks/engine/moe_routed.py`, the router/top-k and shared experts kept.

A serving engine's fused-MoE kernel reads only the weights of the experts the router picked, with the expert ids read
on the device (no host sync, so the step is graph-capturable). transformers' experts modules (`MixtralExperts`,
`Qwen3MoeExperts`, `DeepseekV3Experts`, `Glm4MoeExperts`, ...) hold all experts as `gate_up_proj [E, 2·I, H]`
(gate rows first, then up rows) and `down_proj [E, H, I]`, and their forward takes the router's
`(hidden_states [T, H], top_k_index [T, k], top_k_weights [T, k])`. `ServingMoE` replaces that forward on each such
module, for one decode token (T = 1), by:

- `routed_experts_triton`: `moe_routed._w13` (gate/up rows of each routed slot) then `moe_routed._w2` (SiLU·up, the
  down projection, weighted, added into an fp32 row with atomics), then one cast — the kernels the engine benchmark
  uses as its independent routed-experts reference, code apart from decodetop's `moe` probe — with the tile picked
  per expert shape on the GPU as engines ship tuned configs per shape (`tune_tiles`: each of `TILE_CANDIDATES`
  timed under CUDA-graph replay on the model's own weights when the form is entered; before, one fixed 32×128 tile
  for every shape, which left the reference's routed experts 15 % slower than decodetop's tuned kernel at Mixtral:
  docs/benchmarks.md, "Budget fidelity with these kernels");
- `routed_experts_torch`: the same arithmetic in torch (index_select of the routed experts by the device ids, fp32
  accumulation, one cast): the fallback where there is no Triton GPU kernel (CPU) and the reference the CPU tests
  check the kernel and the stock block against.

More than one token (prefill) goes to the module's own forward. Modules of another layout (transposed experts, biases,
no gate, another activation: gpt-oss) are left alone and named.
"""

from __future__ import annotations

import os
import sys
import types
from pathlib import Path
from typing import Any

#: Activation classes that compute SiLU (the kernel's `gate / (1 + exp(-gate))`): transformers' ACT2FN["silu"] is
#: `SiLUActivation` (transformers 5.17, activations.py) or `nn.SiLU`.
SILU_CLASSES = ("SiLU", "SiLUActivation")

#: What `ServingMoE.backend` can be.
BACKENDS = ("triton", "torch")
#: (rows, reduction elements) per program of moe_routed's two kernels that `tune_tiles` tries: the ranges vLLM's
#: fused_moe configs use at small M (BLOCK_SIZE_N 16–64, BLOCK_SIZE_K 64–256), and 512 for long rows.
TILE_CANDIDATES = ((32, 128), (16, 256), (32, 256), (16, 512), (64, 128), (8, 512))
#: Calls per captured graph and replays timed per candidate (median).
TUNE_CALLS = 8
TUNE_REPLAYS = 5

_TILES: dict[tuple[int, ...], tuple[int, int]] = {}


def routed_kernels() -> types.ModuleType | None:
    """`benchmarks/engine/moe_routed.py` (its grouped kernels), or None where Triton is not installed."""
    engine = str(Path(__file__).resolve().parents[1] / "engine")
    if engine not in sys.path:
        sys.path.insert(0, engine)
    import moe_routed

    return moe_routed if moe_routed.HAVE_TRITON else None


def routed_experts_triton(x: Any, gate_up: Any, down: Any, ids: Any, weights: Any) -> Any:
    """One token's routed experts through moe_routed's kernels: x [H], gate_up [E, 2I, H], down [E, H, I], ids [k]
    (on the device), weights [k] → [H] in x's dtype. Reads only the k routed experts' rows."""
    import torch

    mr = routed_kernels()
    if mr is None:
        raise RuntimeError("Triton is not installed: moe_routed's grouped kernel cannot run")
    import triton

    k_top, hidden, inter = ids.numel(), x.shape[0], down.shape[-1]
    h = torch.empty(k_top, 2 * inter, device=x.device, dtype=torch.float32)
    acc = torch.zeros(hidden, device=x.device, dtype=torch.float32)
    bn, bk = _TILES.get(_shape(gate_up, k_top), (mr.BLOCK_N, mr.BLOCK_K))
    mr._w13[(k_top, triton.cdiv(2 * inter, bn))](x, gate_up, ids, h, hidden, 2 * inter, gate_up.stride(0), bn=bn, bk=bk)
    mr._w2[(k_top, triton.cdiv(hidden, bn))](h, down, ids, weights, acc, hidden, inter, down.stride(0), bn=bn, bk=bk)
    return acc.to(x.dtype)


def _shape(gate_up: Any, k_top: int) -> tuple[int, ...]:
    return (*gate_up.shape, k_top, gate_up.dtype.itemsize)


def tune_tiles(gate_up: Any, down: Any, k_top: int) -> tuple[int, int]:
    """The fastest (rows, reduction elements) of `TILE_CANDIDATES` for these experts at `k_top` routed slots (one
    token, random ids on the device), timed under CUDA-graph replay and remembered per shape; a candidate that fails
    is skipped."""
    import statistics

    import torch

    key = _shape(gate_up, k_top)
    if key in _TILES:
        return _TILES[key]
    dev = gate_up.device
    x = torch.randn(gate_up.shape[-1], device=dev, dtype=gate_up.dtype)
    ids = torch.randperm(gate_up.shape[0], device=dev)[:k_top].to(torch.int32)
    wts = torch.rand(k_top, device=dev) + 0.1
    timed: list[tuple[float, tuple[int, int]]] = []
    for tile in TILE_CANDIDATES:
        _TILES[key] = tile
        try:
            routed_experts_triton(x, gate_up, down, ids, wts)  # compile
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                routed_experts_triton(x, gate_up, down, ids, wts)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                for _ in range(TUNE_CALLS):
                    routed_experts_triton(x, gate_up, down, ids, wts)
            samples = []
            for _ in range(TUNE_REPLAYS):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                graph.replay()
                end.record()
                end.synchronize()
                samples.append(start.elapsed_time(end) / TUNE_CALLS)
            graph.reset()
            timed.append((statistics.median(samples), tile))
        except Exception:
            torch.cuda.synchronize()
            continue
    _TILES[key] = min(timed)[1] if timed else (routed_kernels().BLOCK_N, routed_kernels().BLOCK_K)  # type: ignore[union-attr]
    return _TILES[key]


def routed_experts_torch(x: Any, gate_up: Any, down: Any, ids: Any, weights: Any) -> Any:
    """The kernels' arithmetic in torch (same arguments, same result up to summation order): gather the routed
    experts by the device ids, gate/up and down in fp32, SiLU(gate)·up, weighted sum, one cast."""
    import torch

    inter = down.shape[-1]
    h = torch.bmm(gate_up.index_select(0, ids).float(), x.float().view(1, -1, 1).expand(ids.numel(), -1, 1))
    h = h.squeeze(-1)  # [k, 2I]
    act = torch.nn.functional.silu(h[:, :inter]) * h[:, inter:]
    y = torch.bmm(down.index_select(0, ids).float(), act.unsqueeze(-1)).squeeze(-1)  # [k, H]
    return (weights.float().unsqueeze(1) * y).sum(0).to(x.dtype)


def is_swappable_experts(module: Any) -> bool:
    """A transformers experts module of the layout the kernel reads: concatenated gate/up, not transposed, no bias,
    a gate, SiLU, contiguous 3-D weights whose shapes agree."""
    gate_up, down = getattr(module, "gate_up_proj", None), getattr(module, "down_proj", None)
    if gate_up is None or down is None or getattr(gate_up, "dim", lambda: 0)() != 3 or down.dim() != 3:
        return False
    layout_ok = (
        getattr(module, "is_concatenated", True)
        and not getattr(module, "is_transposed", False)
        and not getattr(module, "has_bias", False)
        and getattr(module, "has_gate", True)
        and not getattr(module, "has_post_expert_norm", False)
        and type(getattr(module, "act_fn", None)).__name__ in SILU_CLASSES
    )
    experts, two_inter, hidden = gate_up.shape
    shapes_ok = tuple(down.shape) == (experts, hidden, two_inter // 2) and two_inter % 2 == 0
    return bool(layout_ok and shapes_ok and gate_up.is_contiguous() and down.is_contiguous())


def looks_like_experts(module: Any) -> bool:
    """Any module holding stacked expert weights (swappable or not), so that the ones left alone are named."""
    return type(module).__name__.endswith("Experts") and hasattr(module, "down_proj")


def choose_backend(device_type: str, requested: str = "auto") -> str:
    """`triton` on a CUDA device (or anywhere under Triton's CPU interpreter, TRITON_INTERPRET=1) when Triton is
    installed; `torch` on CPU otherwise. A CUDA device without Triton raises: there the torch path would time a
    different kernel class, so the form is unavailable rather than silently something else."""
    if requested not in ("auto", *BACKENDS):
        raise ValueError(f"serving MoE backend {requested!r}: expected auto, triton or torch")
    if requested != "auto":
        return requested
    interpret = os.environ.get("TRITON_INTERPRET", "0") == "1"
    if routed_kernels() is not None and (device_type == "cuda" or interpret):
        return "triton"
    if device_type == "cpu":
        return "torch"
    raise RuntimeError("Triton is not installed: the serving MoE form needs moe_routed's grouped kernel on the GPU")


def serving_experts_forward(self: Any, hidden_states: Any, top_k_index: Any, top_k_weights: Any) -> Any:
    """The experts module's forward for one decode token through the chosen routed-experts path; more tokens go to
    the module's own forward (the class's, which dispatches on transformers' experts implementation)."""
    if hidden_states.shape[0] != 1:
        return type(self).forward(self, hidden_states, top_k_index, top_k_weights)
    run = routed_experts_triton if self._decodetop_serving_backend == "triton" else routed_experts_torch
    y = run(
        hidden_states.reshape(-1),
        self.gate_up_proj,
        self.down_proj,
        top_k_index.reshape(-1),
        top_k_weights.reshape(-1),
    )
    return y.view_as(hidden_states)


class ServingMoE:
    """Switches every swappable experts module of a transformers model to `serving_experts_forward`, and back. The
    router, top-k and shared experts stay the model's own."""

    def __init__(self, model: Any, *, backend: str = "auto") -> None:
        self.model = model
        self.experts = [m for m in model.modules() if is_swappable_experts(m)]
        self.kept = sorted(
            {type(m).__name__ for m in model.modules() if looks_like_experts(m) and not is_swappable_experts(m)}
        )
        device_type = next(model.parameters()).device.type
        self.backend = choose_backend(device_type, backend) if self.experts else "none"
        self.tiles: dict[tuple[int, ...], tuple[int, int]] = {}
        """Expert shape → the tile `tune_tiles` picked (GPU only)."""

    def __enter__(self) -> ServingMoE:
        if not self.experts:
            raise ValueError("no experts module of the gate_up/down layout: the serving MoE form does not apply")
        if self.backend == "triton" and self.experts[0].gate_up_proj.is_cuda:
            k_top = int(getattr(self.model.config, "num_experts_per_tok", 0) or 0)
            for m in self.experts:
                if k_top:
                    self.tiles[_shape(m.gate_up_proj, k_top)] = tune_tiles(m.gate_up_proj, m.down_proj, k_top)
        for m in self.experts:
            m._decodetop_serving_backend = self.backend
            m.forward = types.MethodType(serving_experts_forward, m)
        return self

    def __exit__(self, *exc: object) -> None:
        for m in self.experts:
            m.__dict__.pop("forward", None)
            m.__dict__.pop("_decodetop_serving_backend", None)

    def describe(self) -> str:
        """One line: what ran the routed experts, in how many blocks, and what was left alone."""
        path = {
            "triton": "moe_routed.py's grouped Triton kernel (routed experts only, ids on the device)",
            "torch": "the grouped kernel's torch reference path (no Triton GPU kernel here)",
        }.get(self.backend, "nothing")
        kept = f"; left alone: {', '.join(self.kept)}" if self.kept else ""
        tiles = ", ".join(f"{bn}×{bk}" for bn, bk in dict.fromkeys(self.tiles.values()))
        tuned = f", tiles tuned per shape: {tiles}" if tiles else ""
        return (
            f"routed experts of {len(self.experts)} MoE blocks through {path}{tuned}; router and shared experts "
            f"stock{kept}"
        )
