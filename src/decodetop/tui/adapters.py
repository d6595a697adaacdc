"""Provides the real sources behind the UI: the telemetry collector, the probe controller, the budget, host checks.

Each adapter turns a layer's own types (`TelemetrySnapshot`, `ProbeResult`, `CheckResult`, the budget) into the
UI's view types (`decodetop.tui.model`). Of the packages beneath only the probe controller (multiprocessing,
spawned ranks) is imported where it is used; nothing here imports torch (the UI process never touches CUDA).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import TYPE_CHECKING, Any

from decodetop.budget.compose import Budget, ObservedStep, default_observed
from decodetop.budget.plan import build_plan
from decodetop.budget.scenario import Scenario, build_scenario, choose_tp, source_from_setting
from decodetop.budget.spec import preset_info, preset_names
from decodetop.collectors.checks.host import run_all_checks
from decodetop.collectors.checks.model import CheckResult
from decodetop.collectors.nvml import Nvml
from decodetop.collectors.serving import ObservedStep as ServerObserved
from decodetop.collectors.serving import ServerStatus
from decodetop.collectors.telemetry import GpuSnapshot, TelemetryCollector, TelemetrySnapshot
from decodetop.errors import DecodetopError
from decodetop.history import Fingerprint
from decodetop.history import format_ago as ago
from decodetop.probes.budgeting import (
    GpuHint,
    compose,
    expected_fingerprint,
    fingerprint_accepts,
    fingerprint_of,
)
from decodetop.probes.hooks import ProbeRequest
from decodetop.probes.protocol import Progress
from decodetop.probes.registry import ProbeRegistry
from decodetop.probes.results import Measurement, ProbeResult
from decodetop.settings import Settings
from decodetop.textfmt import format_bytes, format_duration_us, format_number
from decodetop.tui.model import (
    BudgetSegment,
    BudgetView,
    GpuProcessView,
    GpuView,
    ProbeCurves,
    ProbeState,
    ProbeView,
    RankValue,
    Series,
    TelemetryFrame,
)
from decodetop.tui.sources import ProbeOutcome, ProgressCallback
from decodetop.tui.taps import SERVER_POLL_S, ServerPoller, StepSource

if TYPE_CHECKING:
    # types only: the controller module pulls in multiprocessing (a --replay or --no-probes session never loads it)
    from decodetop.probes.controller import GroupLayout, ProbeController

log = logging.getLogger(__name__)

BYTES_PER_GB = 1e9
BANDWIDTH_PROBES = frozenset({"membw"})
"""Probes that time large copies (hundreds of µs and up), which a process-list call does not disturb."""


# --- telemetry ------------------------------------------------------------------------------------------------


ProcessDescriber = Callable[[int], tuple[str, str]]
"""pid → (user, command line) of a process on this host."""
COMMAND_CHARS = 200
"""Command lines are kept to this many characters (the list cuts them to its width; details show them whole)."""


def describe_local_process(pid: int) -> tuple[str, str]:
    """(user, command line) of a process on this host, read through psutil; ("?", why) when it cannot be read."""
    import psutil

    try:
        proc = psutil.Process(pid)
        with proc.oneshot():
            user = proc.username()
            command = " ".join(proc.cmdline()) or proc.name()
    except psutil.NoSuchProcess:
        return "?", "(exited)"
    except psutil.AccessDenied:
        return "?", "(not readable by this user)"
    except (psutil.Error, OSError) as exc:
        return "?", f"({type(exc).__name__})"
    return user, command[:COMMAND_CHARS]


def _process_views(snapshot: GpuSnapshot, describe: ProcessDescriber | None) -> tuple[GpuProcessView, ...] | None:
    if snapshot.processes is None:
        return None
    out = []
    for proc in snapshot.processes:
        user, command = describe(proc.pid) if describe is not None else ("?", "(recorded on another host)")
        out.append(
            GpuProcessView(
                pid=proc.pid,
                used_mem_bytes=proc.used_mem_bytes,
                kind=proc.kind,
                user=user,
                command=command,
                sm_util_pct=None if proc.sm_util_pct is None else float(proc.sm_util_pct),
            )
        )
    return tuple(out)


def gpu_view(snapshot: GpuSnapshot, describe: ProcessDescriber | None = None) -> GpuView:
    """One `GpuSnapshot` as a table row; `describe` names its processes (None: they ran on another host)."""

    def gbps(value: float | None) -> float | None:
        return None if value is None else value / BYTES_PER_GB

    def num(value: float | None) -> float | None:
        return None if value is None else float(value)

    return GpuView(
        index=snapshot.index,
        name=snapshot.name or "",
        util_pct=num(snapshot.gpu_util_pct),
        sm_clock_mhz=num(snapshot.sm_clock_mhz),
        sm_clock_max_mhz=num(snapshot.sm_clock_max_mhz),
        mem_clock_mhz=num(snapshot.mem_clock_mhz),
        pcie_gen=snapshot.pcie_gen,
        pcie_gen_max=snapshot.pcie_gen_max,
        pcie_width=snapshot.pcie_width,
        pcie_width_max=snapshot.pcie_width_max,
        pcie_tx_gbps=gbps(snapshot.pcie_tx_bytes_per_s),
        pcie_rx_gbps=gbps(snapshot.pcie_rx_bytes_per_s),
        power_w=snapshot.power_w,
        power_limit_w=snapshot.power_limit_enforced_w or snapshot.power_limit_w,
        temp_c=num(snapshot.temperature_c),
        clock_reasons=tuple(snapshot.clock_event_reasons),
        mem_used_bytes=snapshot.mem_used_bytes,
        mem_total_bytes=snapshot.mem_total_bytes,
        bus_id=snapshot.pci_bus_id or "",
        mem_util_pct=num(snapshot.mem_util_pct),
        mem_clock_max_mhz=num(snapshot.mem_clock_max_mhz),
        pcie_gen_gpu_max=snapshot.pcie_gen_gpu_max,
        pcie_replay_count=snapshot.pcie_replay_count,
        ecc_enabled=snapshot.ecc_enabled,
        ecc_uncorrected=snapshot.ecc_uncorrected_volatile,
        ecc_corrected=snapshot.ecc_corrected_volatile,
        nvlink_active=snapshot.nvlink_active_links,
        nvlink_links=snapshot.nvlink_links,
        clock_event_share=tuple(sorted(snapshot.clock_event_share.items())),
        processes=_process_views(snapshot, describe),
        processes_note=snapshot.processes_note,
    )


def telemetry_frame(snapshot: TelemetrySnapshot, describe: ProcessDescriber | None = None) -> TelemetryFrame:
    """A `TelemetrySnapshot` as the UI's frame, saying where the data came from when it is not live NVML.
    Processes are named through `describe` only for live NVML (a recording's pids belong to another host)."""
    live = snapshot.source == "nvml"
    note = "" if live else f"data from {snapshot.source}"
    return TelemetryFrame(
        taken_at_s=snapshot.taken_at_unix_s,
        gpus=tuple(gpu_view(g, describe if live else None) for g in snapshot.gpus),
        unavailable_reason="" if snapshot.nvml_available else (snapshot.nvml_reason or "NVML unavailable"),
        source_note=note,
        sample_ms=snapshot.tick_cost_s * 1000.0,
    )


class CollectorTelemetry:
    """`TelemetrySource` over `decodetop.collectors.telemetry.TelemetryCollector` (its own daemon thread)."""

    def __init__(
        self, nvml: Nvml, interval_s: float, on_snapshot: Callable[[TelemetrySnapshot], None] | None = None
    ) -> None:
        self.nvml = nvml
        self.extra_listener = on_snapshot
        """Also called with every raw snapshot (the recorder, the Prometheus exporter)."""
        self._on_frame: Callable[[TelemetryFrame], None] | None = None
        self.collector: TelemetryCollector = TelemetryCollector(nvml, interval_s=interval_s, on_snapshot=self._snap)

    def _snap(self, snapshot: TelemetrySnapshot) -> None:
        if self.extra_listener is not None:
            try:
                self.extra_listener(snapshot)
            except Exception:  # a recorder or exporter error must not stop telemetry
                log.exception("telemetry listener failed")
        if self._on_frame is not None:
            self._on_frame(telemetry_frame(snapshot, describe_local_process))

    def start(self, on_frame: Callable[[TelemetryFrame], None]) -> None:
        """Start the collector's thread."""
        self._on_frame = on_frame
        self.collector.start()

    def set_quiet(self, quiet: bool) -> None:
        """Pause process lists while a latency probe runs."""
        if quiet:
            self.collector.costly_paused.set()
        else:
            self.collector.costly_paused.clear()

    def close(self) -> None:
        """Stop the thread, then release NVML."""
        self.collector.stop()
        self.nvml.close()


class ReplayTelemetry:
    """`TelemetrySource` replaying recorded snapshots (``--replay``) on a thread, one per tick."""

    def __init__(self, snapshots: Sequence[TelemetrySnapshot], interval_s: float, loop: bool = True) -> None:
        self.snapshots = list(snapshots)
        self.interval_s = interval_s
        self.loop = loop
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, on_frame: Callable[[TelemetryFrame], None]) -> None:
        """Start replaying."""

        def run() -> None:
            index = 0
            while not self._stop.is_set() and self.snapshots:
                frame = telemetry_frame(self.snapshots[index])
                on_frame(frame)
                index += 1
                if index >= len(self.snapshots):
                    if not self.loop:
                        return
                    index = 0
                self._stop.wait(self.interval_s)

        self._thread = threading.Thread(target=run, name="decodetop-replay", daemon=True)
        self._thread.start()

    def set_quiet(self, quiet: bool) -> None:
        """Nothing costly to pause in a replay."""

    def close(self) -> None:
        """Stop the thread."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5.0)


# --- probes ---------------------------------------------------------------------------------------------------


@contextlib.contextmanager
def real_stderr() -> Iterator[None]:
    """Point sys.stderr at the process's real stderr for a moment.

    Textual replaces sys.stderr with a capture object whose `fileno()` is not a real descriptor, and
    multiprocessing's resource tracker passes `sys.stderr.fileno()` to the process it spawns ("bad value(s) in
    fds_to_keep"). Spawning the probe group (and the tracker) under this context gives them the terminal's stderr.
    """
    saved = sys.stderr
    if sys.__stderr__ is not None:
        sys.stderr = sys.__stderr__
    try:
        yield
    finally:
        sys.stderr = saved


def start_resource_tracker() -> None:
    """Start multiprocessing's resource tracker before the UI takes over stderr (see `real_stderr`)."""
    from multiprocessing import resource_tracker

    with real_stderr():
        resource_tracker.ensure_running()


