"""Provides the kernel and OS checks C10-C16 of docs/reference/healthchecks.md: NUMA balancing, THP, swappiness,
perf_event_paranoid, kernel vs NVIDIA module, IRQ placement and the virtualization context."""

from __future__ import annotations

from decodetop.collectors.checks.context import HostContext, guarded, per_gpu
from decodetop.collectors.checks.parsers import format_cpulist, parse_cpulist, parse_int, parse_thp_bracket
from decodetop.collectors.checks.result import CheckResult, Status

C12_SWAPPINESS_MAX = 10
"""tuned latency-performance sets vm.swappiness=10 ([TUNED-LP])."""
C13_MAINLINE_DEFAULT = 2
"""Documentation/admin-guide/sysctl/kernel.rst: perf_event_paranoid defaults to 2; > 2 is a Debian/Ubuntu patch."""


def _host_note(ctx: HostContext) -> str:
    return " (a host-wide setting: change it on the host)" if ctx.virt.container else ""


@guarded("C10", "NUMA balancing")
def check_numa_balancing(ctx: HostContext) -> list[CheckResult]:
    """C10: automatic NUMA balancing off (it migrates pages under a running server and adds faults)."""
    path = "/proc/sys/kernel/numa_balancing"
    text = ctx.root.try_read_text(path)
    title = "NUMA balancing"
    if text is None:
        return [CheckResult("C10", title, Status.INFO, f"{path} absent (kernel without NUMA balancing)", "0")]
    value = parse_int(text, path)
    if value == 0:
        status = Status.PASS
    elif value == 1:
        status = Status.WARN
    else:
        status = Status.INFO  # 2 and 3 are memory-tiering modes (docs/reference/healthchecks.md C10, unconfirmed)
    return [
        CheckResult(
            "C10",
            title,
            ctx.host_global_status(status),
            f"numa_balancing={value}" + (_host_note(ctx) if status != Status.PASS else ""),
            "0 (tuned network-latency, NVIDIA Grace guide)",
            "Balancing unmaps pages to sample accesses and migrates them: page faults and migrations land on the "
            "serving process's hot path.",
            "sysctl -w kernel.numa_balancing=0 (persist in /etc/sysctl.d), or boot with numa_balancing=disable."
            if status != Status.PASS
            else "",
            facts={"numa_balancing": str(value)},
        )
    ]


@guarded("C11", "Transparent hugepages")
def check_thp(ctx: HostContext) -> list[CheckResult]:
    """C11: THP `never` or `madvise`; `always` is reported."""
    base = "/sys/kernel/mm/transparent_hugepage"
    enabled = parse_thp_bracket(ctx.root.read_text(f"{base}/enabled"))
    defrag_text = ctx.root.try_read_text(f"{base}/defrag")
    defrag = parse_thp_bracket(defrag_text) if defrag_text is not None else "?"
    status = Status.PASS if enabled in ("never", "madvise") else Status.INFO
    return [
        CheckResult(
            "C11",
            "Transparent hugepages",
            status,
            f"enabled [{enabled}], defrag [{defrag}]",
            "never (tuned network-latency) or madvise",
            "With THP always, huge-page faults and compaction (direct or khugepaged) can stall the serving threads.",
            "echo madvise > /sys/kernel/mm/transparent_hugepage/enabled" if status != Status.PASS else "",
            facts={"thp_enabled": enabled, "thp_defrag": defrag},
        )
    ]


@guarded("C12", "Swappiness")
def check_swappiness(ctx: HostContext) -> list[CheckResult]:
    """C12: swappiness <= 10 when swap exists; irrelevant without swap."""
    path = "/proc/sys/vm/swappiness"
    value = parse_int(ctx.root.read_text(path), path)
    swaps_text = ctx.root.try_read_text("/proc/swaps")
    swaps = [line for line in (swaps_text or "").splitlines()[1:] if line.strip()]
    if swaps_text is None:
        status, observed = Status.INFO, f"swappiness {value}; /proc/swaps unreadable"
    elif not swaps:
        status, observed = Status.PASS, f"swappiness {value}, no swap configured (irrelevant)"
    else:
        status = Status.PASS if value <= C12_SWAPPINESS_MAX else Status.INFO
        observed = f"swappiness {value}, {len(swaps)} swap device(s)"
    return [
        CheckResult(
            "C12",
            "Swappiness",
            status,
            observed,
            f"<= {C12_SWAPPINESS_MAX} when swap exists (tuned latency-performance)",
            "A swapped-out page of the server's host memory costs a disk read on the decode path.",
            f"sysctl -w vm.swappiness={C12_SWAPPINESS_MAX}" if status != Status.PASS else "",
            facts={"swappiness": str(value), "swap_devices": str(len(swaps))},
        )
    ]


