"""Provides the UI's own view data: frozen dataclasses the widgets draw, filled by the sources in `tui.sources`.

Widgets depend only on these types, never on the probe, budget or collector packages directly, so a change in a
layer beneath touches one adapter, and tests and snapshots feed the widgets fixed data.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from decodetop.collectors.checks.result import CheckResult


class ProbeState(str, enum.Enum):
    """Where one probe stands in the UI."""

    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    TIMED_OUT = "timed out"
    UNSUPPORTED = "unsupported"
    CANCELLED = "cancelled"
    IDLE = "idle"
    """Not run in this session (and no history), e.g. with --no-probes."""


@dataclass(frozen=True)
class RankValue:
    """One rank's value for a probe's headline figure."""

    rank: int
    value_text: str
    device: str = ""


@dataclass(frozen=True)
class ProbeView:
    """Everything the probe table and the detail screen show for one probe."""

    probe_id: str
    title: str
    state: ProbeState = ProbeState.IDLE
    progress: float | None = None
    """0..1 while running, when the probe reports it."""
    progress_note: str = ""
    value_text: str = ""
    """The headline figure, e.g. "41.2 µs @ 32 KiB (p50)"."""
    measured_at_s: float | None = None
    """Unix time the shown value was measured (from this session or the history)."""
    from_history: bool = False
    """The value was read back from the history file, not measured in this session."""
    error: str = ""
    traceback: str = ""
    ranks: tuple[RankValue, ...] = ()
    spread_text: str = ""
    """Spread across ranks / repetitions, e.g. "p10 39.8 µs, p90 44.0 µs, ranks ±3%"."""
    telemetry_text: tuple[str, ...] = ()
    """What NVML saw during the run: clocks, clock-event reasons, PCIe link, one line each."""
    details: tuple[tuple[str, str], ...] = ()
    """Further key/value lines for the detail screen (sizes, modes, environment)."""


@dataclass(frozen=True)
class BudgetSegment:
    """One component's share of the per-token step."""

    key: str
    """`Component` value or `UNEXPLAINED_KEY`."""
    label: str
    ms: float
    status: str = "measured"
    """"measured", "interpolated" (along a measured curve), "estimated" (roofline, not measured), "missing" (no
    figure) or "remainder" (the unexplained part)."""
    measured_at_s: float | None = None
    p10_ms: float | None = None
    """The spread of the component's figure (None for a point figure): what the baseline diff calls noise."""
    p90_ms: float | None = None
    provenance: str = ""
    """Where the figure came from, in words (`decodetop.budget.segment.Segment.provenance`)."""
    kernels: str = ""
    """Which class of kernel the figure was timed with, and what torch ops would take
    (`decodetop.budget.segment.Segment.kernel_text`; '' where not said)."""
    provenance_kind: str = ""
    """The same as a kind: measured_now, measured_earlier, estimate … (`decodetop.budget.segment.PROVENANCE_KINDS`)."""

    @property
    def stored(self) -> bool:
        """Measured in an earlier session (read back from the history): the legend marks it "↺"."""
        return self.provenance_kind == "measured_earlier"

    @property
    def estimated(self) -> bool:
        """True for a roofline estimate (drawn with its own fill, never marked as moved since the baseline)."""
        return self.status == "estimated"


@dataclass(frozen=True)
class BudgetMove:
    """A component that moved beyond its noise since the baseline (`decodetop.budget.diff`)."""

    key: str
    """`Component` value."""
    delta_ms: float
    """Now − baseline, ms per step (negative: faster)."""


