"""Provides the exposition itself: the metric families rendered from an `ExportState` at scrape time by a custom
collector on its own registry (`make_registry`, `render_exposition`).

Names follow Prometheus conventions: a `decodetop_` prefix, base units (`_seconds`, `_bytes`, `_hertz`, `_watts`,
`_celsius`, `_bytes_per_second`, `_ratio` for 0–1), `_total` on counters, `_info` on constant-1 series that carry
labels, and a `gpu` label with the NVML index. Values are converted from decodetop's own units (MHz, µs, GB/s, %)
on the way out. Nothing here reads hardware: the collector renders whatever `ExportState` the caller's state
provider returns at scrape time, so the exporter command and the TUI serve the same thing.

The series stay few whatever the plan: per probe point its median and p99 pooled over the ranks (no per-rank and
no per-sample series; the points of a GEMM sweep, diagnostic variants and a layer's parts stay in `probe --json`),
one series per health check and per budget component (its status and provenance as labels). At 8 GPUs with a full
model plan that is about 110 series per GPU plus 350 for the plan (benchmarks/cost/exporter_series.py).

Every part of the state (telemetry, probes, budget, checks, observed step) is rendered on its own: a part that
fails to render is left out of that scrape and counted in `decodetop_exporter_render_errors_total{part}`; a scrape
never fails."""

from __future__ import annotations

import datetime as dt
import logging
import math
import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from decodetop import __version__
from decodetop.budget.compose import Budget
from decodetop.budget.remainder import EXCEEDS_OBSERVED
from decodetop.collectors.checks.result import CheckResult, Status, exit_code
from decodetop.collectors.serving import ServerStatus, ServerStep
from decodetop.collectors.telemetry import CLOCK_EVENT_REASONS, GpuSnapshot, TelemetrySnapshot
from decodetop.export.prometheus.state import ExportState, Observation, StateProvider
from decodetop.probes.results import Measurement, MeasurementStatus, ProbeResult

log = logging.getLogger(__name__)

PREFIX = "decodetop_"
PARTS: tuple[str, ...] = ("telemetry", "probes", "budget", "checks", "observed")

_NAME_BAD = re.compile(r"[^a-zA-Z0-9_]")
_MHZ_TO_HZ = 1e6
_PCT_TO_RATIO = 0.01
_NS_TO_S = 1e-9
_GB_TO_BYTES = 1e9
"""docs/reference/probes.md §1: algbw/busbw in GB/s as nccl-tests prints them, decimal (1e9 bytes)."""


# --- family building -----------------------------------------------------------------------------------------


class _Family:
    """One metric family being filled; drops None/non-finite values (unless `nan_ok`) and repeated label sets."""

    def __init__(self, kind: str, name: str, doc: str, labels: Sequence[str]) -> None:
        self.kind = kind
        self.name = name
        self.doc = doc
        self.labels = tuple(labels)
        self.samples: list[tuple[tuple[str, ...], float]] = []
        self._seen: set[tuple[str, ...]] = set()

    def add(self, labels: Sequence[object], value: float | None, *, nan_ok: bool = False) -> None:
        if value is None:
            if not nan_ok:
                return
            value = math.nan
        number = float(value)
        if not math.isfinite(number) and not (nan_ok and math.isnan(number)):
            return
        key = tuple("" if v is None else str(v) for v in labels)
        if len(key) != len(self.labels):
            raise ValueError(f"{self.name}: {len(key)} label values for {len(self.labels)} labels")
        if key in self._seen:
            return
        self._seen.add(key)
        self.samples.append((key, number))

    def build(self) -> Metric:
        family: CounterMetricFamily | GaugeMetricFamily
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

    def built(self) -> list[Metric]:
        return [f.build() for f in self.families.values() if f.samples]


def _scaled(value: float | None, scale: float) -> float | None:
    return None if value is None else value * scale


# --- telemetry -----------------------------------------------------------------------------------------------

GpuNumber = Callable[[GpuSnapshot], float | None]


