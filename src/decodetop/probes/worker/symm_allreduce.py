"""Provides the engine-class all-reduce for the `allreduce` probe: P2P one-shot and two-shot all-reduce kernels on
torch's own symmetric memory (`torch.distributed._symmetric_memory`, torch ≥ 2.5), timed exactly as the NCCL one.

vLLM and SGLang run decode-size all-reduces through their own P2P kernels ("custom all-reduce") when every GPU pair
has P2P access (decodetop.budget.engine_paths cites their rules). torch's symmetric memory has kernels of the same
class, with nothing to install:

- `one_shot`: every rank reads every peer's whole buffer over P2P and reduces locally (`one_shot_all_reduce_out`:
  input in the symmetric buffer, output in a local tensor — as vLLM's custom all-reduce runs in a CUDA graph, on
  IPC-registered inputs);
- `two_shot`: reduce-scatter then all-gather over P2P (`two_shot_all_reduce_out`; in place where torch has no
  out variant);
- `multimem`: NVLink SHARP multicast (`multimem_all_reduce_`). Never used unless the probe's `multimem` parameter
  is true: multicast stays off on shared machines, so every other run sets `TORCH_SYMM_MEM_DISABLE_MULTICAST=1`
  in the rank before the first symmetric allocation.

One buffer of the largest size is allocated and rendezvoused once; each size uses its leading slice. Sizes above
`custom_max_bytes` are not swept (the engines send nothing that large through their custom kernels: 8 MiB). Each
size is checked once (inputs rank+1, expected n(n+1)/2) before it is timed; timed buffers hold zeros, so two-shot's
in-place scratch never overflows.

Where it cannot run — CPU/gloo ranks, one rank, torch without symmetric memory or without the op, a group spanning
hosts, GPUs without P2P between a pair, `NCCL_P2P_DISABLE` set (the host declares P2P off), a failed rendezvous —
every rank agrees
first (no rank enters the collective rendezvous alone) and each requested implementation is one `unsupported`
measurement with the reason.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import socket
import statistics
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from decodetop.probes.results import MeasurementStatus, RankMeasurement
from decodetop.probes.worker.context import ProbeContext
from decodetop.probes.worker.tensors import first_line
from decodetop.probes.worker.timing import plan_counts, time_graph, time_host, time_host_and_events
from decodetop.textfmt import format_bytes

#: P2P implementations (`impl` values besides `nccl`); `multimem` only with the `multimem` opt-in.
IMPLS = ("one_shot", "two_shot")
OPT_IN_IMPLS = ("multimem",)
#: Each implementation's torch.ops.symm_mem ops: the one writing into an output buffer (used where this torch has
#: it; '' where none exists) and the one taking the input alone (in place, or returning its result), which it needs.
_OPS: dict[str, tuple[str, str]] = {
    "one_shot": ("one_shot_all_reduce_out", "one_shot_all_reduce"),
    "two_shot": ("two_shot_all_reduce_out", "two_shot_all_reduce_"),
    "multimem": ("", "multimem_all_reduce_"),
}
#: Modes the custom implementations are timed in: what the NCCL one reports under the same names.
MODES = ("graph", "pipelined")
#: torch.distributed._symmetric_memory and its all-reduce ops appeared in torch 2.5
#: (https://docs.pytorch.org/docs/stable/symmetric_memory.html).
MIN_TORCH = (2, 5)
#: torch reads this before the first symmetric allocation: 1 keeps NVLink multicast off (h200-machine setting;
#: https://github.com/pytorch/pytorch/blob/main/torch/csrc/distributed/c10d/symm_mem/CUDASymmetricMemoryUtils.cpp).
DISABLE_MULTICAST_ENV = "TORCH_SYMM_MEM_DISABLE_MULTICAST"
#: Values of NCCL_P2P_DISABLE that turn P2P off (NCCL reads it as a boolean:
#: https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html#nccl-p2p-disable).
_TRUE = ("1", "true", "yes", "on")
#: Ops used to estimate one op's time before planning the counts (not kept), as the NCCL sweep does.
_ESTIMATE_OPS = 3


def _torch_version() -> tuple[int, int]:
    parts = torch.__version__.split("+")[0].split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        return (0, 0)


def _op(name: str) -> Any:
    """torch.ops.symm_mem.<name>, or None where this torch has no such op."""
    try:
        return getattr(torch.ops.symm_mem, name)
    except (AttributeError, RuntimeError):
        return None


def local_reason(ctx: ProbeContext, impls: Sequence[str], *, multimem: bool, env: dict[str, str] | None = None) -> str:
    """Why the custom all-reduce cannot run on this rank ('' when it can), from what this rank sees alone."""
    environ = os.environ if env is None else env
    if not ctx.is_cuda:
        return f"torch symmetric memory needs CUDA GPUs; these are {ctx.backend} CPU ranks"
    if ctx.world_size < 2:
        return "a P2P all-reduce needs two or more GPUs"
    return _torch_reason(impls) or _opt_in_reason(impls, multimem=multimem, environ=environ)


def _torch_reason(impls: Sequence[str]) -> str:
    """Why this torch cannot run the `impls` (no symmetric memory, or no op for one of them); '' when it can."""
    if _torch_version() < MIN_TORCH:
        return f"torch {torch.__version__} has no symmetric memory (needs {MIN_TORCH[0]}.{MIN_TORCH[1]} or newer)"
    try:
        importlib.import_module("torch.distributed._symmetric_memory")
    except ImportError as exc:
        return f"torch {torch.__version__} has no torch.distributed._symmetric_memory ({first_line(exc)})"
    for impl in impls:
        needed = _OPS.get(impl, _OPS["multimem"])[1]
        if _op(needed) is None:
            return f"torch {torch.__version__} has no symm_mem.{needed}"
    return ""


def _opt_in_reason(impls: Sequence[str], *, multimem: bool, environ: Mapping[str, str]) -> str:
    """Why the host or the run's settings keep the `impls` off (multimem not opted in, NCCL_P2P_DISABLE set)."""
    if "multimem" in impls and not multimem:
        return "multimem needs the multimem opt-in (multicast stays off on shared machines)"
    flag = environ.get("NCCL_P2P_DISABLE", "").strip().lower()
    if flag in _TRUE:
        return f"NCCL_P2P_DISABLE={environ['NCCL_P2P_DISABLE']} is set: this host declares GPU P2P off"
    return ""


