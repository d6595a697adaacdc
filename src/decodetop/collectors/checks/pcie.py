"""Provides the PCIe checks read from sysfs: P1 link, P3 MaxPayload/MaxReadReq, P4 ACS on bridges, P5 IOMMU, P6 GPU-CPU
NUMA affinity and P7 GPU-pair topology (docs/reference/healthchecks.md §1-§2). One result per GPU (or pair)."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass

from decodetop.collectors.checks.context import HostContext, guarded, per_gpu, unless_root
from decodetop.collectors.checks.parsers import format_cpulist, parse_cpulist, parse_int
from decodetop.collectors.checks.result import CheckResult, Status
from decodetop.collectors.hostroot import HostRoot
from decodetop.collectors.pci import (
    HEADER_ONLY_BYTES,
    PciConfig,
    PciConfigError,
    PciDevice,
    parse_link_speed,
    read_config,
    root_complex,
    upstream_bdfs,
)

P3_MRRS_RECOMMENDED_BYTES = 4096
"""docs/reference/healthchecks.md P3: MRRS 4096 for DMA-heavy devices ([MLNX-PCIE]; the GPU optimum is unconfirmed)."""
P3_MRRS_TOO_LOW_BYTES = 256
"""fwts maxreadreq: below 256 is too low ([FWTS-MRRS])."""

_NEEDS_ROOT = " (the header): capabilities need host root (CAP_SYS_ADMIN in the init user namespace)"
_NO_GPU = "no NVIDIA GPU (vendor 0x10de, class 0x03xxxx) in /sys/bus/pci/devices"


def _no_gpu(check_id: str, title: str) -> list[CheckResult]:
    return [CheckResult(check_id, title, Status.INFO, _NO_GPU, "one result per GPU")]


def _each_gpu(
    ctx: HostContext, check_id: str, title: str, one: Callable[[HostContext, PciDevice, str], CheckResult]
) -> list[CheckResult]:
    """`one` GPU's result for every GPU (a GPU whose files cannot be read gets an UNKNOWN result of its own), or
    the one no-GPU result."""
    if not ctx.gpus:
        return _no_gpu(check_id, title)
    results: list[CheckResult] = []
    for gpu in ctx.gpus:
        with per_gpu(results, check_id, title, gpu, root=ctx.root):
            results.append(one(ctx, gpu, title))
    return results


def _config_or_reason(root: HostRoot, bdf: str) -> tuple[PciConfig | None, str]:
    """Decoded config, or None and a reason ('only 64 bytes readable: needs host root')."""
    try:
        config = read_config(root, bdf)
    except PciConfigError as exc:
        return None, f"{bdf} config: {exc}"
    except OSError as exc:
        return None, f"{bdf} config unreadable: {exc}"
    if config.header_only:
        return None, (
            f"{bdf} config: only {config.size_bytes} bytes readable"
            + (_NEEDS_ROOT if config.size_bytes == HEADER_ONLY_BYTES else "")
        )
    return config, ""


@guarded("P1", "GPU PCIe link (sysfs)")
def check_link(ctx: HostContext) -> list[CheckResult]:
    """P1: width current = max (else fail); speed current = max, judged only under load."""
    return _each_gpu(ctx, "P1", "GPU PCIe link (sysfs)", _link_one)


def _link_one(ctx: HostContext, gpu: PciDevice, title: str) -> CheckResult:
    root = ctx.root
    cur_speed = parse_link_speed(root.read_text(gpu.sysfs("current_link_speed")))
    max_speed = parse_link_speed(root.read_text(gpu.sysfs("max_link_speed")))
    cur_width = parse_int(root.read_text(gpu.sysfs("current_link_width")), gpu.sysfs("current_link_width"))
    max_width = parse_int(root.read_text(gpu.sysfs("max_link_width")), gpu.sysfs("max_link_width"))
    expected = "width current = max; speed current = max under load"
    why = (
        "A narrower link cuts host-GPU bandwidth in proportion; NVIDIA GPUs retrain to 2.5 GT/s when idle, so "
        "speed only counts under load."
    )
    facts = {
        "link": f"{cur_speed or '?'} GT/s x{cur_width}",
        "link_max": f"{max_speed or '?'} GT/s x{max_width}",
    }
    subject = f"GPU {gpu.bdf}"
    observed = f"{cur_speed or '?'} GT/s x{cur_width} (max {max_speed or '?'} GT/s x{max_width})"
    bridges = upstream_bdfs(gpu)
    slot_note = ""
    if bridges and max_speed is not None:
        parent_text = root.try_read_text(f"/sys/bus/pci/devices/{bridges[-1]}/max_link_speed")
        parent_max = parse_link_speed(parent_text) if parent_text else None
        if parent_max is not None and parent_max < max_speed:
            slot_note = f"; the slot ({bridges[-1]}) tops out at {parent_max} GT/s"
    status, suffix, fix = _link_verdict(ctx, gpu.bdf, (cur_speed, max_speed), (cur_width, max_width), slot_note)
    if status is Status.INFO:
        facts["link"] = "idle"
    return CheckResult(
        f"P1:{gpu.bdf}", title, status, observed + suffix, expected, why, fix, subject=subject, facts=facts
    )


def _link_verdict(
    ctx: HostContext,
    bdf: str,
    speeds: tuple[float | None, float | None],
    widths: tuple[int, int],
    slot_note: str,
) -> tuple[Status, str, str]:
    """P1's status, the text added to the observed link, and the fix: width always counts, speed only under load."""
    (cur_speed, max_speed), (cur_width, max_width) = speeds, widths
    if cur_speed is None or max_speed is None:
        return Status.UNKNOWN, ": link speed reads Unknown", ""
    if cur_width < max_width:
        return (
            Status.FAIL,
            slot_note,
            "Reseat the GPU or riser, check the slot's lane wiring (BIOS bifurcation) and the cable.",
        )
    if slot_note:
        return (
            Status.WARN,
            slot_note,
            "Move the GPU to a slot whose bridge supports the GPU's speed, or check the riser.",
        )
    if cur_speed >= max_speed:
        return Status.PASS, "", ""
    busy = None if ctx.gpu_busy is None else ctx.gpu_busy.get(bdf)
    if busy:
        return (
            Status.WARN,
            " under load",
            "Check the slot and riser; set the PCIe speed in the BIOS to the GPU's generation.",
        )
    return (
        Status.INFO,
        ": idle, recheck under load" + ("" if busy is False else " (load unknown)"),
        "Re-run `decodetop check` while the GPU serves traffic.",
    )


