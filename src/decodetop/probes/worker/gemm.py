"""Provides the `gemm` probe: the inventory's dense GEMMs at M = batch, and a sweep over M for the chart.

For every key (`gemm:m=…,n=…,k=…,batch=…,dtype=…`) and every M of the sweep (1…256 by default, the key's own M
included) the probe times one GEMM [M×k]·[k×n] with weights as the model's shard holds them (random values, [n×k]
like nn.Linear), rotating weight copies so the working set exceeds 2× L2 (docs/reference/probes.md §4), by CUDA-graph
replay on GPUs. FP8 keys run `torch._scaled_mm` with per-tensor (cuBLASLt) and row-wise (CUTLASS) scales, each reported;
NVFP4 runs only on sm_100/sm_120 (elsewhere "unsupported on sm_XY"); MXFP4 has no torch GEMM.

Each point reports time, achieved GB/s (weights + activations) and TFLOP/s, against two references measured first
on the same rank: the device copy bandwidth (read + write, as `membw`) and the BF16 matrix peak (a large square
GEMM). CPU ranks time bf16/fp32 with the host clock, few repetitions, no rotation, and a capped sweep (each
point's note says so); fp8/fp4 are unsupported there with the reason.

Point params: `key` (the GemmKey at that M), `curve` (`GemmKey.curve_id`), `m`, `variant`, `role` ("budget" at a
key's own M, "sweep" elsewhere). `decodetop.probes.plan_hooks` turns them into the budget's times and GEMM-vs-M curves.
"""

from __future__ import annotations

import dataclasses
import statistics
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812 - the conventional name

from decodetop.budget.keys import GemmKey, parse_key_id
from decodetop.probes.results import MeasurementStatus, RankMeasurement, RankOutput
from decodetop.probes.worker.context import ProbeContext, UnsupportedError
from decodetop.probes.worker.ops import OpRunner, TimingOptions, free_memory, kernels_note, key_list, measure, not_run
from decodetop.probes.worker.tensors import (
    DTYPES,
    copies_for,
    first_line,
    randn,
    require_free,
    scaled_mm,
    sm_tag,
    weight_cache,
    weights,
)
from decodetop.probes.worker.timing import Rotation, rotation_count, time_events, time_host

FP8_VARIANTS = ("tensor", "row")
"""FP8 `_scaled_mm` scalings: per-tensor (cuBLASLt) and row-wise (CUTLASS) (docs/reference/probes.md §4)."""


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
    dtype = torch.float8_e4m3fn if fp8 else DTYPES.get(key.dtype, torch.bfloat16)
    wsize = 1 if fp8 else dtype.itemsize
    w_bytes = batch * n * k * wsize
    act_bytes = batch * (m * k * (1 if fp8 else dtype.itemsize) + m * n * 2)
    copies = copies_for(ctx, w_bytes, rotate)
    require_free(ctx, copies * w_bytes + 4 * act_bytes, f"GEMM weights {key.key_id}")
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
    x8, sa, sb, note = _fp8_operands(w8.items[0], m, variant=variant, device=device)

    def mm8() -> torch.Tensor:
        return scaled_mm(x8, w8.next().t(), sa, sb)

    return OpRunner(mm8, w_bytes + act_bytes, flops, copies, note, weight_bytes=w_bytes)