_STATUS_TO_STATE = {
    "ok": ProbeState.DONE,
    "failed": ProbeState.FAILED,
    "timed_out": ProbeState.TIMED_OUT,
    "unsupported": ProbeState.UNSUPPORTED,
    "cancelled": ProbeState.CANCELLED,
}


def _ok_measurements(result: ProbeResult) -> list[Measurement]:
    return [m for m in result.measurements if m.status.value == "ok" and m.stats is not None]


def _fmt_value(value: float, unit: str) -> str:
    if unit == "us":
        return format_duration_us(value)  # 127993 µs reads 128 ms
    if unit == "ms":
        return format_duration_us(value * 1000.0)
    if unit == "gbps":
        return f"{format_number(value)} GB/s"
    return f"{format_number(value)} {unit}".rstrip()


KEY_PARAMS_HIDDEN = frozenset({"batch", "dtype", "kv_dtype", "ranks", "bias", "q_len"})
"""Point-key parameters the label leaves out: the same for every point of a plan (the detail screen has them)."""
KEY_PARAMS_SHOWN = 4
"""At most this many of a point key's parameters in a label (the first ones name the shape)."""
HEADLINE_ROLES = ("budget", "layer", "")
"""Which points make a probe's headline, best first: the figures the budget composes from, a whole layer, a point
of a probe without roles; never a reference copy, a peak, a part of a layer or a diagnostic."""
REFERENCE_POINTS = frozenset({"copy", "peak"})


