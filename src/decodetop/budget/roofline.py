"""Provides the roofline: the fastest a decode step can be on this hardware, from the step inventory alone.

    step = max(weight + KV bytes of the busiest GPU / memory bandwidth, FLOPs / matrix peak)
           + Σ collectives (latency + message bytes × algorithm factor / bus bandwidth)

(docs/reference/probes.md §5's budget model without the efficiency and launch terms). Memory bandwidth is, in
order of preference: measured (the gemm probe's device copy, or `--bandwidth-tbps`), or the datasheet table
(`decodetop.budget.gpus`), the same on every surface. The collective latency is measured when given, else the
table's figure for the interconnect. Each choice is recorded in `Hardware.*_source` so the output can say where
a number came from.
"""

from __future__ import annotations

from dataclasses import dataclass

from decodetop.budget.gpus import GPUS, INTERCONNECTS, GpuModel, find_gpu
from decodetop.budget.inventory import StepInventory
from decodetop.errors import UserInputError


@dataclass(frozen=True)
class Hardware:
    """The figures the roofline needs, each with where it came from."""

    gpu_name: str
    mem_bandwidth_gbps: float
    bandwidth_source: str
    allreduce_latency_us: float
    latency_source: str
    busbw_gbps: float
    interconnect: str
    bf16_dense_tflops: float | None = None

    def __post_init__(self) -> None:
        for name in ("mem_bandwidth_gbps", "allreduce_latency_us", "busbw_gbps"):
            value = getattr(self, name)
            if not value > 0 or value == float("inf"):
                raise UserInputError(f"{name}: {value} must be a positive number")


def hardware_for(
    gpu: GpuModel | None,
    *,
    bandwidth_gbps: float | None = None,
    bandwidth_source: str = "measured",
    allreduce_latency_us: float | None = None,
    latency_source: str = "measured",
    interconnect: str | None = None,
    gpu_name: str | None = None,
) -> Hardware:
    """Combine a table row (or none) with measured/NVML overrides. Without a row or a bandwidth, it is an error."""
    link = INTERCONNECTS[interconnect or (gpu.interconnect if gpu else "pcie5")]
    if bandwidth_gbps is None:
        if gpu is None:
            raise UserInputError(
                f"no memory bandwidth: pass --gpu ({', '.join(GPUS)}) or --bandwidth-tbps, or run where NVML works"
            )
        bandwidth_gbps = gpu.mem_bandwidth_gbps
        bandwidth_source = f"datasheet: {gpu.source}"
    lat_source = latency_source
    if allreduce_latency_us is None:
        allreduce_latency_us = link.allreduce_latency_us
        lat_source = f"default for {link.name}: {link.source}"
    return Hardware(
        gpu_name=gpu_name or (gpu.name if gpu else "unknown GPU"),
        mem_bandwidth_gbps=bandwidth_gbps,
        bandwidth_source=bandwidth_source,
        allreduce_latency_us=allreduce_latency_us,
        latency_source=lat_source,
        busbw_gbps=link.busbw_gbps,
        interconnect=link.key,
        bf16_dense_tflops=gpu.bf16_dense_tflops if gpu else None,
    )


def collective_time_us(kind: str, nbytes: float, ranks: int, hw: Hardware) -> float:
    """latency + the bandwidth term of a ring collective (nccl-tests' busbw definitions,
    https://github.com/NVIDIA/nccl-tests/blob/master/doc/PERFORMANCE.md)."""
    if ranks <= 1:
        return 0.0
    # all-reduce moves 2(n-1)/n of the message per rank; all-gather of nbytes per rank moves (n-1)·nbytes
    moved = nbytes * 2 * (ranks - 1) / ranks if kind == "all_reduce" else nbytes * (ranks - 1)
    return hw.allreduce_latency_us + moved / (hw.busbw_gbps * 1e3)


@dataclass(frozen=True)
class RooflineTerm:
    """One additive (or bounding) term of the roofline."""

    name: str
    ms: float
    detail: str


