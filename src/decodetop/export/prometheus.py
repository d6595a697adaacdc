"""Provides decodetop's Prometheus exposition: a custom collector over the latest snapshots, an HTTP server on its
own registry, and the node_exporter textfile for `decodetop check`.

Names follow Prometheus conventions: a `decodetop_` prefix, base units (`_seconds`, `_bytes`, `_hertz`, `_watts`,
`_celsius`, `_bytes_per_second`, `_ratio` for 0–1), `_total` on counters, `_info` on constant-1 series that carry
labels, and a `gpu` label with the NVML index. Values are converted from decodetop's own units (MHz, µs, GB/s, %)
on the way out. Nothing here reads hardware: the collector renders whatever `ExportState` the caller's state
provider returns at scrape time, so the exporter command and the TUI serve the same thing.

Every part of the state (telemetry, probes, budget, checks, observed step) is rendered on its own: a part that
fails to render is left out of that scrape and counted in `decodetop_exporter_render_errors_total{part}`; a scrape
never fails.

    handle = start_metrics_server("127.0.0.1:9464", box)   # box: StateBox, or any () -> ExportState
    ...
    handle.close()
"""

from __future__ import annotations

import datetime as dt
import logging
import math
import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from decodetop import __version__
from decodetop.atomic import write_text_atomic
from decodetop.collectors.checks.model import CheckResult, Status, exit_code
from decodetop.errors import DecodetopError, UserInputError

log = logging.getLogger(__name__)

PREFIX = "decodetop_"
DEFAULT_LISTEN = "127.0.0.1:9464"
"""9464 is the port OpenTelemetry's Prometheus exporter uses by default; loopback unless told otherwise (AGENTS.md)."""
PARTS: tuple[str, ...] = ("telemetry", "probes", "budget", "checks", "observed")

_NAME_BAD = re.compile(r"[^a-zA-Z0-9_]")
_MHZ_TO_HZ = 1e6
_PCT_TO_RATIO = 0.01
_NS_TO_S = 1e-9
_GB_TO_BYTES = 1e9
"""probes.md §1: algbw/busbw in GB/s as nccl-tests prints them, decimal (1e9 bytes)."""


# --- state ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ExportState:
    """What one scrape renders: the latest of everything, as the TUI or the exporter command holds it.

    Types are the other packages' dataclasses (`collectors.telemetry.TelemetrySnapshot`, `probes.results.
    ProbeResult`, the budget, `CheckResult`, `collectors.serving.ObservedStep`/`ServerStatus`); the collector reads
    them by attribute, so a part that is None or empty is simply absent from the exposition.
    """

    telemetry: Any | None = None
    probe_results: tuple[Any, ...] = ()
    budget: Any | None = None
    checks: tuple[CheckResult, ...] = ()
    checks_unix_s: float | None = None
    """When the checks ran (wall clock)."""
    observed: Any | None = None
    """The live server's step (`ObservedStep`) or why there is none (`ServerStatus`)."""
    probe_interval_s: float | None = None
    """The exporter's probe schedule, when it has one."""
    notes: Mapping[str, str] = field(default_factory=dict)
    """Part → one line about its last failure (e.g. "probes": "probe group failed to start: ...")."""


class StateBox:
    """A thread-safe holder of the current `ExportState`; calling it returns the state (a state provider)."""

    def __init__(self, state: ExportState | None = None) -> None:
        self._lock = threading.Lock()
        self._state = state or ExportState()

    def __call__(self) -> ExportState:
        with self._lock:
            return self._state

    def update(self, **changes: Any) -> ExportState:
        """Replace some fields (dataclasses.replace) atomically; returns the new state."""
        with self._lock:
            self._state = replace(self._state, **changes)
            return self._state

    def add_probe_result(self, result: Any) -> ExportState:
        """Keep the latest result per probe name."""
        with self._lock:
            name = getattr(result, "probe", None)
            kept = tuple(r for r in self._state.probe_results if getattr(r, "probe", None) != name)
            self._state = replace(self._state, probe_results=(*kept, result))
            return self._state


StateProvider = Callable[[], ExportState]


# --- family building -----------------------------------------------------------------------------------------