def _key_label(key: str) -> str:
    """ "gemm:m=1,n=5120,k=8192,batch=1,dtype=bf16" → "m=1 n=5120 k=8192"; zero-valued and plan-wide ones left out."""
    _, _, body = key.partition(":")
    pairs = []
    for part in body.split(","):
        name, sep, value = part.partition("=")
        if sep and name not in KEY_PARAMS_HIDDEN and value not in ("0", ""):
            pairs.append(f"{name}={value}")
    return " ".join(pairs[:KEY_PARAMS_SHOWN])


def _point_label(m: Measurement) -> str:
    params = dict(m.params)
    key = params.get("key")
    what = params.get("what")
    if isinstance(key, str) and ":" in key:
        label = _key_label(key)
        if what == "part":
            label = f"{params.get('layer', '')} part {key.partition(':')[0]}".strip()
        for extra in ("variant", "sampler", "mode"):
            value = params.get(extra)
            if isinstance(value, str):
                label += f" [{value}]"
        return label or m.name
    if what == "layer":
        return f"{params.get('layer', '')} layer {params.get('mode', '')}".strip()
    parts = []
    size = params.pop("size_bytes", params.pop("size", None))
    if isinstance(size, int):
        parts.append(format_bytes(size))
    mode = params.pop("mode", None)
    if isinstance(mode, str):
        parts.append(mode)
    for name in ("what", "shape", "kind", "context", "m", "tokens", "nodes"):
        value = params.pop(name, None)
        if isinstance(value, (int, float, str)):
            parts.append(str(value) if name in ("what", "shape", "kind") else f"{name}={value}")
    parts.extend(f"[{params[extra]}]" for extra in ("variant", "sampler") if isinstance(params.get(extra), str))
    return " ".join(parts) or m.name


def _headline_rank(m: Measurement) -> int:
    role = m.params.get("role", "")
    if m.params.get("what") in REFERENCE_POINTS:
        return len(HEADLINE_ROLES)
    return HEADLINE_ROLES.index(role) if role in HEADLINE_ROLES else len(HEADLINE_ROLES)


def headline_point(result: ProbeResult) -> Measurement | None:
    """The point a probe's row shows: the first good one of the best role (a budget figure before a whole layer
    before a reference copy or a part)."""
    good = _ok_measurements(result)
    return min(good, key=_headline_rank) if good else None


def headline(result: ProbeResult) -> str:
    """One line for the table: the headline point's median and where it was taken ("" without a good point)."""
    point = headline_point(result)
    if point is None or point.stats is None:
        return ""
    return f"{_fmt_value(point.stats.median, point.unit)} @ {_point_label(point)}"


def all_unsupported(result: ProbeResult) -> str:
    """The reason when a probe measured nothing because every point is unsupported here ("" otherwise)."""
    points = result.measurements
    if not points or any(m.status.value != "unsupported" for m in points):
        return ""
    notes = sorted({m.note for m in points if m.note})
    return "; ".join(notes) or "every point is unsupported here"


