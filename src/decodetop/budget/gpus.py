"""Provides the GPU and interconnect table the roofline falls back on when nothing was measured.

Every row names its source. Memory bandwidth and dense BF16 matrix peak are datasheet figures (per GPU); "dense"
means without 2:4 sparsity, and where a datasheet only quotes the sparse figure the row says it was halved.
Collective latencies are small-message all-reduce figures reported for that interconnect (docs/reference/probes.md §1,
§7; docs/reference/h200-machine.md): the roofline uses them only when no all-reduce was measured, and says so."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Interconnect:
    """How the GPUs of one host talk, as the roofline models a collective: latency + bytes / bus bandwidth."""

    key: str
    name: str
    allreduce_latency_us: float
    """Small-message (≤ 64 KB) all-reduce time on 8 GPUs with NCCL."""
    busbw_gbps: float
    """Large-message all-reduce bus bandwidth (GB/s), nccl-tests' busbw."""
    source: str


INTERCONNECTS: dict[str, Interconnect] = {
    "pcie5": Interconnect(
        "pcie5",
        "PCIe Gen5 x16 (no NVLink)",
        24.0,
        41.1,
        "docs/reference/probes.md §1: 8x RTX PRO 6000 behind PCIe switches, NCCL ~24 us at 256 B-64 KB, busbw 41.1 "
        "GB/s "
        "(rtx6kpro hardware/pcie-bandwidth.md); untuned dual-socket boxes see 42-48 us",
    ),
    "pcie4": Interconnect(
        "pcie4",
        "PCIe Gen4 x16 (no NVLink)",
        42.0,
        20.0,
        "docs/reference/probes.md §1: 8x RTX 4090 PCIe ~42 us at 8 B (NVIDIA/nccl#1530); busbw taken as half of Gen5's "
        "41 GB/s "
        "(Gen4 has half the link rate)",
    ),
    "nvlink4": Interconnect(
        "nvlink4",
        "NVLink 4 / NVSwitch",
        14.0,
        300.0,
        "docs/reference/h200-machine.md: nccl-tests all_reduce_perf on 2x H200 NVLink, 12-14 us pipelined at 8 B-32 "
        "KB, "
        "~300 GB/s busbw at 128 MiB; docs/reference/probes.md §7.4 expects <= ~20 us NCCL on 8x H100/H200",
    ),
    "nvlink3": Interconnect(
        "nvlink3",
        "NVLink 3 / NVSwitch",
        34.0,
        230.0,
        "docs/reference/probes.md §1: DGX-A100 ring, 8 GPUs, 1 channel: 33.7 us (NVIDIA/nccl-tests#123); busbw ~230 "
        "GB/s is "
        "nccl-tests' commonly reported A100 figure (UNCONFIRMED here)",
    ),
    "nvlink5": Interconnect(
        "nvlink5",
        "NVLink 5 / NVSwitch",
        14.0,
        480.0,
        "no B200 small-message figure in the references: H200's 14 us (docs/reference/h200-machine.md) used; busbw "
        "from "
        "docs/reference/probes.md §1's 8x H100 NVLS peak ~480 GB/s as a lower bound",
    ),
}


@dataclass(frozen=True)
class GpuModel:
    """One GPU model's datasheet figures."""

    key: str
    name: str
    mem_bandwidth_gbps: float
    """Peak DRAM bandwidth, GB/s (1e9 bytes/s)."""
    bf16_dense_tflops: float
    """Dense BF16 tensor-core peak with FP32 accumulate, TFLOP/s."""
    memory_gib: float
    interconnect: str
    """Key into INTERCONNECTS for a multi-GPU host of this model."""
    nvml_names: tuple[str, ...]
    """Substrings of the NVML device name that identify it (matched case-insensitively)."""
    source: str