class _Family:
    """One metric family being filled; drops None/non-finite values and repeated label sets."""

    def __init__(self, kind: str, name: str, doc: str, labels: Sequence[str]) -> None:
        self.kind = kind
        self.name = name
        self.doc = doc
        self.labels = tuple(labels)
        self.samples: list[tuple[tuple[str, ...], float]] = []
        self._seen: set[tuple[str, ...]] = set()

    def add(self, labels: Sequence[object], value: float | int | bool | None) -> None:
        if value is None:
            return
        number = float(value)
        if not math.isfinite(number):
            return
        key = tuple("" if v is None else str(v) for v in labels)
        if len(key) != len(self.labels):
            raise ValueError(f"{self.name}: {len(key)} label values for {len(self.labels)} labels")
        if key in self._seen:
            return
        self._seen.add(key)
        self.samples.append((key, number))

    def build(self) -> Any:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        family: Any
        if self.kind == "counter":
            family = CounterMetricFamily(self.name, self.doc, labels=self.labels)
        else:
            family = GaugeMetricFamily(self.name, self.doc, labels=self.labels)
        for key, value in self.samples:
            family.add_metric(list(key), value)
        return family


class _Out:
    """The families of one part, by name, in first-use order."""

    def __init__(self) -> None:
        self.families: dict[str, _Family] = {}

    def gauge(self, name: str, doc: str, labels: Sequence[str] = ()) -> _Family:
        return self._family("gauge", name, doc, labels)

    def counter(self, name: str, doc: str, labels: Sequence[str] = ()) -> _Family:
        """`name` without `_total`; the exposition adds it."""
        return self._family("counter", name, doc, labels)

    def _family(self, kind: str, name: str, doc: str, labels: Sequence[str]) -> _Family:
        full = PREFIX + _NAME_BAD.sub("_", name)
        family = self.families.get(full)
        if family is None:
            family = self.families[full] = _Family(kind, full, doc, labels)
        elif family.kind != kind or family.labels != tuple(labels):
            raise ValueError(f"{full} declared twice with different type or labels")
        return family

    def built(self) -> list[Any]:
        return [f.build() for f in self.families.values() if f.samples]


def _num(obj: Any, attr: str) -> float | None:
    value = getattr(obj, attr, None)
    if isinstance(value, bool):
        return 1.0 if value else 0.0
    if isinstance(value, (int, float)):
        return float(value)
    return None


def _scaled(value: float | None, scale: float) -> float | None:
    return None if value is None else value * scale


# --- telemetry -----------------------------------------------------------------------------------------------