@dataclass(frozen=True)
class _GpuGauge:
    """One numeric GpuSnapshot field as a per-GPU series: how to read it, its name, help and scale to base units."""

    read: GpuNumber
    name: str
    doc: str
    scale: float = 1.0


_GPU_GAUGES: tuple[_GpuGauge, ...] = (
    _GpuGauge(lambda g: g.sm_clock_mhz, "gpu_sm_clock_hertz", "SM clock now.", _MHZ_TO_HZ),
    _GpuGauge(lambda g: g.sm_clock_max_mhz, "gpu_sm_clock_max_hertz", "Highest SM clock the GPU allows.", _MHZ_TO_HZ),
    _GpuGauge(lambda g: g.mem_clock_mhz, "gpu_memory_clock_hertz", "Memory clock now.", _MHZ_TO_HZ),
    _GpuGauge(
        lambda g: g.mem_clock_max_mhz, "gpu_memory_clock_max_hertz", "Highest memory clock the GPU allows.", _MHZ_TO_HZ
    ),
    _GpuGauge(
        lambda g: g.app_sm_clock_mhz, "gpu_applications_sm_clock_hertz", "Applications SM clock setting.", _MHZ_TO_HZ
    ),
    _GpuGauge(
        lambda g: g.app_mem_clock_mhz,
        "gpu_applications_memory_clock_hertz",
        "Applications memory clock setting.",
        _MHZ_TO_HZ,
    ),
    _GpuGauge(
        lambda g: g.performance_state,
        "gpu_performance_state",
        "P-state: 0 is P0 (max performance) ... 15; 32 unknown.",
    ),
    _GpuGauge(lambda g: g.pcie_gen, "gpu_pcie_link_generation", "PCIe link generation now."),
    _GpuGauge(
        lambda g: g.pcie_gen_max, "gpu_pcie_link_generation_max", "Highest PCIe generation of slot, riser and GPU."
    ),
    _GpuGauge(
        lambda g: g.pcie_gen_gpu_max, "gpu_pcie_link_generation_gpu_max", "Highest PCIe generation of the GPU alone."
    ),
    _GpuGauge(lambda g: g.pcie_width, "gpu_pcie_link_width_lanes", "PCIe link width now."),
    _GpuGauge(lambda g: g.pcie_width_max, "gpu_pcie_link_width_max_lanes", "Widest PCIe link possible."),
    _GpuGauge(
        lambda g: g.pcie_tx_bytes_per_s,
        "gpu_pcie_tx_bytes_per_second",
        "PCIe transmit throughput over the last tick.",
    ),
    _GpuGauge(
        lambda g: g.pcie_rx_bytes_per_s, "gpu_pcie_rx_bytes_per_second", "PCIe receive throughput over the last tick."
    ),
    _GpuGauge(lambda g: g.power_w, "gpu_power_watts", "Power draw."),
    _GpuGauge(lambda g: g.power_limit_enforced_w, "gpu_power_limit_enforced_watts", "Power limit the GPU enforces."),
    _GpuGauge(lambda g: g.power_limit_w, "gpu_power_limit_watts", "Power-management limit currently set."),
    _GpuGauge(lambda g: g.power_limit_default_w, "gpu_power_limit_default_watts", "Default power-management limit."),
    _GpuGauge(lambda g: g.temperature_c, "gpu_temperature_celsius", "GPU core temperature."),
    _GpuGauge(
        lambda g: g.gpu_util_pct,
        "gpu_utilization_ratio",
        "Share of time a kernel ran (NVML utilization.gpu).",
        _PCT_TO_RATIO,
    ),
    _GpuGauge(
        lambda g: g.mem_util_pct,
        "gpu_memory_busy_ratio",
        "Share of time device memory was read or written.",
        _PCT_TO_RATIO,
    ),
    _GpuGauge(lambda g: g.mem_total_bytes, "gpu_memory_total_bytes", "Device memory."),
    _GpuGauge(lambda g: g.mem_used_bytes, "gpu_memory_used_bytes", "Device memory in use."),
    _GpuGauge(lambda g: g.mem_free_bytes, "gpu_memory_free_bytes", "Device memory free."),
    _GpuGauge(lambda g: g.nvlink_links, "gpu_nvlink_links", "NVLink links present."),
    _GpuGauge(lambda g: g.nvlink_active_links, "gpu_nvlink_active_links", "NVLink links up."),
    _GpuGauge(lambda g: _flag(g.ecc_enabled), "gpu_ecc_enabled", "1 if ECC is on."),
    _GpuGauge(
        lambda g: _flag(g.ecc_pending_enabled), "gpu_ecc_pending_enabled", "1 if ECC will be on after the next reset."
    ),
    _GpuGauge(lambda g: _flag(g.persistence_mode), "gpu_persistence_mode", "1 if persistence mode is on."),
    _GpuGauge(
        lambda g: _flag(g.retired_pages_pending),
        "gpu_retired_pages_pending",
        "1 if a page retirement waits for a reset.",
    ),
    _GpuGauge(
        lambda g: g.remapped_rows_correctable,
        "gpu_remapped_rows_correctable",
        "Rows remapped for correctable errors.",
    ),
    _GpuGauge(
        lambda g: g.remapped_rows_uncorrectable,
        "gpu_remapped_rows_uncorrectable",
        "Rows remapped for uncorrectable errors.",
    ),
    _GpuGauge(
        lambda g: _flag(g.remapped_rows_pending), "gpu_remapped_rows_pending", "1 if a row remap waits for a reset."
    ),
    _GpuGauge(lambda g: _flag(g.remapped_rows_failure), "gpu_remapped_rows_failure", "1 if a row remap failed."),
    _GpuGauge(lambda g: g.numa_node_id, "gpu_numa_node", "NUMA node NVML places the GPU on."),
)
_GPU_COUNTERS: tuple[_GpuGauge, ...] = (
    _GpuGauge(lambda g: g.pcie_tx_bytes_total, "gpu_pcie_tx_bytes", "PCIe bytes transmitted since driver load."),
    _GpuGauge(lambda g: g.pcie_rx_bytes_total, "gpu_pcie_rx_bytes", "PCIe bytes received since driver load."),
    _GpuGauge(lambda g: g.pcie_replay_count, "gpu_pcie_replays", "PCIe replays (link-level retransmissions)."),
)
_ECC_FIELDS: tuple[tuple[GpuNumber, str, str], ...] = (
    (lambda g: g.ecc_corrected_volatile, "corrected", "volatile"),
    (lambda g: g.ecc_uncorrected_volatile, "uncorrected", "volatile"),
    (lambda g: g.ecc_corrected_aggregate, "corrected", "aggregate"),
    (lambda g: g.ecc_uncorrected_aggregate, "uncorrected", "aggregate"),
)
_KNOWN_CLOCK_REASONS = tuple(r.name for r in CLOCK_EVENT_REASONS)