def _p2p_reason(ctx: ProbeContext) -> str:
    """'' when every rank is on this host and this rank's GPU reaches every other rank's GPU over P2P
    (torch.cuda.can_device_access_peer), else why not."""
    mine = ctx.device.index or 0
    placed = _gather(ctx, (socket.gethostname(), mine))
    hosts = sorted({host for host, _ in placed})
    if len(hosts) > 1:
        return f"the group spans {len(hosts)} hosts: P2P all-reduce kernels run within one node (as the engines')"
    for rank, (_host, peer) in enumerate(placed):
        if rank == ctx.rank or peer == mine:
            continue
        try:
            ok = torch.cuda.can_device_access_peer(mine, int(peer))
        except RuntimeError as exc:
            return f"P2P access from GPU {mine} to GPU {peer} could not be checked: {first_line(exc)[:120]}"
        if not ok:
            return f"no P2P access from GPU {mine} to GPU {peer}"
    return ""


def _gather(ctx: ProbeContext, value: Any) -> list[Any]:
    """Every rank's `value` through the host group (no GPU work)."""
    if ctx.world_size == 1:
        return [value]
    out: list[Any] = [None] * ctx.world_size
    dist.all_gather_object(out, value, group=ctx.cpu_group)
    return out


def agreed_reason(ctx: ProbeContext, reason: str) -> str:
    """The first rank's non-empty reason, as 'rank r: …' (every rank gets the same answer), or ''."""
    if ctx.world_size == 1 or not ctx.is_cuda:
        return reason
    reasons = _gather(ctx, reason)
    for rank, text in enumerate(reasons):
        if text:
            return text if all(r == text for r in reasons) else f"rank {rank}: {text}"
    return ""


@dataclass
class SymmBuffer:
    """One rendezvoused symmetric buffer of `numel` elements and a local output of the same size."""

    buf: torch.Tensor
    out: torch.Tensor
    group_name: str
    handle: Any
    multicast: bool


def rendezvous(ctx: ProbeContext, numel: int, dtype: torch.dtype, *, multimem: bool) -> SymmBuffer:
    """Allocate and rendezvous the symmetric buffer on every rank (collective; every rank must call it)."""
    if not multimem:
        os.environ[DISABLE_MULTICAST_ENV] = "1"
    import torch.distributed._symmetric_memory as symm_mem

    group = dist.group.WORLD
    assert group is not None
    name = group.group_name
    enable = getattr(symm_mem, "enable_symm_mem_for_group", None)
    if enable is not None:  # required before torch 2.8, a deprecated no-op after
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            enable(name)
    buf = symm_mem.empty(numel, dtype=dtype, device=ctx.device)
    buf.zero_()
    handle = symm_mem.rendezvous(buf, name)
    multicast = bool(getattr(handle, "multicast_ptr", 0))  # a torch build without multicast has no such field
    return SymmBuffer(buf, torch.zeros(numel, dtype=dtype, device=ctx.device), name, handle, multicast)