@guarded("C13", "perf_event_paranoid")
def check_perf_paranoid(ctx: HostContext) -> list[CheckResult]:
    """C13: <= 2 (mainline default); > 2 is the Debian/Ubuntu patch that blocks all unprivileged perf."""
    path = "/proc/sys/kernel/perf_event_paranoid"
    value = parse_int(ctx.root.read_text(path), path)
    if value <= 1:
        status = Status.PASS
    elif value == C13_MAINLINE_DEFAULT:
        status = Status.INFO
    else:
        status = Status.WARN
    return [
        CheckResult(
            "C13",
            "perf_event_paranoid",
            ctx.host_global_status(status),
            f"{value}" + (_host_note(ctx) if status == Status.WARN else ""),
            "<= 2 (mainline default); <= 1 lets profilers see CPU events without CAP_PERFMON",
            "Values above 2 (Ubuntu ships 4) block all unprivileged perf, so CPU-side profiling of the serving "
            "process (perf, py-spy --native, Nsight Systems CPU sampling) fails.",
            "sysctl -w kernel.perf_event_paranoid=1 (persist in /etc/sysctl.d)" if status == Status.WARN else "",
            facts={"perf_event_paranoid": str(value)},
        )
    ]


def _proc_driver_version(ctx: HostContext) -> str:
    """The version number in /proc/driver/nvidia/version ('' when absent)."""
    for token in (ctx.root.try_read_text("/proc/driver/nvidia/version") or "").split():
        if token.count(".") >= 1 and token.replace(".", "").isdigit():
            return token
    return ""


def _no_module_verdict(ctx: HostContext, release: str) -> tuple[Status, str, str]:
    """C14 when no nvidia module is loaded: info without GPUs or in a container, else fail naming the builds."""
    if not ctx.gpus:
        return Status.INFO, f"kernel {release}; no NVIDIA GPU in sysfs and no nvidia module", ""
    fix = "dkms autoinstall -k $(uname -r) (or reinstall the driver package), then modprobe nvidia."
    if ctx.virt.container:
        return Status.INFO, f"kernel {release}; /sys/module/nvidia not visible from this container", fix
    built_for = [
        k
        for k in ctx.root.try_listdir("/lib/modules")
        if any(
            ctx.root.glob(f"/lib/modules/{k}/{sub}/nvidia.ko*")
            for sub in ("updates/dkms", "kernel/drivers/video", "extra")
        )
    ]
    detail = f"built for {', '.join(built_for)}" if built_for else "no nvidia.ko found under /lib/modules"
    return Status.FAIL, f"kernel {release}; {len(ctx.gpus)} NVIDIA GPU(s) but no nvidia module loaded ({detail})", fix


@guarded("C14", "Kernel vs NVIDIA module")
def check_kernel_module(ctx: HostContext) -> list[CheckResult]:
    """C14: report the kernel; fail when GPUs are present but the nvidia module is not loaded for this kernel."""
    release = ctx.root.read_text("/proc/sys/kernel/osrelease").strip()
    if not release:
        raise ValueError("/proc/sys/kernel/osrelease is empty")
    module = (ctx.root.try_read_text("/sys/module/nvidia/version") or "").strip()
    proc_version = _proc_driver_version(ctx)
    if module and proc_version and module != proc_version:
        status = Status.FAIL
        observed = (
            f"kernel {release}; /sys/module/nvidia/version {module} != /proc/driver/nvidia/version {proc_version}"
        )
        fix = "Reboot or reload the nvidia modules so the loaded driver matches the installed one."
    elif module:
        status, observed, fix = Status.PASS, f"kernel {release}, nvidia {module}", ""
    else:
        status, observed, fix = _no_module_verdict(ctx, release)
    return [
        CheckResult(
            "C14",
            "Kernel vs NVIDIA module",
            status,
            observed,
            "nvidia module loaded for the running kernel; /sys/module and /proc/driver versions equal",
            "After a kernel upgrade DKMS must rebuild the nvidia module; if it did not, the GPUs have no driver "
            "after reboot.",
            fix,
            facts={"kernel": release, "nvidia_module": module or "not loaded"},
        )
    ]


