"""Provides `compile_ahead`: a probe's Triton kernels compiled in parallel processes before it times them.

Triton compiles one binary per kernel specialization (constexprs, dtypes, which integer arguments are 1 or divisible
by 16) on its first launch, 0.3–1.9 s each on an H200's host, one after another in the rank. A curve plan meets
dozens: GLM-5's full plan spent ~28 of its 30 s of attention and ~10 s of its routed experts' first key compiling,
not timing (docs/benchmarks.md, "The acceptance campaign on one H200"). Here the probe's launches are first
collected on meta tensors (`kernels.common.collecting`: shapes and dtypes, no memory, no kernel run), one request
per specialization; the rank's compile processes (`python -m decodetop.probes.worker.precompile --serve`, started by
`boot` before the probes that compile, so that their imports overlap the GEMM probe; requests pickled on stdin, one
JSON line per request on stdout) compile them with `JITFunction.warmup` into Triton's on-disk cache, which the
rank's own launches then load in milliseconds. Nothing runs on the GPU; a request that fails or is not done by the
deadline is only compiled by the rank at its launch, as before. Ranks of one host split the requests and meet at a
host barrier (the cache directory is shared).

`DECODETOP_PRECOMPILE=0` turns it off (each kernel is then compiled at its first launch).
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import pickle
import select
import selectors
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import BinaryIO

import torch

from decodetop.probes.worker.context import ProbeContext
from decodetop.probes.worker.kernels.common import (
    HAVE_TRITON,
    CompileRequest,
    TensorArg,
    collecting,
    fp8_mma_supported,
    interpreted,
    pdl_enabled,
    sm_count,
)

#: Set to 0 to compile each kernel at its first launch instead.
ENV_SWITCH = "DECODETOP_PRECOMPILE"
#: Most compile processes per rank: each imports torch and Triton (~0.5 GB of host memory).
MAX_PROCESSES = 12
#: Longest a probe waits for its compile processes; what is not done by then compiles at its launch. Well above
#: the ~30 s a whole GLM-5 plan's attention compiles took one after another.
DEADLINE_S = 120.0


@dataclass(frozen=True)
class Ahead:
    """What `compile_ahead` did: specializations requested and compiled, processes, wall seconds."""

    requested: int
    compiled: int
    failed: int
    processes: int
    wall_s: float
    skipped: str = ""
    """Why nothing was compiled ahead ('' when it ran)."""
    unbuilt: int = 0
    """Shapes whose launches could not be collected (compiled at their launch)."""

    @property
    def text(self) -> str:
        """'compiled 41 of 41 Triton kernel specializations ahead in 12 processes (6.2 s)'."""
        if self.skipped:
            return f"no kernels compiled ahead: {self.skipped}"
        failed = f", {self.failed} failed (compiled at launch)" if self.failed else ""
        if self.unbuilt:
            failed += f", {self.unbuilt} shapes not collected"
        return (
            f"compiled {self.compiled} of {self.requested} Triton kernel specializations ahead in "
            f"{self.processes} processes ({self.wall_s:.1f} s{failed})"
        )


def _why_not(ctx: ProbeContext) -> str:
    if os.environ.get(ENV_SWITCH, "1") == "0":
        return f"{ENV_SWITCH}=0"
    if not HAVE_TRITON:
        return "Triton is not installed"
    if not ctx.is_cuda or interpreted():
        return "not on a CUDA GPU"
    return ""


def collect(
    ctx: ProbeContext, builders: Sequence[Callable[[ProbeContext], object]]
) -> tuple[list[CompileRequest], int]:
    """The distinct kernel specializations the `builders` launch, each called with a context on device "meta",
    and how many builders failed (their shapes compile at launch). Sized for `ctx`'s GPU: its SM count, and
    whether its launches use PDL (the launch option and the `USE_GDC` constexpr are part of a specialization) and
    whether it multiplies FP8 (the DSA indexer's product)."""
    meta = replace(ctx, device=torch.device("meta"), progress_sink=None)
    unbuilt = 0
    with collecting(sm_count(ctx.device), pdl=pdl_enabled(ctx.device), fp8=fp8_mma_supported(ctx.device)) as found:
        for build in builders:
            try:
                build(meta)
            except Exception:
                unbuilt += 1
    return sorted(found.requests.values(), key=lambda r: repr(r.specialization())), unbuilt


def compile_ahead(
    ctx: ProbeContext, builders: Sequence[Callable[[ProbeContext], object]], *, deadline_s: float = DEADLINE_S
) -> Ahead:
    """Collect the `builders`' kernel specializations, compile this rank's share in the rank's compile processes
    (started now unless `boot` started them), then meet the host's other ranks (all ranks call this together, as
    they run a probe)."""
    why = _why_not(ctx)
    if why:
        return Ahead(0, 0, 0, 0, 0.0, why)
    start = time.monotonic()
    requests, unbuilt = collect(ctx, builders)
    mine = requests[ctx.rank % max(1, ctx.world_size) :: max(1, ctx.world_size)]
    compiled = failed = processes = 0
    if mine:
        pool = boot(ctx)
        processes = min(len(mine), len(pool.children))
        ctx.progress(f"compiling {len(mine)} Triton kernel specializations ahead in {processes} processes")
        compiled, failed = pool.compile(mine, deadline_s)
    ctx.host_barrier()
    return Ahead(len(mine), compiled, failed, processes, time.monotonic() - start, unbuilt=unbuilt)


#: Probes before which a rank starts its compile processes (`boot`), so that their start (each imports torch and
#: Triton: ~6 s on an H200's host, docs/benchmarks.md) overlaps work: the GEMM probe runs before the routed
#: experts and attention in every plan and times CUDA graphs, which the host's load does not enter.
BOOT_BEFORE = frozenset({"gemm", "moe", "attention"})
#: A compile process with nothing to do this long exits (a rank kept for hours holds no idle processes).
IDLE_EXIT_S = 120.0


@dataclass(eq=False)
class _Child:
    """One compile process: requests go in as length-prefixed pickles, a JSON line per request comes out."""

    proc: subprocess.Popen[bytes]
    buffer: bytes = b""

    def alive(self) -> bool:
        return self.proc.poll() is None

    def send(self, share: Sequence[CompileRequest]) -> bool:
        payload = pickle.dumps(list(share))
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.write(len(payload).to_bytes(8, "big") + payload)
            self.proc.stdin.flush()
        except OSError:
            return False
        return True

    def stop(self) -> None:
        if self.alive():
            self.proc.kill()
        self.proc.wait()
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                pipe.close()


@dataclass
class Pool:
    """A rank's compile processes (`boot`)."""

    children: list[_Child] = field(default_factory=list)

    def alive(self) -> bool:
        return bool(self.children) and all(c.alive() for c in self.children)

    def stop(self) -> None:
        for child in self.children:
            child.stop()
        self.children = []

    def compile(self, requests: Sequence[CompileRequest], deadline_s: float) -> tuple[int, int]:
        """(compiled, failed) of `requests` dealt round-robin over the children; at the deadline the pool is
        stopped (what was not compiled counts as failed; the next `boot` starts a new one)."""
        shares = [list(requests[i :: len(self.children)]) for i in range(len(self.children))]
        waiting = {}
        for child, share in zip(self.children, shares, strict=True):
            if share and child.send(share):
                waiting[child] = len(share)
        compiled, failed = 0, len(requests) - sum(waiting.values())
        end = time.monotonic() + deadline_s
        with selectors.DefaultSelector() as sel:
            for child in waiting:
                assert child.proc.stdout is not None
                sel.register(child.proc.stdout, selectors.EVENT_READ, child)
            while waiting and time.monotonic() < end:
                for event, _ in sel.select(timeout=max(0.01, end - time.monotonic())):
                    child = event.data
                    chunk = os.read(event.fd, 65536)
                    lines, _, child.buffer = (child.buffer + chunk).rpartition(b"\n")
                    for line in lines.splitlines() if lines else []:
                        if child in waiting and line.startswith(b"{"):
                            ok = _ok(line.decode(errors="replace"))
                            compiled, failed = compiled + ok, failed + (not ok)
                            waiting[child] -= 1
                    if not chunk or (child in waiting and waiting[child] <= 0):
                        failed += max(0, waiting.pop(child, 0))
                        sel.unregister(event.fileobj)
        if waiting:  # past the deadline, or a child died: start afresh next time
            failed += sum(max(0, n) for n in waiting.values())
            self.stop()
        return compiled, failed


_POOL = Pool()


def boot(ctx: ProbeContext) -> Pool:
    """This rank's compile processes, started now where none are alive (they import torch and Triton, then wait
    for requests; one per core the host's ranks leave, at most MAX_PROCESSES). Returns at once: requests sent
    before a child is ready wait in its pipe."""
    global _POOL
    if _why_not(ctx):
        return _POOL
    if _POOL.alive():
        return _POOL
    _POOL.stop()
    _POOL = start_pool(ctx, min(MAX_PROCESSES, max(1, (os.cpu_count() or 2) // max(1, ctx.world_size) - 1)))
    return _POOL


def start_pool(ctx: ProbeContext, count: int) -> Pool:
    """Up to `count` compile processes for `ctx`'s GPU (`boot` keeps one pool per rank); as many as could be
    started where the host refuses more (a probe never fails for want of them: its kernels compile at launch)."""
    env = _child_env(ctx)
    children = []
    for _ in range(count):
        try:
            proc = subprocess.Popen(  # this interpreter, a fixed module, no shell
                [sys.executable, "-m", "decodetop.probes.worker.precompile", "--serve"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                env=env,
            )
        except OSError:
            break
        children.append(_Child(proc))
    return Pool(children)


def boot_before(ctx: ProbeContext, probe: str) -> None:
    """`boot` when `probe` is one of BOOT_BEFORE (the rank's loop calls this before each probe)."""
    if probe in BOOT_BEFORE:
        boot(ctx)


def _child_env(ctx: ProbeContext) -> dict[str, str]:
    """The rank's environment, with this rank's GPU as the only one visible (the compile target is its
    architecture) and decodetop importable from where this rank imports it."""
    env = dict(os.environ)
    index = ctx.device.index or 0
    visible = [v for v in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    env["CUDA_VISIBLE_DEVICES"] = visible[index] if index < len(visible) else str(index)
    root = str(Path(__file__).resolve().parents[3])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    return env


def _ok(line: str) -> bool:
    try:
        return bool(json.loads(line).get("ok"))
    except ValueError:
        return False


def _warm(request: CompileRequest) -> None:
    """Compile one request into Triton's cache (`JITFunction.warmup`: tensors stand as their dtypes)."""
    kernel = getattr(importlib.import_module(request.module), request.name)
    args = [getattr(torch, a.dtype) if isinstance(a, TensorArg) else a for a in request.args]
    kernel.warmup(*args, grid=(1,), **dict(request.kwargs))


def _read_exactly(stream: BinaryIO, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = os.read(stream.fileno(), size - len(data))
        if not chunk:
            break
        data += chunk
    return data


def main(argv: Sequence[str] | None = None) -> int:
    """A compile process (`--serve`, started by `boot` only): batches of pickled `CompileRequest`s on stdin, each
    8-byte length-prefixed; one JSON line per request on stdout; exits at EOF or after IDLE_EXIT_S idle."""
    args = sys.argv[1:] if argv is None else argv
    if args != ["--serve"]:
        print("usage: python -m decodetop.probes.worker.precompile --serve (started by a probe rank)", file=sys.stderr)
        return 2
    _pin_driver()
    for mod in ("attention", "fused_moe"):  # the kernels' modules, imported before the first request
        importlib.import_module(f"decodetop.probes.worker.{mod}")
    stdin = sys.stdin.buffer
    while True:
        ready, _, _ = select.select([stdin], [], [], IDLE_EXIT_S)
        if not ready:
            return 0
        header = _read_exactly(stdin, 8)
        if len(header) < 8:
            return 0
        requests = pickle.loads(_read_exactly(stdin, int.from_bytes(header, "big")))  # noqa: S301 - our parent's
        for request in requests:
            begin = time.monotonic()
            try:
                _warm(request)
                line: dict[str, object] = {"kernel": request.name, "ok": True}
            except Exception as exc:
                line = {"kernel": request.name, "ok": False, "error": f"{type(exc).__name__}: {exc}"[:300]}
            line["s"] = round(time.monotonic() - begin, 3)
            sys.stdout.write(json.dumps(line) + "\n")
            sys.stdout.flush()


def _pin_driver() -> None:
    """Triton's CUDA driver asks torch for the current device and stream (torch would set up CUDA streams for
    it): a compile needs only the architecture, of device 0 (the rank's GPU is the only one visible here)."""
    with contextlib.suppress(Exception):
        from triton.runtime import driver  # type: ignore[import-not-found,unused-ignore]

        active = driver.active
        active.get_current_device = lambda: 0
        active.get_current_stream = lambda device=None: 0


if __name__ == "__main__":
    sys.exit(main())