def probe_view(result: ProbeResult, title: str = "") -> ProbeView:
    """A `ProbeResult` as the table row and detail screen."""
    state = _STATUS_TO_STATE.get(result.status.value, ProbeState.FAILED)
    good = _ok_measurements(result)
    unsupported = all_unsupported(result)
    if state is ProbeState.DONE and unsupported:
        state = ProbeState.UNSUPPORTED  # "done" with no value would hide that nothing could be measured
    ranks: tuple[RankValue, ...] = ()
    spread = ""
    first = headline_point(result)
    if first is not None:
        assert first.stats is not None
        ranks = tuple(
            RankValue(r.rank, _fmt_value(r.stats.median, first.unit)) for r in first.per_rank if r.stats is not None
        )
        stats = first.stats
        spread = (
            f"p10 {_fmt_value(stats.p10, first.unit)} · p90 {_fmt_value(stats.p90, first.unit)} · "
            f"p99 {_fmt_value(stats.p99, first.unit)} · {stats.count} samples"
        )
        medians = [r.stats.median for r in first.per_rank if r.stats is not None]
        if len(medians) > 1 and min(medians) > 0:
            spread += f" · ranks ±{(max(medians) / min(medians) - 1) * 50:.1f}%"
    details: list[tuple[str, str]] = [
        (f"point {_point_label(m)}", _fmt_value(m.stats.median, m.unit)) for m in good if m.stats
    ]
    details.extend(
        (f"point {_point_label(m)}", f"{m.status.value}: {m.note}")
        for m in result.measurements
        if m.status.value != "ok"
    )
    telemetry: list[str] = []
    env = result.environment
    if env is not None:
        details.append(("backend", f"{env.backend} × {env.world_size} ({env.device_kind})"))
        versions = ", ".join(
            f"{k} {v}"
            for k, v in (("torch", env.torch), ("cuda", env.cuda), ("nccl", env.nccl), ("driver", env.driver))
            if v
        )
        if versions:
            details.append(("versions", versions))
        if env.gpu_names:
            details.append(("GPUs", ", ".join(env.gpu_names)))
        for key, value in sorted(env.extra.items()):
            if "telemetry" in key or "clock" in key or "pcie" in key:
                telemetry.append(f"{key}: {value}")
    details.append(("duration", f"{result.duration_s:.1f} s"))
    if result.rank_log and (result.rank_warnings or state is ProbeState.FAILED):
        plural = "s" if result.rank_warnings != 1 else ""
        warned = f"{result.rank_warnings} warning{plural} in " if result.rank_warnings else ""
        details.append(("rank output", f"{warned}{result.rank_log}"))
    error = result.error or ("" if state is ProbeState.DONE else result.message) or unsupported
    if result.error_rank is not None and error and not error.startswith(f"rank {result.error_rank} "):
        error = f"rank {result.error_rank}: {error}"
    return ProbeView(
        probe_id=result.probe,
        title=title,
        state=state,
        value_text=headline(result) or (f"unsupported: {unsupported}" if unsupported else ""),
        error=error,
        traceback=result.traceback or "",
        ranks=ranks,
        spread_text=spread,
        telemetry_text=tuple(telemetry),
        details=tuple(details),
    )


def compact_payload(data: dict[str, Any]) -> dict[str, Any]:
    """A result's dict without the raw samples (stats and metrics stay): what the history keeps of a probe."""
    out = dict(data)
    measurements = []
    for raw in data.get("measurements", ()):
        m = dict(raw)
        m["per_rank"] = [{k: v for k, v in r.items() if k != "samples"} for r in m.get("per_rank", ())]
        measurements.append(m)
    out["measurements"] = measurements
    return out


@dataclass(frozen=True)
class GroupInfo:
    """The probe group a budget is for, as far as the UI knows it without spawning it: its size and device kind."""

    size: int
    kind: str
    """cuda or cpu."""
    label: str
    """How to name its ranks: "GPUs", "CPU ranks", "fake GPUs"."""
    where: str = "of the probe group"
    """What they are: "of the probe group", "of the demo"."""


def group_of(layout: GroupLayout) -> GroupInfo:
    """A `probes.controller.GroupLayout` as a `GroupInfo`."""
    kind = str(layout.kind)
    return GroupInfo(int(layout.world_size), kind, "GPUs" if kind == "cuda" else "CPU ranks")


def scenario_for(settings: Settings, group: GroupInfo | None, allreduce: str = "auto") -> Scenario:
    """The scenario of the UI's settings on its probe group, by the one rule (`decodetop.budget.scenario`): TP is
    the settings' (from --tp or the settings file), else the group's size, else 1; `allreduce` is --allreduce."""
    tp = choose_tp(
        settings.tp,
        group_size=group.size if group is not None else None,
        group_label=group.label if group is not None else "ranks",
        group_where=group.where if group is not None else "of the probe group",
        tp_from="--tp or the settings file",
    )
    return build_scenario(source_from_setting(settings.model), tp, allreduce=allreduce)