def _flag(value: bool | None) -> float | None:
    return None if value is None else float(value)


def _render_telemetry(snap: TelemetrySnapshot, out: _Out) -> None:
    g = "gpu"
    out.gauge("nvml_up", "1 if NVML answered on the last telemetry tick.").add([], float(snap.nvml_available))
    out.gauge("telemetry_source_info", "Where telemetry comes from (nvml, a fake recording, none).", ["source"]).add(
        [snap.source], 1
    )
    out.gauge("telemetry_last_tick_timestamp_seconds", "Unix time of the last telemetry tick.").add(
        [], snap.taken_at_unix_s
    )
    out.gauge("telemetry_tick_cost_seconds", "Wall time of the last tick's NVML reads, all GPUs.").add(
        [], snap.tick_cost_s
    )
    out.gauge("telemetry_nvml_calls", "NVML calls made on the last tick.").add([], snap.nvml_calls)
    driver, cuda = snap.system.driver_version, snap.system.cuda_driver_version
    if driver or cuda:
        out.gauge("nvml_driver_info", "NVIDIA driver and its CUDA version.", ["driver_version", "cuda_version"]).add(
            [driver or "", cuda or ""], 1
        )
    out.gauge("gpus", "GPUs NVML sees.").add([], len(snap.gpus))
    for gpu in snap.gpus:
        label = str(gpu.index)
        out.gauge(
            "gpu_info", "Identity of each GPU (value 1).", [g, "name", "uuid", "pci_bus_id", "compute_capability"]
        ).add([label, gpu.name or "", gpu.uuid or "", gpu.pci_bus_id or "", gpu.compute_capability or ""], 1)
        for gauge in _GPU_GAUGES:
            out.gauge(gauge.name, gauge.doc, [g]).add([label], _scaled(gauge.read(gpu), gauge.scale))
        for counter in _GPU_COUNTERS:
            out.counter(counter.name, counter.doc, [g]).add([label], counter.read(gpu))
        for read, kind, scope in _ECC_FIELDS:
            out.counter(
                "gpu_ecc_errors",
                "ECC errors by type; volatile since driver load, aggregate over the GPU's life.",
                [g, "type", "scope"],
            ).add([label, kind, scope], read(gpu))
        _render_clock_events(gpu, label, out)
        if gpu.processes is not None:
            out.gauge("gpu_processes", "Processes with a context on the GPU (when read this tick).", [g]).add(
                [label], len(gpu.processes)
            )
    for pair in snap.pairs:
        out.gauge(
            "gpu_pair_topology_level",
            "Common ancestor of a GPU pair: 0 same board, 10 PIX, 20 PXB, 30 PHB, 40 NODE, 50 SYS.",
            ["gpu_a", "gpu_b", "topology"],
        ).add([pair.gpu_a, pair.gpu_b, pair.topology_name or ""], pair.topology_level)
        for capability, code in pair.p2p_status.items():
            out.gauge(
                "gpu_pair_p2p_ok",
                "1 if the driver reports this P2P capability OK between the pair.",
                ["gpu_a", "gpu_b", "capability"],
            ).add([pair.gpu_a, pair.gpu_b, capability], 1 if code == 0 else 0)