GPUS: dict[str, GpuModel] = {
    "rtx-pro-6000": GpuModel(
        "rtx-pro-6000",
        "NVIDIA RTX PRO 6000 Blackwell",
        1792.0,
        500.0,
        96.0,
        "pcie5",
        ("RTX PRO 6000",),
        "docs/reference/models.md §1: 512-bit GDDR7, 1,792 GB/s (hardware-corner.net, gpu.name); BF16 = NVIDIA's 4,000 "
        "AI TOPS "
        "(FP4, sparse) / 8, consistent with the 350-417 TFLOPS measured at 8192^3 (docs/reference/probes.md §4)",
    ),
    "h100": GpuModel(
        "h100",
        "NVIDIA H100 SXM5 80GB",
        3350.0,
        989.0,
        80.0,
        "nvlink4",
        ("H100 80GB HBM3", "H100 SXM"),
        "NVIDIA H100 datasheet: 3.35 TB/s HBM3, BF16 1,979 TFLOPS with sparsity (989 dense), NVLink 900 GB/s",
    ),
    "h100-pcie": GpuModel(
        "h100-pcie",
        "NVIDIA H100 PCIe 80GB",
        2000.0,
        756.0,
        80.0,
        "pcie5",
        ("H100 PCIe",),
        "NVIDIA H100 datasheet: H100 PCIe 2.0 TB/s HBM2e, BF16 1,513 TFLOPS with sparsity (756 dense)",
    ),
    "h200": GpuModel(
        "h200",
        "NVIDIA H200 141GB",
        4800.0,
        989.0,
        141.0,
        "nvlink4",
        ("H200",),
        "NVIDIA H200 datasheet: 4.8 TB/s HBM3e (docs/reference/h200-machine.md: NVML 6016-bit bus x 3201 MHz x 2 = 4.8 "
        "TB/s), "
        "BF16 1,979 TFLOPS with sparsity (989 dense)",
    ),
    "b200": GpuModel(
        "b200",
        "NVIDIA B200",
        8000.0,
        2250.0,
        180.0,
        "nvlink5",
        ("B200",),
        "NVIDIA HGX B200 datasheet: 8 TB/s HBM3e per GPU, FP16/BF16 4.5 PFLOPS with sparsity (2.25 dense)",
    ),
    "a100": GpuModel(
        "a100",
        "NVIDIA A100 SXM4 80GB",
        2039.0,
        312.0,
        80.0,
        "nvlink3",
        ("A100",),
        "NVIDIA A100 datasheet: A100 80GB SXM 2,039 GB/s HBM2e, BF16 312 TFLOPS dense (624 sparse), NVLink 600 GB/s",
    ),
    "l40s": GpuModel(
        "l40s",
        "NVIDIA L40S",
        864.0,
        362.0,
        48.0,
        "pcie4",
        ("L40S",),
        "NVIDIA L40S datasheet: 864 GB/s GDDR6, BF16 733 TFLOPS with sparsity (362 dense), PCIe Gen4 x16",
    ),
    "rtx-4090": GpuModel(
        "rtx-4090",
        "NVIDIA GeForce RTX 4090",
        1008.0,
        165.2,
        24.0,
        "pcie4",
        ("RTX 4090",),
        "NVIDIA Ada Lovelace architecture whitepaper: RTX 4090 1,008 GB/s GDDR6X, FP16/BF16 tensor with FP32 "
        "accumulate 165.2 TFLOPS dense, PCIe Gen4",
    ),
    "rtx-5090": GpuModel(
        "rtx-5090",
        "NVIDIA GeForce RTX 5090",
        1792.0,
        209.5,
        32.0,
        "pcie5",
        ("RTX 5090",),
        "NVIDIA RTX 5090 specifications: 512-bit GDDR7 at 28 Gbps = 1,792 GB/s; FP16 dense 209.5 TFLOPS (FP32 "
        "accumulate; codesota.com/hardware/rtx-5090 quoting the datasheet), PCIe Gen5",
    ),
}

ALIASES: dict[str, str] = {
    "rtx6000": "rtx-pro-6000",
    "rtx-6000": "rtx-pro-6000",
    "pro6000": "rtx-pro-6000",
    "rtx-pro-6000-blackwell": "rtx-pro-6000",
    "h100-sxm": "h100",
    "h200-sxm": "h200",
    "a100-sxm": "a100",
    "4090": "rtx-4090",
    "5090": "rtx-5090",
}


def find_gpu(name: str) -> GpuModel | None:
    """A table row by key (`h200`), alias or NVML device name (`NVIDIA H200`), or None."""
    key = name.strip().lower().replace(" ", "-").replace("_", "-")
    key = ALIASES.get(key, key)
    if key in GPUS:
        return GPUS[key]
    folded = name.lower()
    for gpu in GPUS.values():
        if any(n.lower() in folded for n in gpu.nvml_names):
            return gpu
    return None


def nvml_bandwidth_gbps(bus_width_bits: int, max_mem_clock_mhz: int) -> float:
    """Theoretical DRAM bandwidth from NVML: bus width / 8 × memory clock × 2 (double data rate).

    docs/reference/h200-machine.md: 6016 bits / 8 × 3201 MHz × 2 = 4.8 TB/s, the datasheet figure.
    """
    return bus_width_bits / 8 * max_mem_clock_mhz * 2 / 1000