# (attribute of GpuSnapshot, metric name, help, scale to the base unit)
_GPU_GAUGES: tuple[tuple[str, str, str, float], ...] = (
    ("sm_clock_mhz", "gpu_sm_clock_hertz", "SM clock now.", _MHZ_TO_HZ),
    ("sm_clock_max_mhz", "gpu_sm_clock_max_hertz", "Highest SM clock the GPU allows.", _MHZ_TO_HZ),
    ("mem_clock_mhz", "gpu_memory_clock_hertz", "Memory clock now.", _MHZ_TO_HZ),
    ("mem_clock_max_mhz", "gpu_memory_clock_max_hertz", "Highest memory clock the GPU allows.", _MHZ_TO_HZ),
    ("app_sm_clock_mhz", "gpu_applications_sm_clock_hertz", "Applications SM clock setting.", _MHZ_TO_HZ),
    ("app_mem_clock_mhz", "gpu_applications_memory_clock_hertz", "Applications memory clock setting.", _MHZ_TO_HZ),
    ("performance_state", "gpu_performance_state", "P-state: 0 is P0 (max performance) ... 15; 32 unknown.", 1.0),
    ("pcie_gen", "gpu_pcie_link_generation", "PCIe link generation now.", 1.0),
    ("pcie_gen_max", "gpu_pcie_link_generation_max", "Highest PCIe generation of slot, riser and GPU.", 1.0),
    ("pcie_gen_gpu_max", "gpu_pcie_link_generation_gpu_max", "Highest PCIe generation of the GPU alone.", 1.0),
    ("pcie_width", "gpu_pcie_link_width_lanes", "PCIe link width now.", 1.0),
    ("pcie_width_max", "gpu_pcie_link_width_max_lanes", "Widest PCIe link possible.", 1.0),
    ("pcie_tx_bytes_per_s", "gpu_pcie_tx_bytes_per_second", "PCIe transmit throughput over the last tick.", 1.0),
    ("pcie_rx_bytes_per_s", "gpu_pcie_rx_bytes_per_second", "PCIe receive throughput over the last tick.", 1.0),
    ("power_w", "gpu_power_watts", "Power draw.", 1.0),
    ("power_limit_enforced_w", "gpu_power_limit_enforced_watts", "Power limit the GPU enforces.", 1.0),
    ("power_limit_w", "gpu_power_limit_watts", "Power-management limit currently set.", 1.0),
    ("power_limit_default_w", "gpu_power_limit_default_watts", "Default power-management limit.", 1.0),
    ("temperature_c", "gpu_temperature_celsius", "GPU core temperature.", 1.0),
    ("gpu_util_pct", "gpu_utilization_ratio", "Share of time a kernel ran (NVML utilization.gpu).", _PCT_TO_RATIO),
    ("mem_util_pct", "gpu_memory_busy_ratio", "Share of time device memory was read or written.", _PCT_TO_RATIO),
    ("mem_total_bytes", "gpu_memory_total_bytes", "Device memory.", 1.0),
    ("mem_used_bytes", "gpu_memory_used_bytes", "Device memory in use.", 1.0),
    ("mem_free_bytes", "gpu_memory_free_bytes", "Device memory free.", 1.0),
    ("nvlink_links", "gpu_nvlink_links", "NVLink links present.", 1.0),
    ("nvlink_active_links", "gpu_nvlink_active_links", "NVLink links up.", 1.0),
    ("ecc_enabled", "gpu_ecc_enabled", "1 if ECC is on.", 1.0),
    ("ecc_pending_enabled", "gpu_ecc_pending_enabled", "1 if ECC will be on after the next reset.", 1.0),
    ("persistence_mode", "gpu_persistence_mode", "1 if persistence mode is on.", 1.0),
    ("retired_pages_pending", "gpu_retired_pages_pending", "1 if a page retirement waits for a reset.", 1.0),
    ("remapped_rows_correctable", "gpu_remapped_rows_correctable", "Rows remapped for correctable errors.", 1.0),
    ("remapped_rows_uncorrectable", "gpu_remapped_rows_uncorrectable", "Rows remapped for uncorrectable errors.", 1.0),
    ("remapped_rows_pending", "gpu_remapped_rows_pending", "1 if a row remap waits for a reset.", 1.0),
    ("remapped_rows_failure", "gpu_remapped_rows_failure", "1 if a row remap failed.", 1.0),
    ("numa_node_id", "gpu_numa_node", "NUMA node NVML places the GPU on.", 1.0),
)
_GPU_COUNTERS: tuple[tuple[str, str, str], ...] = (
    ("pcie_tx_bytes_total", "gpu_pcie_tx_bytes", "PCIe bytes transmitted since driver load."),
    ("pcie_rx_bytes_total", "gpu_pcie_rx_bytes", "PCIe bytes received since driver load."),
    ("pcie_replay_count", "gpu_pcie_replays", "PCIe replays (link-level retransmissions)."),
)
_ECC_FIELDS: tuple[tuple[str, str, str], ...] = (
    ("ecc_corrected_volatile", "corrected", "volatile"),
    ("ecc_uncorrected_volatile", "uncorrected", "volatile"),
    ("ecc_corrected_aggregate", "corrected", "aggregate"),
    ("ecc_uncorrected_aggregate", "uncorrected", "aggregate"),
)


def _known_clock_reasons() -> tuple[str, ...]:
    try:
        from decodetop.collectors.telemetry import CLOCK_EVENT_REASONS
    except ImportError:  # the telemetry module is optional to the exporter's tests
        return ()
    return tuple(str(r.name) for r in CLOCK_EVENT_REASONS)