class ControllerProbes:
    """`ProbeSource` over `decodetop.probes.controller.ProbeController`; the group is spawned on the first run."""

    def __init__(
        self,
        make_controller: Callable[[], ProbeController],
        telemetry_line: Callable[[], str] | None = None,
        *,
        cpu_rank_nice: int | None = None,
        layout: Callable[[], GroupLayout] | None = None,
        preflight: Callable[[Sequence[int]], str | None] | None = None,
    ):
        self._make = make_controller
        self.preflight = preflight
        """Given our ranks' pids, says why probing must not start now (another process holds a GPU), or None."""
        self.layout = layout
        """Returns the group's `GroupLayout` without spawning it (the plan depends on its size and device kind)."""
        self._requests: dict[str, ProbeRequest] = {}
        self.plan_notes: tuple[str, ...] = ()
        """What the plan cannot measure on this group (collectives on fewer ranks than the TP degree)."""
        self.cpu_rank_nice = cpu_rank_nice
        """Niceness for CPU (gloo) ranks, so spinning ranks on a small box leave the UI its share; None leaves them."""
        self._reniced: set[int] = set()
        self._controller: ProbeController | None = None
        self._lock = threading.Lock()
        self._closed = False
        self.telemetry_line = telemetry_line
        """Returns a one-line summary of the current telemetry (clocks, clock events), recorded with each run."""

    def _get(self) -> ProbeController:
        with self._lock:
            if self._closed:
                raise DecodetopError("probe group is closed")
            if self._controller is None:
                with real_stderr():
                    self._controller = self._make()
            return self._controller

    def plan(self, settings: Settings) -> list[ProbeView]:
        """The model's probe plan on this group: one row per probe run, with the keys it measures."""
        from decodetop.probes.planrun import plan_requests  # pulls in the probe controller (multiprocessing)

        layout = self.layout() if self.layout is not None else None
        group = group_of(layout) if layout is not None else None
        scenario = scenario_for(settings, group)
        inventory = scenario.inventory()
        world = group.size if group is not None else scenario.tp
        kind = group.kind if group is not None else "cuda"
        requests, notes = plan_requests(build_plan(inventory), inventory, world_size=world, device_kind=kind)
        self._requests = {r.probe: r for r in requests}
        self.plan_notes = tuple(notes)
        return [
            ProbeView(
                probe_id=r.probe,
                title=r.probe,
                details=(("keys measured", str(len(r.keys))), *((("first key", r.keys[0]),) if r.keys else ())),
            )
            for r in requests
        ]

    def run(self, probe_id: str, on_progress: ProgressCallback) -> ProbeOutcome:
        """Run one probe on the group (blocking), with the plan's parameters for it."""
        before = self.telemetry_line() if self.telemetry_line else ""
        if self.preflight is not None:
            own = self._controller.rank_pids() if self._controller is not None else []
            refusal = self.preflight(own)
            if refusal:
                view = ProbeView(probe_id=probe_id, title=probe_id, state=ProbeState.UNSUPPORTED, error=refusal)
                return ProbeOutcome(view=view)
        try:
            controller = self._get()

            def progress(p: Progress) -> None:
                fraction = p.done / p.total if p.total else None
                on_progress(fraction, p.line())

            self._renice(controller)
            request = self._requests.get(probe_id)
            params = dict(request.params) if request is not None else None
            result = controller.run(probe_id, params, on_progress=progress)
        except Exception as exc:  # the group could not start, or the controller is closed
            view = ProbeView(
                probe_id=probe_id,
                title=probe_id,
                state=ProbeState.FAILED,
                error=f"{type(exc).__name__}: {exc}",
                traceback=traceback.format_exc(),
            )
            return ProbeOutcome(view=view)
        after = self.telemetry_line() if self.telemetry_line else ""
        view = probe_view(result, title=probe_id)
        lines = tuple(
            line for line in (f"at start: {before}" if before else "", f"at end: {after}" if after else "") if line
        )
        if lines:
            view = replace(view, telemetry_text=lines + view.telemetry_text)
        payload = compact_payload(result.to_dict()) if result.ok else {}
        return ProbeOutcome(view=view, payload=payload, result=result if result.ok else None)

    def _renice(self, controller: ProbeController) -> None:
        """Lower the priority of CPU ranks (our own children; nothing about the host changes)."""
        if self.cpu_rank_nice is None or controller.backend != "gloo":
            return
        import psutil  # third-party, needed only for CPU ranks

        for pid in controller.rank_pids():
            if pid in self._reniced:
                continue
            with contextlib.suppress(psutil.Error):
                process = psutil.Process(pid)
                process.nice(max(process.nice(), self.cpu_rank_nice))
                self._reniced.add(pid)

    def restore(self, probe_id: str, payload: Mapping[str, Any], measured_at_s: float) -> ProbeOutcome | None:
        """A stored `ProbeResult.to_dict()` back as an outcome."""
        try:
            result = ProbeResult.from_dict(payload)
        except (KeyError, TypeError, ValueError):
            return None
        return ProbeOutcome(view=probe_view(result, title=probe_id), payload=payload, result=result)

    def is_latency_probe(self, probe_id: str) -> bool:
        """Every probe times microseconds; NVML's process-list call holds the driver lock for milliseconds
        (docs/reference/peers.md §3.8), so telemetry skips it while any probe but the bandwidth one runs."""
        return probe_id not in BANDWIDTH_PROBES

    def cancel(self) -> None:
        """Cancel the running probe (any thread)."""
        controller = self._controller
        if controller is not None:
            controller.cancel()

    def close(self) -> None:
        """End every rank."""
        with self._lock:
            self._closed = True
            controller = self._controller
        if controller is not None:
            controller.close()

    def rank_pids(self) -> list[int]:
        """PIDs of live ranks (tests)."""
        controller = self._controller
        return controller.rank_pids() if controller is not None else []


