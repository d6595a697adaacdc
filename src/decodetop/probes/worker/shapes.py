"""Provides the kernels the decode-component probes time, built at a measurement key's exact shape, and the timer
they share (torch side).

Each `*_runner(key, ...)` builds the tensors one key needs (random values, never zeros, sized like the model's
shard on this rank) and returns an `OpRunner`: a no-argument `fn` that does one instance of the op, the bytes it
moves and the FLOPs it does, and how many rotated copies of its inputs it cycles through. Rotation keeps the
working set above 2× the last-level cache so weight-streaming work reads DRAM, not L2 (probes.md §4); CPU ranks
skip it (one copy) to stay fast. A kernel that cannot run here raises `UnsupportedError` with the reason (fp8 on a CPU,
NVFP4 off sm_100/sm_120, ...); the probe turns that into an `unsupported` measurement instead of failing.

`time_runner` times an op: CUDA-graph replay on GPUs (the launch cost is a separate budget line; falls back to CUDA
events when capture fails, and says so), the host clock on CPU ranks. The `layer` probe strings these same
runners together, so a layer and the sum of its parts are timed with the same kernels.
"""

from __future__ import annotations

import contextlib
import math
import statistics
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F  # noqa: N812 - the conventional name

from decodetop.budget.keys import (
    AllreduceKey,
    AttentionKey,
    GemmKey,
    KvcastKey,
    MoeKey,
    NormKey,
    RoutingKey,
    SamplingKey,
    parse_key_id,
)
from decodetop.probes.results import MeasurementStatus, RankMeasurement
from decodetop.probes.worker.context import ProbeContext
from decodetop.probes.worker.timing import Rotation, capture_graph, rotation_count, time_events, time_graph_replay
from decodetop.probes.worker.timing import time_host as _time_host

#: Scale of random weights and activations (typical init std; keeps bf16 sums finite, never all zeros).
INIT_STD = 0.02
#: Largest number of rotated copies of one op's inputs (memory bound; 64 copies of a small weight is < 100 MB).
MAX_ROTATION = 64
#: Ops per captured graph at least this long in total, so one replay's fixed cost (~15 µs: probes.md §3) and the
#: event resolution stay small against it.
MIN_GRAPH_US = 200.0
#: Most ops captured into one graph (capture time and graph memory grow with it).
MAX_GRAPH_OPS = 256
#: FP8 E4M3's largest finite value (OCP FP8 spec), for dynamic scales.
FP8_E4M3_MAX = 448.0
#: Rows of the embedding table the `embedding` norm op looks up from (the key carries no vocab size; lookups
#: touch `tokens` rows whatever the table size).
EMBEDDING_ROWS = 32768
#: ... capped at this many bytes (a lookup reads `tokens` rows; a larger table only costs setup time).
EMBEDDING_TABLE_BYTES = 256 * 1024**2
#: Tokens per KV-cache block when gathering blocks (SGLang/vLLM page sizes are 1-64; FlashMLA uses 64).
KV_BLOCK_TOKENS = 64

#: Elements drawn at random for a large CPU tensor, then tiled (see `randn`).
CPU_RANDOM_BLOCK = 1 << 20

_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


class UnsupportedError(Exception):
    """This kernel cannot run on this rank; the message says why."""


@dataclass
class OpRunner:
    """One op at one key's shape, ready to time."""

    fn: Callable[[], Any]
    moved_bytes: float
    """Bytes one instance reads + writes from memory (weights, KV, activations)."""
    flops: float
    rotation: int = 1
    """Copies of the inputs `fn` cycles through (call it this many times to touch each once)."""
    note: str = ""
    weight_bytes: float = 0.0
    kv_bytes: float = 0.0


def sm_tag(ctx: ProbeContext) -> str:
    """`sm_90` for an H200, `cpu` on CPU ranks."""
    if not ctx.is_cuda:
        return "cpu"
    major, minor = torch.cuda.get_device_capability(ctx.device)
    return f"sm_{major}{minor}"


def act_dtype(name: str, ctx: ProbeContext) -> torch.dtype:
    """Activation/weight dtype for a plain (non-quantized) key dtype name; UnsupportedError otherwise."""
    if name in _DTYPES:
        return _DTYPES[name]
    raise UnsupportedError(f"dtype {name!r} is not a plain torch dtype")


