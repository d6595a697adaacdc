"""Provides what the probe controller needs to know about the GPUs before spawning ranks, through NVML (no torch).

- `visible_gpus()`: the GPUs CUDA would show this process (NVML order, narrowed by CUDA_VISIBLE_DEVICES), or an
  empty list where there is no NVML or no GPU.
- `compute_processes(gpus)`: other processes holding memory on those GPUs (NVML compute processes), so the CLI
  can name them and ask for `--force` before probing a busy GPU.
- `host_environment_fields()`: driver version, topology (`nvidia-smi topo -m`), NCCL_* variables, host name.

Read-only: nothing here changes a GPU setting (no clocks, power, persistence or MIG calls).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class GpuInfo:
    """One GPU as CUDA would number it for this process (`cuda_index`), with its NVML index."""

    cuda_index: int
    nvml_index: int
    name: str
    uuid: str
    memory_total_bytes: int
    memory_used_bytes: int


@dataclass(frozen=True)
class GpuProcess:
    """A process holding memory on a GPU (NVML compute process)."""

    cuda_index: int
    pid: int
    name: str
    used_memory_bytes: int | None


def _decode(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


@contextlib.contextmanager
def _nvml() -> Iterator[Any]:
    """pynvml, initialised; raises RuntimeError when NVML is not there."""
    try:
        import pynvml
    except ImportError as exc:
        raise RuntimeError(f"nvidia-ml-py is not installed ({exc})") from None
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
        raise RuntimeError(f"NVML unavailable: {exc}") from None
    try:
        yield pynvml
    finally:
        with contextlib.suppress(Exception):  # shutting down a library we opened; nothing to report
            pynvml.nvmlShutdown()


def _visible_nvml_indices(pynvml: Any, count: int) -> list[int]:
    """NVML indices in CUDA order, honouring CUDA_VISIBLE_DEVICES (integers or GPU-/MIG- UUID prefixes).

    The ranks run with CUDA_DEVICE_ORDER=PCI_BUS_ID (unless the user set it), which is NVML's order.
    """
    raw = os.environ.get("CUDA_VISIBLE_DEVICES")
    if raw is None:
        return list(range(count))
    uuids = [_decode(pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(i))) for i in range(count)]
    out: list[int] = []
    for item in (p.strip() for p in raw.split(",")):
        if not item:
            break
        if item.lstrip("-").isdigit():
            idx = int(item)
            if idx < 0 or idx >= count:
                break  # CUDA stops at the first invalid entry
            out.append(idx)
        else:
            matches = [i for i, u in enumerate(uuids) if u.startswith(item)]
            if len(matches) != 1:
                break
            out.append(matches[0])
    return out


def visible_gpus() -> list[GpuInfo]:
    """The GPUs this process would see through CUDA; empty where NVML or GPUs are missing."""
    try:
        with _nvml() as pynvml:
            count = int(pynvml.nvmlDeviceGetCount())
            gpus = []
            for cuda_index, nvml_index in enumerate(_visible_nvml_indices(pynvml, count)):
                handle = pynvml.nvmlDeviceGetHandleByIndex(nvml_index)
                mem = pynvml.nvmlDeviceGetMemoryInfo(handle)
                gpus.append(
                    GpuInfo(
                        cuda_index=cuda_index,
                        nvml_index=nvml_index,
                        name=_decode(pynvml.nvmlDeviceGetName(handle)),
                        uuid=_decode(pynvml.nvmlDeviceGetUUID(handle)),
                        memory_total_bytes=int(mem.total),
                        memory_used_bytes=int(mem.used),
                    )
                )
            return gpus
    except RuntimeError:
        return []


def compute_processes(gpus: Sequence[GpuInfo], exclude_pids: Sequence[int] = ()) -> list[GpuProcess]:
    """Processes other than `exclude_pids` that hold memory on `gpus` (empty where NVML is missing)."""
    found: list[GpuProcess] = []
    try:
        with _nvml() as pynvml:
            for gpu in gpus:
                handle = pynvml.nvmlDeviceGetHandleByIndex(gpu.nvml_index)
                try:
                    procs = pynvml.nvmlDeviceGetComputeProcesses(handle)
                except Exception:  # noqa: S112 - not supported on this GPU/driver: nothing to list
                    continue
                for proc in procs:
                    pid = int(proc.pid)
                    if pid in exclude_pids:
                        continue
                    used = getattr(proc, "usedGpuMemory", None)
                    found.append(
                        GpuProcess(
                            cuda_index=gpu.cuda_index,
                            pid=pid,
                            name=_process_name(pid),
                            used_memory_bytes=None if used is None else int(used),
                        )
                    )
    except RuntimeError:
        return []
    return found


def clock_snapshot(gpus: Sequence[GpuInfo]) -> list[dict[str, Any]]:
    """Clocks, clock-event reasons, temperature and power of `gpus` now (read-only; empty without NVML).

    Taken before and after each probe so a result says whether the GPU ran at full clocks (architecture.md:
    "every result records ... the clock-event reasons and clocks NVML saw during the run").
    """
    if not gpus:
        return []
    out: list[dict[str, Any]] = []
    try:
        with _nvml() as pynvml:
            for gpu in gpus:
                handle = pynvml.nvmlDeviceGetHandleByIndex(gpu.nvml_index)
                row: dict[str, Any] = {"cuda_index": gpu.cuda_index}
                reads = {
                    "sm_clock_mhz": lambda h: pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM),
                    "mem_clock_mhz": lambda h: pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_MEM),
                    "clock_event_reasons": _clock_event_reasons(pynvml),
                    "temperature_c": lambda h: pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU),
                    "power_w": lambda h: pynvml.nvmlDeviceGetPowerUsage(h) / 1000.0,
                }
                for key, read in reads.items():
                    try:
                        row[key] = read(handle)
                    except Exception:  # noqa: S112 - not supported on this GPU/driver: leave the key out
                        continue
                out.append(row)
    except RuntimeError:
        return []
    return out


def _clock_event_reasons(pynvml: Any) -> Any:
    """nvmlDeviceGetCurrentClocksEventReasons (new name) or …ThrottleReasons (older nvidia-ml-py)."""
    fn = getattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or getattr(
        pynvml, "nvmlDeviceGetCurrentClocksThrottleReasons", None
    )

    def read(handle: Any) -> int:
        if fn is None:
            raise RuntimeError("no clock-event reasons in this nvidia-ml-py")
        return int(fn(handle))

    return read


def _process_name(pid: int) -> str:
    try:
        import psutil

        return str(psutil.Process(pid).name())
    except Exception:
        return "?"


def host_environment_fields(gpus: Sequence[GpuInfo] = ()) -> dict[str, Any]:
    """Host-side environment: host, driver, GPU names/UUIDs, topology text, NCCL_* variables (no torch)."""
    fields: dict[str, Any] = {
        "host": socket.gethostname(),
        "nccl_env": nccl_env(),
        "visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
    }
    try:
        with _nvml() as pynvml:
            fields["driver"] = _decode(pynvml.nvmlSystemGetDriverVersion())
    except RuntimeError:
        fields["driver"] = None
    if gpus:
        fields["gpu_names"] = tuple(g.name for g in gpus)
        fields["gpu_uuids"] = tuple(g.uuid for g in gpus)
        fields["topology"] = nvidia_smi_topology()
    return fields


def nccl_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """NCCL_* variables and the multicast switches (the settings that swing small-message latency)."""
    env = os.environ if environ is None else environ
    keys = [k for k in env if k.startswith(("NCCL_", "TORCH_NCCL_", "NVSHMEM_"))]
    keys += [k for k in ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "CUDA_DEVICE_ORDER") if k in env]
    return {k: env[k] for k in sorted(set(keys))}


def nvidia_smi_topology(timeout_s: float = 10.0) -> str | None:
    """`nvidia-smi topo -m` output, or None where nvidia-smi is missing or fails (read-only query)."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        out = subprocess.run([exe, "topo", "-m"], capture_output=True, text=True, timeout=timeout_s, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None
