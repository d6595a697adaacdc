"""Provides GPU telemetry, split as nvitop splits its API: what one tick holds (`snapshot`: frozen snapshots and the
tables that decode NVML's codes), how a tick is read (`sampler`: every GPU once through the NVML choke point) and
the thread that takes one per tick (`collector`: the TUI and the exporter both use it; costly process lists pause
while a latency probe runs).

The names below are the package's public API; import them from here."""

from __future__ import annotations

from decodetop.collectors.telemetry.collector import TelemetryCollector
from decodetop.collectors.telemetry.sampler import (
    CPU_SET_WORDS,
    DEFAULT_SLOW_EVERY_TICKS,
    NVML_CLOCK_MEM,
    NVML_CLOCK_SM,
    NVML_TEMPERATURE_GPU,
    P2P_CAPS,
    PCIE_THROUGHPUT_UNIT_BYTES,
    SLOW_FIELDS,
    TOPOLOGY_NAMES,
    TelemetrySampler,
    cpus_from_affinity,
    normalize_bus_id,
)
from decodetop.collectors.telemetry.snapshot import (
    CLOCK_EVENT_BY_NAME,
    CLOCK_EVENT_REASONS,
    EXTRA_COUNTERS,
    P2P_STATUS_NAMES,
    ClockEventReason,
    GpuPairSnapshot,
    GpuProcess,
    GpuSnapshot,
    NvmlSystemInfo,
    TelemetrySnapshot,
    decode_clock_event_reasons,
)

__all__ = [
    "CLOCK_EVENT_BY_NAME",
    "CLOCK_EVENT_REASONS",
    "CPU_SET_WORDS",
    "DEFAULT_SLOW_EVERY_TICKS",
    "EXTRA_COUNTERS",
    "NVML_CLOCK_MEM",
    "NVML_CLOCK_SM",
    "NVML_TEMPERATURE_GPU",
    "P2P_CAPS",
    "P2P_STATUS_NAMES",
    "PCIE_THROUGHPUT_UNIT_BYTES",
    "SLOW_FIELDS",
    "TOPOLOGY_NAMES",
    "ClockEventReason",
    "GpuPairSnapshot",
    "GpuProcess",
    "GpuSnapshot",
    "NvmlSystemInfo",
    "TelemetryCollector",
    "TelemetrySampler",
    "TelemetrySnapshot",
    "cpus_from_affinity",
    "decode_clock_event_reasons",
    "normalize_bus_id",
]