def _path_mps(ctx: HostContext, gpu: PciDevice, own_cap: int | None) -> tuple[int | None, list[str]]:
    """The largest MaxPayload every device on the GPU's path supports, and the bridges whose config was unreadable."""
    caps = [own_cap]
    unread: list[str] = []
    for bridge in upstream_bdfs(gpu):
        config, _ = _config_or_reason(ctx.root, bridge)
        if config is None or config.pcie is None:
            unread.append(bridge)
        else:
            caps.append(config.pcie.devcap_mps_bytes)
    known = [c for c in caps if c is not None]
    return (min(known) if known else None), unread


def _payload_problems(mrrs: int | None, mps: int | None, path_mps: int | None) -> list[str]:
    """P3's problems: MaxReadReq below the recommendation, MaxPayload unlike the path's (when every bridge read)."""
    problems = []
    if mrrs is None or mrrs < P3_MRRS_TOO_LOW_BYTES:
        problems.append("MaxReadReq below 256 B (fwts: too low)")
    elif mrrs < P3_MRRS_RECOMMENDED_BYTES:
        problems.append(f"MaxReadReq {mrrs} B < {P3_MRRS_RECOMMENDED_BYTES} B")
    if path_mps is not None and mps is not None and mps != path_mps:
        problems.append(f"MaxPayload {mps} B != path {path_mps} B")
    return problems