@dataclass(frozen=True)
class Roofline:
    """The roofline of one decode step on the busiest GPU."""

    hardware: Hardware
    weight_bytes: float
    kv_bytes: float
    memory_ms: float
    compute_ms: float | None
    collective_count: int
    collective_ms: float
    step_ms: float
    tokens_per_step: float
    batch: int
    terms: tuple[RooflineTerm, ...]

    @property
    def ms_per_token(self) -> float:
        """Step time over the tokens each sequence gains per step."""
        return self.step_ms / self.tokens_per_step

    @property
    def tokens_per_s(self) -> float:
        """Tokens per second of one sequence."""
        return 1000.0 / self.ms_per_token

    @property
    def tokens_per_s_total(self) -> float:
        """Tokens per second of the whole batch."""
        return self.tokens_per_s * self.batch


def roofline(inventory: StepInventory, hardware: Hardware) -> Roofline:
    """The roofline of `inventory` on `hardware`."""
    bw = hardware.mem_bandwidth_gbps * 1e9
    weights, kv = inventory.weight_bytes, inventory.kv_bytes
    memory_ms = (weights + kv) / bw * 1e3
    compute_ms = None
    if hardware.bf16_dense_tflops:
        compute_ms = inventory.flops / (hardware.bf16_dense_tflops * 1e12) * 1e3
    terms = [
        RooflineTerm("weights", weights / bw * 1e3, f"{weights / 1e9:.3f} GB at {hardware.mem_bandwidth_gbps:g} GB/s"),
        RooflineTerm("kv cache", kv / bw * 1e3, f"{kv / 1e9:.4f} GB at {hardware.mem_bandwidth_gbps:g} GB/s"),
    ]
    coll_ms = 0.0
    count = 0
    for kind in ("all_reduce", "all_gather"):
        sizes = inventory.collective_sizes(kind)
        if not sizes:
            continue
        ms = sum(
            n * collective_time_us(kind, size, inventory.deployment.tp, hardware) / 1e3 for size, n in sizes.items()
        )
        n_total = sum(sizes.values())
        size_text = ", ".join(f"{n} × {size} B" for size, n in sorted(sizes.items()))
        terms.append(
            RooflineTerm(
                kind.replace("_", "-"), ms, f"{size_text} at {hardware.allreduce_latency_us:g} µs + bytes / busbw"
            )
        )
        coll_ms += ms
        count += n_total
    bound = memory_ms
    if compute_ms is not None:
        terms.append(
            RooflineTerm(
                "compute (bound, not added)",
                compute_ms,
                f"{inventory.flops / 1e9:.2f} GFLOP at {hardware.bf16_dense_tflops:g} TFLOP/s BF16 dense",
            )
        )
        bound = max(memory_ms, compute_ms)
    return Roofline(
        hardware=hardware,
        weight_bytes=weights,
        kv_bytes=kv,
        memory_ms=memory_ms,
        compute_ms=compute_ms,
        collective_count=count,
        collective_ms=coll_ms,
        step_ms=bound + coll_ms,
        tokens_per_step=inventory.tokens_per_step,
        batch=inventory.deployment.batch,
        terms=tuple(terms),
    )


def weights_fit_warning(inventory: StepInventory, gpu_name: str) -> str:
    """The warning every surface shows when the busiest GPU's weights alone exceed its memory (before any KV cache):
    such a deployment cannot load, so no timing of it is worth tuning. '' when they fit, or when the GPU is not in
    the hardware table (its memory is not known)."""
    gpu = find_gpu(gpu_name)
    resident = inventory.resident_weight_bytes
    if gpu is None or resident <= gpu.memory_gib * 2**30:
        return ""
    held = f"{resident / 1e9:.3g} GB" if resident >= 1e8 else f"{resident / 1e6:.3g} MB"
    return (
        f"{held} of weights per GPU do not fit in the {gpu.memory_gib:g} GiB of a {gpu.name} (before any KV cache): "
        "use more GPUs or fewer bits"
    )
