"""GPU discovery and the busy-GPU refusal, with NVML faked (the one boundary faked in CI)."""

from __future__ import annotations

import pytest

from decodetop.cli import main
from decodetop.collectors.fake_nvml import err, fake_nvml, load_recording, ok
from decodetop.collectors.nvml import NVML_ERROR_NOT_SUPPORTED, Nvml
from decodetop.errors import UserInputError
from decodetop.probes import gpuinfo
from decodetop.probes.controller import GroupLayout, resolve_layout
from decodetop.probes.gpuinfo import GpuInfo, GpuProcess, _visible_nvml_indices, nccl_env

UUIDS = ["GPU-aaaa-1111", "GPU-bbbb-2222", "GPU-cccc-3333"]


def _three_h200s() -> Nvml:
    """The H200 recording made on the GPU machine, replicated to three GPUs with distinct UUIDs."""
    recording = load_recording("h200x1-load").replicated(3)
    return fake_nvml(recording.with_calls({f"nvmlDeviceGetUUID(gpu{i})": ok(u) for i, u in enumerate(UUIDS)}))


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
    assert _visible_nvml_indices(_three_h200s(), 3) == expected


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
        gpuinfo, "compute_processes", lambda gpus, exclude_pids=(), nvml=None: [GpuProcess(1, 4242, "vllm", 70 << 30)]
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
    assert nccl_env({**env, "CUDA_LAUNCH_BLOCKING": "1"})["CUDA_LAUNCH_BLOCKING"] == "1"


def test_visible_gpus_from_a_real_h200_recording(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    gpus = gpuinfo.visible_gpus(_three_h200s())
    assert [(g.cuda_index, g.name, g.uuid) for g in gpus] == [(i, "NVIDIA H200", u) for i, u in enumerate(UUIDS)]
    assert gpus[0].memory_total_bytes == 150754820096  # as NVML read it on the H200


def test_compute_processes_names_the_recorded_process() -> None:
    """The load recording holds the recorder's own torch process (pid 428, 1.7 GB) on GPU 0."""
    procs = gpuinfo.compute_processes(_gpus(1), nvml=_three_h200s())
    assert [(p.cuda_index, p.pid, p.used_memory_bytes) for p in procs] == [(0, 428, 1721761792)]
    assert gpuinfo.compute_processes(_gpus(1), exclude_pids=[428], nvml=_three_h200s()) == []


def test_clock_snapshot_reads_nvml() -> None:
    """Clocks and reasons as recorded under load on the H200 (power cap, 0x4); power not supported, as on some VMs."""
    recording = load_recording("h200x1-load").with_calls(
        {"nvmlDeviceGetPowerUsage(gpu0)": err(NVML_ERROR_NOT_SUPPORTED)}
    )
    snap = gpuinfo.clock_snapshot(_gpus(1), nvml=fake_nvml(recording))
    procs = snap[0].pop("processes")  # every compute process on the GPU, for a straggler's likely cause
    assert [(p["pid"], p["used_memory_bytes"]) for p in procs] == [(428, 1721761792)]
    assert snap == [
        {
            "cuda_index": 0,
            "sm_clock_mhz": 1560,
            "mem_clock_mhz": 3201,
            "clock_event_reasons": 4,
            "temperature_c": 57,
            "pcie_gen": 5,
            "pcie_gen_max": 5,
            "pcie_width": 16,
            "pcie_width_max": 16,
            "gpu_util_pct": 99,
        }
    ]
    assert gpuinfo.clock_snapshot([]) == []


def test_clock_snapshot_gives_each_process_its_sm_share_since_the_probe_started() -> None:
    """NVML's per-process samples newer than the probe's start, averaged per pid (a GEMM neighbour at 97 % beside a
    probe rank at 12 %); no samples (NVML_ERROR_NOT_FOUND) leaves the share out."""
    samples = [
        {"pid": 1306, "timeStamp": 5_000_001, "smUtil": 96, "memUtil": 40},
        {"pid": 1306, "timeStamp": 5_100_001, "smUtil": 98, "memUtil": 41},
        {"pid": 428, "timeStamp": 5_100_001, "smUtil": 12, "memUtil": 3},
    ]
    procs = [{"pid": 428, "usedGpuMemory": 1 << 30}, {"pid": 1306, "usedGpuMemory": 2 << 30}]
    recording = load_recording("h200x1-load").with_calls(
        {
            "nvmlDeviceGetComputeRunningProcesses(gpu0)": ok(procs),
            "nvmlDeviceGetProcessUtilization(gpu0,5000000)": ok(samples),
        }
    )
    (row,) = gpuinfo.clock_snapshot(_gpus(1), nvml=fake_nvml(recording), since_us=5_000_000)
    assert [(p["pid"], p.get("sm_util_pct")) for p in row["processes"]] == [(428, 12), (1306, 97)]
    (row,) = gpuinfo.clock_snapshot(_gpus(1), nvml=fake_nvml(recording), since_us=6_000_000)  # no such samples
    assert all("sm_util_pct" not in p for p in row["processes"])