def _render_clock_events(gpu: GpuSnapshot, label: str, out: _Out) -> None:
    g = "gpu"
    if gpu.clock_event_mask is not None:
        active = set(gpu.clock_event_reasons)
        for reason in [*_KNOWN_CLOCK_REASONS, *sorted(active - set(_KNOWN_CLOCK_REASONS))]:
            out.gauge(
                "gpu_clock_event_reason_active",
                "1 while this clock-event (throttle) reason holds the clocks (docs/reference/healthchecks.md N3).",
                [g, "reason"],
            ).add([label, reason], 1 if reason in active else 0)
    for reason, ns in gpu.clock_event_time_ns.items():
        out.counter(
            "gpu_clock_event_seconds",
            "Time spent with each clock-event reason since driver load, in seconds.",
            [g, "reason"],
        ).add([label, reason], ns * _NS_TO_S)
    for reason, share in gpu.clock_event_share.items():
        out.gauge(
            "gpu_clock_event_share_ratio", "Share of the last tick spent with each clock-event reason.", [g, "reason"]
        ).add([label, reason], share)


# --- probe results -------------------------------------------------------------------------------------------

_TIME_UNITS = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}
_BASE_UNITS: dict[str, tuple[str, float]] = {
    **{unit: ("seconds", scale) for unit, scale in _TIME_UNITS.items()},
    "gbps": ("bytes_per_second", _GB_TO_BYTES),
    "tflops": ("flops_per_second", 1e12),
    "bytes": ("bytes", 1.0),
    "pct": ("ratio", _PCT_TO_RATIO),
    "ratio": ("ratio", 1.0),
    "count": ("count", 1.0),
}
"""A probe key's unit suffix → (the Prometheus base-unit suffix, the scale to it)."""
_SIZE_KEYS = ("size_bytes", "bytes", "message_bytes", "size", "nbytes")
_MODE_KEYS = ("mode", "timing", "timing_mode", "method")
_DETAIL_ROLES = frozenset({"sweep", "diagnostic", "part"})
"""Measurement roles (params["role"]) that are the probe's working: the points of a GEMM curve, diagnostic
variants, a layer's parts. They stay in `decodetop probe --json` and the UI's details; the exposition keeps the
points the budget reads and the primitives' own points, so its size does not grow with the plan's sweeps."""
PERCENTILES: tuple[tuple[str, str], ...] = (("50", "median"), ("99", "p99"))
"""The median and the tail of each exported point: (the `percentile` label, the `Stats` field)."""


