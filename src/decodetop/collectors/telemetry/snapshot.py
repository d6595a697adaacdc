"""Provides the frozen telemetry snapshots (one tick: every GPU, every pair, what the tick cost) and the tables that
decode NVML's codes in them (clock-event reasons, P2P status).

`decodetop.collectors.telemetry.sampler` fills them from NVML; everything downstream (the TUI, the exporter, the
checks, recordings) reads only these classes."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

P2P_STATUS_NAMES = {
    0: "OK",
    1: "CHIPSET_NOT_SUPPORTED",
    2: "GPU_NOT_SUPPORTED",
    3: "IOH_TOPOLOGY_NOT_SUPPORTED",
    4: "DISABLED_BY_REGKEY",
    5: "NOT_SUPPORTED",
    6: "UNKNOWN",
}
"""nvmlGpuP2PStatus_t (docs/reference/healthchecks.md N9)."""


@dataclass(frozen=True)
class ClockEventReason:
    """One bit of the clock-event (throttle) reason mask and how serious it is (docs/reference/healthchecks.md N3)."""

    bit: int
    name: str
    severity: str
    """"fail", "warn" or "info" as N3 grades it (warn for SwPowerCap only when sustained under load)."""
    meaning: str
    counter_field_id: int | None = None
    """NVML field id of the accumulated time (ns) spent with this reason, where the driver counts it."""


CLOCK_EVENT_REASONS: tuple[ClockEventReason, ...] = (
    # Bits and names: NVML nvmlClocksEventReasons (docs/reference/healthchecks.md N3, [NVML-CER]); counters: pynvml
    # NVML_FI_DEV_CLOCKS_EVENT_REASON_* / NVML_FI_DEV_PERF_POLICY_* (nanoseconds).
    ClockEventReason(0x1, "GpuIdle", "info", "nothing is running; clocks drop at idle"),
    ClockEventReason(0x2, "ApplicationsClocksSetting", "info", "application clocks hold the clocks down"),
    ClockEventReason(0x4, "SwPowerCap", "warn", "the software power cap lowers clocks to stay under the limit", 74),
    ClockEventReason(0x8, "HwSlowdown", "fail", "hardware slowdown (thermal or power brake), clocks cut ≥ 2×"),
    ClockEventReason(0x10, "SyncBoost", "info", "clocks held to the slowest GPU of a sync-boost group", 76),
    ClockEventReason(0x20, "SwThermalSlowdown", "warn", "software thermal slowdown: GPU or memory too hot", 269),
    ClockEventReason(0x40, "HwThermalSlowdown", "fail", "hardware thermal slowdown: temperature over the limit", 270),
    ClockEventReason(0x80, "HwPowerBrakeSlowdown", "fail", "external power brake asserted (PSU or board)", 271),
    ClockEventReason(0x100, "DisplayClockSetting", "info", "clocks follow the display clock"),
    # pynvml 13.x nvmlClocksThrottleReasonBoardLimit / Reliability (values "not checked" in
    # docs/reference/healthchecks.md N3).
    ClockEventReason(0x200, "BoardLimit", "info", "board-level limit", 77),
    ClockEventReason(0x400, "Reliability", "info", "reliability limit", 79),
)
CLOCK_EVENT_BY_NAME = {r.name: r for r in CLOCK_EVENT_REASONS}

EXTRA_COUNTERS: tuple[tuple[str, int], ...] = (
    ("TotalAppClocks", 80),
    ("Thermal", 75),
    ("LowUtilization", 78),
    ("TotalBaseClocks", 81),
)
"""Other perf-policy time counters (ns) read with the reason counters (pynvml NVML_FI_DEV_PERF_POLICY_*): time
below application clocks / base clocks for any reason, and time at low utilisation (on the H200 recordings,
TotalAppClocks and LowUtilization grow at 100 % of an idle interval)."""


def decode_clock_event_reasons(mask: int) -> tuple[str, ...]:
    """Names of the bits set in a clock-event reason mask; unknown bits as "Unknown(0x...)"."""
    names = [r.name for r in CLOCK_EVENT_REASONS if mask & r.bit]
    known = 0
    for r in CLOCK_EVENT_REASONS:
        known |= r.bit
    unknown = mask & ~known
    bit = 1
    while unknown:
        if unknown & bit:
            names.append(f"Unknown(0x{bit:x})")
            unknown &= ~bit
        bit <<= 1
    return tuple(names)


# --- snapshots ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GpuProcess:
    """A process with a context on a GPU (nvmlDeviceGet{Compute,Graphics}RunningProcesses)."""

    pid: int
    used_mem_bytes: int | None
    kind: str
    """"compute" or "graphics"."""
    sm_util_pct: int | None = None
    """Its share of SM time over NVML's recent sample buffer (nvmlDeviceGetProcessUtilization); None where the
    driver gives none (no samples yet, MIG, or not supported)."""


@dataclass(frozen=True)
class GpuSnapshot:
    """One GPU at one tick. None means NVML could not give the value; `unavailable[field]` says why."""

    index: int
    name: str | None
    uuid: str | None
    pci_bus_id: str | None
    """sysfs form, "0000:3b:00.0" (NVML's 8-digit domain normalised) so it joins sysfs data."""
    minor_number: int | None
    """N in /dev/nvidiaN."""
    compute_capability: str | None
    # clocks
    sm_clock_mhz: int | None
    sm_clock_max_mhz: int | None
    mem_clock_mhz: int | None
    mem_clock_max_mhz: int | None
    app_sm_clock_mhz: int | None
    app_mem_clock_mhz: int | None
    default_app_sm_clock_mhz: int | None
    default_app_mem_clock_mhz: int | None
    performance_state: int | None
    """P-state: 0 = P0 (max performance) … 15; 32 = unknown."""
    # clock-event reasons
    clock_event_mask: int | None
    clock_event_supported_mask: int | None
    clock_event_reasons: tuple[str, ...]
    """Names decoded from `clock_event_mask` (empty when none, or when the mask is unavailable)."""
    clock_event_time_ns: Mapping[str, int]
    """Accumulated time per reason (and other perf-policy counters) since driver load, where the driver counts it."""
    clock_event_share: Mapping[str, float]
    """Share (0–1) of the last tick's wall time spent with each counted reason; empty on the first tick."""
    # PCIe
    pcie_gen: int | None
    pcie_gen_max: int | None
    """The system's max (slot, riser and GPU together)."""
    pcie_gen_gpu_max: int | None
    """The GPU's own max; greater than `pcie_gen_max` means the slot or riser limits the link (P2)."""
    pcie_width: int | None
    pcie_width_max: int | None
    pcie_tx_bytes_per_s: float | None
    pcie_rx_bytes_per_s: float | None
    pcie_tx_bytes_total: int | None
    pcie_rx_bytes_total: int | None
    pcie_rate_source: str
    """"counters" (delta of NVML's byte counters between ticks), "sampled" (nvmlDeviceGetPcieThroughput, a
    20 ms window per call) or "" (none yet)."""
    pcie_rate_is_lower_bound: bool
    """True when the byte counters are 32-bit: they wrap every 4 GiB ("Value can be wrapped", nvml.h; the H200
    recordings carry them as unsigned int), so a tick that moved more than 4 GiB shows less than it moved."""
    pcie_replay_count: int | None
    counters_timestamp_us: int | None
    """NVML's timestamp of the counter reads (field values, µs); rates divide by the change of this clock, so
    they stay right however late the tick ran (and when a recording is replayed)."""
    # power and thermals
    power_w: float | None
    power_limit_enforced_w: float | None
    power_limit_w: float | None
    """The power-management limit currently set (nvmlDeviceGetPowerManagementLimit)."""
    power_limit_default_w: float | None
    temperature_c: int | None
    # load and memory
    gpu_util_pct: int | None
    mem_util_pct: int | None
    mem_total_bytes: int | None
    mem_used_bytes: int | None
    mem_free_bytes: int | None
    memory_bus_width_bits: int | None
    # reliability
    ecc_enabled: bool | None
    ecc_pending_enabled: bool | None
    ecc_uncorrected_volatile: int | None
    ecc_uncorrected_aggregate: int | None
    ecc_corrected_volatile: int | None
    ecc_corrected_aggregate: int | None
    retired_pages_pending: bool | None
    remapped_rows_correctable: int | None
    remapped_rows_uncorrectable: int | None
    remapped_rows_pending: bool | None
    remapped_rows_failure: bool | None
    # links, modes, placement
    nvlink_links: int | None
    """Links present at this GPU (indices NVML answers for)."""
    nvlink_active_links: int | None
    persistence_mode: bool | None
    cpu_affinity: tuple[int, ...] | None
    """CPUs NVML calls local to this GPU."""
    numa_node_id: int | None
    # processes (costly)
    processes: tuple[GpuProcess, ...] | None
    """None when not read this tick (see `processes_note`)."""
    processes_note: str
    # cost
    sample_cost_s: float
    """Wall time spent reading this GPU this tick."""
    unavailable: Mapping[str, str] = field(default_factory=dict)
    """Field name → why NVML could not give it ("not supported on this GPU or driver", ...)."""
    # NVLink traffic per link (after `unavailable`: recordings made before these fields read with them empty)
    nvlink_tx_kib_total: Mapping[int, int] = field(default_factory=dict)
    """Link index → data KiB sent since the driver loaded (NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, scope = link)."""
    nvlink_rx_kib_total: Mapping[int, int] = field(default_factory=dict)
    """Link index → data KiB received (NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX)."""
    nvlink_tx_bytes_per_s: Mapping[int, float] = field(default_factory=dict)
    """Link index → bytes per second sent since the last tick (empty: see `unavailable`)."""
    nvlink_rx_bytes_per_s: Mapping[int, float] = field(default_factory=dict)


@dataclass(frozen=True)
class GpuPairSnapshot:
    """Topology and P2P capability of one GPU pair (a < b), read once."""

    gpu_a: int
    gpu_b: int
    topology_level: int | None
    """nvmlDeviceGetTopologyCommonAncestor: 0 INTERNAL, 10 PIX, 20 PXB, 30 PHB, 40 NODE, 50 SYS (P7)."""
    topology_name: str | None
    p2p_status: Mapping[str, int | None]
    """Capability ("read", "write", "nvlink", "atomics", "pci") → nvmlGpuP2PStatus_t (0 = OK)."""
    unavailable: Mapping[str, str] = field(default_factory=dict)

    def p2p_name(self, capability: str) -> str:
        """The status name of one capability ("OK", "NOT_SUPPORTED", ... or "N/A")."""
        code = self.p2p_status.get(capability)
        return "N/A" if code is None else P2P_STATUS_NAMES.get(code, f"status {code}")


@dataclass(frozen=True)
class NvmlSystemInfo:
    """Driver-wide facts."""

    driver_version: str | None
    cuda_driver_version: str | None
    """"12.4" from nvmlSystemGetCudaDriverVersion's 12040 (v//1000, (v%1000)//10; healthchecks N1)."""
    nvml_version: str | None
    device_count: int


@dataclass(frozen=True)
class TelemetrySnapshot:
    """Every GPU and pair at one tick, with where the data came from and what the tick cost."""

    tick: int
    taken_at_unix_s: float
    monotonic_s: float
    source: str
    """Backend label: "nvml", "fake: h200x1-load (replicated 1→8 GPUs)", "none"."""
    nvml_available: bool
    nvml_reason: str
    """Why NVML is unavailable ("" when available): library not found, driver not loaded, version mismatch."""
    system: NvmlSystemInfo
    gpus: tuple[GpuSnapshot, ...]
    pairs: tuple[GpuPairSnapshot, ...]
    processes_sampled: bool
    processes_note: str
    tick_cost_s: float
    """Wall time of this tick's NVML reads (all GPUs; the one-time static reads are in `static_cost_s`)."""
    tick_cost_per_gpu_s: float
    """`tick_cost_s` divided by the GPU count (0 with no GPU)."""
    static_cost_s: float
    """Wall time of the one-time reads (names, max clocks, topology, P2P) made on this tick; 0 once cached."""
    nvml_calls: int
    """NVML calls made this tick."""

    def gpu(self, index: int) -> GpuSnapshot | None:
        """The GPU with this NVML index, if present."""
        for g in self.gpus:
            if g.index == index:
                return g
        return None
