"""Provides `TelemetrySampler`: every GPU read once per tick through the NVML choke point, into a
`TelemetrySnapshot`.

`TelemetrySampler.sample()` reads every GPU once (clocks, clock-event reasons and their accumulated time, PCIe link
and traffic, power, temperature, utilisation, memory, ECC, row remapping, NVLink, persistence, processes) and the
topology and P2P status of every pair (once: they do not change while the driver is loaded). Every value NVML cannot
give is `None`, and the snapshot's `unavailable` map says why. The cost of each tick is measured and carried in
the snapshot, in total and per GPU. Settings only an admin changes (`SLOW_FIELDS`) are read every
`slow_every_ticks` ticks and carried between: they are among the costliest calls."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from decodetop.collectors.nvml import NA, GpuRef, Nvml, error_reason
from decodetop.collectors.telemetry.snapshot import (
    CLOCK_EVENT_REASONS,
    EXTRA_COUNTERS,
    GpuPairSnapshot,
    GpuProcess,
    GpuSnapshot,
    NvmlSystemInfo,
    TelemetrySnapshot,
    decode_clock_event_reasons,
)

# --- NVML enums used here (nvidia-ml-py 13.615.71 pynvml.py, docs/reference/healthchecks.md [PYNVML])
# -----------------------
NVML_CLOCK_SM = 1
NVML_CLOCK_MEM = 2
NVML_TEMPERATURE_GPU = 0
NVML_MEMORY_ERROR_TYPE_CORRECTED = 0
NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
NVML_VOLATILE_ECC = 0
NVML_AGGREGATE_ECC = 1
NVML_PCIE_UTIL_TX_BYTES = 0
NVML_PCIE_UTIL_RX_BYTES = 1
NVML_NVLINK_MAX_LINKS = 36
"""Link indices to scan when the driver does not give the link count (36 in nvidia-ml-py 13.x, healthchecks N10)."""
NVML_FI_DEV_NVLINK_LINK_COUNT = 91
NVML_FI_DEV_PCIE_COUNT_TX_BYTES = 197
NVML_FI_DEV_PCIE_COUNT_RX_BYTES = 198
NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX = 138
NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX = 139
"""Per-link NVLink data counters in KiB; the link is the field's scopeId (nvml.h: "Link ID needs to be specified in
the scopeId field"). One H200 without NVLink answers NOT_SUPPORTED for both (benchmarks/results/nvlink/)."""
NVLINK_THROUGHPUT_UNIT_BYTES = 1024
"""The NVLink throughput fields count KiB (nvml.h: "NVLink TX Data throughput in KiB"). The older
nvmlDeviceGetNvLinkUtilizationCounter is not used: it counts what its control was set to (cycles, packets or bytes),
setting that is a GPU setting decodetop never changes, and the H200 answered NOT_SUPPORTED for it too."""
CPU_SET_WORDS = 16
"""64-bit words passed to nvmlDeviceGetCpuAffinity: 1024 CPUs, more than any current host. NVML fills at most
this many words; a fixed size keeps recordings independent of the recording host's CPU count."""
PCIE_THROUGHPUT_UNIT_BYTES = 1024
"""nvmlDeviceGetPcieThroughput reports KB/s (nvml.h); nvtop converts with 1024, and so do we."""

P2P_CAPS: tuple[tuple[str, int], ...] = (("read", 0), ("write", 1), ("nvlink", 2), ("atomics", 3), ("pci", 4))
"""nvmlDeviceGetP2PStatus indices, passed as ints: pynvml's NVML_P2P_CAPS_INDEX_READ is the tuple (0,) (N9)."""

TOPOLOGY_NAMES = {0: "INTERNAL", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}
"""nvmlGpuTopologyLevel_t with nvidia-smi topo's names: SINGLE=PIX, MULTIPLE=PXB, HOSTBRIDGE=PHB (healthchecks P7)."""


def normalize_bus_id(nvml_bus_id: str) -> str:
    """NVML's "00000000:3B:00.0" → sysfs's "0000:3b:00.0" (docs/reference/healthchecks.md §1 notes); already-sysfs ids
    pass."""
    text = nvml_bus_id.strip().lower()
    parts = text.split(":")
    if len(parts) == 3:
        domain, bus, devfn = parts
        try:
            return f"{int(domain, 16):04x}:{bus}:{devfn}"
        except ValueError:
            return text
    if len(parts) == 2:  # no domain
        return f"0000:{text}"
    return text