def metric_for_key(key: str) -> tuple[str, float] | None:
    """A unit-suffixed metric key from the probes (`time_us`, `busbw_gbps`, `achieved_tflops`, `mem_pct`) as a
    Prometheus name stem in base units and the scale to get there; None for a key with no known unit."""
    stem, _, unit = key.rpartition("_")
    base = _BASE_UNITS.get(unit)
    if not stem or base is None:
        return None
    return f"{stem}_{base[0]}", base[1]


def _param(params: Mapping[str, object], keys: Sequence[str]) -> str:
    for key in keys:
        value = params.get(key)
        if value is not None:
            return str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)
    return ""


def _iso_to_unix(text: str) -> float | None:
    if not text:
        return None
    try:
        stamp = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=dt.timezone.utc)
    return stamp.timestamp()


def exported_points(result: ProbeResult) -> tuple[Measurement, ...]:
    """The measurements of a result that get series of their own: every one except the detail roles."""
    return tuple(m for m in result.measurements if m.params.get("role") not in _DETAIL_ROLES)


def _render_probes(results: Iterable[ProbeResult], out: _Out) -> None:
    latest = {result.probe: result for result in results}
    for probe, result in latest.items():
        out.gauge(
            "probe_ok",
            "1 if each probe's last run ended ok, else 0; the status label says how it ended "
            "(ok, failed, timed_out, unsupported, cancelled).",
            ["probe", "status"],
        ).add([probe, result.status.value], 1 if result.ok else 0)
        out.gauge("probe_duration_seconds", "Wall time of each probe's last run.", ["probe"]).add(
            [probe], result.duration_s
        )
        out.gauge("probe_last_run_timestamp_seconds", "Unix time each probe last started.", ["probe"]).add(
            [probe], _iso_to_unix(result.started_utc)
        )
        statuses = [m.status for m in result.measurements]
        points = out.gauge(
            "probe_points", "Points each probe measured in its last run, by outcome.", ["probe", "outcome"]
        )
        for outcome in MeasurementStatus:
            points.add([probe, outcome.value], statuses.count(outcome))
        for m in exported_points(result):
            _render_point(out, probe, m)


def _render_point(out: _Out, probe: str, m: Measurement) -> None:
    """The median and the tail of one point, in base units, as one summary-style family per unit."""
    stats = m.stats
    if stats is None or m.status is not MeasurementStatus.OK:
        return
    labels = ["probe", "measurement", "size", "mode", "percentile"]
    point = [probe, m.name, _param(m.params, _SIZE_KEYS), _param(m.params, _MODE_KEYS)]
    if stats.unit in _TIME_UNITS:
        fam = out.gauge(
            "probe_seconds",
            "Median and tail (percentile 50, 99) of each point's samples, pooled over the ranks.",
            labels,
        )
        scale = _TIME_UNITS[stats.unit]
    elif stats.unit == "gbps":
        fam = out.gauge(
            "probe_bytes_per_second",
            "Median and tail (percentile 50, 99) of each bandwidth-valued point's samples, pooled over the ranks.",
            labels,
        )
        scale = _GB_TO_BYTES
    else:
        return
    values = {"median": stats.median, "p99": stats.p99}
    for percentile, which in PERCENTILES:
        fam.add([*point, percentile], values[which] * scale)


# --- budget --------------------------------------------------------------------------------------------------

_MS_TO_S = 1e-3


