"""Provides the probe rank's main loop (torch side): join the group, run probe modules, report, leave.

A probe module `decodetop.probes.worker.<name>` exposes `run(ctx: ProbeContext, params: dict) -> RankOutput`.
It runs on every rank at once; collective probes call torch.distributed on `ctx`'s group. Exceptions are caught
here and reported with the rank and traceback; the loop goes on with the next command.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import importlib
import os
import platform
import socket
import threading
import traceback
from collections.abc import Mapping
from multiprocessing.connection import Connection
from typing import Any

import torch
import torch.distributed as dist

from decodetop.probes.gpuinfo import nccl_env
from decodetop.probes.protocol import Fatal, Progress, RankConfig, RankDone, Ready, RunProbe, Shutdown
from decodetop.probes.registry import ProbeRegistry
from decodetop.probes.results import Environment, RankOutput
from decodetop.probes.warning_count import WarningCount
from decodetop.probes.worker.context import ProbeContext

__all__ = [
    "ProbeContext",
    "collect_environment",
    "init_device",
    "leave_group",
    "run_probe_module",
    "serve",
    "share_cpu_threads",
]


def init_device(device_kind: str, local_rank: int) -> torch.device:
    """This rank's device: cuda:<local_rank> (set as current) or cpu."""
    if device_kind == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError("CUDA requested but torch sees no CUDA device")
        if local_rank >= torch.cuda.device_count():
            raise RuntimeError(f"rank needs cuda:{local_rank} but torch sees {torch.cuda.device_count()} GPU(s)")
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def share_cpu_threads(world_size: int) -> int:
    """CPU ranks split the host's cores (cores / ranks intra-op threads each, at least 1) and return the count.

    Every rank with torch's default of one thread per core oversubscribes the host, and the ranks then spin-wait on
    each other: on 2 cores, 2 ranks × 2 threads made a 64k-element op 250× slower (found by the component probes'
    helper).
    """
    threads = max(1, (os.cpu_count() or 1) // max(1, world_size))
    torch.set_num_threads(threads)
    return threads


def collect_environment(ctx: ProbeContext) -> Environment:
    """Versions and devices as torch sees them on this rank (the controller adds driver and topology)."""
    nccl_version: str | None = None
    if ctx.backend == "nccl":
        with contextlib.suppress(Exception):
            v = torch.cuda.nccl.version()  # type: ignore[no-untyped-call]
            nccl_version = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
    gpu_names: tuple[str, ...] = ()
    if ctx.is_cuda:
        gpu_names = tuple(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count()))
    extra: dict[str, Any] = {
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "torch_threads": torch.get_num_threads(),
    }
    if ctx.is_cuda:
        props = torch.cuda.get_device_properties(ctx.device)
        extra.update(
            {
                "compute_capability": f"{props.major}.{props.minor}",
                "multiprocessors": props.multi_processor_count,
                "l2_cache_bytes": int(props.L2_cache_size),
                "device_memory_bytes": int(props.total_memory),
            }
        )
    return Environment(
        host=socket.gethostname(),
        time_utc=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        python=platform.python_version(),
        backend=ctx.backend,
        device_kind=ctx.device.type,
        world_size=ctx.world_size,
        launcher=ctx.launcher,
        torch=str(torch.__version__),
        cuda=torch.version.cuda if ctx.is_cuda else None,
        nccl=nccl_version,
        gpu_names=gpu_names,
        visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"),
        nccl_env=nccl_env(),
        extra=extra,
    )


def run_probe_module(ctx: ProbeContext, module_name: str, params: Mapping[str, Any]) -> RankOutput:
    """Import the probe's module and run it on this rank; CUDA graphs it kept are freed afterwards."""
    module = importlib.import_module(module_name)
    try:
        output = module.run(ctx, dict(params))
    finally:
        ctx.release_graphs()
    if not isinstance(output, RankOutput):
        raise TypeError(f"{module_name}.run returned {type(output).__name__}, not RankOutput")
    return output