def cpus_from_affinity(words: list[int]) -> tuple[int, ...]:
    """CPU ids set in nvmlDeviceGetCpuAffinity's 64-bit words (bit i of word j = CPU 64j+i, healthchecks P6)."""
    cpus: list[int] = []
    for j, word in enumerate(words):
        for i in range(64):
            if (int(word) >> i) & 1:
                cpus.append(64 * j + i)
    return tuple(cpus)


# --- reading ------------------------------------------------------------------------------------------------


class _Reads:
    """Query helper that records why a field is missing and counts calls."""

    def __init__(self, nvml: Nvml) -> None:
        self.nvml = nvml
        self.unavailable: dict[str, str] = {}
        self.calls = 0

    def raw(self, name: str, fn: str, *args: Any) -> Any:
        self.calls += 1
        value = self.nvml.query(fn, *args)
        if isinstance(value, NA):
            self.unavailable[name] = value.reason
            return None
        return value

    def int_(self, name: str, fn: str, *args: Any) -> int | None:
        value = self.raw(name, fn, *args)
        if isinstance(value, bool):
            return int(value)
        if isinstance(value, int):
            return value
        if value is not None:
            self.unavailable[name] = f"unexpected value {value!r} from {fn}"
        return None

    def first_int(self, name: str, fns: tuple[str, ...], *args: Any) -> int | None:
        """The first function that answers (newer name first, then the older one)."""
        reasons: list[str] = []
        for fn in fns:
            self.calls += 1
            value = self.nvml.query(fn, *args)
            if isinstance(value, NA):
                reasons.append(value.reason)
                continue
            if isinstance(value, int):
                return value
        self.unavailable[name] = reasons[0] if reasons else "no answer"
        return None


def _mw_to_w(value: int | None) -> float | None:
    return None if value is None else value / 1000.0


def _as_dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


@dataclass(frozen=True)
class _GpuStatic:
    values: Mapping[str, Any]
    unavailable: Mapping[str, str]
    nvlink_indices: tuple[int, ...]


_COUNTER_FIELDS: tuple[tuple[str, int], ...] = (
    *((r.name, r.counter_field_id) for r in CLOCK_EVENT_REASONS if r.counter_field_id is not None),
    *EXTRA_COUNTERS,
)
_FIELD_IDS: tuple[int, ...] = (
    NVML_FI_DEV_PCIE_COUNT_TX_BYTES,
    NVML_FI_DEV_PCIE_COUNT_RX_BYTES,
    *(fid for _, fid in _COUNTER_FIELDS),
)
_NVML_SUCCESS = 0
_UINT32_MODULUS = 2**32
_COUNTER_MODULUS = {1: _UINT32_MODULUS}
"""nvmlValueType_t → counter width: 1 = unsigned int (32-bit) wraps at 2**32; the 64-bit types never wrap in
practice (pynvml NVML_VALUE_TYPE_*)."""


SLOW_FIELDS: tuple[str, ...] = (
    "app_sm_clock_mhz",
    "app_mem_clock_mhz",
    "power_limit_w",
    "ecc_enabled",
    "ecc_pending_enabled",
    "retired_pages_pending",
    "persistence_mode",
)
"""Settings only an admin changes, read every `slow_every_ticks` ticks: on the H200, nvmlDeviceGetApplicationsClock
costs 1.0 ms per call, nvmlDeviceGetEccMode 0.32 ms and nvmlDeviceGetPowerManagementLimit 0.24 ms, about half of a
tick (docs/benchmarks.md, "NVML telemetry cost")."""
DEFAULT_SLOW_EVERY_TICKS = 10


