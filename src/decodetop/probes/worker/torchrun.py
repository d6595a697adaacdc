"""Provides the probe entry point under `torchrun` (env:// rendezvous): this process is one rank of the group.

    torchrun --standalone --nproc-per-node 2 -m decodetop probe allreduce --launcher torchrun

Every rank runs the same probes in the same order; the ranks' outputs are gathered to rank 0 through a gloo group
(never through the GPU), merged exactly as the spawned controller merges them, and rank 0 returns the results
for printing and JSON. There is no deadline here: torchrun's own supervision ends a group whose rank dies, and a
probe that raises on one rank is reported as failed (the other ranks still answer the gather).
"""

from __future__ import annotations

import contextlib
import ctypes
import datetime as dt
import os
import pickle
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

import torch
import torch.distributed as dist

from decodetop.errors import UserInputError
from decodetop.probes.gpuinfo import host_environment_fields, visible_gpus
from decodetop.probes.protocol import RANK_ENV_DEFAULTS, Progress
from decodetop.probes.registry import ProbeRegistry
from decodetop.probes.results import Environment, ProbeResult, ProbeStatus, RankOutput, merge_rank_outputs
from decodetop.probes.worker import (
    collect_environment,
    init_device,
    leave_group,
    run_probe_module,
    share_cpu_threads,
)
from decodetop.probes.worker.context import ProbeContext


def _env_int(name: str) -> int:
    value = os.environ.get(name)
    if value is None or not value.isdigit():
        raise UserInputError(f"--launcher torchrun: ${name} is not set; start this command with torchrun")
    return int(value)


def run_under_torchrun(
    names: Sequence[str],
    params: Mapping[str, Mapping[str, Any]],
    *,
    registry: ProbeRegistry,
    progress: Callable[[Progress], None] | None = None,
    device: str = "auto",
) -> list[ProbeResult] | None:
    """Run `names` as this torchrun rank; rank 0 gets the merged results, the other ranks None."""
    rank = _env_int("RANK")
    world_size = _env_int("WORLD_SIZE")
    local_rank = _env_int("LOCAL_RANK")
    for key, value in RANK_ENV_DEFAULTS.items():
        os.environ.setdefault(key, value)
    use_cuda = device != "cpu" and torch.cuda.is_available()
    if device == "cuda" and not use_cuda:
        raise UserInputError("--device cuda: torch sees no CUDA device")
    dev = init_device("cuda" if use_cuda else "cpu", local_rank)
    if not use_cuda:
        share_cpu_threads(_env_int("LOCAL_WORLD_SIZE") if "LOCAL_WORLD_SIZE" in os.environ else world_size)
    backend = "nccl" if use_cuda else "gloo"
    kwargs: dict[str, Any] = {"device_id": dev} if use_cuda else {}
    dist.init_process_group(backend, init_method="env://", rank=rank, world_size=world_size, **kwargs)
    ctx = ProbeContext(rank=rank, world_size=world_size, device=dev, backend=backend, launcher="torchrun")
    ctx.cpu_group = dist.new_group(backend="gloo") if backend != "gloo" else None
    results: list[ProbeResult] = []
    try:
        env = collect_environment(ctx)
        if rank == 0:
            host = host_environment_fields(visible_gpus() if use_cuda else ())
            env = replace(
                env,
                driver=host.driver,
                topology=host.topology,
                nccl_env={**host.nccl_env, **dict(env.nccl_env)},
            )
        for seq, name in enumerate(names, start=1):
            spec = registry.get(name)
            resolved = spec.resolve_params(params.get(name))
            result = _run_one(ctx, seq, name, module=spec.module, params=resolved, env=env, progress=progress)
            if result is not None:
                results.append(result)
    finally:
        leave_group(ctx, timeout_s=2.0)
    return results if rank == 0 else None


def gather_pickled(obj: Any, world_size: int, group: Any) -> list[Any]:
    """Every rank's `obj`, on every rank, through all_gather of pickled bytes on a CPU (gloo) group.

    torch's gather_object needs numpy, which CPU-only environments may lack; this needs nothing but torch.
    """
    data = pickle.dumps(obj)
    size = torch.tensor([len(data)], dtype=torch.int64)
    sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(world_size)]
    dist.all_gather(sizes, size, group=group)
    longest = max(int(s.item()) for s in sizes)
    padded = torch.zeros(longest, dtype=torch.uint8)
    if data:
        padded[: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    buffers = [torch.zeros(longest, dtype=torch.uint8) for _ in range(world_size)]
    dist.all_gather(buffers, padded, group=group)
    # Our own ranks' pickles, over the group's private channel.
    return [
        pickle.loads(ctypes.string_at(b.data_ptr(), int(n.item())))  # noqa: S301
        for b, n in zip(buffers, sizes, strict=True)
    ]


def _run_one(
    ctx: ProbeContext,
    seq: int,
    name: str,
    *,
    module: str,
    params: dict[str, Any],
    env: Environment,
    progress: Callable[[Progress], None] | None,
) -> ProbeResult | None:
    ctx.probe, ctx.seq = name, seq

    def sink(text: str, done: int, total: int) -> None:
        if progress is not None:
            with contextlib.suppress(Exception):
                progress(Progress(seq, ctx.rank, name, text, done, total))

    ctx.progress_sink = sink
    started = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    t0 = time.monotonic()
    reply: tuple[RankOutput | None, str | None, str | None]
    try:
        reply = (run_probe_module(ctx, module, params), None, None)
    except Exception as exc:
        reply = (None, f"{type(exc).__name__}: {exc}".splitlines()[0], traceback.format_exc())
    gathered = gather_pickled(reply, ctx.world_size, ctx.cpu_group)
    if ctx.rank != 0:
        return None
    outputs = {r: g[0] for r, g in enumerate(gathered) if g is not None and g[0] is not None}
    errors = {r: (g[1], g[2]) for r, g in enumerate(gathered) if g is not None and g[1] is not None}
    common: dict[str, Any] = {
        "probe": name,
        "params": params,
        "environment": replace(env, time_utc=started),
        "started_utc": started,
        "duration_s": round(time.monotonic() - t0, 3),
        "world_size": ctx.world_size,
        "measurements": merge_rank_outputs(outputs),
    }
    if errors:
        rank = min(errors)
        error, tb = errors[rank]
        return ProbeResult(
            status=ProbeStatus.FAILED,
            message=f"rank {rank}: {error}",
            error_rank=rank,
            error=error,
            traceback=tb,
            **common,
        )
    reasons = [o.unsupported_reason for o in outputs.values() if o.unsupported_reason]
    if reasons and not any(o.measurements for o in outputs.values()):
        return ProbeResult(status=ProbeStatus.UNSUPPORTED, message=reasons[0], **common)
    return ProbeResult(status=ProbeStatus.OK, message=reasons[0] if reasons else "", **common)
