"""Provides the telemetry's view types: a `TelemetrySnapshot` (and each GPU in it) as the frame and rows the UI draws,
with the processes on each GPU named by user and command line, their CPU share, resident memory and age."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from decodetop.collectors.telemetry import GpuSnapshot, TelemetrySnapshot
from decodetop.inert import inert_data
from decodetop.tui.model import GpuProcessView, GpuView, TelemetryFrame

BYTES_PER_GB = 1e9


@dataclass(frozen=True)
class ProcessInfo:
    """What the host says of one process: who runs it, its command line, and (as nvitop shows them) its CPU share
    since the previous tick, its resident memory and when it started (None where not known)."""

    user: str
    command: str
    cpu_pct: float | None = None
    rss_bytes: int | None = None
    started_at_s: float | None = None


ProcessDescriber = Callable[[int], ProcessInfo]
"""pid → what the host says of that process."""
COMMAND_CHARS = 200
"""Command lines are kept to this many characters (the list cuts them to its width; details show them whole)."""
FOREIGN = ProcessInfo("?", "(recorded on another host)")


class LocalProcesses:
    """`ProcessDescriber` of this host's processes, through psutil (collector thread). It keeps each process's psutil
    handle between ticks, so the CPU % is over the time since the previous tick (its first tick has none)."""

    def __init__(self) -> None:
        self._handles: dict[int, object] = {}

    def __call__(self, pid: int) -> ProcessInfo:
        import psutil  # third-party: only where the host's processes are named

        proc = self._handles.get(pid)
        try:
            fresh = not isinstance(proc, psutil.Process) or not proc.is_running()
            if fresh:
                proc = psutil.Process(pid)
                self._handles[pid] = proc
            assert isinstance(proc, psutil.Process)
            with proc.oneshot():
                user = proc.username()
                command = " ".join(proc.cmdline()) or proc.name()
                cpu = proc.cpu_percent(None)
                rss = int(proc.memory_info().rss)
                started = float(proc.create_time())
        except psutil.NoSuchProcess:
            self._handles.pop(pid, None)
            return ProcessInfo("?", "(exited)")
        except psutil.AccessDenied:
            return ProcessInfo("?", "(not readable by this user)")
        except (psutil.Error, OSError) as exc:
            return ProcessInfo("?", f"({type(exc).__name__})")
        return ProcessInfo(user, command[:COMMAND_CHARS], None if fresh else cpu, rss, started)

    def keep_only(self, pids: set[int]) -> None:
        """Forget the handles of processes no longer on a GPU."""
        for pid in set(self._handles) - pids:
            del self._handles[pid]


def _process_views(snapshot: GpuSnapshot, describe: ProcessDescriber | None) -> tuple[GpuProcessView, ...] | None:
    if snapshot.processes is None:
        return None
    out = []
    for proc in snapshot.processes:
        info = describe(proc.pid) if describe is not None else FOREIGN
        out.append(
            GpuProcessView(
                pid=proc.pid,
                used_mem_bytes=proc.used_mem_bytes,
                kind=proc.kind,
                user=info.user,
                command=info.command,
                sm_util_pct=None if proc.sm_util_pct is None else float(proc.sm_util_pct),
                cpu_pct=info.cpu_pct,
                rss_bytes=info.rss_bytes,
                started_at_s=info.started_at_s,
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
        **_nvlink_view(snapshot),
        clock_event_share=tuple(sorted(snapshot.clock_event_share.items())),
        processes=_process_views(snapshot, describe),
        processes_note=snapshot.processes_note,
    )


def _nvlink_view(snapshot: GpuSnapshot) -> dict[str, Any]:
    """The NVLink throughput fields of a `GpuView`: per link and summed, GB/s, or why they are n/a."""
    tx, rx = snapshot.nvlink_tx_bytes_per_s, snapshot.nvlink_rx_bytes_per_s
    links = sorted(set(tx) | set(rx))
    per_link = tuple(
        (link, None if link not in tx else tx[link] / BYTES_PER_GB, None if link not in rx else rx[link] / BYTES_PER_GB)
        for link in links
    )
    note = snapshot.unavailable.get("nvlink_tx_bytes_per_s") or snapshot.unavailable.get("nvlink_rx_bytes_per_s", "")
    return {
        "nvlink_tx_gbps": sum(tx.values()) / BYTES_PER_GB if tx else None,
        "nvlink_rx_gbps": sum(rx.values()) / BYTES_PER_GB if rx else None,
        "nvlink_link_gbps": per_link,
        "nvlink_note": "" if tx or rx else note,
    }


def telemetry_frame(snapshot: TelemetrySnapshot, describe: ProcessDescriber | None = None) -> TelemetryFrame:
    """A `TelemetrySnapshot` as the UI's frame, saying where the data came from when it is not live NVML.
    Processes are named through `describe` only for live NVML (a recording's pids belong to another host)."""
    live = snapshot.source == "nvml"
    note = "" if live else f"data from {snapshot.source}"
    frame = TelemetryFrame(
        taken_at_s=snapshot.taken_at_unix_s,
        gpus=tuple(gpu_view(g, describe if live else None) for g in snapshot.gpus),
        unavailable_reason="" if snapshot.nvml_available else (snapshot.nvml_reason or "NVML unavailable"),
        source_note=note,
        sample_ms=snapshot.tick_cost_s * 1000.0,
    )
    return inert_data(frame)  # GPU names, command lines, a replay's source: data, never a control sequence