@guarded("P3", "MaxPayload / MaxReadReq")
def check_payload(ctx: HostContext) -> list[CheckResult]:
    """P3: MRRS 4096 (warn below); MPS equal to the smallest supported MPS along the path."""
    title = "MaxPayload / MaxReadReq"
    if not ctx.gpus:
        return _no_gpu("P3", title)
    results: list[CheckResult] = []
    for gpu in ctx.gpus:
        with per_gpu(results, "P3", title, gpu, root=ctx.root):
            subject = f"GPU {gpu.bdf}"
            expected = f"MaxReadReq {P3_MRRS_RECOMMENDED_BYTES} B; MaxPayload = the smallest DevCap MPS on the path"
            why = (
                "Small read requests split every DMA read into more TLPs, each with its own completion; NIC tuning "
                "guides set 4096 for DMA-heavy devices (the GPU optimum is not confirmed)."
            )
            config, reason = _config_or_reason(ctx.root, gpu.bdf)
            if config is None or config.pcie is None:
                results.append(
                    CheckResult(
                        f"P3:{gpu.bdf}",
                        title,
                        Status.UNKNOWN,
                        reason or f"{gpu.bdf}: no PCI Express capability",
                        expected,
                        why,
                        unless_root(ctx.root, "Run `decodetop check` as root on the host (not in a container)."),
                        subject=subject,
                    )
                )
                continue
            pcie = config.pcie
            path_mps, unread = _path_mps(ctx, gpu, pcie.devcap_mps_bytes)
            observed = f"MaxPayload {pcie.mps_bytes} B, MaxReadReq {pcie.mrrs_bytes} B"
            if path_mps is not None:
                observed += f" (path supports MPS {path_mps} B" + (
                    f", {len(unread)} bridge(s) unreadable)" if unread else ")"
                )
            problems = _payload_problems(pcie.mrrs_bytes, pcie.mps_bytes, None if unread else path_mps)
            # MaxPayload against a path with unreadable bridges is not judged: that half never passes
            unjudged = bool(unread) or path_mps is None or pcie.mps_bytes is None
            status = Status.WARN if problems else Status.UNKNOWN if unjudged else Status.PASS
            if problems:
                observed += ": " + "; ".join(problems)
            results.append(
                CheckResult(
                    f"P3:{gpu.bdf}",
                    title,
                    status,
                    observed,
                    expected,
                    why,
                    "Set MaxReadReq in the BIOS (PCIe 'Max Read Request Size'), or pass pci=pcie_bus_perf; decodetop "
                    "never writes config space."
                    if problems
                    else "",
                    subject=subject,
                    facts={"mps_bytes": str(pcie.mps_bytes), "mrrs_bytes": str(pcie.mrrs_bytes)},
                )
            )
    return results


@dataclass(frozen=True)
class _BridgeScan:
    """What the ACS Control registers of the bridges above one GPU say."""

    redirecting: tuple[str, ...]
    unknown: tuple[str, ...]
    clean: int


def _scan_bridges(ctx: HostContext, bridges: list[str]) -> _BridgeScan:
    """Each bridge: redirects P2P, clean (no ACS or redirect bits clear), or unknowable (with the reason)."""
    redirecting: list[str] = []
    unknown: list[str] = []
    header_only: list[str] = []
    clean = 0
    for bridge in bridges:
        config, reason = _config_or_reason(ctx.root, bridge)
        if config is None and reason.endswith(_NEEDS_ROOT):
            header_only.append(bridge)
        elif config is None:
            unknown.append(reason)
        elif not config.has_extended_space:
            unknown.append(f"{bridge}: no extended config space ({config.size_bytes} bytes), ACS unknowable")
        elif config.acs is not None and config.acs.redirects_p2p:
            redirecting.append(f"{bridge} {config.acs.describe_control()}")
        else:
            clean += 1
    if header_only:
        unknown.insert(
            0,
            f"bridges {', '.join(header_only)}: only {HEADER_ONLY_BYTES} bytes of config space readable{_NEEDS_ROOT}",
        )
    return _BridgeScan(tuple(redirecting), tuple(unknown), clean)


