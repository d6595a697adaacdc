"""Neighbours for the plants (engine kernels, part c): load that shares a GPU or a NUMA node's cores with one probe
rank, without changing any GPU setting.

- `gemm --gpu N`: another process looping 8192³ BF16 GEMMs on GPU N (the GPU time-slices its contexts: the 2 × H200
  reading had rank 1's launch+sync go from 17 µs to 2,421 µs);
- `cpu --gpu N`: one busy process per core of GPU N's NUMA node (`/sys/bus/pci/devices/<bus id>/local_cpulist`),
  each pinned to its core, so the rank driving GPU N competes for its host.

Both run until `--seconds` pass or they are terminated (the plant script ends them by PID). `--ready FILE` is
written once the load runs, so the caller starts measuring only then.

    python3 benchmarks/engine/neighbour.py gemm --gpu 1 --seconds 300 --ready /tmp/n.ready &
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

#: Matrix side of the GEMM neighbour (the 2 × H200 reading's 8192³ BF16 loop).
GEMM_N = 8192


def parse_cpulist(text: str) -> list[int]:
    """'0-3,8,10-11' → [0, 1, 2, 3, 8, 10, 11] (the sysfs cpulist format); ValueError on anything else."""
    cpus: list[int] = []
    for part in text.strip().split(","):
        if not part:
            continue
        lo, sep, hi = part.partition("-")
        if sep:
            a, b = int(lo), int(hi)
            if b < a:
                raise ValueError(f"bad cpulist range {part!r}")
            cpus.extend(range(a, b + 1))
        else:
            cpus.append(int(lo))
    return sorted(set(cpus))


def sysfs_bus_id(nvidia_bus_id: str) -> str:
    """nvidia-smi's '00000000:00:06.0' → sysfs's '0000:00:06.0' (4-hex-digit domain, lower case)."""
    domain, _, rest = nvidia_bus_id.strip().partition(":")
    if not rest:
        raise ValueError(f"not a PCI bus id: {nvidia_bus_id!r}")
    return f"{int(domain, 16):04x}:{rest.lower()}"


def gpu_bus_id(gpu: int) -> str:
    """GPU `gpu`'s PCI bus id from nvidia-smi (as nvidia-smi numbers GPUs)."""
    out = subprocess.run(
        ["nvidia-smi", "--query-gpu=pci.bus_id", "--format=csv,noheader", "-i", str(gpu)],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    )
    return out.stdout.strip().splitlines()[0]


def numa_cpus(gpu: int, sys_root: Path = Path("/sys")) -> list[int]:
    """The cores of GPU `gpu`'s NUMA node (its PCI device's local_cpulist); every online core when not exposed."""
    try:
        path = sys_root / "bus/pci/devices" / sysfs_bus_id(gpu_bus_id(gpu)) / "local_cpulist"
        cpus = parse_cpulist(path.read_text())
        if cpus:
            return cpus
    except (OSError, ValueError, subprocess.SubprocessError):
        pass
    return sorted(os.sched_getaffinity(0))


def _spin(cpu: int, until: float) -> None:
    os.sched_setaffinity(0, {cpu})
    x = 0
    while time.monotonic() < until:
        for _ in range(100_000):
            x = (x * 1103515245 + 12345) & 0x7FFFFFFF


def cpu_neighbour(cpus: Sequence[int], seconds: float, ready: Path | None) -> int:
    """One busy process per core in `cpus` until `seconds` pass or SIGTERM."""
    until = time.monotonic() + seconds
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_spin, args=(cpu, until), daemon=True) for cpu in cpus]
    for p in procs:
        p.start()

    def stop(*_: object) -> None:
        for p in procs:
            p.terminate()
        sys.exit(0)

    signal.signal(signal.SIGTERM, stop)
    if ready is not None:
        ready.write_text(f"cpu {len(procs)} cores: {','.join(map(str, cpus))}\n")
    for p in procs:
        p.join()
    return 0


def gemm_neighbour(gpu: int, seconds: float, ready: Path | None) -> int:
    """Loop N³ BF16 GEMMs on GPU `gpu` until `seconds` pass or SIGTERM."""
    import torch

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    dev = torch.device("cuda", gpu)
    a = torch.randn(GEMM_N, GEMM_N, device=dev, dtype=torch.bfloat16)
    b = torch.randn(GEMM_N, GEMM_N, device=dev, dtype=torch.bfloat16)
    c = a @ b
    torch.cuda.synchronize(dev)
    if ready is not None:
        ready.write_text(f"gemm {GEMM_N}³ on GPU {gpu}\n")
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        for _ in range(20):
            torch.matmul(a, b, out=c)
        torch.cuda.synchronize(dev)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("kind", choices=("gemm", "cpu"))
    ap.add_argument("--gpu", type=int, default=1, help="the GPU (nvidia-smi index) whose rank gets the neighbour")
    ap.add_argument("--seconds", type=float, default=300.0, help="stop after this long (default 300)")
    ap.add_argument("--ready", type=Path, help="file written once the load runs")
    args = ap.parse_args(argv)
    if args.kind == "gemm":
        return gemm_neighbour(args.gpu, args.seconds, args.ready)
    return cpu_neighbour(numa_cpus(args.gpu), args.seconds, args.ready)


if __name__ == "__main__":
    sys.exit(main())