class NoProbes:
    """`ProbeSource` for ``--no-probes`` without history: an empty plan, nothing to run."""

    def __init__(self, reason: str = "probes are off (--no-probes)") -> None:
        self.reason = reason

    def plan(self, settings: Settings) -> list[ProbeView]:
        """The registry's probes, shown idle."""
        return [ProbeView(probe_id=spec.name, title=spec.name) for spec in ProbeRegistry().specs()]

    def run(self, probe_id: str, on_progress: ProgressCallback) -> ProbeOutcome:
        """Refuse, saying why."""
        return ProbeOutcome(view=ProbeView(probe_id, probe_id, ProbeState.UNSUPPORTED, error=self.reason))

    def restore(self, probe_id: str, payload: Mapping[str, Any], measured_at_s: float) -> ProbeOutcome | None:
        """History still shows."""
        return ControllerProbes.restore(self, probe_id, payload, measured_at_s)  # type: ignore[arg-type]

    def is_latency_probe(self, probe_id: str) -> bool:
        """Nothing runs."""
        return False

    def cancel(self) -> None:
        """Nothing runs."""

    def close(self) -> None:
        """Nothing to end."""


class ReplayProbes:
    """`ProbeSource` for ``--replay``: "running" a probe shows the recorded result (the newest of each probe)."""

    def __init__(self, results: Sequence[ProbeResult]) -> None:
        self.results = {r.probe: r for r in results}

    def plan(self, settings: Settings) -> list[ProbeView]:
        """The recorded probes, in recorded order."""
        return [ProbeView(probe_id=name, title=name) for name in self.results]

    def run(self, probe_id: str, on_progress: ProgressCallback) -> ProbeOutcome:
        """The recorded result."""
        result = self.results.get(probe_id)
        if result is None:
            return ProbeOutcome(
                view=ProbeView(probe_id, probe_id, ProbeState.UNSUPPORTED, error="not in the recording")
            )
        view = probe_view(result, title=probe_id)
        at = _utc_to_unix(result.started_utc) if result.started_utc else None
        return ProbeOutcome(view=replace(view, measured_at_s=at), result=result if result.ok else None)

    def restore(self, probe_id: str, payload: Mapping[str, Any], measured_at_s: float) -> ProbeOutcome | None:
        """No history in a replay."""
        return None

    def is_latency_probe(self, probe_id: str) -> bool:
        """Nothing really runs."""
        return False

    def cancel(self) -> None:
        """Nothing runs."""

    def close(self) -> None:
        """Nothing to end."""


class RecordedChecks:
    """`ChecksSource` giving the checks a recording holds."""

    def __init__(self, checks: Sequence[CheckResult]) -> None:
        self.checks = list(checks)

    def run(self) -> list[CheckResult]:
        """The recorded checks."""
        return list(self.checks)


# --- budget ---------------------------------------------------------------------------------------------------


_DIST_IMPLS = ("nccl", "gloo")
"""`impl` values of torch.distributed's own all-reduce (the group's backend): their series are named by mode alone."""


def allreduce_curves(result: ProbeResult) -> tuple[Series, ...]:
    """Latency vs size, one series per (mode, implementation) from an all-reduce result: 'graph' (NCCL, or gloo on
    CPU ranks), 'graph one-shot', 'graph two-shot' (the engines' P2P kernel class), so the paths never mix."""
    by_series: dict[tuple[str, int, str], list[tuple[float, float]]] = {}
    for m in _ok_measurements(result):
        size = m.params.get("size_bytes", m.params.get("size"))
        mode = m.params.get("mode", m.name)
        impl = str(m.params.get("impl", "nccl"))
        value = m.metrics.get("time_us")
        if value is None and m.stats is not None and m.unit == "us":
            value = m.stats.median
        if isinstance(size, int) and value is not None:
            dist = impl in _DIST_IMPLS
            label = str(mode) if dist else f"{mode} {impl.replace('_', '-')}"
            by_series.setdefault((str(mode), 0 if dist else 1, label), []).append((float(size), float(value)))
    return tuple(
        Series(label, tuple(x for x, _ in sorted(points)), tuple(y for _, y in sorted(points)))
        for (_mode, _order, label), points in sorted(by_series.items())
    )


def gemm_curves(result: ProbeResult, max_series: int = 6) -> tuple[Series, ...]:
    """Achieved GB/s vs M, one series per weight shape (the point's `curve` param; the fastest variant per M)."""
    by_curve: dict[str, dict[float, float]] = {}
    for m in _ok_measurements(result):
        rows = m.params.get("m")
        gbps = m.metrics.get("gbps")
        curve = m.params.get("curve")
        if isinstance(rows, int) and gbps is not None and isinstance(curve, str):
            label = curve.removeprefix("gemm:")
            points = by_curve.setdefault(label, {})
            points[float(rows)] = max(points.get(float(rows), 0.0), float(gbps))
    ordered = sorted(by_curve.items(), key=lambda item: -len(item[1]))[:max_series]
    return tuple(
        Series(label, tuple(sorted(points)), tuple(points[x] for x in sorted(points))) for label, points in ordered
    )