def _read_clocks_power_memory(r: _Reads, g: GpuRef, v: dict[str, Any]) -> None:
    """The fields read every tick: clocks, P-state, clock-event reasons, PCIe link, power, temperature,
    utilisation and memory use."""
    v["sm_clock_mhz"] = r.int_("sm_clock_mhz", "nvmlDeviceGetClockInfo", g, NVML_CLOCK_SM)
    v["mem_clock_mhz"] = r.int_("mem_clock_mhz", "nvmlDeviceGetClockInfo", g, NVML_CLOCK_MEM)
    v["performance_state"] = r.int_("performance_state", "nvmlDeviceGetPerformanceState", g)
    mask = r.first_int(
        "clock_event_mask",
        ("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"),
        g,
    )
    v["clock_event_mask"] = mask
    v["clock_event_reasons"] = decode_clock_event_reasons(mask) if mask is not None else ()
    v["pcie_gen"] = r.int_("pcie_gen", "nvmlDeviceGetCurrPcieLinkGeneration", g)
    v["pcie_width"] = r.int_("pcie_width", "nvmlDeviceGetCurrPcieLinkWidth", g)
    v["pcie_replay_count"] = r.int_("pcie_replay_count", "nvmlDeviceGetPcieReplayCounter", g)
    v["power_w"] = _mw_to_w(r.int_("power_w", "nvmlDeviceGetPowerUsage", g))
    v["power_limit_enforced_w"] = _mw_to_w(r.int_("power_limit_enforced_w", "nvmlDeviceGetEnforcedPowerLimit", g))
    v["temperature_c"] = r.int_("temperature_c", "nvmlDeviceGetTemperature", g, NVML_TEMPERATURE_GPU)
    util = r.raw("gpu_util_pct", "nvmlDeviceGetUtilizationRates", g)
    v["gpu_util_pct"] = _int_or_none(_as_dict(util).get("gpu"))
    v["mem_util_pct"] = _int_or_none(_as_dict(util).get("memory"))
    if util is None:
        r.unavailable["mem_util_pct"] = r.unavailable.get("gpu_util_pct", "")
    mem = r.raw("mem_used_bytes", "nvmlDeviceGetMemoryInfo", g)
    v["mem_total_bytes"] = _int_or_none(_as_dict(mem).get("total"))
    v["mem_used_bytes"] = _int_or_none(_as_dict(mem).get("used"))
    v["mem_free_bytes"] = _int_or_none(_as_dict(mem).get("free"))
    if mem is None:
        r.unavailable["mem_total_bytes"] = r.unavailable["mem_free_bytes"] = r.unavailable["mem_used_bytes"]


def _read_memory_health(r: _Reads, g: GpuRef, v: dict[str, Any]) -> None:
    """ECC error counts (N5) and row remapping (N7); retired pages (N6) are read with the slow fields."""
    for name, etype, ctype in (
        ("ecc_uncorrected_volatile", NVML_MEMORY_ERROR_TYPE_UNCORRECTED, NVML_VOLATILE_ECC),
        ("ecc_uncorrected_aggregate", NVML_MEMORY_ERROR_TYPE_UNCORRECTED, NVML_AGGREGATE_ECC),
        ("ecc_corrected_volatile", NVML_MEMORY_ERROR_TYPE_CORRECTED, NVML_VOLATILE_ECC),
        ("ecc_corrected_aggregate", NVML_MEMORY_ERROR_TYPE_CORRECTED, NVML_AGGREGATE_ECC),
    ):
        v[name] = r.int_(name, "nvmlDeviceGetTotalEccErrors", g, etype, ctype)
    rows = r.raw("remapped_rows", "nvmlDeviceGetRemappedRows", g)
    ok_rows = isinstance(rows, list) and len(rows) == 4
    v["remapped_rows_correctable"] = int(rows[0]) if ok_rows else None
    v["remapped_rows_uncorrectable"] = int(rows[1]) if ok_rows else None
    v["remapped_rows_pending"] = bool(rows[2]) if ok_rows else None
    v["remapped_rows_failure"] = bool(rows[3]) if ok_rows else None
    if not ok_rows:
        reason = r.unavailable.pop("remapped_rows", "unexpected answer from nvmlDeviceGetRemappedRows")
        for name in ("correctable", "uncorrectable", "pending", "failure"):
            r.unavailable[f"remapped_rows_{name}"] = reason
    else:
        r.unavailable.pop("remapped_rows", None)


