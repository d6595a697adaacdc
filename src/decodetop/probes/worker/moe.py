"""Provides the `moe` probe: one MoE layer's routed experts on this rank, for the top-k active experts.

Per key (`moe:tokens=…,top_k=…,experts_local=…,experts_active=…,hidden=…,intermediate=…,dtype=…`) it times the
whole routed-expert op the budget's key means — sort tokens by expert, gate_up GEMM, SiLU-and-mul, down GEMM,
weighted combine — two ways, both reported:

- `grouped`: one grouped GEMM per projection (`torch.nn.functional.grouped_mm` / `torch._grouped_mm`; FP8 through
  `torch._scaled_grouped_mm`), as fused-MoE kernels do (docs/reference/probes.md §7.7);
- `loop`: a per-expert loop of plain GEMMs (`_scaled_mm` for FP8), what a naive implementation launches;
- `fused`: decodetop's Triton grouped GEMV over the routed experts (three kernels, expert ids read on the device), the
  class of kernel serving engines run at decode (`decodetop.probes.worker.fused_moe`; GPUs with Triton only), with
  its tiles tuned once per GPU and shape and kept in the tile store under the state dir (`kernels.tiles`; the
  point's note names the tiles); the one variant that runs FP4 experts (MXFP4, NVFP4: weight-only, dequantised in
  registers, as engines run them on Hopper), which the torch paths have no kernel for;
- `engine`: vLLM's or SGLang's `fused_experts` where importable in the probe rank (`kernels.engines`).

Every point carries its kernel class (engine, decodetop Triton, torch, CPU).

Only the active experts' weights are allocated (× rotation copies above 2× L2); metrics include the bytes of the
active experts per step. The budget takes the faster supported variant. The shared experts are dense MLP GEMMs in
the step inventory and are measured by the `gemm` probe at their own shapes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812 - the conventional name

from decodetop.budget.keys import MoeKey, parse_key_id
from decodetop.probes.results import RankMeasurement, RankOutput
from decodetop.probes.worker import fused_moe
from decodetop.probes.worker.context import ProbeContext, UnsupportedError
from decodetop.probes.worker.fused_moe import engine_moe_runner, fused_moe_runner, torch_moe_kernel
from decodetop.probes.worker.kernels.common import best_runner
from decodetop.probes.worker.ops import OpRunner, TimingOptions, each_key, key_list, measure
from decodetop.probes.worker.precompile import compile_ahead
from decodetop.probes.worker.tensors import DTYPES, copies_for, first_line, randn, require_free, scaled_mm, sm_tag
from decodetop.probes.worker.timing import Rotation

MOE_VARIANTS = ("grouped", "loop", "fused", "engine")


def _grouped_mm_fn() -> Callable[..., torch.Tensor] | None:
    # the public name where this torch has it, else the private one of earlier releases; None on neither
    return getattr(F, "grouped_mm", None) or getattr(torch, "_grouped_mm", None)


@dataclass(frozen=True)
class _Experts:
    """One MoE layer's routed experts at a key's shape, the fixed routing, and the shared dispatch and combine."""

    key: MoeKey
    fp8: bool
    active: int
    """Experts the `tokens` × `top_k` assignments touch."""
    weights: Rotation[tuple[torch.Tensor, torch.Tensor]]
    """(gate_up [E, 2I, H], down [E, H, I]) per rotation copy, as nn.Linear stores them."""
    bounds: list[int]
    """Row offsets of each expert's tokens after the sort (host side, for the loop)."""
    dispatch: Callable[[], tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]]
    """Sort: (order, token index, tokens in expert order, cumulative counts)."""
    combine: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
    """Weighted scatter-add of the experts' outputs back to the tokens."""
    w_bytes: float
    moved_bytes: float
    flops: float

    def act(self, hcat: torch.Tensor) -> torch.Tensor:
        """SiLU-and-mul of the gate_up output."""
        inter = self.key.intermediate
        return F.silu(hcat[:, :inter]) * hcat[:, inter:]