def _render_budget(budget: Budget, out: _Out) -> None:
    model = budget.model
    out.gauge(
        "budget_info",
        "What the budget is of (value 1): model, deployment, the hardware its roofline and estimates are for, the "
        "device kind the probes ran on, and the line every surface shows above the figures.",
        ["model", "deployment", "hardware", "device_kind", "header"],
    ).add([model, budget.deployment, budget.hardware_text, budget.device_kind, budget.header], 1)
    fam = out.gauge(
        "budget_segment_seconds",
        "Per-step decode time of each component (one series each) and 'unexplained' (observed minus their sum; "
        f"negative: {EXCEEDS_OBSERVED} that much). "
        "status: measured, interpolated, estimated or missing (NaN: no figure); provenance: measured_now, "
        "measured_earlier, measured, estimate, not_applicable or missing.",
        ["model", "component", "status", "provenance"],
    )
    for seg in budget.segments:
        fam.add([model, seg.component, seg.status, seg.provenance_kind], _scaled(seg.ms, _MS_TO_S), nan_ok=True)
    paths = [seg for seg in budget.segments if seg.path]
    if paths:
        info = out.gauge(
            "budget_segment_path",
            "The kernel path a component's figure assumes (value 1), e.g. the engine's all-reduce: 'custom one-shot' "
            "(a P2P kernel, as vLLM and SGLang run below their size limit), 'NCCL', or both joined by '+' where the "
            "step's message sizes take both; the reason is in `decodetop budget` and the budget JSON.",
            ["model", "component", "path"],
        )
        for seg in paths:
            info.add([model, seg.component, seg.path], 1)
    rest = budget.unexplained
    observed = budget.observed_step
    fam.add(
        [model, rest.component, rest.status, "assumed" if observed.assumed else "observed"],
        budget.unexplained_ms * _MS_TO_S,
    )
    out.gauge("budget_complete", "1 when every segment has data (else the sum is a lower bound).", ["model"]).add(
        [model], float(budget.complete)
    )
    lines = out.gauge(
        "budget_step_seconds",
        "Decode step lines: sum of the components, observed (source: flag, settings, server, trace, or default = "
        "assumed, not observed), target (from the target throughput), roofline.",
        ["model", "line", "source"],
    )
    lines.add([model, "sum", "probes"], budget.total_ms * _MS_TO_S)
    lines.add([model, "observed", observed.source], observed.ms * _MS_TO_S)
    lines.add([model, "target", "target"], budget.target_ms * _MS_TO_S)
    lines.add([model, "roofline", "roofline"], _scaled(budget.roofline_ms, _MS_TO_S))
    lines.add([model, "mean", "probes"], budget.mean_total_ms * _MS_TO_S)
    if budget.ranks is not None:
        _render_ranks(budget, lines, out)
    out.gauge("budget_target_tokens_per_second", "Target decode throughput per stream.", ["model"]).add(
        [model], budget.target_tps
    )
    out.gauge(
        "budget_tokens_per_step", "Tokens one decode step yields per sequence (MTP accept length).", ["model"]
    ).add([model], budget.tokens_per_step)


def _render_ranks(budget: Budget, lines: _Family, out: _Out) -> None:
    """One gauge per rank's own composed step (straggler="1" on the rank the straggler rule names) and the step
    bound (the slowest rank at every all-reduce) as a step line."""
    spread = budget.ranks
    if spread is None:
        return
    named = spread.straggler.rank if spread.straggler is not None else None
    lines.add([budget.model, "rank_bound", "probes"], spread.step_bound_ms * _MS_TO_S)
    fam = out.gauge(
        "budget_rank_step_seconds",
        "Per-step decode time composed from each rank's own measurements (medians); straggler=1 on the rank that "
        "stands out beyond the other ranks' noise (decodetop.budget.ranks).",
        ["model", "rank", "device", "straggler"],
    )
    for r in spread.ranks:
        fam.add([budget.model, str(r.rank), r.label, "1" if r.rank == named else "0"], r.total_ms * _MS_TO_S)


# --- checks --------------------------------------------------------------------------------------------------

