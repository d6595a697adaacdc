"""Provides `ProbeContext`: what a probe function gets on its rank (device, group, progress, memory checks)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist

from decodetop.probes.registry import ProbeRegistry
from decodetop.textfmt import format_bytes

#: Kept free on a GPU beyond what a probe asks for: the CUDA context, NCCL buffers and allocator slack.
#: (NCCL's own buffers are a few hundred MiB per communicator on NVLink machines; 1 GiB leaves room.)
GPU_MEMORY_MARGIN_BYTES = 1024**3
#: Fallback last-level cache size where neither CUDA nor sysfs says (bigger than any current CPU L3 slice
#: a single rank would use; only used to size rotation sets, so erring high only costs memory).
DEFAULT_CACHE_BYTES = 64 * 1024**2


class InsufficientMemoryError(RuntimeError):
    """The device does not have the free memory a probe needs (checked before allocating)."""


class UnsupportedError(Exception):
    """This kernel cannot run on this rank; the message says why (fp8 on a CPU, NVFP4 off sm_100/sm_120, ...)."""


@dataclass
class ProbeContext:
    """A probe's view of its rank. Probe modules get one as `run(ctx, params)`."""

    rank: int
    world_size: int
    device: torch.device
    backend: str
    launcher: str = "spawn"
    probe: str = ""
    seq: int = 0
    progress_sink: Callable[[str, int, int], None] | None = None
    #: A gloo group over the same ranks for host-side agreement and barriers that keep the GPUs idle
    #: (None: use the default group, which is gloo already on CPU ranks).
    cpu_group: dist.ProcessGroup | None = None
    #: The probes this rank knows (built-ins plus the controller's extra modules): the `layer` probe finds each
    #: key's kernels through its probe's worker module.
    registry: ProbeRegistry = field(default_factory=ProbeRegistry)
    _graphs: list[torch.cuda.CUDAGraph] = field(default_factory=list)

    @property
    def is_cuda(self) -> bool:
        return self.device.type == "cuda"

    def progress(self, text: str, done: int = 0, total: int = 0) -> None:
        """Report progress (only rank 0's reaches the user, so every rank may call this)."""
        if self.rank == 0 and self.progress_sink is not None:
            self.progress_sink(text, done, total)

    def barrier(self) -> None:
        """All ranks meet (device-aware for NCCL)."""
        if self.world_size > 1:
            if self.is_cuda:
                dist.barrier(device_ids=[self.device.index])
            else:
                dist.barrier()

    def host_barrier(self) -> None:
        """All ranks meet through the gloo group: no kernel runs on any GPU while waiting."""
        if self.world_size > 1:
            dist.barrier(group=self.cpu_group)

    def agree_max(self, value: float) -> float:
        """The largest of every rank's `value` (host-side): ranks must agree on counts before a collective loop."""
        if self.world_size == 1:
            return value
        t = torch.tensor([value], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.cpu_group)
        return float(t.item())

    def synchronize(self) -> None:
        """Wait for this rank's device work (a no-op on CPU ranks)."""
        if self.is_cuda:
            torch.cuda.synchronize(self.device)

    def free_bytes(self, device: torch.device | None = None) -> int:
        """Free memory on `device` (this rank's by default): CUDA's mem_get_info, or MemAvailable on CPU."""
        dev = device or self.device
        if dev.type == "cuda":
            free, _total = torch.cuda.mem_get_info(dev)
            return int(free)
        return _mem_available_bytes()

    def require_free_bytes(self, needed_bytes: int, what: str, device: torch.device | None = None) -> None:
        """Raise `InsufficientMemoryError` (one line) unless `needed_bytes` + a margin are free on the device."""
        dev = device or self.device
        if dev.type == "meta":  # shapes only (kernel launches collected to compile ahead): no memory is taken
            return
        free = self.free_bytes(dev)
        margin = GPU_MEMORY_MARGIN_BYTES if dev.type == "cuda" else 0
        if needed_bytes + margin > free:
            raise InsufficientMemoryError(
                f"{what} needs {format_bytes(needed_bytes)} on {dev} but only {format_bytes(free)} is free"
                + (f" (keeping {format_bytes(margin)} spare)" if margin else "")
            )

    def cache_bytes(self) -> int:
        """Last-level cache size: the GPU's L2, or the CPU's largest cache level from sysfs."""
        if self.is_cuda:
            return int(torch.cuda.get_device_properties(self.device).L2_cache_size)
        return _cpu_llc_bytes()

    def keep_graph(self, graph: torch.cuda.CUDAGraph) -> torch.cuda.CUDAGraph:
        """Register a CUDA graph so that shutdown frees it before leaving the process group."""
        self._graphs.append(graph)
        return graph

    def release_graphs(self) -> None:
        """Free registered CUDA graphs (call when a probe is done with them; shutdown calls it too)."""
        while self._graphs:
            graph = self._graphs.pop()
            with contextlib.suppress(Exception):
                graph.reset()
        if self.is_cuda:
            with contextlib.suppress(Exception):
                torch.cuda.synchronize(self.device)


def _mem_available_bytes() -> int:
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    pages = os.sysconf("SC_AVPHYS_PAGES") if hasattr(os, "sysconf") else 0
    return int(pages) * int(os.sysconf("SC_PAGE_SIZE"))


def _cpu_llc_bytes() -> int:
    best = 0
    base = Path("/sys/devices/system/cpu/cpu0/cache")
    with contextlib.suppress(OSError):
        for index in base.glob("index*"):
            with contextlib.suppress(OSError, ValueError):
                text = (index / "size").read_text().strip().upper()
                mult = {"K": 1024, "M": 1024**2, "G": 1024**3}.get(text[-1:], 1)
                value = int(text.rstrip("KMG")) * mult
                best = max(best, value)
    return best or DEFAULT_CACHE_BYTES