def op_for(sb: SymmBuffer, impl: str, numel: int) -> Callable[[], torch.Tensor]:
    """One all-reduce of the leading `numel` elements with `impl`; returns the tensor holding the result (`sb.out`,
    or the input slice for in-place kernels)."""
    inp = sb.buf[:numel]
    out = sb.out[:numel]
    name = sb.group_name
    if impl not in _OPS:
        raise ValueError(f"unknown custom all-reduce {impl!r} (known: {', '.join(IMPLS + OPT_IN_IMPLS)})")
    out_name, in_name = _OPS[impl]
    with_out = _op(out_name) if out_name else None
    if with_out is not None:
        return lambda: with_out(inp, "sum", name, out)
    without_out = _op(in_name)
    return lambda: without_out(inp, "sum", name)


def check_sum(ctx: ProbeContext, sb: SymmBuffer, impl: str, numel: int) -> int:
    """Inputs rank+1 everywhere, one all-reduce, n(n+1)/2 expected in the result; the buffers are zeroed after.
    Returns the largest count of wrong elements over the ranks (every rank gets the same answer)."""
    n = ctx.world_size
    inp = sb.buf[:numel]
    inp.fill_(ctx.rank + 1)
    sb.out[:numel].zero_()
    ctx.synchronize()
    ctx.host_barrier()
    got = op_for(sb, impl, numel)()
    ctx.synchronize()
    wrong = int((got != n * (n + 1) / 2).sum().item())
    ctx.host_barrier()
    inp.zero_()
    sb.out[:numel].zero_()
    ctx.synchronize()
    return int(ctx.agree_max(float(wrong)))


def unsupported(name: str, point: dict[str, Any], reason: str) -> RankMeasurement:
    """One `unsupported` point naming the reason."""
    return RankMeasurement(name, point, "us", status=MeasurementStatus.UNSUPPORTED, note=reason)