@dataclass(frozen=True)
class BudgetView:
    """The stacked bar's data: components, observed and target step, roofline."""

    title: str
    """e.g. "GLM-5 (NVFP4) · TP8 · batch 1"."""
    segments: tuple[BudgetSegment, ...]
    observed_ms: float
    target_ms: float
    roofline_ms: float | None = None
    note: str = ""
    """One line under the bar (what is missing, what source the observed figure came from)."""
    moved: tuple[BudgetMove, ...] = ()
    """Components that moved beyond their noise since the baseline (the app fills it; the legend marks them Δ)."""
    header: str = ""
    """A line above the figures that must not be missed: 'CPU ranks (gloo): timings show the method, not a GPU', or
    the server being unreachable."""
    observed_assumed: bool = False
    """True when the observed step is the default, not an observation: the bar says "assumed, not observed"."""
    observed_text: str = ""
    """Where the observed step came from, one line (`ObservedStep.text`)."""
    observed_source: str = ""
    """Where the observed step came from: flag, settings, server, trace or default (`ObservedStep.source`)."""
    verdict: str = ""
    """The roofline verdict, worded as the CLI's (`decodetop.budget.compose.roofline_verdict`)."""
    hardware_text: str = ""
    """What the roofline and the estimates are for ('NVIDIA H200 141GB (detected by NVML)', 'n/a on CPU')."""
    ranks_text: str = ""
    """Every rank's composed total and the spread ('' for one rank): `decodetop.budget.ranks.RankSpread.short_line`."""
    straggler: str = ""
    """The straggler line, when one rank stands out beyond the noise ('straggler: GPU 1 (+2.4 ms …; likely: …)')."""
    contention: str = ""
    """The likely-cause line when other processes ran on the probed GPUs during the measurements ('likely cause:
    another process on the probed GPU — GPU 0: pid 1306 (python3, 97 % SM during the run): …'), else ''."""
    warnings: tuple[str, ...] = ()
    """What makes the figures moot, shown first ('190 GB of weights per GPU do not fit …'): `Budget.warnings`."""

    @property
    def components(self) -> tuple[BudgetSegment, ...]:
        """Segments other than the unexplained remainder."""
        return tuple(s for s in self.segments if s.status != "remainder")

    @property
    def explained_ms(self) -> float:
        """Sum of the component segments."""
        return sum(s.ms for s in self.components)

    @property
    def unexplained_ms(self) -> float:
        """Observed minus explained (never negative)."""
        return max(0.0, self.observed_ms - self.explained_ms)

    def move(self, key: str) -> BudgetMove | None:
        """The move of one component since the baseline, or None."""
        return next((m for m in self.moved if m.key == key), None)

    def to_budget_dict(self) -> dict[str, object]:
        """The components in `Budget.to_dict()`'s shape (what `decodetop.budget.diff` reads, and what a baseline
        stores): a missing component has no ms (its 0 here is a placeholder, not a figure)."""
        segments = [
            {
                "component": s.key,
                "label": s.label,
                "ms": None if s.status == "missing" else s.ms,
                "p10_ms": None if s.status == "missing" else s.p10_ms,
                "p90_ms": None if s.status == "missing" else s.p90_ms,
                "status": s.status,
                "provenance": s.provenance,
            }
            for s in self.components
        ]
        missing = [s.key for s in self.components if s.status == "missing"]
        return {
            "model": self.title,
            "deployment": "",
            "segments": segments,
            "total_ms": self.explained_ms,
            "complete": not missing,
            "missing": missing,
            "observed_ms": self.observed_ms,
        }