def _utc_to_unix(text: str) -> float | None:
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def measured_at(results: Mapping[str, ProbeResult]) -> dict[str, float]:
    """Probe id → Unix time the result was taken."""
    times: dict[str, float] = {}
    for probe_id, result in results.items():
        started = result.started_utc
        if started:
            at = _utc_to_unix(started)
            if at is not None:
                times[probe_id] = at
    return times


def budget_view(budget: Budget, title: str, measured_s: Mapping[str, float], tp_text: str = "") -> BudgetView:
    """A composed `Budget` as the bar's view: every figure with its provenance, the header, the observed step's
    origin and the roofline verdict, as the CLI prints them. `measured_s`: probe → when its result was taken (the age
    shown beside a measured figure)."""
    segments = []
    for seg in budget.segments:
        ages = [measured_s[p] for p in seg.probes if p in measured_s]
        measured = seg.provenance_kind.startswith("measured")
        segments.append(
            BudgetSegment(
                key=seg.component,
                label=seg.label,
                ms=seg.ms or 0.0,
                status=seg.status,
                measured_at_s=min(ages) if ages and measured else None,
                p10_ms=seg.p10_ms,
                p90_ms=seg.p90_ms,
                provenance=seg.provenance,
            )
        )
    estimates = any(s.estimated for s in budget.segments)
    summary = budget.summary() + (f" (≈ for {budget.hardware_text})" if estimates else "")
    lines = [
        f"{tp_text} · {budget.kernels} kernels/step, {budget.launch_mode} launch" if tp_text else "",
        summary,
        # the engine's all-reduce path where a rule or the flag chose it (as measured otherwise: said in the CLI)
        *dict.fromkeys(f"all-reduce: {s.path_text}" for s in budget.segments if s.path_rule and s.path_text),
    ]
    obs = budget.observed_step
    return BudgetView(
        title=title,
        segments=tuple(segments),
        observed_ms=budget.observed_ms,
        target_ms=budget.target_ms,
        roofline_ms=budget.roofline_ms,
        note="\n".join(line for line in lines if line),
        header=budget.header,
        observed_assumed=obs.assumed,
        observed_text=obs.text,
        verdict=budget.verdict,
        hardware_text=budget.hardware_text,
        ranks_text=budget.ranks.short_line() if budget.ranks is not None else "",
        straggler=budget.ranks.straggler.text if budget.ranks is not None and budget.ranks.straggler else "",
    )


_SERVER_FAILURES = frozenset(
    {"unreachable", "timed_out", "http_error", "not_metrics", "unparseable", "no_latency_metric"}
)
"""`collectors.serving.ServerState` values that mean the server could not be read (said in the bar's header)."""