def _acs_one(ctx: HostContext, gpu: PciDevice, title: str) -> CheckResult:
    expected = "ReqRedir- CmpltRedir- EgressCtrl- on every bridge between GPUs that do P2P"
    why = (
        "ACS redirect sends GPU peer-to-peer traffic up to the root complex (or blocks it): NCCL P2P gets slow "
        "or hangs (NCCL troubleshooting, NCCL#199)."
    )
    subject = f"GPU {gpu.bdf}"
    bridges = upstream_bdfs(gpu)
    if not bridges:
        observed = "no bridge between the GPU and its root complex"
        return CheckResult(f"P4:{gpu.bdf}", title, Status.PASS, observed, expected, why, subject=subject)
    scan = _scan_bridges(ctx, bridges)
    fix = ""
    if scan.redirecting:
        status = Status.INFO if ctx.virt.vm or len(ctx.gpus) < 2 else Status.WARN
        observed = "; ".join(scan.redirecting) + (" (one GPU: no P2P to redirect)" if len(ctx.gpus) < 2 else "")
        fix = (
            "Disable ACS in the BIOS (or setpci per NCCL's troubleshooting guide on bare metal; not inside VMs "
            "that need it for passthrough)."
        )
    elif scan.unknown:
        status, observed = Status.UNKNOWN, "; ".join(scan.unknown)
        fix = unless_root(ctx.root, "Run as root on the host to read bridge config space.")
    else:
        status, observed = Status.PASS, f"{scan.clean} bridge(s), none redirects P2P"
    return CheckResult(
        f"P4:{gpu.bdf}",
        title,
        status,
        observed,
        expected,
        why,
        fix,
        subject=subject,
        facts={"acs_redirect_bridges": str(len(scan.redirecting))},
    )


@guarded("P4", "ACS on bridges")
def check_acs(ctx: HostContext) -> list[CheckResult]:
    """P4: RR, CR and EC clear in ACS Control on every bridge above each GPU (bare metal)."""
    return _each_gpu(ctx, "P4", "ACS on bridges", _acs_one)


@guarded("P5", "IOMMU mode")
def check_iommu(ctx: HostContext) -> list[CheckResult]:
    """P5: no IOMMU or `identity` (iommu=pt) on bare metal; DMA/DMA-FQ translation on a GPU group warns."""
    title = "IOMMU mode"
    units = ctx.root.try_listdir("/sys/class/iommu")
    expected = "no IOMMU, or identity (iommu=pt) for GPU groups"
    why = "A translating IOMMU (DMA, DMA-FQ) adds IOTLB lookups and map/unmap work to every GPU DMA."
    if not ctx.gpus:
        observed = f"{len(units)} IOMMU unit(s); " + _NO_GPU
        return [CheckResult("P5", title, Status.INFO, observed, expected, why, facts={"iommu_units": str(len(units))})]
    results: list[CheckResult] = []
    for gpu in ctx.gpus:
        with per_gpu(results, "P5", title, gpu, root=ctx.root):
            subject = f"GPU {gpu.bdf}"
            group_path = gpu.sysfs("iommu_group")
            if not units and not ctx.root.exists(group_path):
                results.append(
                    CheckResult(
                        f"P5:{gpu.bdf}",
                        title,
                        Status.PASS,
                        "no IOMMU active",
                        expected,
                        why,
                        subject=subject,
                        facts={"iommu": "off"},
                    )
                )
                continue
            group = ctx.root.realpath(group_path).rsplit("/", 1)[1]
            kind = ctx.root.read_text(f"/sys/kernel/iommu_groups/{group}/type").strip()
            if not kind:
                raise ValueError(f"/sys/kernel/iommu_groups/{group}/type is empty")
            if kind == "identity":
                status = Status.PASS
            elif kind.startswith("DMA"):
                status = Status.INFO if ctx.virt.vm else Status.WARN
            else:
                status = Status.INFO
            results.append(
                CheckResult(
                    f"P5:{gpu.bdf}",
                    title,
                    status,
                    f"group {group} type {kind}"
                    + (" (VM guest: the vIOMMU is the host's choice)" if ctx.virt.vm else ""),
                    expected,
                    why,
                    "Boot with iommu=pt (amd_iommu=on iommu=pt / intel_iommu=on iommu=pt)."
                    if status == Status.WARN
                    else "",
                    subject=subject,
                    facts={"iommu": kind},
                )
            )
    return results