def _render_telemetry(snap: Any, out: _Out) -> None:
    g = "gpu"
    up = out.gauge("nvml_up", "1 if NVML answered on the last telemetry tick.")
    up.add([], _num(snap, "nvml_available"))
    source = getattr(snap, "source", None)
    if source is not None:
        out.gauge(
            "telemetry_source_info", "Where telemetry comes from (nvml, a fake recording, none).", ["source"]
        ).add([source], 1)
    out.gauge("telemetry_last_tick_timestamp_seconds", "Unix time of the last telemetry tick.").add(
        [], _num(snap, "taken_at_unix_s")
    )
    out.gauge("telemetry_tick_cost_seconds", "Wall time of the last tick's NVML reads, all GPUs.").add(
        [], _num(snap, "tick_cost_s")
    )
    out.gauge("telemetry_nvml_calls", "NVML calls made on the last tick.").add([], _num(snap, "nvml_calls"))
    system = getattr(snap, "system", None)
    if system is not None:
        driver = getattr(system, "driver_version", None)
        cuda = getattr(system, "cuda_driver_version", None)
        if driver or cuda:
            out.gauge(
                "nvml_driver_info", "NVIDIA driver and its CUDA version.", ["driver_version", "cuda_version"]
            ).add([driver or "", cuda or ""], 1)
    gpus = tuple(getattr(snap, "gpus", ()) or ())
    out.gauge("gpus", "GPUs NVML sees.").add([], len(gpus))
    known_reasons = _known_clock_reasons()
    for gpu in gpus:
        index = getattr(gpu, "index", None)
        if index is None:
            continue
        label = str(index)
        out.gauge(
            "gpu_info",
            "Identity of each GPU (value 1).",
            [g, "name", "uuid", "pci_bus_id", "compute_capability"],
        ).add(
            [
                label,
                getattr(gpu, "name", None) or "",
                getattr(gpu, "uuid", None) or "",
                getattr(gpu, "pci_bus_id", None) or "",
                getattr(gpu, "compute_capability", None) or "",
            ],
            1,
        )
        for attr, name, doc, scale in _GPU_GAUGES:
            out.gauge(name, doc, [g]).add([label], _scaled(_num(gpu, attr), scale))
        for attr, name, doc in _GPU_COUNTERS:
            out.counter(name, doc, [g]).add([label], _num(gpu, attr))
        for attr, kind, scope in _ECC_FIELDS:
            out.counter(
                "gpu_ecc_errors",
                "ECC errors by type; volatile since driver load, aggregate over the GPU's life.",
                [g, "type", "scope"],
            ).add([label, kind, scope], _num(gpu, attr))
        mask = getattr(gpu, "clock_event_mask", None)
        active = set(getattr(gpu, "clock_event_reasons", ()) or ())
        if isinstance(mask, int):
            reasons = list(known_reasons) + sorted(active - set(known_reasons))
            for reason in reasons:
                out.gauge(
                    "gpu_clock_event_reason_active",
                    "1 while this clock-event (throttle) reason holds the clocks (healthchecks.md N3).",
                    [g, "reason"],
                ).add([label, reason], 1 if reason in active else 0)
        for reason, ns in dict(getattr(gpu, "clock_event_time_ns", {}) or {}).items():
            if isinstance(ns, (int, float)):
                out.counter(
                    "gpu_clock_event_seconds",
                    "Time spent with each clock-event reason since driver load, in seconds.",
                    [g, "reason"],
                ).add([label, reason], ns * _NS_TO_S)
        for reason, share in dict(getattr(gpu, "clock_event_share", {}) or {}).items():
            if isinstance(share, (int, float)):
                out.gauge(
                    "gpu_clock_event_share_ratio",
                    "Share of the last tick spent with each clock-event reason.",
                    [g, "reason"],
                ).add([label, reason], share)
        processes = getattr(gpu, "processes", None)
        if processes is not None:
            out.gauge("gpu_processes", "Processes with a context on the GPU (when read this tick).", [g]).add(
                [label], len(processes)
            )
    for pair in tuple(getattr(snap, "pairs", ()) or ()):
        a, b = getattr(pair, "gpu_a", None), getattr(pair, "gpu_b", None)
        if a is None or b is None:
            continue
        level = _num(pair, "topology_level")
        out.gauge(
            "gpu_pair_topology_level",
            "Common ancestor of a GPU pair: 0 same board, 10 PIX, 20 PXB, 30 PHB, 40 NODE, 50 SYS.",
            ["gpu_a", "gpu_b", "topology"],
        ).add([a, b, getattr(pair, "topology_name", None) or ""], level)
        for capability, code in dict(getattr(pair, "p2p_status", {}) or {}).items():
            if isinstance(code, int):
                out.gauge(
                    "gpu_pair_p2p_ok",
                    "1 if the driver reports this P2P capability OK between the pair.",
                    ["gpu_a", "gpu_b", "capability"],
                ).add([a, b, capability], 1 if code == 0 else 0)


# --- probe results -------------------------------------------------------------------------------------------

_PROBE_STATUSES = ("ok", "failed", "timed_out", "unsupported", "cancelled")
_TIME_UNITS = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}
_SIZE_KEYS = ("size_bytes", "bytes", "message_bytes", "size", "nbytes")
_MODE_KEYS = ("mode", "timing", "timing_mode")


def metric_for_key(key: str) -> tuple[str, float] | None:
    """A unit-suffixed metric key from the probes (`time_us`, `busbw_gbps`, `achieved_tflops`, `mem_pct`) as a
    Prometheus name stem in base units and the scale to get there; None for a key with no known unit."""
    stem, _, unit = key.rpartition("_")
    if not stem:
        return None
    if unit in _TIME_UNITS:
        return f"{stem}_seconds", _TIME_UNITS[unit]
    if unit == "gbps":
        return f"{stem}_bytes_per_second", _GB_TO_BYTES
    if unit == "tflops":
        return f"{stem}_flops_per_second", 1e12
    if unit == "bytes":
        return f"{stem}_bytes", 1.0
    if unit == "pct":
        return f"{stem}_ratio", _PCT_TO_RATIO
    if unit in {"ratio", "count"}:
        return f"{stem}_{unit}", 1.0
    return None


