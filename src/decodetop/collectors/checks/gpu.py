"""Provides the GPU health checks (docs/reference/healthchecks.md P2, P6, P7, N1–N7, N9–N11) over the NVML choke point.

`gpu_checks(root, nvml)` takes two telemetry samples `window_s` apart (counters such as PCIe replays and the
clock-event reason times need a window), reads the few host files it needs through `HostRoot`, and returns one
`CheckResult` per check and subject (a GPU, a GPU pair, or the driver). N1, the driver and NVML — without NVML one
result saying why, failing where NVIDIA GPUs are on the PCI bus, and over a copied host tree — lives in
`gpu_driver`; the fixed words of every GPU check (`GpuCheck`) in `gpu_check`.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable

from decodetop.collectors.checks.gpu_check import GpuCheck
from decodetop.collectors.checks.gpu_driver import N1_NO_GPU, check_driver, no_nvml, on_the_bus, pci_gpus
from decodetop.collectors.checks.parsers import format_cpulist, parse_cpulist
from decodetop.collectors.checks.result import CheckResult, Status
from decodetop.collectors.hostroot import HostRoot
from decodetop.collectors.nvml import Nvml
from decodetop.collectors.telemetry import (
    CLOCK_EVENT_BY_NAME,
    CLOCK_EVENT_REASONS,
    GpuPairSnapshot,
    GpuSnapshot,
    TelemetrySampler,
    decode_clock_event_reasons,
)

DEFAULT_WINDOW_S = 0.5
"""Seconds between the two samples: long enough for a replay or a throttle counter to move, short enough that
`decodetop check` stays well under 2 s."""

_HW_SLOWDOWN_MASK = 0x8 | 0x40 | 0x80  # HwSlowdown, HwThermalSlowdown, HwPowerBrakeSlowdown → fail (N3)
_SW_THERMAL_MASK = 0x20  # SwThermalSlowdown → warn (N3)
_SW_POWER_CAP_MASK = 0x4  # SwPowerCap → warn when sustained under load (N3)
_APP_CLOCKS_MASK = 0x2  # ApplicationsClocksSetting (N4)
_HW_COUNTERS = ("HwThermalSlowdown", "HwPowerBrakeSlowdown")
_P2P_REQUIRED = ("read", "write")
_NS_PER_S = 1e9


def _na(g: GpuSnapshot, field: str) -> str:
    return g.unavailable.get(field, "not reported")


def _fmt_cpus(cpus: set[int]) -> str:
    """{0,1,2,3,8,9} → "0-3,8-9" (the kernel's cpulist format); "none" for no CPU."""
    return format_cpulist(cpus) or "none"


N2 = GpuCheck(
    "N2",
    "Persistence mode",
    "enabled (NVIDIA recommends the nvidia-persistenced daemon)",
    "Without persistence the driver tears the GPU state down when the last client exits; the next start pays "
    "seconds of initialisation and clocks/ECC settings are reloaded.",
    "Run nvidia-persistenced (systemctl enable --now nvidia-persistenced); decodetop never changes it.",
)
N3 = GpuCheck(
    "N3",
    "Clock-event (throttle) reasons",
    "no HwSlowdown / HwThermalSlowdown / HwPowerBrakeSlowdown; no SwThermalSlowdown; no sustained SwPowerCap "
    "under load",
    "Hardware slowdown cuts clocks by 2× or more; thermal or power capping slows every decode step by the clock ratio.",
    "Check cooling and airflow, PSU and power-brake cabling, and the power limit (nvidia-smi -q -d PERFORMANCE).",
)
N4 = GpuCheck(
    "N4",
    "Application clocks and power limit",
    "application clocks at default or max; enforced power limit = default",
    "A lowered application clock or power limit caps clocks under load (reasons 0x2 / 0x4).",
    "Reset with `nvidia-smi -rac` / `nvidia-smi -pl <default>` if the change was not intended (decodetop never "
    "changes them).",
)
N5 = GpuCheck(
    "N5",
    "ECC",
    "ECC on, current = pending; 0 uncorrected errors (volatile and aggregate)",
    "Uncorrected ECC errors since boot mean corrupted results and a GPU that needs a reset; an aggregate count "
    "means it happened before. A pending mode change waits for a GPU reset.",
    "Volatile uncorrected errors: drain the GPU, reset it (nvidia-smi -r) and watch Xid 48/63/64; repeated "
    "errors: RMA. A pending ECC mode: reset the GPU.",
)
N6 = GpuCheck(
    "N6",
    "Retired pages",
    "no page retirement pending",
    "A pending retirement takes effect only after the driver reloads; until then the bad page is in use.",
    "Reload the driver or reboot when the GPU is idle (Xid 63/64 in the kernel log).",
)
N7 = GpuCheck(
    "N7",
    "Row remapping",
    "pending = no (else a reset activates the remap); failure = no (else RMA criteria are met)",
    "A pending remap is not active until the GPU resets; a remapping failure means the memory ran out of spare rows.",
    "Pending: reset the GPU when idle. Failure: the GPU meets NVIDIA's RMA criteria; replace it.",
)
P2 = GpuCheck(
    "P2",
    "PCIe link (NVML)",
    "width = max; gen = max under load; the GPU's own max gen = the system's max",
    "A narrower link cuts host↔GPU bandwidth (weights loading, KV offload, PCIe P2P) in proportion; a slot below "
    "the GPU's generation halves it per generation.",
    "Reseat the GPU or riser, check the slot's wiring (x16 electrical) and the BIOS PCIe speed setting.",
)
P6 = GpuCheck(
    "P6",
    "GPU ↔ CPU NUMA affinity",
    "a NUMA node ≥ 0 on multi-socket hosts; NVML's and sysfs's local CPUs agree; serving processes pinned inside them",
    "A rank running on the far socket pays the inter-socket hop on every host↔GPU copy and kernel launch.",
    "Pin each rank to its GPU's local CPUs (numactl --cpunodebind, taskset, or the launcher's binding); enable "
    "ACPI SRAT/NUMA in the BIOS if the node is -1.",
)
N11 = GpuCheck(
    "N11",
    "PCIe replays",
    "about 0 growth",
    "Replays are link-level retransmissions: a growing count means a marginal link (riser, slot, cable) that "
    "costs bandwidth and may down-train.",
    "Reseat the GPU/riser; check the slot; compare with the link width and speed (P1/P2).",
)
N10_NONE = GpuCheck(
    "N10",
    "NVLink links",
    "every GPU has as many active links as its peers",
    "GPUs without NVLink talk over PCIe.",
)
N10 = GpuCheck(
    "N10",
    "NVLink links",
    "every GPU has the same active-link count as its peers, and every present link is active",
    "A GPU with an inactive NVLink has less bandwidth to its peers: every all-reduce waits for the slowest.",
    "Check `nvidia-smi nvlink -s` and the Fabric Manager (on NVSwitch systems); a persistently down link needs a "
    "reset or service.",
)
P7 = GpuCheck(
    "P7",
    "GPU-pair topology",
    "report only; pairs at SYS get poor PCIe P2P",
    "PCIe P2P between GPUs under different CPU sockets crosses the socket interconnect (slow, sometimes "
    "disabled). NVLink pairs are not affected.",
    "Place tensor-parallel groups on GPUs that share a switch or NVLink.",
)
N9 = GpuCheck(
    "N9",
    "GPU P2P capability",
    "read and write OK for every tensor-parallel pair (and NVLink OK for > 2 GPUs in vLLM)",
    "Without P2P, vLLM turns its custom all-reduce off ('lacks GPU P2P capability') and NCCL copies through host "
    "memory.",
    "Check ACS on the PCIe bridges (P4), the IOMMU mode (P5) and that the GPUs are not in different VMs.",
)


# --- per GPU ------------------------------------------------------------------------------------------------


def _check_persistence(g: GpuSnapshot, daemon: bool | None) -> CheckResult:
    daemon_text = {True: "nvidia-persistenced running", False: "nvidia-persistenced not running", None: ""}[daemon]
    if g.persistence_mode is None:
        status, observed = Status.UNKNOWN, f"persistence mode not readable ({_na(g, 'persistence_mode')})"
    elif g.persistence_mode:
        status, observed = Status.PASS, "enabled"
    else:
        status, observed = Status.WARN, "disabled"
    if daemon_text:
        observed += f"; {daemon_text}"
    return N2.for_gpu(g, status, observed, facts={"persistence": str(g.persistence_mode)})


def _counter_delta(a: GpuSnapshot, b: GpuSnapshot, name: str) -> int | None:
    before, after = a.clock_event_time_ns.get(name), b.clock_event_time_ns.get(name)
    if before is None or after is None or after < before:
        return None
    return after - before


def _clock_event_verdict(union: int, both: int, *, hw_grown: bool, under_load: bool) -> tuple[Status, list[str]]:
    """N3: hardware slowdown fails; software thermal slowdown warns; a power cap held across the window warns
    under load. `union`/`both` are the reason masks seen in either or both samples."""
    if union & _HW_SLOWDOWN_MASK or hw_grown:
        return Status.FAIL, ["hardware slowdown active"]
    if union & _SW_THERMAL_MASK:
        return Status.WARN, ["software thermal slowdown"]
    if both & _SW_POWER_CAP_MASK and under_load:
        return Status.WARN, ["power cap held across the window under load"]
    return Status.PASS, []


def _check_clock_events(a: GpuSnapshot, b: GpuSnapshot, *, under_load: bool, window_s: float) -> CheckResult:
    masks = [m for m in (a.clock_event_mask, b.clock_event_mask) if m is not None]
    supported = b.clock_event_supported_mask
    if not masks:
        return N3.for_gpu(b, Status.UNKNOWN, f"not readable ({_na(b, 'clock_event_mask')})")
    union = 0
    for m in masks:
        union |= m
    if supported is not None:
        union_masked = union & supported
        union = union_masked if union_masked or not union else union
    both = masks[0] & masks[-1]
    reasons = decode_clock_event_reasons(union)
    hw_grown = any(_counter_delta(a, b, n) for n in _HW_COUNTERS)
    hw_total = {n: b.clock_event_time_ns[n] for n in _HW_COUNTERS if b.clock_event_time_ns.get(n)}
    status, notes = _clock_event_verdict(union, both, hw_grown=hw_grown, under_load=under_load)
    observed = f"0x{union:x} " + (", ".join(reasons) if reasons else "none")
    if b.clock_event_share:
        shares = ", ".join(
            f"{k} {v:.0%}" for k, v in sorted(b.clock_event_share.items()) if v > 0 and k in CLOCK_EVENT_BY_NAME
        )
        if shares:
            observed += f"; share of the last interval: {shares}"
    if hw_total:
        observed += "; since driver load: " + ", ".join(f"{k} {v / _NS_PER_S:.1f} s" for k, v in hw_total.items())
    if notes:
        observed += f" ({'; '.join(notes)})"
    if not under_load and status is Status.PASS:
        observed += " (idle: sample under load for a verdict on power capping)"
    facts = {"clock_event_mask": f"0x{union:x}"}
    facts.update({f"{k}_ns": str(v) for k, v in b.clock_event_time_ns.items()})
    fixes = [CLOCK_EVENT_BY_NAME[n].meaning for n in reasons if n in CLOCK_EVENT_BY_NAME and n != "GpuIdle"]
    return N3.for_gpu(
        b,
        status,
        observed,
        facts=facts,
        fix=("; ".join(fixes) + ". " if fixes else "") + N3.fix,
    )


def _check_app_clocks_power(g: GpuSnapshot, *, under_load: bool) -> CheckResult:
    mask = g.clock_event_mask or 0
    notes: list[str] = []
    status = Status.PASS
    sm_ref = g.default_app_sm_clock_mhz or g.sm_clock_max_mhz
    parts = [
        f"app clocks SM {g.app_sm_clock_mhz or 'N/A'} / mem {g.app_mem_clock_mhz or 'N/A'} MHz "
        f"(default {g.default_app_sm_clock_mhz or 'N/A'} / {g.default_app_mem_clock_mhz or 'N/A'}, "
        f"max {g.sm_clock_max_mhz or 'N/A'} / {g.mem_clock_max_mhz or 'N/A'})"
    ]
    if g.app_sm_clock_mhz is not None and sm_ref is not None and g.app_sm_clock_mhz < sm_ref:
        notes.append("application SM clock below default")
        status = Status.WARN if under_load and mask & _APP_CLOCKS_MASK else Status.INFO
    parts.append(
        f"power limit enforced {g.power_limit_enforced_w or 'N/A'} W, default {g.power_limit_default_w or 'N/A'} W"
    )
    if (
        g.power_limit_enforced_w is not None
        and g.power_limit_default_w is not None
        and g.power_limit_enforced_w < g.power_limit_default_w
    ):
        notes.append("power limit below default")
        lowered = Status.WARN if under_load and mask & _SW_POWER_CAP_MASK else Status.INFO
        status = max(status, lowered, key=lambda s: s.severity)
    if g.app_sm_clock_mhz is None and g.power_limit_enforced_w is None:
        status = Status.UNKNOWN
    observed = "; ".join(parts) + (f" ({'; '.join(notes)})" if notes else "")
    return N4.for_gpu(
        g,
        status,
        observed,
        facts={
            "app_sm_clock_mhz": str(g.app_sm_clock_mhz),
            "power_limit_enforced_w": str(g.power_limit_enforced_w),
        },
    )


def _check_ecc(g: GpuSnapshot) -> CheckResult:
    vol, agg = g.ecc_uncorrected_volatile, g.ecc_uncorrected_aggregate
    if g.ecc_enabled is None:
        status, observed = Status.INFO, f"ECC mode not readable ({_na(g, 'ecc_enabled')})"
    else:
        observed = f"ECC {'on' if g.ecc_enabled else 'off'}"
        if g.ecc_pending_enabled is not None and g.ecc_pending_enabled != g.ecc_enabled:
            observed += f", {'on' if g.ecc_pending_enabled else 'off'} after reset (pending)"
        observed += f"; uncorrected volatile {vol if vol is not None else 'N/A'}, aggregate "
        observed += f"{agg if agg is not None else 'N/A'}; corrected volatile "
        observed += f"{g.ecc_corrected_volatile if g.ecc_corrected_volatile is not None else 'N/A'}"
        if vol:
            status = Status.FAIL
        elif agg or not g.ecc_enabled or (g.ecc_pending_enabled is not None and g.ecc_pending_enabled != g.ecc_enabled):
            status = Status.WARN
        else:
            status = Status.PASS
    return N5.for_gpu(g, status, observed, facts={"ecc": str(g.ecc_enabled), "ecc_uncorrected_aggregate": str(agg)})


def _check_retired_pages(g: GpuSnapshot) -> CheckResult:
    if g.retired_pages_pending is None:
        status = Status.INFO
        observed = f"not used on this GPU ({_na(g, 'retired_pages_pending')}); Ampere and later remap rows (N7)"
    elif g.retired_pages_pending:
        status, observed = Status.WARN, "page retirement pending"
    else:
        status, observed = Status.PASS, "no retirement pending"
    return N6.for_gpu(g, status, observed)


def _check_row_remap(g: GpuSnapshot) -> CheckResult:
    if g.remapped_rows_pending is None or g.remapped_rows_failure is None:
        status = Status.INFO
        observed = f"not readable ({_na(g, 'remapped_rows_pending')})"
    else:
        observed = (
            f"{g.remapped_rows_correctable} correctable, {g.remapped_rows_uncorrectable} uncorrectable rows remapped; "
            f"pending {'yes' if g.remapped_rows_pending else 'no'}, "
            f"failure {'yes' if g.remapped_rows_failure else 'no'}"
        )
        if g.remapped_rows_failure:
            status = Status.FAIL
        elif g.remapped_rows_pending:
            status = Status.WARN
        else:
            status = Status.PASS
    return N7.for_gpu(
        g,
        status,
        observed,
        facts={
            "remapped_rows_uncorrectable": str(g.remapped_rows_uncorrectable),
            "remapped_rows_pending": str(g.remapped_rows_pending),
        },
    )


def _check_pcie_link(g: GpuSnapshot, *, under_load: bool) -> CheckResult:
    if g.pcie_gen is None or g.pcie_width is None:
        return P2.for_gpu(g, Status.UNKNOWN, f"link not readable ({_na(g, 'pcie_gen')})")
    observed = (
        f"Gen{g.pcie_gen} x{g.pcie_width} (max Gen{g.pcie_gen_max or '?'} x{g.pcie_width_max or '?'}, "
        f"GPU's own max Gen{g.pcie_gen_gpu_max or '?'})"
    )
    status = Status.PASS
    notes: list[str] = []
    if g.pcie_width_max is None or g.pcie_gen_max is None:  # nothing to judge the link against: never a pass
        status = Status.UNKNOWN
        notes.append(f"the link's maximum is not readable ({_na(g, 'pcie_width_max')})")
    if g.pcie_width_max is not None and g.pcie_width < g.pcie_width_max:
        status = Status.FAIL
        notes.append(f"link trained to x{g.pcie_width} of x{g.pcie_width_max}")
    if g.pcie_gen_max is not None and g.pcie_gen < g.pcie_gen_max:
        if under_load:
            status = max(status, Status.WARN, key=lambda s: s.severity)
            notes.append(f"Gen{g.pcie_gen} under load, below Gen{g.pcie_gen_max}")
        else:
            status = max(status, Status.INFO, key=lambda s: s.severity)
            notes.append("idle GPUs retrain to a lower speed: recheck under load")
    if g.pcie_gen_gpu_max is not None and g.pcie_gen_max is not None and g.pcie_gen_gpu_max > g.pcie_gen_max:
        status = max(status, Status.WARN, key=lambda s: s.severity)
        notes.append(f"the slot or riser limits the link to Gen{g.pcie_gen_max}")
    if notes:
        observed += " (" + "; ".join(notes) + ")"
    return P2.for_gpu(
        g,
        status,
        observed,
        facts={
            "pcie_gen": str(g.pcie_gen),
            "pcie_width": str(g.pcie_width),
            "pcie_gen_max": str(g.pcie_gen_max),
            "pcie_width_max": str(g.pcie_width_max),
        },
    )


def _sysfs_affinity(g: GpuSnapshot, root: HostRoot | None) -> tuple[set[int] | None, int | None]:
    """The GPU's local CPUs and NUMA node as sysfs gives them (None where unreadable or malformed)."""
    if root is None or not g.pci_bus_id:
        return None, None
    text = root.try_read_text(f"/sys/bus/pci/devices/{g.pci_bus_id}/local_cpulist")
    try:
        cpus: set[int] | None = set(parse_cpulist(text)) if text else None
    except ValueError:
        cpus = None
    node_text = (root.try_read_text(f"/sys/bus/pci/devices/{g.pci_bus_id}/numa_node") or "").strip()
    return cpus, int(node_text) if node_text.lstrip("-").isdigit() else None


def _numa_verdict(
    numa: int | None, nodes: int | None, cpus: tuple[set[int] | None, set[int] | None], *, have_root: bool
) -> tuple[Status, list[str]]:
    """P6's status and notes from the NUMA node and the (NVML, sysfs) local CPUs."""
    nvml_cpus, sys_cpus = cpus
    status = Status.UNKNOWN if nvml_cpus is None and sys_cpus is None else Status.PASS
    notes: list[str] = []
    if numa is None and nodes == 1:  # an unknown node never passes; on one node there is nothing to misplace
        status = Status.INFO
        notes.append("NUMA node not reported; one NUMA node on this host")
    elif numa is None:
        status = Status.UNKNOWN
        notes.append("NUMA node not reported by NVML or sysfs: affinity not judged")
    elif numa == -1 and nodes is not None and nodes > 1:
        status = Status.WARN
        notes.append(f"firmware gives no NUMA node on a {nodes}-node host")
    elif numa == -1:
        status = Status.INFO
        notes.append("no NUMA proximity from firmware (single node: harmless)")
    if nvml_cpus is not None and sys_cpus is not None and nvml_cpus != sys_cpus:
        status = max(status, Status.WARN, key=lambda s: s.severity)
        notes.append("NVML and sysfs disagree on the local CPUs")
    if not have_root and status is Status.PASS:
        status = Status.INFO
        notes.append("sysfs not read (no host root)")
    return status, notes


def _check_numa(g: GpuSnapshot, root: HostRoot | None, nodes: int | None) -> CheckResult:
    nvml_cpus = set(g.cpu_affinity) if g.cpu_affinity is not None else None
    sys_cpus, numa = _sysfs_affinity(g, root)
    if numa is None:
        numa = g.numa_node_id
    facts: dict[str, str] = {}
    parts = [f"NUMA node {numa if numa is not None else 'unknown'}"]
    if nvml_cpus is not None:
        facts["nvml_cpus"] = _fmt_cpus(nvml_cpus)
        parts.append(f"NVML CPUs {facts['nvml_cpus']}")
    if sys_cpus is not None:
        facts["local_cpulist"] = _fmt_cpus(sys_cpus)
        parts.append(f"sysfs local_cpulist {facts['local_cpulist']}")
    facts["numa_node"] = str(numa)
    status, notes = _numa_verdict(numa, nodes, (nvml_cpus, sys_cpus), have_root=root is not None)
    observed = "; ".join(parts) + (f" ({'; '.join(notes)})" if notes else "")
    return P6.for_gpu(g, status, observed, facts=facts)


def _check_replays(a: GpuSnapshot, b: GpuSnapshot, window_s: float) -> CheckResult:
    if b.pcie_replay_count is None:
        return N11.for_gpu(b, Status.UNKNOWN, f"replay counter not readable ({_na(b, 'pcie_replay_count')})")
    growth = b.pcie_replay_count - a.pcie_replay_count if a.pcie_replay_count is not None else None
    if window_s <= 0 or growth is None:
        status = Status.INFO
        observed = f"{b.pcie_replay_count} replays since driver load (one reading: no window)"
    else:
        status = Status.WARN if growth > 0 else Status.PASS
        observed = f"{b.pcie_replay_count} replays since driver load; +{growth} in {window_s:.1f} s"
    return N11.for_gpu(b, status, observed, facts={"pcie_replays": str(b.pcie_replay_count)})


# --- system-wide and pairs ----------------------------------------------------------------------------------


def _check_nvlink(gpus: tuple[GpuSnapshot, ...]) -> CheckResult:
    counts = {g.index: g.nvlink_active_links for g in gpus}
    present = {g.index: g.nvlink_links for g in gpus}
    known = {i: c for i, c in counts.items() if c is not None}
    observed = ", ".join(f"GPU{i} {c}/{present[i] if present[i] is not None else '?'}" for i, c in known.items())
    if not known or max(known.values()) == 0:
        reason = next((g.unavailable.get("nvlink_active_links") for g in gpus), None) or "no NVLink"
        return N10_NONE.result(Status.INFO, f"no active NVLink ({reason})", subject="all GPUs")
    best = max(known.values())
    short = [i for i, c in known.items() if c < best or (present[i] is not None and c < (present[i] or 0))]
    status = Status.FAIL if short else Status.PASS
    if short:
        observed += f" (short: {', '.join(f'GPU{i}' for i in short)})"
    return N10.result(
        status,
        f"active/present links: {observed}",
        subject="all GPUs",
        facts={f"gpu{i}_nvlink_active": str(c) for i, c in known.items()},
    )


def _check_topology(p: GpuPairSnapshot) -> CheckResult:
    name = p.topology_name or "unknown"
    return P7.result(
        Status.INFO if p.topology_level is not None else Status.UNKNOWN,
        f"common ancestor {name}"
        + (f" ({p.topology_level})" if p.topology_level is not None else f" ({p.unavailable.get('topology_level')})")
        + (" — PCIe P2P crosses the CPU interconnect" if p.topology_level == 50 else ""),
        subject=f"GPU{p.gpu_a}-GPU{p.gpu_b}",
        on=f"GPU{p.gpu_a}-GPU{p.gpu_b}",
        facts={"topology": name},
    )


def _check_p2p(p: GpuPairSnapshot) -> CheckResult:
    statuses = ", ".join(f"{cap} {p.p2p_name(cap)}" for cap in p.p2p_status)
    required = [p.p2p_status.get(cap) for cap in _P2P_REQUIRED]
    if any(code is None for code in required):
        status = Status.UNKNOWN
    elif all(code == 0 for code in required):
        status = Status.PASS
    else:
        status = Status.WARN
    return N9.result(
        status,
        statuses,
        subject=f"GPU{p.gpu_a}-GPU{p.gpu_b}",
        on=f"GPU{p.gpu_a}-GPU{p.gpu_b}",
        facts={cap: p.p2p_name(cap) for cap in p.p2p_status},
    )


def _numa_nodes(root: HostRoot | None) -> int | None:
    if root is None:
        return None
    nodes = [n for n in root.try_listdir("/sys/devices/system/node") if re.fullmatch(r"node\d+", n)]
    return len(nodes) or None


def _persistenced_running(root: HostRoot | None) -> bool | None:
    """Whether a process named nvidia-persistenced runs (comm is cut to 15 characters: "nvidia-persiste")."""
    if root is None:
        return None
    pids = [p for p in root.try_listdir("/proc") if p.isdigit()]
    if not pids:
        return None
    for pid in pids:
        comm = root.try_read_text(f"/proc/{pid}/comm")
        if comm and comm.strip().startswith("nvidia-persiste"):
            return True
    return False


def gpu_checks(
    root: HostRoot | None,
    nvml: Nvml,
    *,
    under_load: bool = False,
    window_s: float = DEFAULT_WINDOW_S,
    runtime_cuda: str | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> list[CheckResult]:
    """Run the GPU checks. `root` None skips the host-file parts; `under_load` means the GPUs are busy now.

    Two samples `window_s` apart (0 for one) give the counters a window. `runtime_cuda` ("12.4", e.g. from
    torch.version.cuda, passed by a caller that has it) adds the driver-vs-runtime CUDA comparison to N1.
    """
    status = nvml.status()
    if not status.available:
        return no_nvml(root, status)
    sampler = TelemetrySampler(nvml)
    first = sampler.sample(processes=False, processes_note="not needed by the checks")
    if window_s > 0:
        sleep(window_s)
        second = sampler.sample(processes=False, processes_note="not needed by the checks")
    else:
        second = first
    results: list[CheckResult] = []
    if not second.gpus:
        on_bus = pci_gpus(root)
        results.append(
            N1_NO_GPU.result(
                Status.FAIL if on_bus else Status.INFO,
                f"NVML works (driver {second.system.driver_version or 'unknown'}) but sees no GPU"
                + (f", while {on_the_bus(on_bus)}" if on_bus else ""),
                subject="driver",
            )
        )
        return results
    results.append(check_driver(root, second, runtime_cuda))
    nodes = _numa_nodes(root)
    daemon = _persistenced_running(root)
    for a, b in zip(first.gpus, second.gpus, strict=True):
        results.append(_check_pcie_link(b, under_load=under_load))
        results.append(_check_numa(b, root, nodes))
        results.append(_check_persistence(b, daemon))
        results.append(_check_clock_events(a, b, under_load=under_load, window_s=window_s))
        results.append(_check_app_clocks_power(b, under_load=under_load))
        results.append(_check_ecc(b))
        results.append(_check_retired_pages(b))
        results.append(_check_row_remap(b))
        results.append(_check_replays(a, b, window_s))
    results.append(_check_nvlink(second.gpus))
    for pair in second.pairs:
        results.append(_check_topology(pair))
        results.append(_check_p2p(pair))
    return results


__all__ = [
    "CLOCK_EVENT_REASONS",
    "DEFAULT_WINDOW_S",
    "gpu_checks",
]