def _fp8_operands(
    w8: torch.Tensor, m: int, *, variant: str, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, str]:
    """The FP8 activation [m×k] and the A and B scales of `variant` (tensor: scalars; row: per row and per column)
    for the weight `w8` [n×k], tried once; where this `_scaled_mm` rejects M, M padded to a multiple of 16, with a
    note saying so."""
    n, k = w8.shape
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
        scaled_mm(x8, w8.t(), sa, sb)
    except Exception as exc:
        if m % 16 == 0:
            raise UnsupportedError(
                f"fp8 {variant}-wise _scaled_mm failed: {type(exc).__name__}: {first_line(exc)}"
            ) from None
        rows = -(-m // 16) * 16
        x8 = randn((rows, k), torch.float8_e4m3fn, device)
        if variant == "row":
            sa = torch.rand(rows, 1, device=device) + 0.5
        try:
            scaled_mm(x8, w8.t(), sa, sb)
        except Exception as exc2:
            raise UnsupportedError(
                f"fp8 {variant}-wise _scaled_mm failed: {type(exc2).__name__}: {first_line(exc2)}"
            ) from None
        return x8, sa, sb, f"M padded {m}→{rows} (this _scaled_mm rejected M={m}: {first_line(exc)[:80]})"
    return x8, sa, sb, ""


def _nvfp4_runner(key: GemmKey, ctx: ProbeContext, *, rotate: bool) -> OpRunner:
    """NVFP4 via `_scaled_mm` with float4_e2m1fn_x2 operands and e4m3 block-16 scales (docs/reference/probes.md §4)."""
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
    require_free(ctx, copies * w_bytes, f"NVFP4 weights {key.key_id}")

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
        return scaled_mm(x, w.t(), sx, sw)

    try:
        mm4()
    except Exception as exc:
        raise UnsupportedError(f"NVFP4 _scaled_mm failed on {tag}: {type(exc).__name__}: {first_line(exc)}") from None
    return OpRunner(mm4, w_bytes + m * k / 2 + m * n * 2, 2.0 * m * n * k, copies, weight_bytes=w_bytes)


def op_runner(key_id: str, ctx: ProbeContext, *, rotate: bool) -> OpRunner:
    """A layer's GEMM: the key's dtype, FP8 with per-tensor scales."""
    key = parse_key_id(key_id)
    assert isinstance(key, GemmKey)
    return gemm_runner(key, ctx, rotate=rotate)


#: Reference copy size: 256 MiB on GPUs (docs/reference/h200-machine.md: 4.1 TB/s D2D at this size), 32 MiB on CPU
#: ranks.
COPY_BYTES_GPU = 256 * 1024**2
COPY_BYTES_CPU = 32 * 1024**2
#: Square BF16 GEMM for the matrix peak: 8192³ on GPUs (docs/reference/probes.md §4 quotes peaks at 8192³), 512³ on CPU
#: ranks.
PEAK_N_GPU = 8192
PEAK_N_CPU = 512


def references(ctx: ProbeContext, samples: int) -> tuple[list[RankMeasurement], float, float]:
    """(points, copy GB/s, BF16 peak TFLOP/s) measured on this rank; 0.0 where a reference failed."""
    out: list[RankMeasurement] = []
    copy_gbps = peak_tflops = 0.0
    device = ctx.device.type
    nbytes = COPY_BYTES_GPU if ctx.is_cuda else COPY_BYTES_CPU
    try:
        numel = nbytes // 4
        copies = rotation_count(2 * nbytes, ctx.cache_bytes(), max_copies=4) if ctx.is_cuda else 1
        ctx.require_free_bytes(2 * nbytes * copies, "copy reference buffers")
        pairs = Rotation(
            [(torch.empty(numel, device=ctx.device), randn((numel,), torch.float32, ctx.device)) for _ in range(copies)]
        )

        def copy(pairs: Rotation[tuple[torch.Tensor, torch.Tensor]] = pairs) -> None:
            dst, src = pairs.next()
            dst.copy_(src)

        s = time_events(copy, 1, samples, warmup=2) if ctx.is_cuda else time_host(copy, 1, samples, warmup=1)
        med = statistics.median(s)
        copy_gbps = 2 * nbytes / med / 1e3
        out.append(
            RankMeasurement(
                "reference: device copy",
                {"what": "copy", "device": device, "size_bytes": nbytes},
                "us",
                samples=tuple(s),
                metrics={"time_us": med, "bandwidth_gbps": copy_gbps},
                note="read + write counted (2 × size), as membw",
            )
        )
        del pairs, copy
    except Exception as exc:
        out.append(not_run("reference: device copy", {"what": "copy", "device": device}, exc))
    free_memory(ctx)
    n = PEAK_N_GPU if ctx.is_cuda else PEAK_N_CPU
    try:
        ctx.require_free_bytes(3 * n * n * 2, "matrix peak operands")
        a = randn((n, n), torch.bfloat16, ctx.device, std=1.0)
        b = randn((n, n), torch.bfloat16, ctx.device, std=1.0)

        def mm(a: torch.Tensor = a, b: torch.Tensor = b) -> torch.Tensor:
            return a @ b

        s = time_events(mm, 1, samples, warmup=3) if ctx.is_cuda else time_host(mm, 1, max(2, samples // 2), warmup=1)
        med = statistics.median(s)
        peak_tflops = 2.0 * n**3 / med / 1e6
        out.append(
            RankMeasurement(
                f"reference: bf16 matrix peak {n}³",
                {"what": "peak", "device": device, "n": n},
                "us",
                samples=tuple(s),
                metrics={"time_us": med, "tflops": peak_tflops},
            )
        )
        del a, b, mm
    except Exception as exc:
        out.append(not_run(f"reference: bf16 matrix peak {n}³", {"what": "peak", "device": device}, exc))
    free_memory(ctx)
    return out, copy_gbps, peak_tflops


#: docs/reference/probes.md §7.6: GEMMs on weights of 32 MB or more should reach a set share of the measured copy
#: bandwidth (80 % there; decodetop bars at 75 %); below it, the note names the kernels torch ran, so the reader can
#: see why.
BAR_WEIGHT_BYTES = 32 * 1000**2
BAR_COPY_PCT = 75.0


def _below_bar(m: RankMeasurement) -> bool:
    return (
        m.status is MeasurementStatus.OK
        and m.metrics.get("weight_bytes", 0.0) >= BAR_WEIGHT_BYTES
        and 0.0 < m.metrics.get("copy_bw_pct", 100.0) < BAR_COPY_PCT
    )


def run(ctx: ProbeContext, params: dict[str, Any]) -> RankOutput:
    """Every key at every M of its sweep, every variant its dtype has."""
    opts = TimingOptions.from_params(ctx, params)
    keys = [parse_key_id(k) for k in key_list(params, "gemm")]
    sweep_m = sorted({int(m) for m in params["sweep_m"]}) if params["sweep"] else []
    if any(m < 1 for m in sweep_m):
        raise ValueError(f"gemm: sweep_m must be positive, got {sweep_m}")
    if not ctx.is_cuda:
        sweep_m = [m for m in sweep_m if m <= int(params["cpu_sweep_max_m"])]
    variants = [str(v) for v in params["fp8_variants"]]
    bad = [v for v in variants if v not in FP8_VARIANTS]
    if bad:
        raise ValueError(f"gemm: unknown fp8 variant(s) {bad} (known: {', '.join(FP8_VARIANTS)})")
    out: list[RankMeasurement] = []
    copy_gbps = peak_tflops = 0.0
    if params["reference"]:
        ctx.progress("references: copy bandwidth, matrix peak", 0, len(keys) + 1)
        refs, copy_gbps, peak_tflops = references(ctx, 10 if ctx.is_cuda else 3)
        out.extend(refs)
    # One curve per (n, k, batch, dtype); budget Ms are the keys' own.
    curves: dict[str, tuple[GemmKey, set[int]]] = {}
    for key in keys:
        assert isinstance(key, GemmKey)
        entry = curves.setdefault(key.curve_id, (key, set()))
        entry[1].add(key.m)
    for index, (curve, (base, budget_ms_set)) in enumerate(curves.items()):
        ctx.progress(f"key {index + 1}/{len(curves)} {curve}", index, len(curves))
        ms = sorted(set(sweep_m) | budget_ms_set)
        names = variants if base.dtype == "fp8" and ctx.is_cuda and base.batch == 1 else [""]
        with weight_cache():
            out.extend(_curve(ctx, opts, base, curve, ms, budget_ms_set, names, copy_gbps, peak_tflops))
        free_memory(ctx)
    ctx.progress("done", len(curves), len(curves))
    return RankOutput(measurements=tuple(out))


def _curve(  # noqa: PLR0917 - private: one curve's loop
    ctx: ProbeContext,
    opts: TimingOptions,
    base: GemmKey,
    curve: str,
    ms: list[int],
    budget_ms_set: set[int],
    names: list[str],
    copy_gbps: float,
    peak_tflops: float,
) -> list[RankMeasurement]:
    out: list[RankMeasurement] = []
    for variant in names:
        for m in ms:
            key = GemmKey(m, base.n, base.k, base.batch, base.dtype)
            role = "budget" if m in budget_ms_set else "sweep"
            label = f" [{variant}-wise]" if variant else ""
            pt = {
                "what": "gemm",
                "key": key.key_id,
                "curve": curve,
                "m": m,
                "variant": variant or base.dtype,
                "role": role,
                "device": ctx.device.type,
            }
            build = partial(gemm_runner, key, ctx, rotate=opts.rotate, variant=variant)
            got = measure(ctx, opts, f"{key.key_id}{label}", pt, build, copy_gbps=copy_gbps, peak_tflops=peak_tflops)
            if ctx.is_cuda and role == "budget" and _below_bar(got):
                got = dataclasses.replace(got, note="; ".join(n for n in (got.note, kernels_note(ctx, build)) if n))
            out.append(got)
    return out