class TelemetrySampler:
    """Reads snapshots through an `Nvml`; keeps the one-time reads and the previous tick (for rates).

    `slow_every_ticks`: SLOW_FIELDS are read on the first tick and every this many ticks after (1 = every tick);
    between, they carry the last value read.
    """

    def __init__(self, nvml: Nvml, *, slow_every_ticks: int = DEFAULT_SLOW_EVERY_TICKS) -> None:
        self.nvml = nvml
        self.slow_every_ticks = slow_every_ticks
        self._static: dict[int, _GpuStatic] = {}
        self._pairs: tuple[GpuPairSnapshot, ...] = ()
        self._system: NvmlSystemInfo | None = None
        self._previous: TelemetrySnapshot | None = None
        self._tick = 0
        self._nvlink_seen: dict[int, dict[tuple[int, int], tuple[int, int, float]]] = {}
        """GPU → (field, link) → (KiB, NVML's µs time stamp, monotonic s) of the last tick: the rates' start."""

    @property
    def previous(self) -> TelemetrySnapshot | None:
        """The last snapshot taken."""
        return self._previous

    def sample(self, *, processes: bool = True, processes_note: str = "") -> TelemetrySnapshot:
        """Read every GPU once. `processes=False` skips the costly process lists (say why in `processes_note`)."""
        self._tick += 1
        now_mono = time.monotonic()
        now_unix = time.time()
        status = self.nvml.status()
        if not status.available:
            snap = TelemetrySnapshot(
                tick=self._tick,
                taken_at_unix_s=now_unix,
                monotonic_s=now_mono,
                source=status.source,
                nvml_available=False,
                nvml_reason=status.reason,
                system=NvmlSystemInfo(None, None, None, 0),
                gpus=(),
                pairs=(),
                processes_sampled=False,
                processes_note="NVML unavailable",
                tick_cost_s=0.0,
                tick_cost_per_gpu_s=0.0,
                static_cost_s=0.0,
                nvml_calls=0,
            )
            self._previous = snap
            return snap

        static_start = time.perf_counter()
        static_calls = 0
        if self._system is None:
            self._system, static_calls = self._read_system()
        count = self._system.device_count
        for index in range(count):
            if index not in self._static:
                static, calls = self._read_static(index)
                self._static[index] = static
                static_calls += calls
        if not self._pairs and count > 1:
            self._pairs, calls = self._read_pairs(count)
            static_calls += calls
        static_cost = time.perf_counter() - static_start if static_calls else 0.0

        if not processes and not processes_note:
            processes_note = "process lists not read this tick"
        tick_start = time.perf_counter()
        calls = 0
        gpus: list[GpuSnapshot] = []
        for index in range(count):
            snap_gpu, gpu_calls = self._read_gpu(
                index, processes=processes, processes_note=processes_note, now=now_mono
            )
            gpus.append(snap_gpu)
            calls += gpu_calls
        tick_cost = time.perf_counter() - tick_start
        snap = TelemetrySnapshot(
            tick=self._tick,
            taken_at_unix_s=now_unix,
            monotonic_s=now_mono,
            source=status.source,
            nvml_available=True,
            nvml_reason="",
            system=self._system,
            gpus=tuple(gpus),
            pairs=self._pairs,
            processes_sampled=processes,
            processes_note="" if processes else processes_note,
            tick_cost_s=tick_cost,
            tick_cost_per_gpu_s=tick_cost / count if count else 0.0,
            static_cost_s=static_cost,
            nvml_calls=calls + static_calls,
        )
        self._previous = snap
        return snap

    # one-time reads ------------------------------------------------------------------------------------------

    def _read_system(self) -> tuple[NvmlSystemInfo, int]:
        r = _Reads(self.nvml)
        driver = r.raw("driver_version", "nvmlSystemGetDriverVersion")
        cuda = r.int_("cuda_driver_version", "nvmlSystemGetCudaDriverVersion")
        nvml_version = r.raw("nvml_version", "nvmlSystemGetNVMLVersion")
        count = r.int_("device_count", "nvmlDeviceGetCount") or 0
        cuda_text = f"{cuda // 1000}.{(cuda % 1000) // 10}" if cuda is not None else None  # healthchecks N1
        info = NvmlSystemInfo(
            driver_version=str(driver) if driver is not None else None,
            cuda_driver_version=cuda_text,
            nvml_version=str(nvml_version) if nvml_version is not None else None,
            device_count=count,
        )
        return info, r.calls

    def _read_static(self, index: int) -> tuple[_GpuStatic, int]:
        r = _Reads(self.nvml)
        g = GpuRef(index)
        v: dict[str, Any] = {}
        name = r.raw("name", "nvmlDeviceGetName", g)
        v["name"] = str(name) if name is not None else None
        uuid = r.raw("uuid", "nvmlDeviceGetUUID", g)
        v["uuid"] = str(uuid) if uuid is not None else None
        pci = r.raw("pci_bus_id", "nvmlDeviceGetPciInfo", g)
        bus_id = _as_dict(pci).get("busId")
        v["pci_bus_id"] = normalize_bus_id(str(bus_id)) if bus_id else None
        if pci is not None and not bus_id:
            r.unavailable["pci_bus_id"] = "no busId in nvmlDeviceGetPciInfo"
        v["minor_number"] = r.int_("minor_number", "nvmlDeviceGetMinorNumber", g)
        cc = r.raw("compute_capability", "nvmlDeviceGetCudaComputeCapability", g)
        v["compute_capability"] = f"{cc[0]}.{cc[1]}" if isinstance(cc, list) and len(cc) == 2 else None
        v["sm_clock_max_mhz"] = r.int_("sm_clock_max_mhz", "nvmlDeviceGetMaxClockInfo", g, NVML_CLOCK_SM)
        v["mem_clock_max_mhz"] = r.int_("mem_clock_max_mhz", "nvmlDeviceGetMaxClockInfo", g, NVML_CLOCK_MEM)
        v["default_app_sm_clock_mhz"] = r.int_(
            "default_app_sm_clock_mhz", "nvmlDeviceGetDefaultApplicationsClock", g, NVML_CLOCK_SM
        )
        v["default_app_mem_clock_mhz"] = r.int_(
            "default_app_mem_clock_mhz", "nvmlDeviceGetDefaultApplicationsClock", g, NVML_CLOCK_MEM
        )
        v["pcie_gen_max"] = r.int_("pcie_gen_max", "nvmlDeviceGetMaxPcieLinkGeneration", g)
        v["pcie_gen_gpu_max"] = r.int_("pcie_gen_gpu_max", "nvmlDeviceGetGpuMaxPcieLinkGeneration", g)
        v["pcie_width_max"] = r.int_("pcie_width_max", "nvmlDeviceGetMaxPcieLinkWidth", g)
        v["power_limit_default_w"] = _mw_to_w(
            r.int_("power_limit_default_w", "nvmlDeviceGetPowerManagementDefaultLimit", g)
        )
        v["memory_bus_width_bits"] = r.int_("memory_bus_width_bits", "nvmlDeviceGetMemoryBusWidth", g)
        v["clock_event_supported_mask"] = r.first_int(
            "clock_event_supported_mask",
            ("nvmlDeviceGetSupportedClocksEventReasons", "nvmlDeviceGetSupportedClocksThrottleReasons"),
            g,
        )
        words = r.raw("cpu_affinity", "nvmlDeviceGetCpuAffinity", g, CPU_SET_WORDS)
        v["cpu_affinity"] = cpus_from_affinity(words) if isinstance(words, list) else None
        v["numa_node_id"] = r.int_("numa_node_id", "nvmlDeviceGetNumaNodeId", g)
        # NVLink: the indices this GPU answers for (N10). The link-count field bounds the scan where it works.
        fields = r.raw("nvlink_links", "nvmlDeviceGetFieldValues", g, (NVML_FI_DEV_NVLINK_LINK_COUNT,))
        link_count: int | None = None
        if isinstance(fields, list) and fields:
            entry = _as_dict(fields[0])
            if entry.get("nvmlReturn") == _NVML_SUCCESS:
                link_count = _int_or_none(entry.get("value"))
        indices: list[int] = []
        for link in range(link_count if link_count is not None else NVML_NVLINK_MAX_LINKS):
            r.calls += 1
            state = self.nvml.query("nvmlDeviceGetNvLinkState", g, link)
            if isinstance(state, int):
                indices.append(link)
        unavailable = dict(r.unavailable)
        if indices or link_count == 0:
            unavailable.pop("nvlink_links", None)
        else:
            unavailable["nvlink_links"] = "no NVLink link answered (no NVLink on this GPU)"
        v["nvlink_links"] = len(indices) if (indices or link_count == 0) else None
        return _GpuStatic(v, unavailable, tuple(indices)), r.calls

    def _read_pairs(self, count: int) -> tuple[tuple[GpuPairSnapshot, ...], int]:
        pairs: list[GpuPairSnapshot] = []
        calls = 0
        for a in range(count):
            for b in range(a + 1, count):
                r = _Reads(self.nvml)
                level = r.int_("topology_level", "nvmlDeviceGetTopologyCommonAncestor", GpuRef(a), GpuRef(b))
                status: dict[str, int | None] = {}
                for cap, idx in P2P_CAPS:
                    status[cap] = r.int_(f"p2p_{cap}", "nvmlDeviceGetP2PStatus", GpuRef(a), GpuRef(b), idx)
                pairs.append(
                    GpuPairSnapshot(
                        gpu_a=a,
                        gpu_b=b,
                        topology_level=level,
                        topology_name=TOPOLOGY_NAMES.get(level, f"level {level}") if level is not None else None,
                        p2p_status=status,
                        unavailable=dict(r.unavailable),
                    )
                )
                calls += r.calls
        return tuple(pairs), calls

    # per-tick reads ------------------------------------------------------------------------------------------

    def _read_gpu(self, index: int, *, processes: bool, processes_note: str, now: float) -> tuple[GpuSnapshot, int]:
        """One GPU's snapshot for this tick (fast fields every tick, admin settings every `slow_every_ticks`), and
        the number of NVML calls it took."""
        start = time.perf_counter()
        static = self._static[index]
        r = _Reads(self.nvml)
        g = GpuRef(index)
        v: dict[str, Any] = dict(static.values)
        _read_clocks_power_memory(r, g, v)
        _read_memory_health(r, g, v)
        prev = self._previous.gpu(index) if self._previous is not None else None
        if prev is None or self.slow_every_ticks <= 1 or (self._tick - 1) % self.slow_every_ticks == 0:
            self._read_slow(r, g, v)
        else:  # settings that change only by an admin's hand: carried from the last tick that read them
            for name in SLOW_FIELDS:
                v[name] = getattr(prev, name)
                if name in prev.unavailable:
                    r.unavailable[name] = prev.unavailable[name]
        self._read_nvlink(r, g, v, static)
        self._read_nvlink_traffic(r, g, v, static, now)
        # Counters in one batched call: PCIe bytes and the clock-event reason times.
        self._read_counters(r, g, v, now)
        # Processes (costly: MangoHud PR #2104, docs/reference/peers.md §3.8)
        if processes:
            v["processes"], v["processes_note"] = self._read_processes(r, g)
        else:
            v["processes"] = None
            v["processes_note"] = processes_note
        unavailable = dict(static.unavailable)
        unavailable.update(r.unavailable)
        for key, value in v.items():
            if value is not None and value != {}:
                unavailable.pop(key, None)
        snap = GpuSnapshot(
            index=index,
            sample_cost_s=time.perf_counter() - start,
            unavailable=unavailable,
            **v,
        )
        return snap, r.calls

    def _read_nvlink(self, r: _Reads, g: GpuRef, v: dict[str, Any], static: _GpuStatic) -> None:
        """Active NVLink links (N10): each link's state; no link is 0 only where the GPU said it has none."""
        if static.nvlink_indices:
            active = 0
            for link in static.nvlink_indices:
                r.calls += 1
                state = self.nvml.query("nvmlDeviceGetNvLinkState", g, link)
                active += int(isinstance(state, int) and state == 1)
            v["nvlink_active_links"] = active
        else:
            v["nvlink_active_links"] = 0 if static.values.get("nvlink_links") == 0 else None
            if v["nvlink_active_links"] is None:
                r.unavailable["nvlink_active_links"] = static.unavailable.get("nvlink_links", "no NVLink")

    def _read_nvlink_traffic(self, r: _Reads, g: GpuRef, v: dict[str, Any], static: _GpuStatic, now: float) -> None:
        """Each link's TX and RX data counters in one field-values call (the link as the field's scope), and their
        rates since the last tick; "n/a" with the reason where the GPU has no NVLink or the driver no counters."""
        names = ("nvlink_tx_bytes_per_s", "nvlink_rx_bytes_per_s", "nvlink_tx_kib_total", "nvlink_rx_kib_total")
        for name in names:
            v[name] = {}
        if not static.nvlink_indices:
            why = "no NVLink on this GPU" if static.values.get("nvlink_links") == 0 else None
            for name in names:
                r.unavailable[name] = why or static.unavailable.get("nvlink_links", "no NVLink")
            return
        fids = (NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX)
        fields = tuple((fid, link) for link in static.nvlink_indices for fid in fids)
        entries = r.raw("nvlink_traffic", "nvmlDeviceGetFieldValues", g, fields)
        why = r.unavailable.pop("nvlink_traffic", "")
        seen: dict[tuple[int, int], tuple[int, int, float]] = {}
        for entry in entries if isinstance(entries, list) else []:
            d = _as_dict(entry)
            key = (_int_or_none(d.get("fieldId")), _int_or_none(d.get("scopeId")))
            value = d.get("value")
            if d.get("nvmlReturn") != _NVML_SUCCESS or not isinstance(value, (int, float)) or key not in fields:
                why = why or error_reason(_int_or_none(d.get("nvmlReturn")) or -1)
                continue
            seen[(int(key[0] or 0), int(key[1] or 0))] = (int(value), _int_or_none(d.get("timestamp")) or 0, now)
        before, self._nvlink_seen[g.index] = self._nvlink_seen.get(g.index, {}), seen
        if not seen:
            for name in names:
                r.unavailable[name] = f"NVLink throughput counters: {why or 'no answer'}"
            return
        for fid, total, rate in (
            (fids[0], "nvlink_tx_kib_total", "nvlink_tx_bytes_per_s"),
            (fids[1], "nvlink_rx_kib_total", "nvlink_rx_bytes_per_s"),
        ):
            v[total] = {link: kib for (f, link), (kib, _, _) in seen.items() if f == fid}
            v[rate] = {
                link: bps
                for (f, link), now_seen in seen.items()
                if f == fid and (bps := _link_rate(before.get((f, link)), now_seen)) is not None
            }
            if not v[rate]:
                r.unavailable[rate] = "first tick: no rate yet" if not before else "the counters went back (reset)"

    def _read_processes(self, r: _Reads, g: GpuRef) -> tuple[tuple[GpuProcess, ...], str]:
        """The compute and graphics processes on the GPU with their memory and SM share, and why a list is
        missing."""
        procs: list[GpuProcess] = []
        notes: list[str] = []
        for kind, fn in (
            ("compute", "nvmlDeviceGetComputeRunningProcesses"),
            ("graphics", "nvmlDeviceGetGraphicsRunningProcesses"),
        ):
            r.calls += 1
            listed = self.nvml.query(fn, g)
            if isinstance(listed, NA):
                notes.append(f"{kind}: {listed.reason}")
                continue
            for p in listed if isinstance(listed, list) else []:
                d = _as_dict(p)
                pid = _int_or_none(d.get("pid"))
                if pid is not None:
                    procs.append(GpuProcess(pid, _int_or_none(d.get("usedGpuMemory")), kind))
        if procs:
            sm_by_pid = self._sm_util_by_pid(r, g)
            procs = [dataclasses.replace(p, sm_util_pct=sm_by_pid.get(p.pid)) for p in procs]
        return tuple(procs), "; ".join(notes)

    def _sm_util_by_pid(self, r: _Reads, g: GpuRef) -> dict[int, int]:
        """Each process's newest SM utilisation sample."""
        # lastSeenTimeStamp 0: every sample in the driver's buffer; the newest per pid is kept
        r.calls += 1
        samples = self.nvml.query("nvmlDeviceGetProcessUtilization", g, 0)
        sm_by_pid: dict[int, int] = {}
        newest: dict[int, int] = {}
        for sample in samples if isinstance(samples, list) else []:
            d = _as_dict(sample)
            pid, stamp, sm = (_int_or_none(d.get(k)) for k in ("pid", "timeStamp", "smUtil"))
            if pid is not None and sm is not None and (stamp or 0) >= newest.get(pid, -1):
                newest[pid], sm_by_pid[pid] = stamp or 0, sm
        return sm_by_pid

    def _read_slow(self, r: _Reads, g: GpuRef, v: dict[str, Any]) -> None:
        """The SLOW_FIELDS: application clocks, power-management limit, ECC mode, retired-page pending, persistence."""
        v["app_sm_clock_mhz"] = r.int_("app_sm_clock_mhz", "nvmlDeviceGetApplicationsClock", g, NVML_CLOCK_SM)
        v["app_mem_clock_mhz"] = r.int_("app_mem_clock_mhz", "nvmlDeviceGetApplicationsClock", g, NVML_CLOCK_MEM)
        v["power_limit_w"] = _mw_to_w(r.int_("power_limit_w", "nvmlDeviceGetPowerManagementLimit", g))
        ecc = r.raw("ecc_enabled", "nvmlDeviceGetEccMode", g)
        ok_ecc = isinstance(ecc, list) and len(ecc) == 2
        v["ecc_enabled"] = bool(ecc[0]) if ok_ecc else None
        v["ecc_pending_enabled"] = bool(ecc[1]) if ok_ecc else None
        if ecc is None:
            r.unavailable["ecc_pending_enabled"] = r.unavailable["ecc_enabled"]
        pending = r.int_("retired_pages_pending", "nvmlDeviceGetRetiredPagesPendingStatus", g)
        v["retired_pages_pending"] = bool(pending) if pending is not None else None
        persistence = r.int_("persistence_mode", "nvmlDeviceGetPersistenceMode", g)
        v["persistence_mode"] = bool(persistence) if persistence is not None else None

    def _read_counters(self, r: _Reads, g: GpuRef, v: dict[str, Any], now: float) -> None:
        """The batched counters (PCIe bytes, clock-event reason times) and their rates since the last tick."""
        values, moduli, v["counters_timestamp_us"], reason = _read_field_counters(r, g)
        times = {name: values[fid] for name, fid in _COUNTER_FIELDS if fid in values}
        v["clock_event_time_ns"] = times
        if not times:
            r.unavailable["clock_event_time_ns"] = reason or "counters not supported on this GPU or driver"
        v["pcie_tx_bytes_total"] = values.get(NVML_FI_DEV_PCIE_COUNT_TX_BYTES)
        v["pcie_rx_bytes_total"] = values.get(NVML_FI_DEV_PCIE_COUNT_RX_BYTES)
        prev = self._previous.gpu(g.index) if self._previous is not None else None
        dt = now - self._previous.monotonic_s if self._previous is not None else 0.0
        if prev is not None and prev.counters_timestamp_us and v["counters_timestamp_us"]:
            dt = (v["counters_timestamp_us"] - prev.counters_timestamp_us) / 1e6  # NVML's own clock, µs
        share: dict[str, float] = {}
        tx_rate: float | None = None
        rx_rate: float | None = None
        rate_source = ""
        if prev is not None and dt > 0:
            for name, ns in times.items():
                before = prev.clock_event_time_ns.get(name)
                if before is not None and ns >= before:
                    share[name] = min(1.0, (ns - before) / (dt * 1e9))
            tx_rate = _rate(
                prev.pcie_tx_bytes_total, v["pcie_tx_bytes_total"], dt, moduli.get(NVML_FI_DEV_PCIE_COUNT_TX_BYTES, 0)
            )
            rx_rate = _rate(
                prev.pcie_rx_bytes_total, v["pcie_rx_bytes_total"], dt, moduli.get(NVML_FI_DEV_PCIE_COUNT_RX_BYTES, 0)
            )
            if tx_rate is not None or rx_rate is not None:
                rate_source = "counters"
        if v["pcie_tx_bytes_total"] is None and v["pcie_rx_bytes_total"] is None:
            # Fallback: nvmlDeviceGetPcieThroughput samples a 20 ms window per call (nvml.h), so it is costly.
            tx = r.int_("pcie_tx_bytes_per_s", "nvmlDeviceGetPcieThroughput", g, NVML_PCIE_UTIL_TX_BYTES)
            rx = r.int_("pcie_rx_bytes_per_s", "nvmlDeviceGetPcieThroughput", g, NVML_PCIE_UTIL_RX_BYTES)
            tx_rate = tx * PCIE_THROUGHPUT_UNIT_BYTES if tx is not None else None
            rx_rate = rx * PCIE_THROUGHPUT_UNIT_BYTES if rx is not None else None
            rate_source = "sampled" if tx_rate is not None or rx_rate is not None else ""
            r.unavailable.setdefault("pcie_tx_bytes_total", reason or "PCIe byte counters not supported")
            r.unavailable.setdefault("pcie_rx_bytes_total", reason or "PCIe byte counters not supported")
        elif prev is None:
            r.unavailable["pcie_tx_bytes_per_s"] = r.unavailable["pcie_rx_bytes_per_s"] = "first tick: no rate yet"
        v["pcie_tx_bytes_per_s"] = tx_rate
        v["pcie_rx_bytes_per_s"] = rx_rate
        v["pcie_rate_source"] = rate_source
        v["pcie_rate_is_lower_bound"] = rate_source == "counters" and any(
            moduli.get(fid) == _UINT32_MODULUS
            for fid in (NVML_FI_DEV_PCIE_COUNT_TX_BYTES, NVML_FI_DEV_PCIE_COUNT_RX_BYTES)
        )
        v["clock_event_share"] = share


