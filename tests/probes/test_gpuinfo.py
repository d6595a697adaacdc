"""GPU discovery and the busy-GPU refusal, with NVML faked (the one boundary faked in CI)."""

from __future__ import annotations

import types
from typing import Any

import pytest

from decodetop.cli import main
from decodetop.errors import UserInputError
from decodetop.probes import gpuinfo
from decodetop.probes.controller import GroupLayout, resolve_layout
from decodetop.probes.gpuinfo import GpuInfo, GpuProcess, _visible_nvml_indices, nccl_env

UUIDS = ["GPU-aaaa-1111", "GPU-bbbb-2222", "GPU-cccc-3333"]


def _fake_nvml() -> Any:
    return types.SimpleNamespace(
        nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetUUID=lambda h: UUIDS[h].encode(),
    )


@pytest.mark.parametrize(
    ("cvd", "expected"),
    [
        (None, [0, 1, 2]),
        ("2,0", [2, 0]),
        ("1,7,0", [1]),  # CUDA stops at the first invalid entry
        ("GPU-bbbb", [1]),  # UUID prefix
        ("", []),
        ("-1", []),
    ],
)
def test_cuda_visible_devices_maps_to_nvml(
    monkeypatch: pytest.MonkeyPatch, cvd: str | None, expected: list[int]
) -> None:
    if cvd is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", cvd)
    assert _visible_nvml_indices(_fake_nvml(), 3) == expected


def _gpus(n: int) -> list[GpuInfo]:
    return [GpuInfo(i, i, "NVIDIA H200", UUIDS[i], 141 << 30, 1 << 30) for i in range(n)]


def test_resolve_layout() -> None:
    assert resolve_layout(available=[]) == GroupLayout("cpu", 2)
    assert resolve_layout(cpu_ranks=3, available=[]).world_size == 3
    two = _gpus(2)
    assert resolve_layout(available=two) == GroupLayout("cuda", 2, tuple(two))
    assert resolve_layout(gpus=[1], available=two).gpus == (two[1],)
    assert resolve_layout(device="cpu", available=two).kind == "cpu"
    with pytest.raises(UserInputError, match=r"--gpus: no GPU 2 \(this host shows 2: 0, 1\)"):
        resolve_layout(gpus=[2], available=two)
    with pytest.raises(UserInputError, match="twice"):
        resolve_layout(gpus=[0, 0], available=two)
    with pytest.raises(UserInputError, match="no CUDA GPU"):
        resolve_layout(device="cuda", available=[])


def test_busy_gpu_needs_force(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import decodetop.probes.controller as controller

    monkeypatch.setattr(controller, "visible_gpus", lambda: _gpus(2))
    monkeypatch.setattr(
        gpuinfo, "compute_processes", lambda gpus, exclude_pids=(): [GpuProcess(1, 4242, "vllm", 70 << 30)]
    )
    assert main(["probe", "allreduce"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        "decodetop: error: other processes hold GPU memory (GPU 1: pid 4242 (vllm, 70 GiB)); "
        "pass --force to probe anyway"
    )


def test_nccl_env_picks_nccl_settings() -> None:
    env = {"NCCL_ALGO": "Ring", "PATH": "/bin", "TORCH_NCCL_BLOCKING_WAIT": "1", "NVSHMEM_DISABLE_NVLS": "1"}
    assert nccl_env(env) == {"NCCL_ALGO": "Ring", "NVSHMEM_DISABLE_NVLS": "1", "TORCH_NCCL_BLOCKING_WAIT": "1"}


def test_clock_snapshot_reads_nvml(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fake pynvml with the constants and calls of nvidia-ml-py; the power call fails as on some VMs."""

    def power(h: int) -> int:
        raise RuntimeError("Not Supported")

    fake = types.SimpleNamespace(
        NVML_CLOCK_SM=1,
        NVML_CLOCK_MEM=2,
        NVML_TEMPERATURE_GPU=0,
        nvmlInit=lambda: None,
        nvmlShutdown=lambda: None,
        nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetClockInfo=lambda h, which: {1: 1980, 2: 3201}[which],
        nvmlDeviceGetCurrentClocksEventReasons=lambda h: 0x1,  # GpuIdle, as h200-machine.md read at rest
        nvmlDeviceGetTemperature=lambda h, which: 31,
        nvmlDeviceGetPowerUsage=power,
    )
    monkeypatch.setitem(__import__("sys").modules, "pynvml", fake)
    snap = gpuinfo.clock_snapshot(_gpus(1))
    assert snap == [
        {"cuda_index": 0, "sm_clock_mhz": 1980, "mem_clock_mhz": 3201, "clock_event_reasons": 1, "temperature_c": 31}
    ]
    assert gpuinfo.clock_snapshot([]) == []