def _experts(key: MoeKey, ctx: ProbeContext, *, rotate: bool) -> _Experts:
    """Allocate the active experts' weights (× rotation copies) and fix the routing: token i goes to experts
    (i·top_k + j) mod active, so the assignments touch exactly `experts_active` experts (the inventory's count)."""
    fp8 = key.dtype == "fp8"
    device = ctx.device
    t, k_top, h, inter = key.tokens, key.top_k, key.hidden, key.intermediate
    active = max(1, min(key.experts_active, key.experts_local, t * k_top))
    wdtype = torch.float8_e4m3fn if fp8 else DTYPES.get(key.dtype, torch.bfloat16)
    w_bytes = active * (2 * inter * h + h * inter) * wdtype.itemsize
    copies = copies_for(ctx, w_bytes, rotate)
    require_free(ctx, copies * w_bytes * 1.05, f"MoE expert weights {key.key_id}")  # +5 %: activations, offsets
    experts = Rotation(
        [
            (randn((active, 2 * inter, h), wdtype, device), randn((active, h, inter), wdtype, device))
            for _ in range(copies)
        ]
    )
    x = randn((t, h), torch.bfloat16, device, std=1.0)
    ids = torch.tensor([[(i * k_top + j) % active for j in range(k_top)] for i in range(t)], device=device)
    gates = torch.rand(t, k_top, device=device, dtype=torch.float32) + 0.1
    flat = ids.flatten()
    counts_host = [0] * active
    for e in flat.tolist():
        counts_host[e] += 1
    bounds = [0]
    for c in counts_host:
        bounds.append(bounds[-1] + c)
    rows = t * k_top
    ones = torch.ones(rows, device=device, dtype=torch.int32)

    def dispatch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        order = torch.argsort(flat, stable=True)
        token_idx = order // k_top
        xs = x.index_select(0, token_idx)
        counts = torch.zeros(active, device=device, dtype=torch.int32).scatter_add_(0, flat, ones)
        offs = torch.cumsum(counts, 0, dtype=torch.int32)
        return order, token_idx, xs, offs

    def combine(y: torch.Tensor, order: torch.Tensor, token_idx: torch.Tensor) -> torch.Tensor:
        scale = gates.flatten().index_select(0, order).unsqueeze(1)
        out = torch.zeros(t, h, device=device, dtype=torch.float32)
        return out.index_add_(0, token_idx, y.float() * scale).to(torch.bfloat16)

    moved = w_bytes + t * h * 2 * 2 + rows * (2 * inter + h) * 2
    return _Experts(key, fp8, active, experts, bounds, dispatch, combine, w_bytes, moved, 2.0 * rows * 3 * h * inter)


def moe_runner(key: MoeKey, ctx: ProbeContext, *, rotate: bool, variant: str) -> OpRunner:
    """One MoE layer's routed experts: sort tokens by expert, gate_up GEMM, SiLU-and-mul, down GEMM, weighted combine,
    as a grouped GEMM per projection (`grouped`) or a per-expert loop of GEMMs (`loop`)."""
    if key.dtype in ("nvfp4", "mxfp4"):
        where = sm_tag(ctx)
        raise UnsupportedError(
            f"{key.dtype} expert GEMMs have no torch kernel on {where} (grouped GEMM: docs/reference/probes.md §4)"
        )
    if key.dtype == "fp8" and not ctx.is_cuda:
        raise UnsupportedError("fp8 expert GEMMs (_scaled_mm / _scaled_grouped_mm) need a GPU")
    builders = {"grouped": (_grouped, "grouped GEMM"), "loop": (_loop, "per-expert loop")}
    if variant not in builders:
        raise ValueError(f"unknown MoE variant {variant!r} (known: {', '.join(MOE_VARIANTS)})")
    build, what = builders[variant]
    experts = _experts(key, ctx, rotate=rotate)
    fn = build(experts, ctx)
    try:
        fn()
    except Exception as exc:
        raise UnsupportedError(f"{what} failed on {sm_tag(ctx)}: {type(exc).__name__}: {first_line(exc)}") from None
    return OpRunner(
        fn,
        experts.moved_bytes,
        experts.flops,
        len(experts.weights),
        weight_bytes=experts.w_bytes,
        kernel=torch_moe_kernel(ctx, variant),
    )


def _grouped(experts: _Experts, ctx: ProbeContext) -> Callable[[], torch.Tensor]:
    """One grouped GEMM per projection (FP8: `_scaled_grouped_mm` with unit scales)."""
    device, key, active = ctx.device, experts.key, experts.active
    if experts.fp8:
        sgmm = getattr(torch, "_scaled_grouped_mm", None)
        if sgmm is None:
            raise UnsupportedError(f"torch {torch.__version__} has no _scaled_grouped_mm for fp8 experts")
        sa_rows = torch.ones(key.tokens * key.top_k, device=device)
        sb13: torch.Tensor | None = torch.ones(active, 2 * key.intermediate, device=device)
        sb2: torch.Tensor | None = torch.ones(active, key.hidden, device=device)

        def gm(a: torch.Tensor, w: torch.Tensor, offs: torch.Tensor, sb: torch.Tensor | None) -> torch.Tensor:
            a8 = a.to(torch.float8_e4m3fn)  # dynamic activation quantization (scales fixed at 1 here)
            return sgmm(a8, w.transpose(-2, -1), sa_rows, sb, offs=offs, out_dtype=torch.bfloat16)  # type: ignore[no-any-return]

    else:
        gmm = _grouped_mm_fn()
        if gmm is None:
            raise UnsupportedError(f"torch {torch.__version__} has no grouped_mm / _grouped_mm")

        def gm(a: torch.Tensor, w: torch.Tensor, offs: torch.Tensor, sb: torch.Tensor | None) -> torch.Tensor:
            return gmm(a, w.transpose(-2, -1), offs=offs)

        sb13 = sb2 = None

    def grouped() -> torch.Tensor:
        w13, w2 = experts.weights.next()
        order, token_idx, xs, offs = experts.dispatch()
        hcat = gm(xs, w13, offs, sb13)
        y = gm(experts.act(hcat), w2, offs, sb2)
        return experts.combine(y, order, token_idx)

    return grouped