@dataclass(frozen=True)
class GpuView:
    """One GPU row; None means NVML did not give the value."""

    index: int
    name: str = ""
    util_pct: float | None = None
    sm_clock_mhz: float | None = None
    sm_clock_max_mhz: float | None = None
    mem_clock_mhz: float | None = None
    pcie_gen: int | None = None
    pcie_gen_max: int | None = None
    pcie_width: int | None = None
    pcie_width_max: int | None = None
    pcie_tx_gbps: float | None = None
    pcie_rx_gbps: float | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    temp_c: float | None = None
    clock_reasons: tuple[str, ...] = ()
    """Active clock-event reasons by NVML name ("GpuIdle", "SwPowerCap", "HwSlowdown"...)."""
    mem_used_bytes: int | None = None
    mem_total_bytes: int | None = None
    bus_id: str = ""
    """PCI bus id, sysfs form ("0000:3b:00.0")."""
    mem_util_pct: float | None = None
    """Share of the last sample period the memory controller was busy (NVML's memory utilisation)."""
    mem_clock_max_mhz: float | None = None
    pcie_gen_gpu_max: int | None = None
    pcie_replay_count: int | None = None
    ecc_enabled: bool | None = None
    ecc_uncorrected: int | None = None
    """Uncorrected ECC errors since the driver loaded (volatile)."""
    ecc_corrected: int | None = None
    nvlink_active: int | None = None
    nvlink_links: int | None = None
    nvlink_tx_gbps: float | None = None
    """NVLink data sent over every link since the last tick, GB/s (None: `nvlink_note` says why)."""
    nvlink_rx_gbps: float | None = None
    nvlink_link_gbps: tuple[tuple[int, float | None, float | None], ...] = ()
    """(link, TX GB/s, RX GB/s) per link."""
    nvlink_note: str = ""
    """Why NVLink throughput is n/a ("no NVLink on this GPU", "NVLink throughput counters: not supported…")."""
    clock_event_share: tuple[tuple[str, float], ...] = ()
    """Share (0–1) of the last tick spent with each counted clock-event reason (where the driver counts them)."""
    processes: tuple[GpuProcessView, ...] | None = None
    """Processes with a context on the GPU; None when not read this tick (`processes_note` says why)."""
    processes_note: str = ""


@dataclass(frozen=True)
class GpuProcessView:
    """One process on one GPU, as the process list shows it."""

    pid: int
    used_mem_bytes: int | None
    kind: str
    """"compute" or "graphics"."""
    user: str = ""
    command: str = ""
    """The command line, or why it is unknown ("not on this host" for a recording)."""
    sm_util_pct: float | None = None
    """The process's share of SM time over the last sample period, where NVML gives it."""
    cpu_pct: float | None = None
    """CPU % since the previous tick (100 = one core), where the host says (None: not known, or its first tick)."""
    rss_bytes: int | None = None
    """Resident host memory."""
    started_at_s: float | None = None
    """When the process started (Unix time): its elapsed time."""


@dataclass(frozen=True)
class TelemetryFrame:
    """One telemetry tick: every GPU, or why there are none."""

    taken_at_s: float
    gpus: tuple[GpuView, ...] = ()
    unavailable_reason: str = ""
    """Why the GPU table is empty ("NVML library not found", "no NVIDIA driver loaded"...)."""
    source_note: str = ""
    """Where the data comes from when it is not live NVML ("fake NVML replaying ... replicated to 8 GPUs")."""
    sample_ms: float | None = None
    """How long the tick took to read (the collector's own cost)."""


@dataclass(frozen=True)
class Series:
    """One line on a chart."""

    label: str
    x: tuple[float, ...]
    y: tuple[float, ...]


@dataclass(frozen=True)
class ProbeCurves:
    """Chart data taken from probe results: all-reduce latency vs size per mode, GEMM GB/s vs M."""

    allreduce_us_by_mode: tuple[Series, ...] = ()
    """x: message size in bytes, y: latency in µs; one series per mode (pipelined, graph, synced p50)."""
    gemm_gbps_by_shape: tuple[Series, ...] = ()
    """x: M (tokens), y: achieved GB/s; one series per weight shape."""


@dataclass(frozen=True)
class HealthView:
    """The health panel's input: checks (from `collectors.checks`) and what changed since the baseline."""

    checks: tuple[CheckResult, ...] = ()
    changed_ids: frozenset[str] = frozenset()
    """check_id values whose status or observed value differs from the baseline."""
    baseline_at_s: float | None = None
    problem: str = ""
    """Why checks could not run, if they could not."""