@guarded("P6", "GPU-CPU NUMA affinity")
def check_numa_affinity(ctx: HostContext) -> list[CheckResult]:
    """P6: report each GPU's NUMA node and local CPUs; numa_node -1 on a multi-node host warns."""
    title = "GPU-CPU NUMA affinity"
    if not ctx.gpus:
        return _no_gpu("P6", title)
    nodes = [n for n in ctx.root.try_listdir("/sys/devices/system/node") if n.startswith("node") and n[4:].isdigit()]
    results: list[CheckResult] = []
    for gpu in ctx.gpus:
        with per_gpu(results, "P6", title, gpu, root=ctx.root):
            node = parse_int(ctx.root.read_text(gpu.sysfs("numa_node")), gpu.sysfs("numa_node"))
            local_text = ctx.root.try_read_text(gpu.sysfs("local_cpulist"))
            local = format_cpulist(parse_cpulist(local_text)) if local_text is not None else "?"
            status = Status.WARN if node < 0 and len(nodes) > 1 else Status.INFO
            results.append(
                CheckResult(
                    f"P6:{gpu.bdf}",
                    title,
                    status,
                    f"numa_node {node}, local CPUs {local} ({len(nodes)} NUMA node(s))",
                    "a NUMA node on multi-socket hosts; serving processes pinned inside the local CPUs",
                    "Host threads on the far socket reach the GPU across the socket interconnect.",
                    "Enable the BIOS's ACPI SRAT/proximity info; pin the server with numactl --cpunodebind."
                    if status == Status.WARN
                    else "",
                    subject=f"GPU {gpu.bdf}",
                    facts={"numa_node": str(node), "local_cpus": local},
                )
            )
    return results


def pair_topology(ctx: HostContext, a: PciDevice, b: PciDevice) -> str:
    """nvidia-smi topo's words from sysfs: PIX (one bridge), PXB (several), PHB (same root complex),
    NODE (same NUMA node, different root complexes), SYS (across sockets)."""
    up_a, up_b = upstream_bdfs(a), upstream_bdfs(b)
    common = [x for x, _ in itertools.takewhile(lambda xy: xy[0] == xy[1], zip(up_a, up_b, strict=False))]
    if common and root_complex(a) == root_complex(b):
        below = max(len(up_a), len(up_b)) - len(common)
        return "PIX" if below <= 1 else "PXB"
    if root_complex(a) == root_complex(b):
        return "PHB"
    node_a = ctx.root.try_read_text(a.sysfs("numa_node"))
    node_b = ctx.root.try_read_text(b.sysfs("numa_node"))
    if node_a is not None and node_a.strip() == (node_b or "").strip() and node_a.strip() != "-1":
        return "NODE"
    return "SYS"


@guarded("P7", "GPU-pair topology")
def check_pair_topology(ctx: HostContext) -> list[CheckResult]:
    """P7: each GPU pair's common ancestor from the sysfs paths (NVML gives the same via GPU checks)."""
    title = "GPU-pair topology"
    if len(ctx.gpus) < 2:
        return [CheckResult("P7", title, Status.INFO, f"{len(ctx.gpus)} GPU(s): no pairs", "reported only")]
    results: list[CheckResult] = []
    for a, b in itertools.combinations(ctx.gpus, 2):
        level = pair_topology(ctx, a, b)
        results.append(
            CheckResult(
                f"P7:{a.bdf}-{b.bdf}",
                title,
                Status.INFO,
                f"{level} (PCIe path; NVLink, if any, is reported by the GPU checks)",
                "reported; pairs at SYS get poor PCIe P2P",
                "PCIe peer traffic that crosses sockets (SYS) goes through the CPU interconnect.",
                subject=f"{a.bdf} ↔ {b.bdf}",
                facts={"topology": level},
            )
        )
    return results


PCIE_CHECKS = (check_link, check_payload, check_acs, check_iommu, check_numa_affinity, check_pair_topology)