def _param(params: Mapping[str, Any], keys: Sequence[str]) -> str:
    for key in keys:
        value = params.get(key)
        if value is not None:
            return str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)
    return ""


def _iso_to_unix(text: object) -> float | None:
    if not isinstance(text, str) or not text:
        return None
    try:
        stamp = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=dt.timezone.utc)
    return stamp.timestamp()


def _render_probes(results: Iterable[Any], out: _Out) -> None:
    latest: dict[str, Any] = {}
    for result in results:
        name = getattr(result, "probe", None)
        if isinstance(name, str):
            latest[name] = result
    base = ["probe", "measurement", "size", "mode", "rank"]
    for probe, result in latest.items():
        status = getattr(result, "status", None)
        status_text = str(getattr(status, "value", status) or "")
        for candidate in _PROBE_STATUSES:
            out.gauge(
                "probe_status",
                "1 for the outcome of each probe's last run (ok, failed, timed_out, unsupported, cancelled).",
                ["probe", "status"],
            ).add([probe, candidate], 1 if candidate == status_text else 0)
        out.gauge("probe_duration_seconds", "Wall time of each probe's last run.", ["probe"]).add(
            [probe], _num(result, "duration_s")
        )
        out.gauge("probe_last_run_timestamp_seconds", "Unix time each probe last started.", ["probe"]).add(
            [probe], _iso_to_unix(getattr(result, "started_utc", None))
        )
        out.gauge("probe_world_size", "Ranks the probe ran on.", ["probe"]).add([probe], _num(result, "world_size"))
        for m in tuple(getattr(result, "measurements", ()) or ()):
            params = dict(getattr(m, "params", {}) or {})
            point = [probe, str(getattr(m, "name", "")), _param(params, _SIZE_KEYS), _param(params, _MODE_KEYS)]
            m_status = getattr(m, "status", None)
            supported = str(getattr(m_status, "value", m_status) or "ok") == "ok"
            out.gauge(
                "probe_measurement_ok",
                "1 if the point was measured, 0 if unsupported here or failed.",
                base[:4],
            ).add(point, 1 if supported else 0)
            _render_stats(out, point, "all", getattr(m, "stats", None), str(getattr(m, "unit", "")))
            _render_metric_map(out, point, "all", getattr(m, "metrics", {}) or {})
            for series in tuple(getattr(m, "per_rank", ()) or ()):
                rank = getattr(series, "rank", None)
                if rank is None:
                    continue
                _render_metric_map(out, point, str(rank), getattr(series, "metrics", {}) or {})


def _render_stats(out: _Out, point: list[str], rank: str, stats: Any, unit: str) -> None:
    if stats is None:
        return
    labels = ["probe", "measurement", "size", "mode", "rank", "stat"]
    if unit in _TIME_UNITS:
        fam = out.gauge("probe_sample_seconds", "Statistics of the samples of each time-valued point.", labels)
        scale = _TIME_UNITS[unit]
    elif unit == "gbps":
        fam = out.gauge(
            "probe_sample_bytes_per_second", "Statistics of the samples of each bandwidth-valued point.", labels
        )
        scale = _GB_TO_BYTES
    else:
        return
    for which in ("median", "p10", "p90", "p99", "min", "max", "mean"):
        fam.add([*point, rank, which], _scaled(_num(stats, which), scale))
    out.gauge("probe_samples", "Samples behind each point's statistics.", labels[:5]).add(
        [*point, rank], _num(stats, "count")
    )


def _render_metric_map(out: _Out, point: list[str], rank: str, metrics: Mapping[str, Any]) -> None:
    for key, value in metrics.items():
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            continue
        named = metric_for_key(str(key))
        if named is None:
            continue
        stem, scale = named
        out.gauge(
            f"probe_{stem}",
            f"Probe metric {key}, in base units (per rank, or the mean over ranks as rank=all).",
            ["probe", "measurement", "size", "mode", "rank"],
        ).add([*point, rank], float(value) * scale)


# --- budget --------------------------------------------------------------------------------------------------

_MS_TO_S = 1e-3


def _first_num(obj: Any, names: Sequence[str]) -> float | None:
    for name in names:
        value = _num(obj, name)
        if value is not None:
            return value
    return None


def _segment_key(seg: Any) -> str | None:
    for attr in ("component", "key", "name"):
        value = getattr(seg, attr, None)
        if value is not None:
            return str(getattr(value, "value", value))
    return None