def _loop(experts: _Experts, ctx: ProbeContext) -> Callable[[], torch.Tensor]:
    """A per-expert loop of plain GEMMs (FP8: `_scaled_mm`, rows padded to 16), what a naive implementation runs."""
    one = torch.tensor(1.0, device=ctx.device)

    def expert_mm(a: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        if experts.fp8:
            a8 = a.to(torch.float8_e4m3fn)
            pad = (-a8.shape[0]) % 16
            if pad:
                a8 = torch.cat([a8, a8.new_zeros(pad, a8.shape[1])])
            return scaled_mm(a8, w.t(), one, one)[: a.shape[0]]
        return F.linear(a, w)

    def loop() -> torch.Tensor:
        w13, w2 = experts.weights.next()
        order, token_idx, xs, _offs = experts.dispatch()
        outs = []
        for e in range(experts.active):
            lo, hi = experts.bounds[e], experts.bounds[e + 1]
            if hi > lo:
                outs.append(expert_mm(experts.act(expert_mm(xs[lo:hi], w13[e])), w2[e]))
        return experts.combine(torch.cat(outs), order, token_idx)

    return loop


def op_runner(key_id: str, ctx: ProbeContext, *, rotate: bool) -> OpRunner:
    """A layer's routed experts with the kernel the probe's budget row takes where it runs (the engine's fused
    experts, else decodetop's fused Triton MoE: the fastest at decode batches), else torch's grouped GEMM, else the
    per-expert loop. FP4 experts, which torch cannot multiply on sm_90, so get a layer point."""
    key = parse_key_id(key_id)
    assert isinstance(key, MoeKey)
    return best_runner(
        [
            ("engine kernel", lambda: engine_moe_runner(key, ctx, rotate=rotate)),
            ("decodetop Triton", lambda: fused_moe_runner(key, ctx, rotate=rotate)),
            ("torch grouped GEMM", lambda: moe_runner(key, ctx, rotate=rotate, variant="grouped")),
            ("torch per-expert loop", lambda: moe_runner(key, ctx, rotate=rotate, variant="loop")),
        ]
    ).runner


def run(ctx: ProbeContext, params: dict[str, Any]) -> RankOutput:
    """Each key in each variant."""
    opts = TimingOptions.from_params(ctx, params)
    keys = key_list(params, "moe")
    variants = [str(v) for v in params["variants"]]
    bad = [v for v in variants if v not in MOE_VARIANTS]
    if bad:
        raise ValueError(f"moe: unknown variant(s) {bad} (known: {', '.join(MOE_VARIANTS)})")
    if "fused" in variants and ctx.is_cuda:
        gpu = torch.cuda.get_device_name(ctx.device)
        parsed = [k for k in map(parse_key_id, keys) if isinstance(k, MoeKey)]
        ahead = compile_ahead(ctx, [partial(fused_moe.launch_triton_once, k, gpu) for k in parsed])
        if ahead.requested:
            ctx.progress(ahead.text)
    out: list[RankMeasurement] = []
    for kid, key in each_key(ctx, keys, MoeKey):
        for variant in variants:
            pt = {"what": "moe", "key": kid, "variant": variant, "role": "budget", "device": ctx.device.type}
            if variant == "fused":
                build = partial(fused_moe_runner, key, ctx, rotate=opts.rotate)
            elif variant == "engine":
                build = partial(engine_moe_runner, key, ctx, rotate=opts.rotate)
            else:
                build = partial(moe_runner, key, ctx, rotate=opts.rotate, variant=variant)
            out.append(measure(ctx, opts, f"{kid} [{variant}]", pt, build))
    ctx.progress("done", len(keys), len(keys))
    return RankOutput(measurements=tuple(out))
