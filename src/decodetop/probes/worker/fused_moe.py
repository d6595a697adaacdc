"""Provides decodetop's fused-MoE decode kernel: a grouped GEMV in Triton that reads only the routed experts' weights,
the `fused` variant of the `moe` probe (torch side).

Serving engines run decode MoE layers as one fused Triton kernel per projection that indexes the expert weights
with the router's ids on the device (vLLM `fused_moe` / SGLang `fused_moe_triton`); the torch path of the `moe`
probe (sort, grouped GEMM, SiLU-and-mul, grouped GEMM, combine) launches a dozen kernels around two grouped GEMMs
built for large M. At batch 1 the layer is a weight stream, so what matters is reading each routed expert once at
full bandwidth. Three kernels do the whole routed-expert op:

1. `gate_up`: one program per (token, routed slot) × block of the intermediate width × part of the hidden width:
   reads the expert id from the device, streams that expert's gate and up rows against the token's activation
   (fp32 accumulation) and writes the gate and up sums as an fp32 row (added with atomics where the hidden width is
   split over several programs);
2. `down`: one program per routed slot × block of the hidden width × part of the intermediate width: streams that
   expert's down-projection rows against SiLU(gate) · up (computed from the sums as each block is read) and writes
   the product, scaled by the router weight, as an fp32 row (added with atomics where split);
3. `combine` (not in the fold form, below): each token's top-k rows summed into its output (deterministic; a few
   KB per token). The down kernel summing the top-k itself instead (no fp32 partials, one launch fewer) was slower
   on an H200 at Mixtral's top-k 2 (docs/benchmarks.md, "Kernels, fourth round").

Splitting the reduction (`Tiles.split_k`) gives a shape with few output rows per slot enough programs to keep
HBM busy: DeepSeek-V3's TP-8 slice has 8 slots × 512 gate/up rows, 128 programs of 32 rows for 132 SMs, and read
45 % of copy bandwidth on an H200 unsplit (docs/benchmarks.md, "Kernels").

No memsets: the split reductions add onto fp32 workspaces (`h`, `ys`) that hold zeros, allocated once with
`torch.zeros`; the combine kernel, the last of the three, writes zeros over each element of them once it is read
(ys by itself, h by the down kernel before it), so the next call finds them zero. Two memsets a step were graph
nodes that are not kernels, which PDL does not cross (DeepSeek-V3's TP-8 slice at 31.0 µs, 67 % of copy:
docs/benchmarks.md, "Kernels, fourth round"). `fused_moe(..., memsets=True)` keeps the earlier form for timing it.

gate_up has a second form, `_gate_up_mma_kernel` (`Tiles.mma`): the slot's token padded to 16 rows and the
products taken by `tl.dot`, so that Triton pipelines the weight tiles' loads (`num_stages`; cp.async in the sm_90
PTX where the hidden width is whole steps, unmasked along k), which it does for no load of the reduction form's
loop (products reduced, not dotted). The tuner times both forms.

Expert ids and weights are tensors on the device, so the three are CUDA-graph replayable with any routing. Weights
are `[E, 2·I, H]` (gate rows, then up rows) and `[E, H, I]`, as `nn.Linear` stores them and as the torch path
allocates them. `reference_moe` is the same computation in plain torch (CPU-testable); the runner checks the kernel
against it once per key before timing.

The three launch with programmatic dependent launch where the GPU has it (sm_90 and newer,
`kernels.common.pdl_enabled`; https://docs.nvidia.com/cuda/cuda-c-programming-guide/index.html#programmatic-dependent-launch-and-synchronization):
each is scheduled while the one before finishes and waits in `gdc_wait` before its first load. Only the expert
weights are written by nothing upstream, but which expert's rows to read comes from the router's ids, so no weight
load can start before the wait either; what overlaps is the launch and the grid's ramp. That is the `late` form
(`tiles.FORM_LATE`): each kernel triggers its dependents after its loop, which left DeepSeek-V3's TP-8 slice at
30.0 µs, 69 % of copy bandwidth, where Mixtral reads 96–98 % and Qwen3-235B ~90 %.

The `early` form (`tiles.FORM_EARLY`) moves each trigger to right after the kernel's `gdc_wait` (where it sits
never changes what the next grid reads: its own `gdc_wait` still waits for this grid's completion and flush), so
the down kernel's programs become resident while gate_up streams, and the combine's while down streams; and the
down kernel loads its expert id, router weight and first weight tile (its rows' whole slice where one k-step covers
its part of I) before its wait. The ids and weights are the router's, two grids back: gate_up let down start only
once each of its programs had passed its own wait on the router (the argument of `dsa._carry_keys`' EARLY loads).
The larger `tiles.PREFETCH_CANDIDATES` (128 rows, 8 warps) let one wave of down programs hold most of a short down
projection before the wait.

The `fold` form (`tiles.FORM_FOLD`) is the early form in two launches: the down kernel adds its weighted rows with
atomics into one fp32 row per token (row t of `ys`) and takes a ticket per (token, hidden block); the program that
draws the last writes the block to the output and zeroes it and its counter, and a second ticket per (slot, k part)
lets the last reader of that part of h zero it (`_fold_into_out`; the CUDA cooperative-groups grid-sync pattern),
so it too needs no memsets. Unlike the top-k sum tried before (slower at Mixtral's top-k 2, above), the three-kernel
forms stay selectable. The tuner times each form as a whole step (all launches of a call in one graph) and stores
the fastest with its tiles (`tiles.TileChoice.form`). On an H200 (benchmarks/kernels/moe_forms.py; docs/benchmarks.md,
"Kernels, eighth round") neither helps DeepSeek-V3's TP-8 slice (29.0 µs late, 30.0 early, 34.2 fold: the fold's
fp32 atomics), and each takes 1–3 % off Mixtral's or Qwen3's where the tuner picks it.

FP4 experts (MXFP4 and NVFP4, `decodetop.probes.worker.fp4`: E2M1 values two a byte along k, a block scale per
32 or 16 of them, NVFP4's fp32 scale per expert) have a gate_up and a down kernel of their own in the reduction
form (`_gate_up_fp4_kernel`, `_down_fp4_kernel`: the same grid, splits, forms and PDL placements), as engines run
them on Hopper, whose tensor cores multiply no FP4: weight-only (w4a16, vLLM's Marlin MXFP4/NVFP4 kernels and
triton_kernels' matmul_ogs for gpt-oss), the packed bytes and scales streamed from memory and dequantised in
registers. At decode batch the layer is a weight stream, so the 4.25 (MXFP4) or 4.5 (NVFP4) bits a weight are what
it moves. Each k-step loads a [rows, step/2] byte tile and its scales, multiplies the low nibbles by the even and
the high by the odd activations in fp32, and scales each block's sum. They have no `tl.dot` form (tiles that say
`mma` are refused; the tuner offers `tiles.FP4_CANDIDATES`), and the reference dequantises the routed experts in
torch (`fp4.dequant_fp4`) before the same computation.

Triton ships with torch's Linux CUDA wheels; where it is missing, or on CPU ranks, the variant is `unsupported`
with the reason. Triton's interpreter (`TRITON_INTERPRET=1`) runs the same kernels on CPU tensors, which the
tests use where Triton is installed.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch
import torch.nn.functional as F  # noqa: N812 - the conventional name

from decodetop.budget.kernels import KernelClass
from decodetop.budget.keys import MoeKey
from decodetop.probes.worker.context import ProbeContext, UnsupportedError
from decodetop.probes.worker.fp4 import GROUP, NVFP4, Fp4Weights, fp4_nbytes, random_fp4
from decodetop.probes.worker.kernels import tiles as tile_store
from decodetop.probes.worker.kernels.common import (
    HAVE_TRITON,
    interpreted,
    launch,
    pdl_enabled,
    sm_count,
    torch_kernel,
    triton_kernel,
)
from decodetop.probes.worker.kernels.tiles import FORM_EARLY, FORM_FOLD, FORM_LATE, FORMS, Tiles
from decodetop.probes.worker.ops import OpRunner
from decodetop.probes.worker.tensors import DTYPES, copies_for, first_line, randn, require_free, sm_tag
from decodetop.probes.worker.timing import Rotation

#: Output rows per program, from the largest down: the largest that still gives every SM `PROGRAMS_PER_SM` programs
#: (a batch-1 layer is a weight stream: enough programs in flight keep HBM busy; fewer, larger blocks cost less
#: per program where there is plenty of work, as Mixtral's 7168-wide gate_up).
BLOCK_N_CHOICES = (32, 16, 8)
#: Rows of the gate_up kernel's `tl.dot` form: the token padded to the M of the tensor cores' BF16 MMA tile
#: (`mma.sync.m16n8k16`, PTX ISA "Warp-level matrix multiply-accumulate instructions":
#: https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#warp-level-matrix-instructions), which a dot
#: of fewer rows is padded to anyway.
MMA_M = 16
#: Elements per program of the combine kernel (sums each token's top-k fp32 rows; a few KB per token).
COMBINE_BLOCK = 1024
#: Programs per SM wanted in flight (H200: 132 SMs → 528 programs).
PROGRAMS_PER_SM = 4
#: Relative tolerance of the one-time check against `reference_moe` (bf16 output: 8 significant bits ≈ 0.4 %;
#: fp32 accumulation order differs from torch's, so allow a few ulps over the output's scale).
CHECK_RTOL = 0.05
#: FP4 weight formats (`decodetop.probes.worker.fp4`), read by the FP4 kernels (weight-only, w4a16).
FP4_DTYPES = tuple(GROUP)
#: Weight formats the kernels read (fp8 E4M3 and FP4 weights are dequantised in registers: weight-only, w8a16 and
#: w4a16).
KERNEL_DTYPES = ("bf16", "fp16", "fp32", "fp8", *FP4_DTYPES)
#: What the probe's note says of each quantized weight format.
WEIGHT_NOTES = {
    "fp8": "fp8 weights dequantised in registers (w8a16)",
    "mxfp4": "fp4 weights (MXFP4: E2M1 + E8M0 scale per 32) dequantised in registers (w4a16)",
    "nvfp4": "fp4 weights (NVFP4: E2M1 + E4M3 scale per 16, fp32 scale per expert) dequantised in registers (w4a16)",
}
#: One projection's expert weights: a plain tensor [E, N, K] or packed FP4 (`fp4.Fp4Weights`).
Experts = torch.Tensor | Fp4Weights

if HAVE_TRITON:
    from decodetop.probes.worker.kernels.moe_gemv import (
        _combine_kernel,
        _down_fp4_kernel,
        _down_kernel,
        _gate_up_fp4_kernel,
        _gate_up_kernel,
        _gate_up_mma_kernel,
    )


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
    gate_up_tiles: Tiles | None = None
    down_tiles: Tiles | None = None


def grid_for(
    tokens: int,
    top_k: int,
    hidden: int,
    inter: int,
    sms: int = 1,
    *,
    gate_up: Tiles | None = None,
    down: Tiles | None = None,
) -> Grid:
    """gate_up: (tokens·top_k, ⌈inter/bn⌉); down: (tokens·top_k, ⌈hidden/bn⌉); combine: (tokens,
    ⌈hidden/COMBINE_BLOCK⌉); bn per kernel from the given tiles, else from `pick_block_n`."""
    if min(tokens, top_k, hidden, inter, sms) < 1:
        raise ValueError(f"fused MoE shapes must be positive: {tokens=}, {top_k=}, {hidden=}, {inter=}, {sms=}")
    slots = tokens * top_k
    gate_up = gate_up or Tiles(pick_block_n(inter, slots, sms))
    down = down or Tiles(pick_block_n(hidden, slots, sms))
    return Grid(
        (slots, -(-inter // gate_up.block_n)),
        (slots, -(-hidden // down.block_n)),
        (tokens, -(-hidden // COMBINE_BLOCK)),
        gate_up.block_n,
        down.block_n,
        gate_up,
        down,
    )


def fused_moe(
    x: torch.Tensor,
    w13: Experts,
    w2: Experts,
    ids: torch.Tensor,
    weights: torch.Tensor,
    *,
    h: torch.Tensor | None = None,
    ys: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    sms: int | None = None,
    tiles: tuple[Tiles, Tiles] | None = None,
    memsets: bool = False,
    form: str = FORM_LATE,
    tickets: torch.Tensor | None = None,
) -> torch.Tensor:
    """Routed experts of `x` [T, H]: Σ_k weights[t, k] · down_e(SiLU(gate_e(x_t)) · up_e(x_t)), e = ids[t, k].

    w13 [E, 2I, H], w2 [E, H, I] (contiguous; both plain tensors or both FP4 of one format, `fp4.Fp4Weights`,
    whose tiles' steps must be whole scale blocks); ids [T, K] int32/int64 and weights [T, K] on x's device. `h`
    [T·K, 2I] fp32 (the gate and up sums), `ys` [T·K, H] fp32 and `out` [T, H] may be passed preallocated so a
    captured graph allocates nothing; `h` and `ys` must then hold zeros (`torch.zeros`), and the combine kernel
    leaves them zero again for the next call. `sms`: the SM count the launch shape is sized for (default: the
    device's; 1 on CPU tensors under Triton's interpreter). `tiles`: (gate_up, down) tiles (default: rows per
    program from `pick_block_n`). `memsets`: the earlier form, which zeroes a split reduction's workspace with a
    memset before its kernel and leaves the workspaces as they are (any contents in, not zero after), for timing
    the memsets' cost. `form`: how the kernels meet (`tiles.FORMS`); the fold form's down kernel sums into row t
    of `ys` per token and counts with `tickets` (int32, at least `ticket_count` elements, zeros; left zero)."""
    if not HAVE_TRITON:
        raise UnsupportedError(triton_unavailable(x.device))
    if form not in FORMS:
        raise ValueError(f"fused MoE form {form!r} is none of {', '.join(FORMS)}")
    if memsets and form == FORM_FOLD:
        raise ValueError("the memsets form is a three-kernel one: not with the fold form")
    tokens, hidden = x.shape
    n_exp, two_inter, hidden_w = w13.shape
    inter = two_inter // 2
    top_k = ids.shape[1]
    if hidden_w != hidden or w2.shape != (n_exp, hidden, inter) or tuple(weights.shape) != (tokens, top_k):
        raise ValueError(
            f"fused MoE shapes disagree: x {tuple(x.shape)}, w13 {tuple(w13.shape)}, w2 {tuple(w2.shape)}, "
            f"ids {tuple(ids.shape)}, weights {tuple(weights.shape)}"
        )
    _check_layout(x, w13, w2, ids)
    if h is None:
        h = torch.zeros(tokens * top_k, 2 * inter, device=x.device, dtype=torch.float32)
    if ys is None:
        ys = torch.zeros(tokens * top_k, hidden, device=x.device, dtype=torch.float32)
    if out is None:
        out = torch.empty(tokens, hidden, device=x.device, dtype=x.dtype)
    if sms is None:
        sms = torch.cuda.get_device_properties(x.device).multi_processor_count if x.is_cuda else 1
    up_t, down_t = tiles if tiles is not None else (None, None)
    grid = grid_for(tokens, top_k, hidden, inter, sms, gate_up=up_t, down=down_t)
    early = form in {FORM_EARLY, FORM_FOLD}
    launch_gate_up(x, w13, ids, h, grid, memset=memsets, early=early)
    if form == FORM_FOLD:
        if tickets is None:
            tickets = torch.zeros(ticket_count(tokens, top_k, hidden), device=x.device, dtype=torch.int32)
        launch_down(h, w2, ids, weights, ys, grid, early=True, fold=(out, tickets))
        return out
    launch_down(h, w2, ids, weights, ys, grid, memset=memsets, early=early)
    launch(
        _combine_kernel,
        grid.combine,
        ys,
        out,
        h,
        hidden,
        top_k * 2 * inter,
        top_k=top_k,
        block=COMBINE_BLOCK,
        zero=not memsets,
        EARLY=early,
        pdl=True,
    )
    return out


def _check_layout(x: torch.Tensor, w13: Experts, w2: Experts, ids: torch.Tensor) -> None:
    """The kernels address x, the weights and ids by unit strides along their last dimension, and read both
    projections in one format."""
    if not (x.is_contiguous() and w13.is_contiguous() and w2.is_contiguous() and ids.is_contiguous()):
        raise ValueError("fused MoE needs contiguous x, w13, w2 and ids")
    if _fp4_format(w13) != _fp4_format(w2):
        raise ValueError(
            f"fused MoE weights disagree: w13 {_fp4_format(w13) or 'plain'}, w2 {_fp4_format(w2) or 'plain'}"
        )


def _fp4_format(w: Experts) -> str:
    """'mxfp4' / 'nvfp4' for FP4 weights, '' for a plain tensor."""
    return w.fmt if isinstance(w, Fp4Weights) else ""


def ticket_count(tokens: int, top_k: int, hidden: int) -> int:
    """Counters the fold form needs at most over the tuner's tiles: one per (token, hidden block) at the fewest rows
    per program, one per (slot, k part) at the most parts."""
    tried = (*tile_store.TILE_CANDIDATES, *tile_store.FP4_CANDIDATES)
    rows = min(*(t.block_n for t in tried), *BLOCK_N_CHOICES)
    parts = max(t.split_k for t in tried)
    return tokens * -(-hidden // rows) + tokens * top_k * parts


def _k_chunk(width: int, tiles: Tiles) -> int:
    """Reduction elements per split: whole steps of `block_k`, `split_k` parts covering `width`."""
    steps = -(-width // tiles.block_k)
    return -(-steps // max(1, tiles.split_k)) * tiles.block_k


def _launch_options(tiles: Tiles) -> dict[str, int]:
    options = {"num_warps": tiles.num_warps}
    if tiles.num_stages:
        options["num_stages"] = tiles.num_stages
    return options


def _weight_args(w: Experts, tiles: Tiles) -> tuple[tuple[torch.Tensor, ...], tuple[int, ...], dict[str, object]]:
    """A projection's arguments to its kernel: the weight tensors, their (expert, row) strides and the format's
    constexprs (FP4: values, scales and NVFP4's expert scales; steps of whole scale blocks, no `tl.dot` form)."""
    if not isinstance(w, Fp4Weights):
        return (w,), (w.stride(0), w.stride(1)), {}
    if tiles.mma:
        raise ValueError(f"the FP4 kernels have no tl.dot form: tiles {tiles.text}")
    if tiles.block_k % w.group:
        raise ValueError(f"{w.fmt} weights: a step of {tiles.block_k} is not whole {w.group}-value scale blocks")
    values, scales = w.values, w.scales.view(torch.uint8)  # E4M3 scales decoded from their bits in the kernel
    gs = w.global_scale if w.global_scale is not None else scales  # unread for MXFP4
    strides = (values.stride(0), values.stride(1), scales.stride(0), scales.stride(1))
    return (values, scales, gs), strides, {"GROUP": w.group, "NVFP4": w.fmt == NVFP4}


def launch_gate_up(
    x: torch.Tensor,
    w13: Experts,
    ids: torch.Tensor,
    h: torch.Tensor,
    grid: Grid,
    *,
    memset: bool = False,
    early: bool = False,
) -> None:
    """The gate_up kernel alone (the tuner times it by itself), in its `tl.dot` form where the tiles say `mma`
    (FP4 weights: the FP4 kernel, which has none); a split reduction adds onto `h`, which holds zeros (`memset`:
    zeroed here first). `early`: its trigger right after its wait and the id load (`tiles.FORM_EARLY`)."""
    tiles = grid.gate_up_tiles or Tiles(grid.gate_up_block_n)
    hidden = x.shape[1]
    chunk = _k_chunk(hidden, tiles)
    splits = -(-hidden // chunk)
    if splits > 1 and memset:
        h.zero_()
    programs = (*grid.gate_up, splits)
    tensors, strides, fmt = _weight_args(w13, tiles)
    even_k = hidden % tiles.block_k == 0  # every split's end then a whole step (`_k_chunk`)
    mma = {"even_k": even_k, "MMA_M": MMA_M, "F32_DOT": interpreted()} if tiles.mma else {}
    kernel = _gate_up_fp4_kernel if fmt else _gate_up_mma_kernel if tiles.mma else _gate_up_kernel
    launch(
        kernel,
        programs,
        x,
        *tensors,
        ids,
        h,
        hidden,
        w13.shape[1] // 2,
        chunk,
        *strides,
        top_k=ids.shape[1],
        block_n=tiles.block_n,
        block_k=tiles.block_k,
        split=splits > 1,
        **mma,
        **fmt,
        EARLY=early,
        pdl=True,
        **_launch_options(tiles),
    )


def launch_down(  # noqa: PLR0917 - the kernel's tensors, in its order
    h: torch.Tensor,
    w2: Experts,
    ids: torch.Tensor,
    weights: torch.Tensor,
    ys: torch.Tensor,
    grid: Grid,
    *,
    memset: bool = False,
    early: bool = False,
    fold: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> None:
    """The down kernel alone (the tuner times it by itself); a split reduction adds onto `ys`, which holds zeros
    (`memset`: zeroed here first). It has no `tl.dot` form: tiles that say `mma` are refused. `early`: its id,
    router weight and first weight tile loaded before its wait, its trigger right after it (`tiles.FORM_EARLY`).
    `fold`: (out, tickets), the combine folded in (`tiles.FORM_FOLD`). FP4 weights: the FP4 down kernel."""
    tiles = grid.down_tiles or Tiles(grid.down_block_n)
    if tiles.mma:
        raise ValueError(f"the down kernel has no tl.dot form: tiles {tiles.text}")
    inter = w2.shape[2]
    chunk = _k_chunk(inter, tiles)
    splits = -(-inter // chunk)
    if splits > 1 and memset:
        ys.zero_()
    programs = (*grid.down, splits)
    out, tickets = fold if fold is not None else (ys, ids)  # unread unless folding
    if fold is not None and tickets.numel() < programs[0] // ids.shape[1] * programs[1] + programs[0] * splits:
        raise ValueError(f"fused MoE fold form: {tickets.numel()} tickets are too few for the launch {programs}")
    tensors, strides, fmt = _weight_args(w2, tiles)
    launch(
        _down_fp4_kernel if fmt else _down_kernel,
        programs,
        h,
        *tensors,
        ids,
        weights,
        ys,
        out,
        tickets,
        w2.shape[1],
        inter,
        chunk,
        *strides,
        top_k=ids.shape[1],
        block_n=tiles.block_n,
        block_k=tiles.block_k,
        split=splits > 1,
        **fmt,
        EARLY=early,
        FOLD=fold is not None,
        pdl=True,
        **_launch_options(tiles),
    )


def reference_moe(x: torch.Tensor, w13: Experts, w2: Experts, ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """The same computation in plain torch, slot by slot: fp32 accumulation, the SiLU-and-mul in fp32 (as the
    kernel computes it from the fp32 gate and up sums), the weighted sum in fp32, the output in x's dtype. FP4
    experts are dequantised one routed expert at a time (`fp4.dequant_fp4`)."""
    tokens, _hidden = x.shape
    inter = w13.shape[1] // 2
    out = torch.zeros(tokens, w2.shape[1], dtype=torch.float32, device=x.device)
    for t in range(tokens):
        xt = x[t].float()
        for j in range(ids.shape[1]):
            e = int(ids[t, j])
            h = _expert(w13, e) @ xt
            a = F.silu(h[:inter]) * h[inter:]
            out[t] += float(weights[t, j]) * (_expert(w2, e) @ a)
    return out.to(x.dtype)


def _expert(w: Experts, e: int) -> torch.Tensor:
    """Expert e's weights [N, K] in fp32."""
    return w.expert(e) if isinstance(w, Fp4Weights) else w[e].float()


def routed_ids(tokens: int, top_k: int, experts: int, device: torch.device) -> torch.Tensor:
    """Slot (t, j) → expert (t·top_k + j) mod `experts`: distinct experts per token (as a router's top-k are), the
    same assignment the torch path of the probe uses."""
    rows = [[(t * top_k + j) % experts for j in range(top_k)] for t in range(tokens)]
    return torch.tensor(rows, dtype=torch.int32, device=device)


def _tile_choice(
    key: MoeKey, ctx: ProbeContext, experts: Rotation[tuple[Experts, Experts]], bufs: _Buffers
) -> tile_store.TileChoice | None:
    """The tiles and form of this shape on this GPU: from the tile store, else tuned now (each kernel alone, no
    memsets, as the default path runs; then whole steps in each form) and stored (None on CPU tensors)."""
    if not ctx.is_cuda:
        return None
    sms = torch.cuda.get_device_properties(ctx.device).multi_processor_count
    t, k_top, h, inter = key.tokens, key.top_k, key.hidden, key.intermediate

    def gate_up(tiles: Tiles) -> Callable[[], None]:
        grid = grid_for(t, k_top, h, inter, sms, gate_up=tiles, down=tiles)

        def go() -> None:
            w13, _ = experts.next()
            launch_gate_up(bufs.x, w13, bufs.ids, bufs.h, grid)

        return go

    def down(tiles: Tiles) -> Callable[[], None]:
        grid = grid_for(t, k_top, h, inter, sms, gate_up=tiles, down=tiles)

        def go() -> None:
            _, w2 = experts.next()
            launch_down(bufs.h, w2, bufs.ids, bufs.wts, bufs.ys, grid)

        return go

    def step(up_t: Tiles, down_t: Tiles, form: str) -> Callable[[], None]:
        def go() -> None:
            w13, w2 = experts.next()
            fused_moe(bufs.x, w13, w2, bufs.ids, bufs.wts, h=bufs.h, ys=bufs.ys, out=bufs.out, sms=sms,
                      tiles=(up_t, down_t), form=form, tickets=bufs.tickets)  # fmt: skip

        return go

    gpu = torch.cuda.get_device_name(ctx.device)
    shape = tile_store.shape_id(t, k_top, h, inter, key.dtype)
    try:
        return tile_store.choose(gpu, shape, gate_up, down, step, candidates_for(key.dtype))
    finally:  # each kernel was timed alone, its split reductions adding onto the last call's sums: zeros again
        bufs.h.zero_()
        bufs.ys.zero_()
        bufs.tickets.zero_()


def launch_triton_once(key: MoeKey, gpu: str, ctx: ProbeContext) -> None:
    """The fused-MoE kernels of one key launched once per tile and form they may run with on `gpu` (the stored
    choice, else every candidate the tuner times, in every form) and no check: what `precompile.compile_ahead`
    collects on meta tensors."""
    if key.dtype not in KERNEL_DTYPES:
        return
    experts, bufs, _ = _moe_tensors(key, ctx, rotate=False)
    found = tile_store.lookup(gpu, tile_store.shape_id(key.tokens, key.top_k, key.hidden, key.intermediate, key.dtype))
    if found is not None:
        runs = [((found.gate_up, found.down), found.form)]
    else:
        runs = [(pair, form) for form in FORMS for pair in _candidate_pairs(candidates_for(key.dtype))]
    w13, w2 = experts.next()
    for tiles, form in runs:
        fused_moe(
            bufs.x,
            w13,
            w2,
            bufs.ids,
            bufs.wts,
            h=bufs.h,
            ys=bufs.ys,
            out=bufs.out,
            tiles=tiles,
            sms=sm_count(ctx.device),
            form=form,
            tickets=bufs.tickets,
        )


def candidates_for(dtype: str) -> tuple[Tiles, ...]:
    """The tiles the tuner tries for experts of `dtype` (FP4: `tiles.FP4_CANDIDATES`, no `tl.dot` form)."""
    return tile_store.FP4_CANDIDATES if dtype in FP4_DTYPES else tile_store.TILE_CANDIDATES


def _candidate_pairs(candidates: tuple[Tiles, ...] = tile_store.TILE_CANDIDATES) -> list[tuple[Tiles, Tiles]]:
    """(gate_up, down) tiles that launch every candidate of each kernel once: each reduction-form candidate for
    both, each `mma` one for gate_up beside the first reduction-form down tile (the down kernel has no dot form)."""
    plain = [t for t in candidates if not t.mma]
    return [(t, t) for t in plain] + [(t, plain[0]) for t in candidates if t.mma]


@dataclass
class _Buffers:
    """Activations, routing and outputs of one key (preallocated: a captured graph allocates nothing)."""

    x: torch.Tensor
    ids: torch.Tensor
    wts: torch.Tensor
    h: torch.Tensor
    """[T·K, 2I] fp32: the gate and up sums (zeros between calls: the combine kernel zeroes them)."""
    ys: torch.Tensor
    """[T·K, H] fp32: each slot's weighted down projection (zeros between calls, as h; the fold form sums each
    token's into row t)."""
    out: torch.Tensor
    tickets: torch.Tensor
    """[`ticket_count`] int32: the fold form's counters (zeros between calls)."""


def fused_moe_runner(key: MoeKey, ctx: ProbeContext, *, rotate: bool) -> OpRunner:
    """The `fused` variant at one MoE key: the same active experts, activations and routing as the torch path,
    through the Triton kernels with the tiles tuned for this shape on this GPU (the tile store), checked once
    against `reference_moe`."""
    if key.dtype not in KERNEL_DTYPES:
        raise UnsupportedError(f"{key.dtype} experts: the Triton grouped GEMV reads {', '.join(KERNEL_DTYPES)} weights")
    reason = triton_unavailable(ctx.device)
    if reason:
        raise UnsupportedError(reason)
    if key.dtype == "fp8" and ctx.is_cuda and torch.cuda.get_device_capability(ctx.device) < (8, 9):
        raise UnsupportedError(f"fp8 weights need sm_89 or newer; this is {sm_tag(ctx)}")
    experts, bufs, w_bytes = _moe_tensors(key, ctx, rotate=rotate)
    try:
        choice = _tile_choice(key, ctx, experts, bufs)
    except Exception as exc:
        raise UnsupportedError(
            f"Triton fused-MoE kernel failed on {sm_tag(ctx)}: {type(exc).__name__}: {first_line(exc)}"
        ) from None
    tiles = (choice.gate_up, choice.down) if choice is not None else None
    form = choice.form if choice is not None else FORM_LATE
    call = partial(fused_moe, h=bufs.h, ys=bufs.ys, out=bufs.out, tiles=tiles, form=form, tickets=bufs.tickets)

    def fused() -> torch.Tensor:
        w13, w2 = experts.next()
        return call(bufs.x, w13, w2, bufs.ids, bufs.wts)

    w13_0, w2_0 = experts.items[0]
    bufs.out.fill_(float("nan"))  # poisoned: every element must be written
    got = call(bufs.x, w13_0, w2_0, bufs.ids, bufs.wts).float()
    want = reference_moe(bufs.x, w13_0, w2_0, bufs.ids, bufs.wts).float()
    scale = float(want.abs().max()) or 1.0
    err = float((got - want).abs().max())
    if not err <= CHECK_RTOL * scale:
        raise RuntimeError(
            f"Triton fused-MoE output differs from the torch reference: max |Δ| {err:.3g} of {scale:.3g}"
        )
    rows = key.tokens * key.top_k
    moved = w_bytes + key.tokens * key.hidden * 2 * 2 + rows * key.intermediate * 2 * 2
    note = "Triton grouped GEMV over the routed experts (expert ids read on the device)"
    if key.dtype in WEIGHT_NOTES:
        note += "; " + WEIGHT_NOTES[key.dtype]
    if choice is not None:
        note += "; " + choice.text
    tuned = " (tiles tuned per shape)" if choice is not None else ""
    kernel = triton_kernel("fused MoE grouped GEMV" + tuned, pdl=pdl_enabled(ctx.device))
    flops = 2.0 * rows * 3 * key.hidden * key.intermediate
    return OpRunner(fused, moved, flops, len(experts), note, weight_bytes=w_bytes, kernel=kernel)


def _expert_shapes(key: MoeKey, active: int) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    """The active experts' gate_up [E, 2I, H] and down [E, H, I] shapes."""
    return (active, 2 * key.intermediate, key.hidden), (active, key.hidden, key.intermediate)


def _expert_pair(key: MoeKey, active: int, device: torch.device) -> tuple[Experts, Experts]:
    """One copy of the active experts' random weights (gate_up, down) in the key's format."""
    w13_shape, w2_shape = _expert_shapes(key, active)
    if key.dtype in FP4_DTYPES:
        return random_fp4(w13_shape, key.dtype, device), random_fp4(w2_shape, key.dtype, device)
    wdtype = _plain_dtype(key.dtype)
    return randn(w13_shape, wdtype, device), randn(w2_shape, wdtype, device)


def _plain_dtype(dtype: str) -> torch.dtype:
    return torch.float8_e4m3fn if dtype == "fp8" else DTYPES.get(dtype, torch.bfloat16)


def _expert_bytes(key: MoeKey, active: int) -> int:
    """Bytes of one copy of the active experts' weights (FP4: packed values, block and expert scales)."""
    w13_shape, w2_shape = _expert_shapes(key, active)
    if key.dtype in FP4_DTYPES:
        return fp4_nbytes(w13_shape, key.dtype) + fp4_nbytes(w2_shape, key.dtype)
    return active * 3 * key.intermediate * key.hidden * _plain_dtype(key.dtype).itemsize


def _moe_tensors(
    key: MoeKey, ctx: ProbeContext, *, rotate: bool
) -> tuple[Rotation[tuple[Experts, Experts]], _Buffers, float]:
    """The active experts' weights (× rotation copies; FP4: the packed values, block and expert scales), the
    token, its routing and the output buffers."""
    device = ctx.device
    t, k_top, h, inter = key.tokens, key.top_k, key.hidden, key.intermediate
    active = max(1, min(key.experts_active, key.experts_local, t * k_top))
    w_bytes = _expert_bytes(key, active)
    copies = copies_for(ctx, w_bytes, rotate)
    require_free(ctx, copies * w_bytes * 1.05, f"MoE expert weights {key.key_id}")  # +5 %: activations
    experts = Rotation([_expert_pair(key, active, device) for _ in range(copies)])
    adtype = torch.float32 if key.dtype == "fp32" else torch.bfloat16
    bufs = _Buffers(
        randn((t, h), adtype, device, std=1.0),
        routed_ids(t, k_top, active, device),
        torch.rand(t, k_top, device=device, dtype=torch.float32) + 0.1,
        torch.zeros(t * k_top, 2 * inter, device=device, dtype=torch.float32),
        torch.zeros(t * k_top, h, device=device, dtype=torch.float32),
        torch.empty(t, h, device=device, dtype=adtype),
        torch.zeros(ticket_count(t, k_top, h), device=device, dtype=torch.int32),
    )
    return experts, bufs, float(w_bytes)


def engine_moe_runner(key: MoeKey, ctx: ProbeContext, *, rotate: bool) -> OpRunner:
    """The `engine` variant: vLLM's or SGLang's fused_experts where importable (BF16/FP16 experts; checked once)."""
    from decodetop.probes.worker.kernels import engines

    if key.dtype not in ("bf16", "fp16"):
        raise UnsupportedError(f"{key.dtype} experts: the engine kernel is only called with bf16/fp16 weights here")
    found = engines.find("moe")
    experts, bufs, w_bytes = _moe_tensors(key, ctx, rotate=rotate)
    ids = bufs.ids

    def engine() -> torch.Tensor:
        w13, w2 = experts.next()
        return found.fn(bufs.x, w13, w2, bufs.wts, ids)  # type: ignore[no-any-return]

    w13_0, w2_0 = experts.items[0]
    got = found.fn(bufs.x, w13_0, w2_0, bufs.wts, ids).float()
    want = reference_moe(bufs.x, w13_0, w2_0, ids, bufs.wts).float()
    scale = float(want.abs().max()) or 1.0
    if not float((got - want).abs().max()) <= CHECK_RTOL * scale:
        raise RuntimeError(f"{found.kernel.text}: output differs from the torch reference")
    rows = key.tokens * key.top_k
    moved = w_bytes + key.tokens * key.hidden * 2 * 2 + rows * key.intermediate * 2 * 2
    flops = 2.0 * rows * 3 * key.hidden * key.intermediate
    return OpRunner(engine, moved, flops, len(experts), weight_bytes=w_bytes, kernel=found.kernel)


def torch_moe_kernel(ctx: ProbeContext, variant: str) -> KernelClass:
    """The class label of the torch paths (`grouped`, `loop`)."""
    ops = "sort, grouped_mm, silu_mul, grouped_mm, index_add" if variant == "grouped" else "sort, per-expert mm loop"
    return torch_kernel(ctx, ops)