def budget_segments_ms(budget: Any) -> dict[str, float]:
    """Component key → ms per step from a budget: `segments` as objects (component/key + ms) or a mapping."""
    raw = getattr(budget, "segments", None)
    if raw is None:
        raw = getattr(budget, "components", None)
    out: dict[str, float] = {}
    if isinstance(raw, Mapping):
        for key, value in raw.items():
            ms = value if isinstance(value, (int, float)) else _first_num(value, ("ms", "time_ms", "step_ms"))
            if ms is not None:
                out[str(getattr(key, "value", key))] = float(ms)
        return out
    for seg in raw or ():
        key = _segment_key(seg)
        ms = _first_num(seg, ("ms", "time_ms", "step_ms", "per_token_ms"))
        if key is not None and ms is not None:
            out[key] = ms
    return out


_SEGMENT_STATUSES = ("measured", "interpolated", "estimated", "missing")
"""Where a segment's time came from (budget/compose.py STATUSES): worst status among its ops."""
_UNEXPLAINED = "unexplained"
"""budget.components.UNEXPLAINED_KEY: observed − Σ components."""


def _render_budget(budget: Any, out: _Out) -> None:
    model = str(getattr(budget, "model", "") or getattr(getattr(budget, "deployment", None), "model", "") or "")
    segments = budget_segments_ms(budget)
    unexplained_ms = _first_num(budget, ("unexplained_ms",))
    if unexplained_ms is not None:
        segments.setdefault(_UNEXPLAINED, unexplained_ms)
    fam = out.gauge(
        "budget_segment_seconds",
        "Per-step decode time by component from the probes; 'unexplained' is observed minus their sum.",
        ["model", "component"],
    )
    for key, ms in segments.items():
        fam.add([model, key], ms * _MS_TO_S)
    raw = getattr(budget, "segments", None)
    for seg in raw if isinstance(raw, (list, tuple)) else ():
        seg_key, status = _segment_key(seg), getattr(seg, "status", None)
        if seg_key is None or not isinstance(status, str):
            continue
        for candidate in _SEGMENT_STATUSES:
            out.gauge(
                "budget_segment_status",
                "1 for where each segment's time came from (measured, interpolated, estimated, missing).",
                ["model", "component", "status"],
            ).add([model, seg_key, candidate], 1 if candidate == status else 0)
    out.gauge("budget_complete", "1 when every segment has data (else the sum is a lower bound).", ["model"]).add(
        [model], _num(budget, "complete")
    )
    lines = out.gauge(
        "budget_step_seconds",
        "Decode step lines: sum of the components, observed, target (from the target throughput), roofline.",
        ["model", "line"],
    )
    for line, names in (
        ("sum", ("total_ms", "sum_ms", "composed_ms", "probed_ms")),
        ("observed", ("observed_ms", "observed_step_ms")),
        ("target", ("target_ms", "target_step_ms")),
        ("roofline", ("roofline_ms", "roofline_step_ms")),
    ):
        lines.add([model, line], _scaled(_first_num(budget, names), _MS_TO_S))
    out.gauge("budget_target_tokens_per_second", "Target decode throughput per stream.", ["model"]).add(
        [model], _first_num(budget, ("target_tps", "target_tok_s", "target_tokens_per_s"))
    )
    out.gauge(
        "budget_tokens_per_step", "Tokens one decode step yields per sequence (MTP accept length).", ["model"]
    ).add([model], _first_num(budget, ("tokens_per_step",)))


# --- checks --------------------------------------------------------------------------------------------------

_STATUSES = tuple(s.value for s in Status)


def _render_checks(checks: Sequence[CheckResult], taken_unix_s: float | None, out: _Out) -> None:
    state = out.gauge(
        "check_status",
        "1 for the status of each health check (pass, info, warn, fail, unknown), 0 for the others.",
        ["check", "subject", "title", "status"],
    )
    counts = dict.fromkeys(_STATUSES, 0)
    for result in checks:
        status = getattr(result.status, "value", str(result.status))
        counts[status] = counts.get(status, 0) + 1
        for candidate in _STATUSES:
            state.add([result.check_id, result.subject, result.title, candidate], 1 if candidate == status else 0)
    by_status = out.gauge("checks", "Health checks by status.", ["status"])
    for status, n in counts.items():
        by_status.add([status], n)
    out.gauge(
        "check_exit_code",
        "decodetop check's exit code for these results: 0 ok, 1 warning, 2 critical, 3 unknown.",
    ).add([], exit_code(list(checks)))
    out.gauge("check_last_run_timestamp_seconds", "Unix time the checks last ran.").add([], taken_unix_s)