def _read_field_counters(r: _Reads, g: GpuRef) -> tuple[dict[int, int], dict[int, int], int | None, str]:
    """One nvmlDeviceGetFieldValues call: the counters that answered by field id, each one's wrap modulus, the newest
    time stamp among them (µs, NVML's clock) and why the call failed ("" when it answered)."""
    values: dict[int, int] = {}
    moduli: dict[int, int] = {}
    entries = r.raw("counters", "nvmlDeviceGetFieldValues", g, _FIELD_IDS)
    reason = r.unavailable.pop("counters", "")
    stamps: list[int] = []
    for entry in entries if isinstance(entries, list) else []:
        d = _as_dict(entry)
        fid = _int_or_none(d.get("fieldId"))
        value = d.get("value")
        if fid is not None and d.get("nvmlReturn") == _NVML_SUCCESS and isinstance(value, (int, float)):
            values[fid] = int(value)
            moduli[fid] = _COUNTER_MODULUS.get(_int_or_none(d.get("valueType")) or 0, 0)
            stamp = _int_or_none(d.get("timestamp"))
            if stamp:
                stamps.append(stamp)
    return values, moduli, (max(stamps) if stamps else None), reason


def _link_rate(before: tuple[int, int, float] | None, after: tuple[int, int, float]) -> float | None:
    """Bytes per second of one NVLink counter between two ticks: KiB over NVML's own time stamps (µs), the ticks'
    monotonic times where the driver gave none. A 64-bit counter never wraps in practice; one that went back was
    reset (None)."""
    if before is None:
        return None
    dt_s = (after[1] - before[1]) / 1e6 if after[1] and before[1] else after[2] - before[2]
    rate = _rate(before[0], after[0], dt_s)
    return None if rate is None else rate * NVLINK_THROUGHPUT_UNIT_BYTES


def _rate(before: int | None, after: int | None, dt_s: float, modulus: int = 0) -> float | None:
    """Bytes per second between two counter readings.

    A counter that went back wrapped when it is 32-bit (`modulus` 2**32: count the wrap once), else it was reset
    (None: no rate this tick).
    """
    if before is None or after is None or dt_s <= 0:
        return None
    if after < before:
        if modulus != _UINT32_MODULUS:
            return None
        after += modulus
    return (after - before) / dt_s