class PresetBudget:
    """`BudgetSource` over the one composition (`decodetop.probes.budgeting.compose`): the same figures and
    provenance as `decodetop budget` and `decodetop probe --budget` for the same scenario and results.

    gpu_name: the GPU's NVML name once telemetry has it (how it was found: `gpu_how`). group: the probe group (its
    size is the default TP, its device kind says whether figures are a GPU's). observed_from: where the settings'
    observed step came from ("flag", "settings" or "default"). server_url: the --server URL (its answers arrive
    through `note_server`). Results taken before `session_start_s` count as measured earlier (from the history).
    """

    def __init__(
        self,
        gpu_name: Callable[[], str | None] | None = None,
        *,
        group: Callable[[], GroupInfo | None] | None = None,
        gpu_how: str = "detected by NVML",
        observed_from: str = "default",
        server_url: str | None = None,
        session_start_s: float | None = None,
        allreduce: str = "auto",
    ) -> None:
        self.gpu_name = gpu_name
        self.group = group
        self.gpu_how = gpu_how
        self.observed_from = observed_from
        self.server_url = server_url
        self.allreduce = allreduce
        """`--allreduce`: which all-reduce the engine runs (auto, nccl or custom)."""
        self.session_start_s = time.time() if session_start_s is None else session_start_s
        self._server_answer: ServerObserved | ServerStatus | None = None
        self._fresh_fingerprint: Fingerprint | None = None

    def _current_fingerprint(self, settings: Settings) -> tuple[Fingerprint, bool]:
        """This session's fingerprint for `settings` and whether it is exact (taken from a fresh result's
        environment) or expected (before the probe group has run: the versions it reports are not known yet)."""
        group = self.group() if self.group is not None else None
        scenario = scenario_for(settings, group, self.allreduce)
        fresh = self._fresh_fingerprint
        if fresh is not None:
            return dataclasses.replace(fresh, scenario=scenario.fingerprint_id), True
        kind = group.kind if group is not None else "cuda"
        name = self.gpu_name() if self.gpu_name else None
        count = group.size if group is not None else scenario.tp
        return expected_fingerprint(scenario, device_kind=kind, gpu_count=count, gpu_name=name), False

    def fingerprint(self, settings: Settings, result: object) -> Fingerprint | None:
        """The fingerprint to store with a fresh result of this session (None without an environment); from then on
        only stored records equal to it feed the budget."""
        if not isinstance(result, ProbeResult) or result.environment is None:
            return None
        group = self.group() if self.group is not None else None
        fp = fingerprint_of(result.environment, scenario_for(settings, group, self.allreduce))
        self._fresh_fingerprint = fp
        return fp

    def accepts(self, fingerprint: Fingerprint | None, settings: Settings) -> bool:
        """Whether a stored record may feed the budget for `settings`: its fingerprint matches this host, device,
        versions and scenario (records of unknown origin never do)."""
        current, exact = self._current_fingerprint(settings)
        return fingerprint_accepts(fingerprint, current, exact=exact)

    def note_server(self, answer: ServerObserved | ServerStatus) -> None:
        """The --server poller's latest answer (any thread)."""
        self._server_answer = answer

    def models(self) -> Sequence[tuple[str, str]]:
        """Preset names with their display names."""
        out = []
        for name in preset_names():
            try:
                info = preset_info(name)
            except (OSError, ValueError, AssertionError):
                info = {}
            out.append((name, str(info.get("display_name", ""))))
        return out

    def observed(self, settings: Settings, now_s: float) -> tuple[ObservedStep, str]:
        """The observed step with its origin, and a header line when the server could not be read."""
        answer = self._server_answer
        header = ""
        last: ServerObserved | None = None
        if isinstance(answer, ServerObserved):
            last = answer
        elif answer is not None:
            last = answer.last_step
            if answer.state.value in _SERVER_FAILURES:
                header = f"server {answer.url}: {answer.message} — the observed step is not live"
        if last is not None and last.step_ms == settings.observed_ms:
            age = last.age_s(now_s)
            when = f", {ago(age)}" if age is not None else ""  # "just now", never "now ago"
            now = "" if answer is last else f"; now: {answer.summary if answer is not None else ''}"
            detail = f"{last.url}, {last.window_s:.0f} s window{when}{now}"
            return ObservedStep(settings.observed_ms, "server", detail), header
        if self.observed_from in ("flag", "settings"):
            what = "--observed-ms" if self.observed_from == "flag" else ""
            return ObservedStep(settings.observed_ms, self.observed_from, what), header
        if self.server_url is not None:
            why = answer.summary if answer is not None else "waiting for the server's first window"
            return default_observed(f"the default; server {self.server_url}: {why}"), header
        return default_observed(), header

    def compose(self, settings: Settings, results: Mapping[str, object], now_s: float) -> BudgetView:
        """The budget for `settings` from the probe results so far (this session's and the history's)."""
        group = self.group() if self.group is not None else None
        scenario = scenario_for(settings, group, self.allreduce)
        good = [r for r in results.values() if isinstance(r, ProbeResult) and r.ok]
        taken = measured_at({r.probe: r for r in good})
        stored = {p: t for p, t in taken.items() if t < self.session_start_s}
        fresh = self._fresh_fingerprint
        if fresh is not None:  # once this session's ranks said what they run, stored results must match it exactly
            want = dataclasses.replace(fresh, scenario=scenario.fingerprint_id)
            good = [
                r
                for r in good
                if r.probe not in stored
                or (r.environment is not None and fingerprint_of(r.environment, want.scenario) == want)
            ]
        name = self.gpu_name() if self.gpu_name else None
        observed, header = self.observed(settings, now_s)
        budget = compose(
            scenario,
            good,
            observed=observed,
            target_tps=settings.target_tps,
            gpu=GpuHint(name, self.gpu_how) if name else None,
            group_kind=group.kind if group is not None else None,
            stored_at_s=stored,
            now_s=now_s,
        )
        view = budget_view(budget, scenario.title, taken, scenario.tp_text)
        if header:
            view = replace(view, header="\n".join(h for h in (view.header, header) if h))
        return view

    def curves(self, results: Mapping[str, object]) -> ProbeCurves:
        """Chart series from the all-reduce and GEMM results."""
        allreduce = results.get("allreduce")
        gemm = results.get("gemm")
        return ProbeCurves(
            allreduce_us_by_mode=allreduce_curves(allreduce) if allreduce is not None else (),  # type: ignore[arg-type]
            gemm_gbps_by_shape=gemm_curves(gemm) if gemm is not None else (),  # type: ignore[arg-type]
        )


# --- checks ---------------------------------------------------------------------------------------------------


class HostChecks:
    """`ChecksSource` over `decodetop.collectors.checks.host.run_all_checks` on the live host."""

    def __init__(self, nvml: Nvml | None = None) -> None:
        self.nvml = nvml

    def run(self) -> list[CheckResult]:
        """Every host and GPU check (blocking; called in a worker)."""
        return run_all_checks(nvml=self.nvml)


class BudgetServerPoller(ServerPoller):
    """`ServerPoller` that hands each answer to the budget first, so its next composition says where the observed
    step came from (or that the server could not be read)."""

    def __init__(self, source: StepSource, budget: PresetBudget, period_s: float = SERVER_POLL_S) -> None:
        super().__init__(source, period_s)
        self.budget = budget

    def start(self, on_answer: Callable[[ServerObserved | ServerStatus], None]) -> None:
        """Start polling; each answer goes to the budget, then to `on_answer`."""

        def both(answer: ServerObserved | ServerStatus) -> None:
            self.budget.note_server(answer)
            on_answer(answer)

        super().start(both)