def run_custom(
    ctx: ProbeContext,
    params: dict[str, Any],
    *,
    sizes: Sequence[int],
    modes: Sequence[str],
    impls: Sequence[str],
    metrics_for: Callable[[int, float, int], dict[str, float]],
) -> list[RankMeasurement]:
    """Time every custom `impl` at every size ≤ `custom_max_bytes` in the graph and pipelined modes; one
    `unsupported` point per impl where the group cannot run them. `metrics_for(bytes, µs, ranks)` is the NCCL
    sweep's (algbw, busbw), so both read alike."""
    if not impls:
        return []
    multimem = bool(params.get("multimem", False))
    known = IMPLS + OPT_IN_IMPLS
    bad = [i for i in impls if i not in known]
    if bad:
        raise ValueError(f"unknown all-reduce impl(s) {bad} (known: nccl, {', '.join(known)})")
    max_bytes = int(params.get("custom_max_bytes", 16 * 1024 * 1024))
    dtype = torch.bfloat16 if ctx.is_cuda else torch.float32
    elsize = torch.tensor([], dtype=dtype).element_size()
    chosen = [s for s in sizes if s <= max_bytes]
    custom_modes = [m for m in modes if m in MODES]
    base: dict[str, Any] = {"dtype": str(dtype).replace("torch.", ""), "world_size": ctx.world_size}
    if ctx.is_cuda:  # the engines' size limits are per GPU generation (budget/engine_paths.py)
        major, minor = torch.cuda.get_device_capability(ctx.device)
        base["compute_capability"] = f"{major}.{minor}"

    def all_unsupported(reason: str) -> list[RankMeasurement]:
        return [
            unsupported(f"allreduce {impl} (custom)", {**base, "impl": impl, "mode": "graph"}, reason) for impl in impls
        ]

    reason = local_reason(ctx, impls, multimem=multimem)
    if not reason and ctx.is_cuda:
        reason = _p2p_reason(ctx)
    reason = agreed_reason(ctx, reason)
    if reason:
        return all_unsupported(reason)
    if not chosen or not custom_modes:
        return []
    numel_max = max(1, max(chosen) // elsize)
    ctx.require_free_bytes(2 * numel_max * elsize, "symmetric-memory all-reduce buffers")
    sb: SymmBuffer | None = None
    failed = ""
    try:
        sb = rendezvous(ctx, numel_max, dtype, multimem=multimem)
    except Exception as exc:
        failed = f"symmetric-memory rendezvous failed: {type(exc).__name__}: {first_line(exc)[:160]}"
    failed = agreed_reason(ctx, failed)
    if failed or sb is None:
        return all_unsupported(failed or "symmetric-memory rendezvous failed")
    sweep = _Sweep(ctx, params, sb, elsize, tuple(custom_modes), base, metrics_for)
    out: list[RankMeasurement] = []
    try:
        for impl in impls:
            if impl == "multimem" and not sb.multicast:
                out.append(unsupported(f"allreduce {impl} (custom)", {**base, "impl": impl}, "no multicast here"))
                continue
            out.extend(_sweep_impl(sweep, impl, chosen))
    finally:
        with contextlib.suppress(Exception):
            ctx.release_graphs()
            ctx.synchronize()
        ctx.host_barrier()
        del sb, sweep
    return out


@dataclass(frozen=True)
class _Sweep:
    """What every size of the custom sweep shares."""

    ctx: ProbeContext
    params: dict[str, Any]
    sb: SymmBuffer
    elsize: int
    modes: tuple[str, ...]
    base: dict[str, Any]
    metrics_for: Callable[[int, float, int], dict[str, float]]

    def failed(self, impl: str, size: int, note: str) -> list[RankMeasurement]:
        """One `failed` point per mode at `size`."""
        nbytes = max(1, size // self.elsize) * self.elsize
        point = {**self.base, "size_bytes": nbytes, "impl": impl}
        label = impl.replace("_", "-")
        return [
            RankMeasurement(
                f"allreduce {format_bytes(nbytes)} {mode} {label}",
                {**point, "mode": mode},
                "us",
                status=MeasurementStatus.FAILED,
                note=note[:300],
            )
            for mode in self.modes
        ]


def _sweep_impl(sweep: _Sweep, impl: str, sizes: Sequence[int]) -> list[RankMeasurement]:
    """Every size with one implementation. A size that fails on any rank stops the implementation on every rank
    (its signal pads may be left mid-barrier); the rest of its sizes are `failed` with that reason."""
    ctx = sweep.ctx
    out: list[RankMeasurement] = []
    stopped = ""
    for index, size in enumerate(sizes):
        if stopped:
            out.extend(sweep.failed(impl, size, f"not run: an earlier size failed ({stopped})"))
            continue
        ctx.progress(f"{impl} {format_bytes(size)}", index, len(sizes))
        error = ""
        try:
            points = _one_size(sweep, impl, size)
        except Exception as exc:
            error = f"{type(exc).__name__}: {first_line(exc)[:200]}"
            points = []
        error = agreed_reason(ctx, error)
        if error:
            stopped = error
            out.extend(sweep.failed(impl, size, error))
        else:
            out.extend(points)
    return out


def _one_size(sweep: _Sweep, impl: str, size: int) -> list[RankMeasurement]:
    """Check, then time one size with one implementation in every mode (graph / pipelined)."""
    ctx, params, sb, elsize = sweep.ctx, sweep.params, sweep.sb, sweep.elsize
    numel = max(1, size // elsize)
    nbytes = numel * elsize
    point = {**sweep.base, "size_bytes": nbytes, "impl": impl}
    label = impl.replace("_", "-")
    wrong = check_sum(ctx, sb, impl, numel)
    if wrong:
        expected = ctx.world_size * (ctx.world_size + 1) / 2
        raise RuntimeError(f"{label} all-reduce sum is wrong: {wrong} of {numel} elements differ from {expected:g}")
    op = op_for(sb, impl, numel)
    warmup = int(params["warmup_ops"])
    est = statistics.median(time_host(op, 1, _ESTIMATE_OPS, warmup=warmup, sync=ctx.synchronize))
    est = ctx.agree_max(est)
    out: list[RankMeasurement] = []
    for mode in sweep.modes:
        counts = plan_counts(
            est,
            float(params["budget_ms"]),
            max_ops=int(params["ops_per_sample"]),
            max_samples=int(params["samples"]),
            min_samples=int(params["min_samples"]),
        )
        ctx.host_barrier()
        device: list[float] = []
        if mode == "graph":
            samples = time_graph(op, counts.ops, counts.samples, warmup=2, keep=ctx.keep_graph)
            ctx.release_graphs()
        else:
            samples, device = time_host_and_events(op, counts.ops, counts.samples, warmup=warmup)
        med = statistics.median(samples)
        metrics = sweep.metrics_for(nbytes, med, ctx.world_size)
        metrics["ops_per_sample"] = float(counts.ops)
        if device:
            metrics["event_time_us"] = statistics.median(device)
        out.append(
            RankMeasurement(
                f"allreduce {format_bytes(nbytes)} {mode} {label}",
                {**point, "mode": mode},
                "us",
                samples=tuple(samples),
                metrics=metrics,
                note=f"torch symmetric memory, {label} (P2P{', multicast' if impl == 'multimem' else ''})",
            )
        )
    with contextlib.suppress(Exception):
        ctx.synchronize()
    return out