_STATUSES = tuple(s.value for s in Status)


def _render_checks(checks: Sequence[CheckResult], taken_unix_s: float | None, out: _Out) -> None:
    state = out.gauge(
        "check_status",
        "One series per health check, labelled with its status (pass, info, warn, fail, unknown); the value is "
        "decodetop check's exit code for it alone: 0 pass/info, 1 warn, 2 fail, 3 unknown.",
        ["check", "subject", "title", "status"],
    )
    counts = dict.fromkeys(_STATUSES, 0)
    for result in checks:
        counts[result.status.value] = counts.get(result.status.value, 0) + 1
        state.add([result.check_id, result.subject, result.title, result.status.value], exit_code([result]))
    by_status = out.gauge("checks", "Health checks by status.", ["status"])
    for status, n in counts.items():
        by_status.add([status], n)
    out.gauge(
        "check_exit_code",
        "decodetop check's exit code for these results: 0 ok, 1 warning, 2 critical, 3 unknown.",
    ).add([], exit_code(list(checks)))
    out.gauge("check_last_run_timestamp_seconds", "Unix time the checks last ran.").add([], taken_unix_s)


# --- observed step -------------------------------------------------------------------------------------------

_UP_DOC = "1 if the serving engine's /metrics gave a step time on the last poll (within its deadline), else 0."
_AGE_DOC = "Seconds since the observed step was last measured (it keeps growing while the server is down)."


def _render_observed(observed: Observation, out: _Out, now_unix_s: float) -> None:
    step = observed if isinstance(observed, ServerStep) else observed.last_step
    up = out.gauge("server_up", _UP_DOC)
    if isinstance(observed, ServerStatus):
        up.add([], 0)
        out.gauge("server_status_info", "Why the last poll of the serving engine gave no step.", ["state"]).add(
            [observed.state.value], 1
        )
    else:
        up.add([], 1)
    if step is None:
        return
    labels = ["source"]
    source = [step.source]
    out.gauge("observed_step_age_seconds", _AGE_DOC, labels).add(source, step.age_s(now_unix_s))
    out.gauge("observed_step_seconds", "Mean decode step the serving engine observed over the window.", labels).add(
        source, step.step_ms * _MS_TO_S
    )
    out.gauge(
        "observed_inter_token_latency_seconds", "Mean inter-token latency (Δsum/Δcount) over the window.", labels
    ).add(source, step.itl_ms * _MS_TO_S)
    out.gauge("observed_step_samples", "Histogram observations in the window.", labels).add(source, step.samples)
    out.gauge("observed_step_window_seconds", "Length of the window.", labels).add(source, step.window_s)
    out.gauge("observed_accept_length", "Speculative accept length applied to the ITL.", labels).add(
        source, step.accept_length
    )
    out.gauge("observed_running_requests", "Requests the engine was running at the end of the window.", labels).add(
        source, step.running_requests
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

    def describe(self) -> list[Metric]:
        """Nothing up front: names depend on the data (registering must not render)."""
        return []

    def collect(self) -> Iterator[Metric]:
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
            "observed": lambda out: (
                _render_observed(state.observed, out, time.time()) if state.observed is not None else None
            ),
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

    def _meta(self, state: ExportState) -> list[Metric]:
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


def make_registry(
    state_provider: StateProvider, parts: Sequence[str] = PARTS, *, process: bool = False
) -> CollectorRegistry:
    """An own CollectorRegistry (never the global one) with the decodetop collector, and process metrics if asked."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(DecodetopCollector(state_provider, parts))
    if process:
        ProcessCollector(namespace="decodetop", registry=registry)
    return registry


def render_exposition(state: ExportState | StateProvider, parts: Sequence[str] = PARTS) -> str:
    """The text exposition (format 0.0.4) of a state."""
    if isinstance(state, ExportState):
        fixed = state

        def provider() -> ExportState:
            return fixed

    else:
        provider = state
    return str(generate_latest(make_registry(provider, parts)).decode("utf-8"))