def leave_group(ctx: ProbeContext | None, timeout_s: float) -> None:
    """Free graphs, then destroy the process group with a deadline: it can hang after graph-captured collectives
    (docs/reference/h200-machine.md), in which case the caller exits the process anyway."""
    if ctx is not None:
        ctx.release_graphs()

    def destroy() -> None:
        with contextlib.suppress(Exception):
            if dist.is_initialized():
                dist.destroy_process_group()

    thread = threading.Thread(target=destroy, daemon=True, name="destroy-pg")
    thread.start()
    thread.join(timeout_s)


def serve(config: RankConfig, conn: Connection) -> None:
    """The spawned rank's loop: join the group, answer commands until Shutdown or the controller goes away."""
    ctx: ProbeContext | None = None
    destroy_timeout_s = 2.0
    try:
        try:
            device = init_device(config.device_kind, config.rank)
            backend = "nccl" if device.type == "cuda" else "gloo"
            if device.type == "cpu":
                share_cpu_threads(config.world_size)
            store = dist.FileStore(config.store_path, config.world_size)  # type: ignore[attr-defined]
            kwargs: dict[str, Any] = {}
            if device.type == "cuda":
                kwargs["device_id"] = device
            dist.init_process_group(
                backend,
                store=store,
                rank=config.rank,
                world_size=config.world_size,
                timeout=dt.timedelta(seconds=config.join_timeout_s),
                **kwargs,
            )
            registry = ProbeRegistry(extra_modules=config.extra_probe_modules)
            ctx = ProbeContext(
                rank=config.rank, world_size=config.world_size, device=device, backend=backend, registry=registry
            )
            if backend != "gloo" and config.world_size > 1:
                ctx.cpu_group = dist.new_group(backend="gloo")
            ctx.barrier()
            env = collect_environment(ctx) if config.rank == 0 else None
            conn.send(Ready(config.rank, env, warnings=WarningCount.take()))
        except BaseException as exc:
            with contextlib.suppress(Exception):
                conn.send(Fatal(config.rank, f"{type(exc).__name__}: {exc}", traceback.format_exc()))
            return
        while True:
            try:
                cmd = conn.recv()
            except (EOFError, OSError):
                break  # the controller went away
            if isinstance(cmd, Shutdown):
                destroy_timeout_s = cmd.destroy_timeout_s
                break
            if not isinstance(cmd, RunProbe):
                continue
            _run_command(ctx, conn, cmd)
    finally:
        leave_group(ctx, destroy_timeout_s)
        with contextlib.suppress(Exception):
            conn.close()
        # Skip interpreter teardown: atexit hooks of NCCL/CUDA can hang exactly like destroy_process_group.
        os._exit(0)


def _run_command(ctx: ProbeContext, conn: Connection, cmd: RunProbe) -> None:
    ctx.probe = cmd.probe
    ctx.seq = cmd.seq

    def sink(text: str, done: int, total: int) -> None:
        with contextlib.suppress(Exception):
            conn.send(Progress(cmd.seq, ctx.rank, cmd.probe, text, done, total))

    ctx.progress_sink = sink
    try:
        from decodetop.probes.worker import precompile  # Triton with it: imported by the first probe that may use it

        precompile.boot_before(ctx, cmd.probe)
        output = run_probe_module(ctx, cmd.module, cmd.params)
    except BaseException as exc:
        message = f"{type(exc).__name__}: {exc}".splitlines()[0] if str(exc) else type(exc).__name__
        reply = RankDone(cmd.seq, ctx.rank, error=message, traceback=traceback.format_exc())
    else:
        reply = RankDone(cmd.seq, ctx.rank, output=output)
    finally:
        ctx.progress_sink = None
    conn.send(dataclasses.replace(reply, warnings=WarningCount.take()))
