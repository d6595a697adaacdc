"""Provides what the probe controller needs to know about the GPUs before spawning ranks (no torch).

Every NVML read goes through the choke point `decodetop.collectors.nvml.Nvml`.

- `visible_gpus()`: the GPUs CUDA would show this process (NVML order, narrowed by CUDA_VISIBLE_DEVICES), or an
  empty list where there is no NVML or no GPU.
- `compute_processes(gpus)`: other processes holding memory on those GPUs (NVML compute processes), so the CLI
  can name them and ask for `--force` before probing a busy GPU.
- `host_environment_fields()`: driver version, topology (`nvidia-smi topo -m`), NCCL_* variables, host name.

Read-only: nothing here changes a GPU setting (no clocks, power, persistence or MIG calls).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from decodetop.collectors.nvml import NA, GpuRef, Nvml


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


# NVML constants (nvidia-ml-py): NVML_CLOCK_SM = 1, NVML_CLOCK_MEM = 2, NVML_TEMPERATURE_GPU = 0.
_CLOCK_SM = 1
_CLOCK_MEM = 2
_TEMPERATURE_GPU = 0


_shared_nvml: Nvml | None = None


def _source(nvml: Nvml | None) -> Nvml | None:
    """The given NVML, or this process's shared one (initialised once, not before and after every probe);
    None where NVML is not usable."""
    global _shared_nvml
    if nvml is None:
        if _shared_nvml is None:
            _shared_nvml = Nvml()
        nvml = _shared_nvml
    return nvml if nvml.available else None


def _visible_nvml_indices(nvml: Nvml, count: int) -> list[int]:
    """NVML indices in CUDA order, honouring CUDA_VISIBLE_DEVICES (integers or GPU-/MIG- UUID prefixes).

    The ranks run with CUDA_DEVICE_ORDER=PCI_BUS_ID (unless the user set it), which is NVML's order.
    """
    raw = os.environ.get("CUDA_VISIBLE_DEVICES")
    if raw is None:
        return list(range(count))
    uuids = [_ok_str(nvml.query("nvmlDeviceGetUUID", GpuRef(i))) for i in range(count)]
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
            matches = [i for i, u in enumerate(uuids) if u and u.startswith(item)]
            if len(matches) != 1:
                break
            out.append(matches[0])
    return out


def _ok_str(value: Any) -> str:
    return "" if isinstance(value, NA) else _decode(value)


def _ok_int(value: Any) -> int | None:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def visible_gpus(nvml: Nvml | None = None) -> list[GpuInfo]:
    """The GPUs this process would see through CUDA; empty where NVML or GPUs are missing."""
    source = _source(nvml)
    if source is None:
        return []
    gpus = []
    for cuda_index, nvml_index in enumerate(_visible_nvml_indices(source, source.device_count())):
        ref = GpuRef(nvml_index)
        mem = source.query("nvmlDeviceGetMemoryInfo", ref)
        mem = mem if isinstance(mem, dict) else {}
        gpus.append(
            GpuInfo(
                cuda_index=cuda_index,
                nvml_index=nvml_index,
                name=_ok_str(source.query("nvmlDeviceGetName", ref)) or "?",
                uuid=_ok_str(source.query("nvmlDeviceGetUUID", ref)),
                memory_total_bytes=int(mem.get("total", 0)),
                memory_used_bytes=int(mem.get("used", 0)),
            )
        )
    return gpus


def compute_processes(
    gpus: Sequence[GpuInfo], exclude_pids: Sequence[int] = (), nvml: Nvml | None = None
) -> list[GpuProcess]:
    """Processes other than `exclude_pids` that hold memory on `gpus` (empty where NVML is missing)."""
    source = _source(nvml) if gpus else None
    if source is None:
        return []
    found: list[GpuProcess] = []
    for gpu in gpus:
        procs = source.query("nvmlDeviceGetComputeRunningProcesses", GpuRef(gpu.nvml_index))
        if not isinstance(procs, list):  # not supported on this GPU/driver: nothing to list
            continue
        for proc in procs:
            pid = _ok_int(proc.get("pid")) if isinstance(proc, dict) else None
            if pid is None or pid in exclude_pids:
                continue
            found.append(
                GpuProcess(
                    cuda_index=gpu.cuda_index,
                    pid=pid,
                    name=_process_name(pid),
                    used_memory_bytes=_ok_int(proc.get("usedGpuMemory")),
                )
            )
    return found


def clock_snapshot(gpus: Sequence[GpuInfo], nvml: Nvml | None = None, *, since_us: int = 0) -> list[dict[str, Any]]:
    """Clocks, clock-event reasons, temperature, power, PCIe link, NUMA node, utilisation and compute processes of
    `gpus` now (read-only; empty without NVML); each process with its mean SM utilisation over NVML's samples
    newer than `since_us` (µs since the epoch, NVML's clock; 0: every sample the driver still holds).

    Taken before and after each probe so a result says whether the GPU ran at full clocks (architecture.md:
    "every result records ... the clock-event reasons and clocks NVML saw during the run") and who else ran on it
    meanwhile, and how much (the after snapshot reads the samples since the probe started).
    """
    source = _source(nvml) if gpus else None
    if source is None:
        return []
    out: list[dict[str, Any]] = []
    for gpu in gpus:
        ref = GpuRef(gpu.nvml_index)
        reasons = source.query("nvmlDeviceGetCurrentClocksEventReasons", ref)
        if isinstance(reasons, NA):  # older nvidia-ml-py names it ...ThrottleReasons
            reasons = source.query("nvmlDeviceGetCurrentClocksThrottleReasons", ref)
        power_mw = source.query("nvmlDeviceGetPowerUsage", ref)
        values = {
            "sm_clock_mhz": source.query("nvmlDeviceGetClockInfo", ref, _CLOCK_SM),
            "mem_clock_mhz": source.query("nvmlDeviceGetClockInfo", ref, _CLOCK_MEM),
            "clock_event_reasons": reasons,
            "temperature_c": source.query("nvmlDeviceGetTemperature", ref, _TEMPERATURE_GPU),
            "power_w": power_mw / 1000.0 if _ok_int(power_mw) is not None else power_mw,
        }
        # What names a straggler's likely cause (decodetop.probes.rankbudget): PCIe link now and at most, NUMA node.
        values.update(
            {
                "pcie_gen": source.query("nvmlDeviceGetCurrPcieLinkGeneration", ref),
                "pcie_gen_max": source.query("nvmlDeviceGetMaxPcieLinkGeneration", ref),
                "pcie_width": source.query("nvmlDeviceGetCurrPcieLinkWidth", ref),
                "pcie_width_max": source.query("nvmlDeviceGetMaxPcieLinkWidth", ref),
                "numa_node_id": source.query("nvmlDeviceGetNumaNodeId", ref),
            }
        )
        row: dict[str, Any] = {"cuda_index": gpu.cuda_index}
        # A value NVML could not give (not supported on this GPU/driver) is left out.
        row.update({key: value for key, value in values.items() if not isinstance(value, NA)})
        util = source.query("nvmlDeviceGetUtilizationRates", ref)
        if isinstance(util, dict) and _ok_int(util.get("gpu")) is not None:
            row["gpu_util_pct"] = _ok_int(util.get("gpu"))  # before a probe the ranks are idle: busy is foreign work
        procs = source.query("nvmlDeviceGetComputeRunningProcesses", ref)
        if isinstance(procs, list):  # every process on the GPU, the probe's own ranks included
            sm = _process_sm_util(source, ref, since_us)
            row["processes"] = [
                {
                    "pid": pid,
                    "name": _process_name(pid),
                    "used_memory_bytes": _ok_int(p.get("usedGpuMemory")),
                    **({"sm_util_pct": sm[pid]} if pid in sm else {}),
                }
                for p in procs
                if isinstance(p, dict) and (pid := _ok_int(p.get("pid"))) is not None
            ]
        out.append(row)
    return out


def _process_sm_util(source: Nvml, ref: GpuRef, since_us: int) -> dict[int, int]:
    """pid → mean SM utilisation (%) over NVML's per-process samples newer than `since_us`; empty where NVML has no
    sample (NVML_ERROR_NOT_FOUND) or the call is not supported."""
    samples = source.query("nvmlDeviceGetProcessUtilization", ref, since_us)
    seen: dict[int, list[int]] = {}
    for sample in samples if isinstance(samples, list) else []:
        pid = _ok_int(sample.get("pid")) if isinstance(sample, dict) else None
        sm = _ok_int(sample.get("smUtil")) if isinstance(sample, dict) else None
        if pid is not None and sm is not None and 0 <= sm <= 100:
            seen.setdefault(pid, []).append(sm)
    return {pid: round(sum(v) / len(v)) for pid, v in seen.items()}


def _process_name(pid: int) -> str:
    try:
        import psutil

        return str(psutil.Process(pid).name())
    except Exception:
        return "?"


@dataclass(frozen=True)
class HostFields:
    """What the host (not torch) says about the environment a result was taken in."""

    host: str
    nccl_env: Mapping[str, str]
    visible_devices: str | None
    driver: str | None
    gpu_names: tuple[str, ...] = ()
    gpu_uuids: tuple[str, ...] = ()
    topology: str | None = None


def host_environment_fields(gpus: Sequence[GpuInfo] = ()) -> HostFields:
    """Host-side environment: host, driver, GPU names/UUIDs, topology text, NCCL_* variables (no torch)."""
    source = _source(None)
    driver = source.query("nvmlSystemGetDriverVersion") if source is not None else None
    return HostFields(
        host=socket.gethostname(),
        nccl_env=nccl_env(),
        visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"),
        driver=None if driver is None or isinstance(driver, NA) else _decode(driver),
        gpu_names=tuple(g.name for g in gpus),
        gpu_uuids=tuple(g.uuid for g in gpus),
        topology=nvidia_smi_topology() if gpus else None,
    )


def nccl_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """NCCL_* variables, the multicast switches and the CUDA settings that swing latency figures."""
    env = os.environ if environ is None else environ
    keys = [k for k in env if k.startswith(("NCCL_", "TORCH_NCCL_", "NVSHMEM_"))]
    # CUDA_LAUNCH_BLOCKING doubles the eager op cost and slows graph-timed probes (docs/benchmarks.md, "Proven on
    # H200"): a result taken with it must say so.
    keys += [
        k
        for k in (
            "TORCH_SYMM_MEM_DISABLE_MULTICAST",
            "CUDA_DEVICE_ORDER",
            "CUDA_LAUNCH_BLOCKING",
            "CUDA_DEVICE_MAX_CONNECTIONS",
            "PYTORCH_CUDA_ALLOC_CONF",
        )
        if k in env
    ]
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