# --- observed step -------------------------------------------------------------------------------------------


def _render_observed(observed: Any, out: _Out) -> None:
    step_ms = _num(observed, "step_ms")
    if step_ms is None:  # a ServerStatus
        state = getattr(observed, "state", None)
        out.gauge("server_up", "1 if the serving engine's /metrics gave a step time on the last poll.").add([], 0)
        out.gauge("server_status_info", "Why the last poll of the serving engine gave no step.", ["state"]).add(
            [str(getattr(state, "value", state) or "")], 1
        )
        return
    source = str(getattr(observed, "source", ""))
    labels = ["source"]
    out.gauge("server_up", "1 if the serving engine's /metrics gave a step time on the last poll.").add([], 1)
    out.gauge("observed_step_seconds", "Mean decode step the serving engine observed over the window.", labels).add(
        [source], step_ms * _MS_TO_S
    )
    out.gauge(
        "observed_inter_token_latency_seconds", "Mean inter-token latency (Δsum/Δcount) over the window.", labels
    ).add([source], _scaled(_num(observed, "itl_ms"), _MS_TO_S))
    out.gauge("observed_step_samples", "Histogram observations in the window.", labels).add(
        [source], _num(observed, "samples")
    )
    out.gauge("observed_step_window_seconds", "Length of the window.", labels).add([source], _num(observed, "window_s"))
    out.gauge("observed_accept_length", "Speculative accept length applied to the ITL.", labels).add(
        [source], _num(observed, "accept_length")
    )
    out.gauge("observed_running_requests", "Requests the engine was running at the end of the window.", labels).add(
        [source], _num(observed, "running_requests")
    )


# --- collector -----------------------------------------------------------------------------------------------


class DecodetopCollector:
    """A prometheus_client custom collector: renders the provider's state at each scrape.

    `parts` limits what is rendered (the check textfile renders only "checks").
    """

    def __init__(self, state_provider: StateProvider, parts: Sequence[str] = PARTS) -> None:
        unknown = set(parts) - set(PARTS)
        if unknown:
            raise ValueError(f"unknown exposition parts: {', '.join(sorted(unknown))}")
        self.state_provider = state_provider
        self.parts = tuple(parts)
        self._errors: dict[str, int] = dict.fromkeys(self.parts, 0)
        self._lock = threading.Lock()

    def describe(self) -> list[Any]:
        """Nothing up front: names depend on the data (registering must not render)."""
        return []

    def collect(self) -> Iterator[Any]:
        """The families of one scrape."""
        state = self.state_provider()
        renderers: dict[str, Callable[[_Out], None]] = {
            "telemetry": lambda out: _render_telemetry(state.telemetry, out) if state.telemetry is not None else None,
            "probes": lambda out: _render_probes(state.probe_results, out),
            "budget": lambda out: _render_budget(state.budget, out) if state.budget is not None else None,
            "checks": lambda out: (
                _render_checks(state.checks, state.checks_unix_s, out)
                if state.checks or state.checks_unix_s is not None
                else None
            ),
            "observed": lambda out: _render_observed(state.observed, out) if state.observed is not None else None,
        }
        names: set[str] = set()
        for part in self.parts:
            out = _Out()
            try:
                renderers[part](out)
                families = out.built()
            except Exception:  # one bad part must not fail the scrape; it is counted and logged
                with self._lock:
                    self._errors[part] = self._errors.get(part, 0) + 1
                log.exception("rendering %s for Prometheus failed", part)
                continue
            for family in families:
                if family.name in names:  # a name two parts both produced: keep the first
                    continue
                names.add(family.name)
                yield family
        yield from self._meta(state)

    def _meta(self, state: ExportState) -> list[Any]:
        out = _Out()
        out.gauge("build_info", "decodetop's version (value 1).", ["version"]).add([__version__], 1)
        errors = out.counter("exporter_render_errors", "Scrapes in which a part failed to render.", ["part"])
        with self._lock:
            for part, n in self._errors.items():
                errors.add([part], n)
        if "probes" in self.parts:
            out.gauge("probe_interval_seconds", "How often the exporter runs the probe plan.").add(
                [], state.probe_interval_s
            )
        notes = out.gauge("exporter_part_failing", "1 while a part's last update failed (see the log).", ["part"])
        for part in self.parts:
            notes.add([part], 1 if state.notes.get(part) else 0)
        return out.built()