def _irqbalance_running(ctx: HostContext) -> bool | None:
    """Whether a process named irqbalance exists (scans /proc/<pid>/comm through the root; None if no /proc)."""
    pids = [p for p in ctx.root.try_listdir("/proc") if p.isdigit()]
    if not pids:
        return None
    for pid in pids:
        comm = ctx.root.try_read_text(f"/proc/{pid}/comm")
        if comm is not None and comm.strip() == "irqbalance":
            return True
    return False


@guarded("C15", "GPU IRQ placement")
def check_irq_placement(ctx: HostContext) -> list[CheckResult]:
    """C15: whether the GPUs' interrupts land on GPU-local CPUs; irqbalance reported."""
    irqbalance = _irqbalance_running(ctx)
    irq_note = {True: "irqbalance running", False: "irqbalance not running", None: "process list unreadable"}[
        irqbalance
    ]
    interrupts = ctx.root.try_read_text("/proc/interrupts")
    if not ctx.gpus:
        return [CheckResult("C15", "GPU IRQ placement", Status.INFO, f"no NVIDIA GPU; {irq_note}", "reported only")]
    if interrupts is None:
        return [CheckResult("C15", "GPU IRQ placement", Status.UNKNOWN, f"/proc/interrupts unreadable; {irq_note}", "")]
    results: list[CheckResult] = []
    for gpu in ctx.gpus:
        with per_gpu(results, "C15", "GPU IRQ placement", gpu, root=ctx.root):
            local_text = ctx.root.try_read_text(gpu.sysfs("local_cpulist"))
            local = parse_cpulist(local_text) if local_text is not None else None
            numbered = [line for line in interrupts.splitlines() if line.split(":", 1)[0].strip().isdigit()]
            # MSI-X rows name the device ('IR-PCI-MSIX-0000:03:00.0 ... nvidia'); legacy rows only the driver.
            own = [line for line in numbered if gpu.bdf in line]
            if not own and len(ctx.gpus) == 1:
                own = [line for line in numbered if "nvidia" in line]
            irqs = [line.split(":", 1)[0].strip() for line in own]
            placed: list[str] = []
            outside = 0
            for irq in irqs:
                aff = ctx.root.try_read_text(f"/proc/irq/{irq}/smp_affinity_list")
                if aff is None:
                    continue
                cpus = parse_cpulist(aff)
                placed.append(f"{irq}→{format_cpulist(cpus)}")
                if local is not None and cpus and not cpus <= local:
                    outside += 1
            observed = (
                f"{len(irqs)} IRQ(s) naming nvidia; {outside} outside local CPUs "
                f"{format_cpulist(local) if local is not None else '?'}; {irq_note}"
            )
            results.append(
                CheckResult(
                    f"C15:{gpu.bdf}",
                    "GPU IRQ placement",
                    Status.INFO,
                    observed,
                    "GPU interrupts on GPU-local CPUs (reported only; the effect on GPUs is unconfirmed)",
                    "An interrupt served on a far socket adds cross-socket traffic to every completion.",
                    subject=gpu.bdf,
                    facts={"irqbalance": irq_note},
                )
            )
    return results


@guarded("C16", "Virtualization context")
def check_virt(ctx: HostContext) -> list[CheckResult]:
    """C16: bare metal, VM or container; sets the context that turns C1-C9 into info."""
    evidence = "; ".join(ctx.virt.evidence) or "no hypervisor flag, no container marker"
    observed = ctx.virt.describe() + f" ({evidence})"
    if ctx.cpu is None:
        observed += f"; {ctx.cpu_error}"
    return [
        CheckResult(
            "C16",
            "Virtualization context",
            Status.INFO,
            observed,
            "reported; inside a VM or container CPU power checks are info (the guest cannot change them)",
            facts={"virt": ctx.virt.describe()},
        )
    ]


KERNEL_CHECKS = (
    check_numa_balancing,
    check_thp,
    check_swappiness,
    check_perf_paranoid,
    check_kernel_module,
    check_irq_placement,
    check_virt,
)