def randn(shape: Sequence[int], dtype: torch.dtype, device: torch.device, std: float = INIT_STD) -> torch.Tensor:
    """Random values (never zeros) of `dtype`; FP8 tensors are drawn in fp32 and cast. Large CPU tensors tile a
    random block (drawing 200M normal values takes seconds on a CPU; a dense kernel's time does not depend on
    the values)."""
    numel = math.prod(shape)
    if device.type == "cpu" and numel > CPU_RANDOM_BLOCK:
        block = randn((CPU_RANDOM_BLOCK,), dtype, device, std)
        return block.repeat(-(-numel // CPU_RANDOM_BLOCK))[:numel].view(*shape)
    if dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        # ×100: FP8 weights are stored pre-scaled (std ≈ 2 here), well inside e4m3's normal range, never 0.
        return (torch.randn(*shape, device=device) * std * 100).clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX).to(dtype)
    return torch.randn(*shape, device=device, dtype=torch.float32 if dtype.itemsize < 2 else dtype).mul_(std).to(dtype)


_WEIGHT_CACHE: dict[tuple[Any, ...], list[torch.Tensor]] | None = None


@contextlib.contextmanager
def weight_cache() -> Iterator[None]:
    """Within the block, `weights(...)` reuses tensors of the same shape, dtype and copy count (the GEMM sweep
    varies M over one weight shape); they are dropped at the end."""
    global _WEIGHT_CACHE
    _WEIGHT_CACHE = {}
    try:
        yield
    finally:
        _WEIGHT_CACHE = None


def weights(shape: Sequence[int], dtype: torch.dtype, device: torch.device, copies: int) -> Rotation:
    """`copies` random weight tensors in a Rotation (shared within a `weight_cache()` block)."""
    key = (tuple(shape), dtype, str(device), copies)
    if _WEIGHT_CACHE is not None and key in _WEIGHT_CACHE:
        return Rotation(_WEIGHT_CACHE[key])
    items = [randn(shape, dtype, device) for _ in range(copies)]
    if _WEIGHT_CACHE is not None:
        _WEIGHT_CACHE[key] = items
    return Rotation(items)


def copies_for(ctx: ProbeContext, nbytes: float, rotate: bool) -> int:
    """Rotated copies needed so `nbytes` × copies exceeds 2× the cache (1 when rotation is off)."""
    if not rotate or nbytes <= 0:
        return 1
    return rotation_count(max(1, int(nbytes)), ctx.cache_bytes(), max_copies=MAX_ROTATION)


def _require(ctx: ProbeContext, nbytes: float, what: str) -> None:
    ctx.require_free_bytes(int(nbytes), what)


# ------------------------------------------------------------------------------------------------- timing


@dataclass(frozen=True)
class Timing:
    """Per-op samples (µs) and how they were taken."""

    samples: tuple[float, ...]
    method: str
    note: str = ""

    @property
    def median_us(self) -> float:
        return statistics.median(self.samples)


def time_runner(
    ctx: ProbeContext,
    runner: OpRunner,
    *,
    budget_ms: float,
    max_samples: int,
    min_samples: int = 3,
    graph: bool = True,
    collective: bool = False,
) -> Timing:
    """Time one op: CUDA-graph replay (or events) on GPUs, host clock on CPU; about `budget_ms` per point.

    collective: the op talks to the other ranks, so every rank must run the same counts (the estimate is agreed).
    """
    fn = runner.fn
    rot = max(1, runner.rotation)

    def agreed(value: float) -> float:
        return ctx.agree_max(value) if collective else value

    if not ctx.is_cuda:
        est = agreed(statistics.median(_time_host(fn, 1, 1, warmup=1)))
        samples = _clamp(int(budget_ms * 1000.0 / max(est, 1e-3)), min_samples, max_samples)
        return Timing(tuple(_time_host(fn, 1, samples, warmup=0)), "host")
    est = agreed(statistics.median(time_events(fn, rot, 2, warmup=rot)))
    reps = max(1, math.ceil(MIN_GRAPH_US / max(est * rot, 1e-3)))
    ops = max(rot, min(MAX_GRAPH_OPS // rot * rot or rot, rot * reps))
    samples = _clamp(int(budget_ms * 1000.0 / max(est * ops, 1e-3)), min_samples, max_samples)
    if graph:
        try:
            g = ctx.keep_graph(capture_graph(fn, ops, warmup=2))
            try:
                return Timing(tuple(time_graph_replay(g, ops, samples, warmup=2)), "graph")
            finally:
                g.reset()
        except Exception as exc:
            torch.cuda.synchronize()
            reason = f"graph capture failed ({type(exc).__name__}: {str(exc).splitlines()[0][:120]}); events timing"
            return Timing(tuple(time_events(fn, ops, samples, warmup=1)), "events", reason)
    return Timing(tuple(time_events(fn, ops, samples, warmup=1)), "events")


def _clamp(value: int, lo: int, hi: int) -> int:
    return max(lo, min(hi, value))


# ------------------------------------------------------------------------------------------------- GEMM

FP8_VARIANTS = ("tensor", "row")
"""FP8 `_scaled_mm` scalings: per-tensor (cuBLASLt) and row-wise (CUTLASS) (probes.md §4)."""


def _scaled_mm(a: torch.Tensor, b: torch.Tensor, sa: torch.Tensor, sb: torch.Tensor) -> torch.Tensor:
    out: Any = torch._scaled_mm(a, b, sa, sb, out_dtype=torch.bfloat16)
    return out[0] if isinstance(out, tuple) else out  # type: ignore[no-any-return] # torch ≤ 2.3: (out, amax)


def gemm_runner(key: GemmKey, ctx: ProbeContext, *, rotate: bool, variant: str = "") -> OpRunner:
    """[m×k]·[k×n] (batched `batch` times) at the key's dtype; weights [n×k] as a Linear stores them."""
    m, n, k, batch = key.m, key.n, key.k, key.batch
    device = ctx.device
    note = ""
    if key.dtype == "mxfp4":
        raise UnsupportedError("no MXFP4 GEMM in torch (MXFP4 experts run weight-only in Triton/CUTLASS kernels)")
    if key.dtype == "nvfp4":
        return _nvfp4_runner(key, ctx, rotate=rotate)
    fp8 = key.dtype == "fp8"
    if fp8 and not ctx.is_cuda:
        raise UnsupportedError("fp8 GEMM (torch._scaled_mm) needs a GPU; CPU ranks time bf16/fp32 only")
    if fp8 and batch > 1:
        fp8 = False
        note = "batched fp8 GEMM has no torch kernel (_scaled_mm is 2-D): timed in bf16"
    dtype = torch.float8_e4m3fn if fp8 else (act_dtype(key.dtype, ctx) if key.dtype in _DTYPES else torch.bfloat16)
    wsize = 1 if fp8 else dtype.itemsize
    w_bytes = batch * n * k * wsize
    act_bytes = batch * (m * k * (1 if fp8 else dtype.itemsize) + m * n * 2)
    copies = copies_for(ctx, w_bytes, rotate)
    _require(ctx, copies * w_bytes + 4 * act_bytes, f"GEMM weights {key.key_id}")
    flops = 2.0 * batch * m * n * k
    if batch > 1:
        ws = weights((batch, n, k), dtype, device, copies)
        x = randn((batch, m, k), dtype, device)

        def bmm() -> torch.Tensor:
            return torch.bmm(x, ws.next().transpose(1, 2))

        return OpRunner(bmm, w_bytes + act_bytes, flops, copies, note, weight_bytes=w_bytes)
    if not fp8:
        wl = weights((n, k), dtype, device, copies)
        xl = randn((m, k), dtype, device)

        def mm() -> torch.Tensor:
            return F.linear(xl, wl.next())

        return OpRunner(mm, w_bytes + act_bytes, flops, copies, note, weight_bytes=w_bytes)
    variant = variant or "tensor"
    if n % 16 or k % 16:
        raise UnsupportedError(f"fp8 _scaled_mm needs n and k divisible by 16 (n={n}, k={k})")
    w8 = weights((n, k), torch.float8_e4m3fn, device, copies)
    rows = m
    x8 = randn((rows, k), torch.float8_e4m3fn, device)
    if variant == "tensor":
        sa = torch.tensor(1.0, device=device)
        sb = torch.tensor(1.0, device=device)
    elif variant == "row":
        sa = torch.rand(rows, 1, device=device) + 0.5
        sb = torch.rand(1, n, device=device) + 0.5
    else:
        raise ValueError(f"unknown fp8 variant {variant!r} (known: {', '.join(FP8_VARIANTS)})")
    try:
        _scaled_mm(x8, w8.items[0].t(), sa, sb)
    except Exception as exc:
        if m % 16 == 0:
            raise UnsupportedError(
                f"fp8 {variant}-wise _scaled_mm failed: {type(exc).__name__}: {_first(exc)}"
            ) from None
        rows = -(-m // 16) * 16
        x8 = randn((rows, k), torch.float8_e4m3fn, device)
        if variant == "row":
            sa = torch.rand(rows, 1, device=device) + 0.5
        try:
            _scaled_mm(x8, w8.items[0].t(), sa, sb)
        except Exception as exc2:
            raise UnsupportedError(
                f"fp8 {variant}-wise _scaled_mm failed: {type(exc2).__name__}: {_first(exc2)}"
            ) from None
        note = f"M padded {m}→{rows} (this _scaled_mm rejected M={m}: {_first(exc)[:80]})"

    def mm8() -> torch.Tensor:
        return _scaled_mm(x8, w8.next().t(), sa, sb)

    return OpRunner(mm8, w_bytes + act_bytes, flops, copies, note, weight_bytes=w_bytes)


def _first(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _nvfp4_runner(key: GemmKey, ctx: ProbeContext, *, rotate: bool) -> OpRunner:
    """NVFP4 via `_scaled_mm` with float4_e2m1fn_x2 operands and e4m3 block-16 scales (probes.md §4)."""
    tag = sm_tag(ctx)
    if not ctx.is_cuda:
        raise UnsupportedError("NVFP4 GEMM needs an sm_100/sm_120 GPU; CPU ranks time bf16/fp32 only")
    major, _minor = torch.cuda.get_device_capability(ctx.device)
    if major not in (10, 12):
        raise UnsupportedError(f"NVFP4 tensor cores exist on sm_100/sm_103/sm_120 only; unsupported on {tag}")
    if not hasattr(torch, "float4_e2m1fn_x2"):
        raise UnsupportedError(f"torch {torch.__version__} has no float4_e2m1fn_x2")
    m, n, k = key.m, key.n, key.k
    if key.batch > 1 or k % 32 or n % 16:
        raise UnsupportedError(f"NVFP4 _scaled_mm needs batch 1, k % 32 == 0 and n % 16 == 0 ({key.key_id})")
    device = ctx.device
    w_bytes = n * k / 2 + n * k / 16
    copies = copies_for(ctx, w_bytes, rotate)
    _require(ctx, copies * w_bytes, f"NVFP4 weights {key.key_id}")

    def packed(rows: int) -> torch.Tensor:
        raw = torch.randint(1, 255, (rows, k // 2), dtype=torch.uint8, device=device)
        return raw.view(torch.float4_e2m1fn_x2)

    def scales(rows: int) -> torch.Tensor:
        # cuBLAS NVFP4 wants the swizzled 128×4 layout padded to it; random values make the layout moot for timing.
        padded = (-(-rows // 128) * 128, -(-(k // 16) // 4) * 4)
        return (torch.rand(padded, device=device) + 0.5).to(torch.float8_e4m3fn)

    ws = Rotation([(packed(n), scales(n)) for _ in range(copies)])
    x = packed(m)
    sx = scales(m)

    def mm4() -> torch.Tensor:
        w, sw = ws.next()
        return _scaled_mm(x, w.t(), sx, sw)

    try:
        mm4()
    except Exception as exc:
        raise UnsupportedError(f"NVFP4 _scaled_mm failed on {tag}: {type(exc).__name__}: {_first(exc)}") from None
    return OpRunner(mm4, w_bytes + m * k / 2 + m * n * 2, 2.0 * m * n * k, copies, weight_bytes=w_bytes)


# ------------------------------------------------------------------------------------------------- MoE

MOE_VARIANTS = ("grouped", "loop")


def _grouped_mm_fn() -> Callable[..., torch.Tensor] | None:
    return getattr(F, "grouped_mm", None) or getattr(torch, "_grouped_mm", None)


def moe_runner(key: MoeKey, ctx: ProbeContext, *, rotate: bool, variant: str) -> OpRunner:
    """One MoE layer's routed experts: sort tokens by expert, gate_up GEMM, SiLU-and-mul, down GEMM, weighted combine.

    Routing is fixed so that the `tokens` × `top_k` assignments touch exactly `experts_active` experts (the
    inventory's expected count); only those experts' weights are allocated (× rotation copies).
    """
    if key.dtype in ("nvfp4", "mxfp4"):
        where = sm_tag(ctx)
        raise UnsupportedError(f"{key.dtype} expert GEMMs have no torch kernel on {where} (grouped GEMM: probes.md §4)")
    fp8 = key.dtype == "fp8"
    if fp8 and not ctx.is_cuda:
        raise UnsupportedError("fp8 expert GEMMs (_scaled_mm / _scaled_grouped_mm) need a GPU")
    device = ctx.device
    t, k_top, h, inter = key.tokens, key.top_k, key.hidden, key.intermediate
    active = max(1, min(key.experts_active, key.experts_local, t * k_top))
    wdtype = torch.float8_e4m3fn if fp8 else (act_dtype(key.dtype, ctx) if key.dtype in _DTYPES else torch.bfloat16)
    wsize = wdtype.itemsize
    per_expert = (2 * inter * h + h * inter) * wsize
    w_bytes = active * per_expert
    copies = copies_for(ctx, w_bytes, rotate)
    _require(ctx, copies * w_bytes * 1.05, f"MoE expert weights {key.key_id}")  # +5 %: activations, offsets
    # [E, N, K] like nn.Linear weights; the GEMMs take the transposed (column-major) view.
    experts = Rotation(
        [
            (randn((active, 2 * inter, h), wdtype, device), randn((active, h, inter), wdtype, device))
            for _ in range(copies)
        ]
    )
    x = randn((t, h), torch.bfloat16, device, std=1.0)
    ids = torch.tensor([[(i * k_top + j) % active for j in range(k_top)] for i in range(t)], device=device)
    weights = torch.rand(t, k_top, device=device, dtype=torch.float32) + 0.1
    flat = ids.flatten()
    counts_host = [0] * active
    for e in flat.tolist():
        counts_host[e] += 1
    bounds = [0]
    for c in counts_host:
        bounds.append(bounds[-1] + c)
    rows = t * k_top
    moved = w_bytes + t * h * 2 * 2 + rows * (2 * inter + h) * 2
    flops = 2.0 * rows * 3 * h * inter
    ones = torch.ones(rows, device=device, dtype=torch.int32)

    def dispatch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        order = torch.argsort(flat, stable=True)
        token_idx = order // k_top
        xs = x.index_select(0, token_idx)
        counts = torch.zeros(active, device=device, dtype=torch.int32).scatter_add_(0, flat, ones)
        offs = torch.cumsum(counts, 0, dtype=torch.int32)
        return order, token_idx, xs, offs

    def combine(y: torch.Tensor, order: torch.Tensor, token_idx: torch.Tensor) -> torch.Tensor:
        scale = weights.flatten().index_select(0, order).unsqueeze(1)
        out = torch.zeros(t, h, device=device, dtype=torch.float32)
        return out.index_add_(0, token_idx, y.float() * scale).to(torch.bfloat16)

    def act(hcat: torch.Tensor) -> torch.Tensor:
        return F.silu(hcat[:, :inter]) * hcat[:, inter:]

    if variant == "grouped":
        gmm = _grouped_mm_fn()
        if fp8:
            sgmm = getattr(torch, "_scaled_grouped_mm", None)
            if sgmm is None:
                raise UnsupportedError(f"torch {torch.__version__} has no _scaled_grouped_mm for fp8 experts")
            sa_rows = torch.ones(rows, device=device)
            sb13: torch.Tensor | None = torch.ones(active, 2 * inter, device=device)
            sb2: torch.Tensor | None = torch.ones(active, h, device=device)

            def gm(a: torch.Tensor, w: torch.Tensor, offs: torch.Tensor, sb: torch.Tensor | None) -> torch.Tensor:
                a8 = a.to(torch.float8_e4m3fn)  # dynamic activation quantization (scales fixed at 1 here)
                return sgmm(a8, w.transpose(-2, -1), sa_rows, sb, offs=offs, out_dtype=torch.bfloat16)  # type: ignore[no-any-return]

        else:
            if gmm is None:
                raise UnsupportedError(f"torch {torch.__version__} has no grouped_mm / _grouped_mm")

            def gm(a: torch.Tensor, w: torch.Tensor, offs: torch.Tensor, sb: torch.Tensor | None) -> torch.Tensor:
                return gmm(a, w.transpose(-2, -1), offs=offs)

            sb13 = sb2 = None

        def grouped() -> torch.Tensor:
            w13, w2 = experts.next()
            order, token_idx, xs, offs = dispatch()
            hcat = gm(xs, w13, offs, sb13)
            y = gm(act(hcat), w2, offs, sb2)
            return combine(y, order, token_idx)

        try:
            grouped()
        except Exception as exc:
            raise UnsupportedError(
                f"grouped GEMM failed on {sm_tag(ctx)}: {type(exc).__name__}: {_first(exc)}"
            ) from None
        return OpRunner(grouped, moved, flops, copies, weight_bytes=w_bytes)

    if variant != "loop":
        raise ValueError(f"unknown MoE variant {variant!r} (known: {', '.join(MOE_VARIANTS)})")
    one = torch.tensor(1.0, device=device)

    def expert_mm(a: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        if fp8:
            a8 = a.to(torch.float8_e4m3fn)
            pad = (-a8.shape[0]) % 16
            if pad:
                a8 = torch.cat([a8, a8.new_zeros(pad, a8.shape[1])])
            return _scaled_mm(a8, w.t(), one, one)[: a.shape[0]]
        return F.linear(a, w)

    def loop() -> torch.Tensor:
        w13, w2 = experts.next()
        order, token_idx, xs, _offs = dispatch()
        outs = []
        for e in range(active):
            lo, hi = bounds[e], bounds[e + 1]
            if hi > lo:
                outs.append(expert_mm(act(expert_mm(xs[lo:hi], w13[e])), w2[e]))
        return combine(torch.cat(outs), order, token_idx)

    try:
        loop()
    except Exception as exc:
        raise UnsupportedError(
            f"per-expert loop failed on {sm_tag(ctx)}: {type(exc).__name__}: {_first(exc)}"
        ) from None
    return OpRunner(loop, moved, flops, copies, weight_bytes=w_bytes)


# ------------------------------------------------------------------------------------------------- routing


def routing_runner(key: RoutingKey, ctx: ProbeContext, *, rotate: bool) -> OpRunner:
    """Router GEMM (fp32 logits), softmax or sigmoid scoring (+ correction bias for sigmoid: DeepSeek noaux_tc),
    group-limited top-k when n_group > 1 (top-2 sum per group, keep topk_group groups), top-k, normalised weights."""
    device = ctx.device
    t, h, e = key.tokens, key.hidden, key.n_experts
    if key.scoring not in ("softmax", "sigmoid"):
        raise UnsupportedError(f"scoring {key.scoring!r} is not softmax or sigmoid")
    wdtype = _DTYPES.get(key.dtype, torch.bfloat16)
    w_bytes = e * h * wdtype.itemsize
    copies = copies_for(ctx, w_bytes, rotate)
    routers = Rotation([randn((e, h), wdtype, device) for _ in range(copies)])
    x = randn((t, h), wdtype, device, std=1.0)
    bias = torch.randn(e, device=device) * 0.01
    groups = key.n_group if key.n_group > 1 and e % key.n_group == 0 else 1
    top_k = min(key.top_k, e)

    def route() -> tuple[torch.Tensor, torch.Tensor]:
        logits = F.linear(x, routers.next()).float()
        if key.scoring == "softmax":
            scores = logits.softmax(dim=-1)
            choice = scores
        else:
            scores = logits.sigmoid()
            choice = scores + bias
        if groups > 1:
            per_group = choice.view(t, groups, e // groups)
            group_score = per_group.topk(min(2, e // groups), dim=-1).values.sum(dim=-1)
            keep = group_score.topk(min(key.topk_group, groups), dim=-1).indices
            mask = torch.zeros(t, groups, device=device, dtype=torch.bool).scatter_(1, keep, True)
            full = mask.unsqueeze(-1).expand(t, groups, e // groups).reshape(t, e)  # no host sync (graph-safe)
            choice = choice.masked_fill(~full, float("-inf"))
        ids = choice.topk(top_k, dim=-1).indices
        w = scores.gather(1, ids)
        if key.scoring == "sigmoid":
            w = w / w.sum(dim=-1, keepdim=True)
        return w, ids

    moved = w_bytes + t * h * wdtype.itemsize + t * e * 4
    return OpRunner(route, moved, 2.0 * t * h * e, copies, weight_bytes=w_bytes)


def permute_runners(tokens: int, hidden: int, top_k: int, ctx: ProbeContext) -> tuple[OpRunner, OpRunner]:
    """(permute, unpermute): gather tokens into expert order ([tokens·top_k × hidden]), and the weighted scatter-add
    back — the dispatch and combine halves of a fused MoE, timed on their own."""
    device = ctx.device
    x = randn((tokens, hidden), torch.bfloat16, device, std=1.0)
    ids = torch.randint(0, 256, (tokens * top_k,), device=device)
    y = randn((tokens * top_k, hidden), torch.bfloat16, device, std=1.0)
    w = torch.rand(tokens * top_k, 1, device=device) + 0.1

    def permute() -> torch.Tensor:
        order = torch.argsort(ids, stable=True)
        return x.index_select(0, order // top_k)

    order0 = torch.argsort(ids, stable=True) // top_k

    def unpermute() -> torch.Tensor:
        out = torch.zeros(tokens, hidden, device=device, dtype=torch.float32)
        return out.index_add_(0, order0, y.float() * w).to(torch.bfloat16)

    rows = tokens * top_k * hidden * 2
    return OpRunner(permute, tokens * hidden * 2 + rows, 0.0), OpRunner(unpermute, 2 * rows, 2.0 * rows / 2)


# ------------------------------------------------------------------------------------------------- attention


def attention_runner(key: AttentionKey, ctx: ProbeContext, *, rotate: bool, context: int | None = None) -> OpRunner:
    """Decode attention for `batch` sequences of `q_len` new tokens against `context` cached ones.

    gqa: SDPA with enable_gqa over a [batch, kv_heads, L, head_dim] K/V cache (sliding window: the last `window`).
    mla: absorbed form over the latent cache [batch, L, kv_lora_rank + rope]: scores = q·cacheᵀ, softmax,
    out = p·cache[..., :kv_lora_rank] (torch matmuls: the latent cache is read twice; FlashMLA reads it once).
    mla+dsa: the indexer first (FP8 index keys cast to bf16, ReLU logits weighted over index heads, top-k of
    `index_topk`), then the same MLA over the gathered top-k latents.
    An FP8 KV cache is read as BF16 here (SDPA takes no FP8): the cast is what `kvcast` measures.
    """
    device = ctx.device
    ctx_len = key.context if context is None else context
    length = ctx_len + key.q_len
    b, q, heads = key.batch, key.q_len, key.heads
    note = "fp8 KV cache timed as bf16 (see kvcast for the cast)" if key.kv_dtype == "fp8" else ""
    dt = torch.bfloat16
    if key.kind == "gqa":
        attended = min(length, key.window) if key.window else length
        kv_bytes = 2 * b * key.kv_heads * attended * key.head_dim * 2
        copies = copies_for(ctx, kv_bytes, rotate)
        _require(ctx, copies * kv_bytes * 1.1, f"KV cache {key.key_id}")
        caches = Rotation(
            [
                (
                    randn((b, key.kv_heads, attended, key.head_dim), dt, device, std=1.0),
                    randn((b, key.kv_heads, attended, key.v_head_dim), dt, device, std=1.0),
                )
                for _ in range(copies)
            ]
        )
        qt = randn((b, heads, q, key.head_dim), dt, device, std=1.0)
        gqa = key.kv_heads != heads

        def sdpa() -> torch.Tensor:
            kc, vc = caches.next()
            return F.scaled_dot_product_attention(qt, kc, vc, enable_gqa=gqa)

        flops = 2.0 * b * q * heads * attended * (key.head_dim + key.v_head_dim)
        return OpRunner(sdpa, kv_bytes + 2 * qt.numel() * 2, flops, copies, note, kv_bytes=kv_bytes)
    if key.kind not in ("mla", "mla+dsa"):
        raise UnsupportedError(f"attention kind {key.kind!r} is not gqa, mla or mla+dsa")
    width = key.head_dim  # kv_lora_rank + rope as the kernel sees it
    lora = key.kv_lora_rank or key.v_head_dim
    dsa = key.kind == "mla+dsa"
    attended = min(length, key.index_topk) if dsa and key.index_topk else length
    latent_bytes = b * length * width * 2
    index_bytes = b * length * (key.index_head_dim + 4) if dsa else 0
    kv_read = b * attended * width * 2 + index_bytes
    copies = copies_for(ctx, latent_bytes + index_bytes, rotate)
    _require(ctx, copies * (latent_bytes + index_bytes) * 1.1 + b * q * heads * length * 4, f"MLA cache {key.key_id}")
    fp8 = torch.float8_e4m3fn
    caches = Rotation(
        [
            (
                randn((b, length, width), dt, device, std=1.0),
                randn((b, length, key.index_head_dim), fp8, device) if dsa else None,
            )
            for _ in range(copies)
        ]
    )
    qt = randn((b, q * heads, width), dt, device, std=1.0)
    scale = 1.0 / math.sqrt(width)
    q_idx = randn((b, q * key.index_heads, key.index_head_dim), dt, device, std=1.0) if dsa else None
    w_idx = torch.rand(b, q, key.index_heads, 1, device=device) if dsa else None

    def mla_over(cache: torch.Tensor, qv: torch.Tensor) -> torch.Tensor:
        s = torch.bmm(qv, cache.transpose(1, 2)).float().mul_(scale)
        p = s.softmax(dim=-1).to(dt)
        return torch.bmm(p, cache[:, :, :lora])

    def mla() -> torch.Tensor:
        cache, _ = caches.next()
        return mla_over(cache, qt)

    def mla_dsa() -> torch.Tensor:
        cache, index_cache = caches.next()
        assert q_idx is not None and w_idx is not None
        keys = index_cache.to(dt)  # FP8 index keys → bf16 (DeepGEMM reads FP8 directly)
        logits = torch.bmm(q_idx, keys.transpose(1, 2)).view(b, q, key.index_heads, length)
        score = (logits.float().relu_() * w_idx).sum(dim=2)  # [b, q, length]
        top = score.topk(attended, dim=-1).indices  # [b, q, attended]
        sel = torch.gather(
            cache.unsqueeze(1).expand(b, q, length, width), 2, top.unsqueeze(-1).expand(b, q, attended, width)
        ).view(b * q, attended, width)
        return mla_over(sel, qt.view(b * q, heads, width))

    flops = 2.0 * b * q * heads * attended * (width + lora)
    if dsa:
        flops += 2.0 * b * q * key.index_heads * length * key.index_head_dim
    note = (note + "; " if note else "") + "torch matmul MLA (reads the latent cache twice; FlashMLA reads it once)"
    return OpRunner(mla_dsa if dsa else mla, kv_read + qt.numel() * 2 * 2, flops, copies, note, kv_bytes=kv_read)


# ------------------------------------------------------------------------------------------------- KV cache


def _kv_torch_dtype(name: str) -> torch.dtype:
    return {"fp8": torch.float8_e4m3fn, "bf16": torch.bfloat16, "fp16": torch.float16}.get(name, torch.bfloat16)


def kvcast_write_runner(key: KvcastKey, ctx: ProbeContext) -> OpRunner:
    """Write one layer's new entries: `tokens` rows of `width` BF16 values cast to the cache dtype and copied into a
    cache of `context` + `tokens` slots (FP8 index keys of a DSA layout get a dynamic scale per 128 values)."""
    device = ctx.device
    kv = _kv_torch_dtype(key.kv_dtype)
    slots = key.context + key.tokens
    _require(ctx, slots * key.width * kv.itemsize * 1.1, f"KV cache {key.key_id}")
    cache = randn((slots, key.width), kv, device, std=1.0)
    new = randn((key.tokens, key.width), torch.bfloat16, device, std=1.0)
    where = torch.arange(key.context, slots, device=device)
    group = 128 if key.layout == "dsa_index" and key.width % 128 == 0 else 0
    scales = torch.ones(slots, max(1, key.width // 128), device=device) if group else None

    # FP8 rows are copied through a uint8 view: index_copy_ has no Float8 kernel on CPU (same bytes, same work).
    raw = cache.view(torch.uint8) if kv.itemsize == 1 else cache

    def write() -> None:
        if kv == torch.float8_e4m3fn:
            if group and scales is not None:
                blocks = new.float().view(key.tokens, -1, group)
                s = blocks.abs().amax(dim=-1).clamp_(min=1e-6) / FP8_E4M3_MAX
                q = (blocks / s.unsqueeze(-1)).view(key.tokens, key.width).to(kv)
                raw.index_copy_(0, where, q.view(torch.uint8))
                scales.index_copy_(0, where, s)
            else:
                raw.index_copy_(0, where, new.to(kv).view(torch.uint8))
        else:
            cache.index_copy_(0, where, new.to(kv))

    moved = key.tokens * key.width * (2 + kv.itemsize)
    return OpRunner(write, moved, 0.0)


def kvcast_read_runners(width: int, context: int, gather_tokens: int, ctx: ProbeContext) -> tuple[OpRunner, OpRunner]:
    """(whole-cache cast, gather-then-cast) of an FP8 cache of `context` tokens read as BF16.

    whole: `cache.to(bf16)` over every cached token: grows with context (the motivating bug's pattern).
    gather: the blocks a step needs — `gather_tokens` tokens in blocks of 64 (a DSA top-k) — gathered, then cast:
    flat in context once context exceeds `gather_tokens`.
    """
    device = ctx.device
    fp8 = torch.float8_e4m3fn
    _require(ctx, context * width * 3.2, f"FP8 cache of {context} tokens")
    cache = randn((context, width), fp8, device, std=1.0)
    need = min(context, gather_tokens)
    blocks = max(1, -(-context // KV_BLOCK_TOKENS))
    want_blocks = max(1, -(-need // KV_BLOCK_TOKENS))
    gen = torch.Generator(device="cpu").manual_seed(context)
    chosen = torch.randperm(blocks, generator=gen)[:want_blocks].sort().values
    idx = (chosen.unsqueeze(1) * KV_BLOCK_TOKENS + torch.arange(KV_BLOCK_TOKENS)).flatten()
    idx = idx[idx < context][:need].to(device)

    def whole() -> torch.Tensor:
        return cache.to(torch.bfloat16)

    def gather() -> torch.Tensor:
        return cache.index_select(0, idx).to(torch.bfloat16)

    whole_bytes = context * width * 3.0
    gather_bytes = idx.numel() * width * 3.0
    return OpRunner(whole, whole_bytes, 0.0), OpRunner(gather, gather_bytes, 0.0)


# ------------------------------------------------------------------------------------------------- norms


def norm_runner(key: NormKey, ctx: ProbeContext) -> OpRunner:
    """One elementwise op over [tokens × width] in eager torch (several small kernels where engines fuse one)."""
    device = ctx.device
    dt = _DTYPES.get(key.dtype, torch.bfloat16)
    t, w = key.tokens, key.width
    x = randn((t, w), dt, device, std=1.0)
    eps = 1e-6
    io = t * w * dt.itemsize
    if key.op == "rmsnorm":
        weight = randn((w,), dt, device, std=1.0)
        return OpRunner(lambda: F.rms_norm(x, (w,), weight, eps), 2 * io + w * 2, 4.0 * t * w)
    if key.op == "add_rmsnorm":
        weight = randn((w,), dt, device, std=1.0)
        res = randn((t, w), dt, device, std=1.0)

        def add_rms() -> torch.Tensor:
            r = x + res
            return F.rms_norm(r, (w,), weight, eps)

        return OpRunner(add_rms, 4 * io, 5.0 * t * w)
    if key.op == "layernorm":
        weight = randn((w,), dt, device, std=1.0)
        bias = randn((w,), dt, device, std=1.0)
        return OpRunner(lambda: F.layer_norm(x, (w,), weight, bias, eps), 2 * io, 6.0 * t * w)
    if key.op == "silu_mul":
        gate_up = randn((t, 2 * w), dt, device, std=1.0)
        return OpRunner(lambda: F.silu(gate_up[:, :w]) * gate_up[:, w:], 3 * io, 5.0 * t * w)
    if key.op == "rotary":
        half = max(1, w // 2)
        xr = randn((t, 2 * half), dt, device, std=1.0)
        cos = randn((t, half), dt, device, std=1.0)
        sin = randn((t, half), dt, device, std=1.0)

        def rotary() -> torch.Tensor:
            x1, x2 = xr[:, :half], xr[:, half:]
            return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)

        return OpRunner(rotary, 3 * io, 3.0 * t * w)
    if key.op == "embedding":
        rows = max(t, min(EMBEDDING_ROWS, EMBEDDING_TABLE_BYTES // (w * dt.itemsize)))
        table = randn((rows, w), dt, device, std=1.0)
        ids = torch.randint(0, rows, (t,), device=device)
        return OpRunner(lambda: F.embedding(ids, table), 2 * io, 0.0)
    raise UnsupportedError(f"norm op {key.op!r} is not rmsnorm, add_rmsnorm, layernorm, silu_mul, rotary or embedding")


# ------------------------------------------------------------------------------------------------- sampling


def sampling_runner(key: SamplingKey, ctx: ProbeContext, *, rotate: bool, sampler: str) -> OpRunner:
    """lm_head on this rank's vocab shard (fp32 logits), then greedy (argmax) or top-p (p=0.9, T=0.7: softmax, sort,
    cumsum, mask, exponential-race draw) sampling."""
    device = ctx.device
    if key.dtype not in _DTYPES:
        raise UnsupportedError(f"lm_head dtype {key.dtype!r} is not bf16/fp16/fp32")
    dt = _DTYPES[key.dtype]
    t, v, h = key.tokens, key.vocab_shard, key.hidden
    w_bytes = v * h * dt.itemsize
    copies = copies_for(ctx, w_bytes, rotate)
    _require(ctx, copies * w_bytes + 6 * t * v * 4, f"lm_head shard {key.key_id}")
    heads = Rotation([randn((v, h), dt, device) for _ in range(copies)])
    x = randn((t, h), dt, device, std=1.0)
    top_p, temperature = 0.9, 0.7

    def greedy() -> torch.Tensor:
        return F.linear(x, heads.next()).float().argmax(dim=-1)

    def nucleus() -> torch.Tensor:
        logits = F.linear(x, heads.next()).float()
        probs = (logits / temperature).softmax(dim=-1)
        sorted_p, order = probs.sort(dim=-1, descending=True)
        cum = sorted_p.cumsum(dim=-1)
        sorted_p = sorted_p.masked_fill(cum - sorted_p > top_p, 0.0)
        # Sample ∝ p as argmax(p / Exp(1)) (the exponential race vLLM uses; graph-safe, unlike multinomial).
        pick = (sorted_p / torch.empty_like(sorted_p).exponential_()).argmax(dim=-1, keepdim=True)
        return order.gather(1, pick)

    if sampler not in ("greedy", "top_p"):
        raise ValueError(f"unknown sampler {sampler!r}")
    fn = greedy if sampler == "greedy" else nucleus
    moved = w_bytes + t * h * dt.itemsize + t * v * 4 * (1 if sampler == "greedy" else 4)
    return OpRunner(fn, moved, 2.0 * t * v * h, copies, weight_bytes=w_bytes)


# ------------------------------------------------------------------------------------------------- collectives


def collective_runner(key: AllreduceKey, ctx: ProbeContext) -> OpRunner:
    """One all-reduce or all-gather of exactly `bytes` per rank, bf16 on GPUs (fp32 on gloo), on the group."""
    if key.ranks != ctx.world_size:
        raise UnsupportedError(f"plan needs {key.ranks} ranks for {key.collective}, the group has {ctx.world_size}")
    if ctx.world_size < 2:
        raise UnsupportedError("a collective needs two or more ranks")
    dt = torch.bfloat16 if ctx.is_cuda else torch.float32
    numel = max(1, key.bytes // dt.itemsize)
    buf = randn((numel,), dt, ctx.device, std=1e-3)
    if key.collective == "all_reduce":

        def all_reduce() -> None:
            dist.all_reduce(buf)

        return OpRunner(all_reduce, 2.0 * key.bytes, 0.0)
    if key.collective == "all_gather":
        out = torch.empty(numel * ctx.world_size, dtype=dt, device=ctx.device)

        def all_gather() -> None:
            dist.all_gather_into_tensor(out, buf)

        return OpRunner(all_gather, key.bytes * (1 + ctx.world_size), 0.0)
    raise UnsupportedError(f"collective {key.collective!r} is not all_reduce or all_gather")


# ------------------------------------------------------------------------------------------------- dispatch


def runner_for(key_id: str, ctx: ProbeContext, *, rotate: bool) -> OpRunner:
    """The default runner for any key (the `layer` probe's building block): fastest-known variants where a key has
    several (MoE: grouped GEMM, else the per-expert loop; fp8 GEMM: per-tensor scaling; sampling: greedy)."""
    key = parse_key_id(key_id)
    if isinstance(key, GemmKey):
        return gemm_runner(key, ctx, rotate=rotate)
    if isinstance(key, MoeKey):
        try:
            return moe_runner(key, ctx, rotate=rotate, variant="grouped")
        except UnsupportedError:
            return moe_runner(key, ctx, rotate=rotate, variant="loop")
    if isinstance(key, RoutingKey):
        return routing_runner(key, ctx, rotate=rotate)
    if isinstance(key, AttentionKey):
        return attention_runner(key, ctx, rotate=rotate)
    if isinstance(key, KvcastKey):
        return kvcast_write_runner(key, ctx)
    if isinstance(key, NormKey):
        return norm_runner(key, ctx)
    if isinstance(key, SamplingKey):
        return sampling_runner(key, ctx, rotate=rotate, sampler="greedy")
    if isinstance(key, AllreduceKey):
        return collective_runner(key, ctx)
    raise UnsupportedError(f"no kernel for {key_id}")


def kernels_note(ctx: ProbeContext, build: Callable[[], OpRunner]) -> str:
    """'kernels: name (µs), …' of one call of the op under torch.profiler (CUDA only): which kernel torch picked,
    its tile and split-K shape in the cuBLAS/CUTLASS name, and each kernel's time."""
    try:
        from torch.profiler import ProfilerActivity, profile

        runner = build()
        runner.fn()
        torch.cuda.synchronize(ctx.device)
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            runner.fn()
            torch.cuda.synchronize(ctx.device)
        parts = []
        for evt in prof.key_averages():
            us = getattr(evt, "self_device_time_total", None) or getattr(evt, "self_cuda_time_total", 0.0)
            if us and us > 0:
                parts.append(f"{evt.key[:110]} ({us / max(1, evt.count):.1f} µs)")
        del runner
        return "kernels: " + ", ".join(parts) if parts else "kernels: none seen by the profiler"
    except Exception as exc:
        return f"kernel names unavailable ({type(exc).__name__}: {_first(exc)[:80]})"
    finally:
        free_memory(ctx)


def free_memory(ctx: ProbeContext) -> None:
    """Return cached blocks to the device between keys (big weights of one key must not crowd out the next)."""
    if ctx.is_cuda:
        torch.cuda.synchronize(ctx.device)
        torch.cuda.empty_cache()


# ------------------------------------------------------------------------------------------------- results


def share_cpu_threads(ctx: ProbeContext) -> int:
    """CPU ranks split the host's cores: cores / ranks intra-op threads each (at least 1). Two ranks of two
    threads each on two cores spin-wait on each other: a 64k-element cast took 100 ms instead of 0.4 ms."""
    import os

    threads = max(1, (os.cpu_count() or 1) // max(1, ctx.world_size))
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)
    return threads


@dataclass(frozen=True)
class TimingOptions:
    """How long and how often to time each point, and whether to rotate inputs, on this rank."""

    budget_ms: float
    max_samples: int
    min_samples: int
    rotate: bool
    graph: bool

    @classmethod
    def from_params(cls, ctx: ProbeContext, params: dict[str, Any]) -> TimingOptions:
        """GPU: `budget_ms`, `samples`, rotation as asked. CPU ranks: `cpu_samples` (few) and no rotation, so a
        70B shard's GEMMs finish in seconds on two cores (each note says so)."""
        if ctx.is_cuda:
            return cls(float(params["budget_ms"]), int(params["samples"]), 5, bool(params["rotate"]), True)
        share_cpu_threads(ctx)
        n = max(1, int(params["cpu_samples"]))
        return cls(float(params["budget_ms"]), n, min(2, n), False, False)

    @property
    def cpu_note(self) -> str:
        return "" if self.graph else f"CPU: host timer, {self.max_samples} reps max, no rotation"


def point(
    name: str,
    params: dict[str, Any],
    runner: OpRunner,
    timing: Timing,
    *,
    copy_gbps: float = 0.0,
    peak_tflops: float = 0.0,
    note: str = "",
    extra: dict[str, float] | None = None,
) -> RankMeasurement:
    """A measured point: samples in µs, plus time_us, GB/s, TFLOP/s, and % of the copy bandwidth / matrix peak."""
    med = timing.median_us
    gbps = runner.moved_bytes / med / 1e3 if med > 0 else 0.0
    metrics: dict[str, float] = {"time_us": med, "gbps": gbps, "moved_bytes": float(runner.moved_bytes)}
    if runner.flops:
        metrics["tflops"] = runner.flops / med / 1e6 if med > 0 else 0.0
    if runner.weight_bytes:
        metrics["weight_bytes"] = float(runner.weight_bytes)
    if runner.kv_bytes:
        metrics["kv_bytes"] = float(runner.kv_bytes)
        metrics["kv_gbps"] = runner.kv_bytes / med / 1e3 if med > 0 else 0.0
    if copy_gbps > 0:
        metrics["copy_bw_pct"] = 100.0 * gbps / copy_gbps
    if peak_tflops > 0 and runner.flops:
        metrics["peak_pct"] = 100.0 * metrics["tflops"] / peak_tflops
    metrics["rotation"] = float(runner.rotation)
    metrics.update(extra or {})
    notes = [n for n in (runner.note, timing.note, note) if n]
    return RankMeasurement(
        name,
        {**params, "method": timing.method},
        "us",
        samples=timing.samples,
        metrics=metrics,
        note="; ".join(notes),
    )


def not_run(name: str, params: dict[str, Any], exc: BaseException) -> RankMeasurement:
    """An `unsupported` point for `UnsupportedError` (and out-of-memory), a `failed` one for anything else."""
    from decodetop.probes.worker.context import InsufficientMemoryError

    if isinstance(exc, (UnsupportedError, InsufficientMemoryError)):
        return RankMeasurement(name, params, "us", status=MeasurementStatus.UNSUPPORTED, note=str(exc))
    text = f"{type(exc).__name__}: {_first(exc)}"
    return RankMeasurement(name, params, "us", status=MeasurementStatus.FAILED, note=text[:300])


def measure(
    ctx: ProbeContext,
    opts: TimingOptions,
    name: str,
    params: dict[str, Any],
    build: Callable[[], OpRunner],
    **kw: Any,
) -> RankMeasurement:
    """Build the runner, time it, and free its memory; any failure becomes a not-run point with the reason."""
    try:
        runner = build()
        timing = time_runner(
            ctx,
            runner,
            budget_ms=opts.budget_ms,
            max_samples=opts.max_samples,
            min_samples=opts.min_samples,
            graph=opts.graph,
        )
        note = "; ".join(n for n in (kw.pop("note", ""), opts.cpu_note) if n)
        return point(name, params, runner, timing, note=note, **kw)
    except Exception as exc:
        if ctx.is_cuda:
            torch.cuda.synchronize(ctx.device)
        return not_run(name, params, exc)
    finally:
        free_memory(ctx)


def key_list(params: dict[str, Any], probe: str) -> list[str]:
    """The probe's `keys` parameter, each a key id of this probe (checked)."""
    out = []
    for kid in params["keys"]:
        key = parse_key_id(str(kid))
        if probe != key.PROBE:
            raise ValueError(f"{probe}: key {kid!r} belongs to the {key.PROBE} probe")
        out.append(key.key_id)
    return out