def make_registry(state_provider: StateProvider, parts: Sequence[str] = PARTS, *, process: bool = False) -> Any:
    """An own CollectorRegistry (never the global one) with the decodetop collector, and process metrics if asked."""
    from prometheus_client import CollectorRegistry, ProcessCollector

    registry = CollectorRegistry(auto_describe=False)
    registry.register(DecodetopCollector(state_provider, parts))
    if process:
        ProcessCollector(namespace="decodetop", registry=registry)
    return registry


def render_exposition(state: ExportState | StateProvider, parts: Sequence[str] = PARTS) -> str:
    """The text exposition (format 0.0.4) of a state."""
    from prometheus_client import generate_latest

    if isinstance(state, ExportState):
        fixed = state

        def provider() -> ExportState:
            return fixed

    else:
        provider = state
    return str(generate_latest(make_registry(provider, parts)).decode("utf-8"))


# --- textfile ------------------------------------------------------------------------------------------------


def textfile_path(path: str | Path) -> Path:
    """`path` as a textfile target, checked before any work: a `.prom` name that is not a directory."""
    target = Path(path)
    if target.suffix != ".prom":
        raise UserInputError(
            f"--prometheus-textfile {target}: must end in .prom (node_exporter's textfile collector reads only *.prom)"
        )
    if target.is_dir():
        raise UserInputError(f"--prometheus-textfile {target}: is a directory")
    return target


def write_check_textfile(path: str | Path, results: Sequence[CheckResult], *, now_unix_s: float | None = None) -> Path:
    """Write the checks for node_exporter's textfile collector, atomically (`decodetop.atomic`).

    node_exporter reads only `*.prom` files in its `--collector.textfile.directory`, so another suffix is refused.
    """
    target = textfile_path(path)
    try:
        import prometheus_client  # noqa: F401 - only to say clearly when it is missing
    except ImportError:
        raise DecodetopError(
            f"--prometheus-textfile {target}: needs the prometheus_client package (pip install prometheus-client)"
        ) from None
    state = ExportState(checks=tuple(results), checks_unix_s=time.time() if now_unix_s is None else now_unix_s)
    text = render_exposition(state, parts=("checks",))
    try:
        write_text_atomic(target, text)
    except OSError as exc:
        raise UserInputError(f"--prometheus-textfile {target}: cannot write ({exc.strerror or exc})") from None
    return target


# --- HTTP server ---------------------------------------------------------------------------------------------


def parse_listen(text: str) -> tuple[str, int]:
    """HOST:PORT (or [IPv6]:PORT, or PORT alone, or :PORT) → (host, port); loopback when no host is given."""
    value = text.strip()
    host = "127.0.0.1"
    port_text = value
    if value.startswith("["):
        end = value.find("]")
        if end < 0 or not value[end + 1 :].startswith(":"):
            raise UserInputError(f"--listen {text!r}: expected [IPv6]:PORT")
        host, port_text = value[1:end], value[end + 2 :]
    elif ":" in value:
        head, _, port_text = value.rpartition(":")
        if ":" in head:
            raise UserInputError(f"--listen {text!r}: put an IPv6 address in brackets, e.g. [::1]:9464")
        host = head or host
    try:
        port = int(port_text)
    except ValueError:
        raise UserInputError(f"--listen {text!r}: port {port_text!r} is not a number") from None
    if not 0 <= port <= 65535:
        raise UserInputError(f"--listen {text!r}: port {port} is out of range 0-65535")
    return host, port


@dataclass
class MetricsServer:
    """A running /metrics server; `close()` stops it (idempotent)."""

    host: str
    port: int
    _server: Any
    _thread: threading.Thread

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop serving and release the port."""
        server, self._server = self._server, None
        if server is None:
            return
        server.shutdown()
        server.server_close()
        self._thread.join(timeout_s)

    def __enter__(self) -> MetricsServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def start_metrics_server(addr: str | tuple[str, int], state_provider: StateProvider) -> MetricsServer:
    """Serve the exposition of `state_provider()` on http://addr/metrics from a daemon thread; own registry.

    `addr` is "HOST:PORT" (default form "127.0.0.1:9464"; port 0 picks a free one, see `.port`). A port in use or
    a host that is not ours gives one UserInputError line.
    """
    from prometheus_client import start_http_server

    host, port = parse_listen(addr) if isinstance(addr, str) else addr
    registry = make_registry(state_provider, process=True)
    try:
        server, thread = start_http_server(port, addr=host, registry=registry)
    except OSError as exc:
        raise UserInputError(f"--listen {host}:{port}: cannot listen ({exc.strerror or exc})") from None
    bound_port = int(server.server_address[1])
    return MetricsServer(host=host, port=bound_port, _server=server, _thread=thread)
