"""Provides the context every host check runs in: the root, the virtualization context (C16), the CPU and the GPUs
found in sysfs, plus the helpers that build `CheckResult`s and turn unreadable input into `unknown`.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from decodetop.collectors.checks.result import CheckResult, Status
from decodetop.collectors.hostroot import HostRoot
from decodetop.collectors.pci import PciConfigError, PciDevice, find_gpus

DEFAULT_SAMPLE_INTERVAL_S = 0.25
"""C8 samples cpuidle `usage` twice this far apart. An idle core enters deep C-states hundreds of times a second,
so a quarter second shows growth while keeping `decodetop check` well under its 2 s target."""

DMI_VM_VENDORS = {
    "QEMU": "qemu",
    "KVM": "kvm",
    "Amazon EC2": "amazon",
    "Google": "google",
    "Microsoft Corporation": "microsoft",
    "VMware, Inc.": "vmware",
    "innotek GmbH": "oracle",
    "Xen": "xen",
    "OpenStack Foundation": "openstack",
}
"""DMI sys_vendor strings that name a hypervisor (the same table systemd-detect-virt's detect_vm_dmi uses)."""


@dataclass(frozen=True)
class VirtContext:
    """Where the checks run: bare metal, a VM guest, a container, or a container inside a VM."""

    vm: str
    """'' on bare metal; else the hypervisor's name, or 'vm' when only the cpuinfo flag says so."""
    container: str
    """'' outside a container; else 'lxc', 'docker', 'podman', ... or 'container'."""
    evidence: tuple[str, ...] = ()

    @property
    def guest(self) -> bool:
        """Whether CPU power management belongs to someone else (a hypervisor or the container's host)."""
        return bool(self.vm or self.container)

    def describe(self) -> str:
        """'bare metal', 'VM (kvm)', 'container (lxc)', 'container (docker) in a VM (firecracker)'."""
        if self.container and self.vm:
            return f"container ({self.container}) in a VM ({self.vm})"
        if self.container:
            return f"container ({self.container})"
        if self.vm:
            return f"VM ({self.vm})"
        return "bare metal"

    def short(self) -> str:
        """'VM', 'container' or 'host': the word used in 'not exposed in this VM'."""
        if self.container:
            return "container"
        if self.vm:
            return "VM"
        return "host"


@dataclass(frozen=True)
class CpuInfo:
    """What /proc/cpuinfo says about the first CPU, plus the CPU count."""

    vendor: str
    family: int | None
    model_name: str
    flags: frozenset[str]
    count: int

    @property
    def is_amd(self) -> bool:
        """AuthenticAMD (also HygonGenuine, which shares amd-pstate's rules)."""
        return self.vendor in ("AuthenticAMD", "HygonGenuine")

    @property
    def is_intel(self) -> bool:
        """GenuineIntel."""
        return self.vendor == "GenuineIntel"

    @property
    def is_epyc_class(self) -> bool:
        """AMD family 0x17 (Zen 1/2) or later: the parts amd-pstate targets (0x17 Zen2+, 0x19 Zen3/4, 0x1A Zen5)."""
        return self.is_amd and self.family is not None and self.family >= 0x17


def parse_cpuinfo(text: str) -> CpuInfo:
    """Parse /proc/cpuinfo (x86 layout; other architectures give an empty vendor)."""
    first: dict[str, str] = {}
    count = 0
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if not sep:
            continue
        key = key.strip()
        if key == "processor":
            count += 1
        if count <= 1 and key not in first:
            first[key] = value.strip()
    if count == 0:
        raise ValueError("no 'processor' entries")
    family_text = first.get("cpu family", "")
    return CpuInfo(
        vendor=first.get("vendor_id", ""),
        family=int(family_text) if family_text.isdigit() else None,
        model_name=first.get("model name", ""),
        flags=frozenset(first.get("flags", "").split()),
        count=count,
    )


def _detect_container(root: HostRoot) -> tuple[str, str]:
    """(container kind, evidence) from `container=` in /proc/1/environ, /run/systemd/container, /.dockerenv or
    /run/.containerenv; ('', '') outside a container."""
    for item in (root.try_read_text("/proc/1/environ") or "").split("\0"):
        if item.startswith("container="):
            return item.split("=", 1)[1] or "container", f"/proc/1/environ {item}"
    marker = (root.try_read_text("/run/systemd/container") or "").strip()
    if marker:
        return marker, f"/run/systemd/container {marker}"
    if root.exists("/.dockerenv"):
        return "docker", "/.dockerenv exists"
    if root.exists("/run/.containerenv"):
        return "podman", "/run/.containerenv exists"
    return "", ""


def _detect_vm(root: HostRoot, cpu: CpuInfo | None) -> tuple[str, list[str]]:
    """(hypervisor, evidence) from /sys/hypervisor/type, DMI sys_vendor and the `hypervisor` cpuinfo flag."""
    evidence: list[str] = []
    vm = (root.try_read_text("/sys/hypervisor/type") or "").strip()
    if vm:
        evidence.append(f"/sys/hypervisor/type {vm}")
    sys_vendor = (root.try_read_text("/sys/class/dmi/id/sys_vendor") or "").strip()
    if sys_vendor in DMI_VM_VENDORS and not vm:
        vm = DMI_VM_VENDORS[sys_vendor]
        evidence.append(f"DMI sys_vendor {sys_vendor}")
    if cpu is not None and "hypervisor" in cpu.flags:
        evidence.append("cpuinfo flag 'hypervisor'")
        if not vm:
            vm = "firecracker" if "firecracker" in (root.try_read_text("/proc/cmdline") or "") else "vm"
    return vm, evidence


def detect_virt(root: HostRoot, cpu: CpuInfo | None) -> VirtContext:
    """C16 signals, all read through the root so a copied tree gives the same answer as its host.

    Container: `container=` in /proc/1/environ, /run/systemd/container, /.dockerenv, /run/.containerenv.
    VM: the `hypervisor` cpuinfo flag, /sys/hypervisor/type, DMI sys_vendor.
    """
    container, container_evidence = _detect_container(root)
    vm, vm_evidence = _detect_vm(root, cpu)
    evidence = ([container_evidence] if container_evidence else []) + vm_evidence
    return VirtContext(vm=vm, container=container, evidence=tuple(evidence))


@dataclass
class HostContext:
    """Everything a host check needs; built once per run by `build_context`."""

    root: HostRoot
    virt: VirtContext
    cpu: CpuInfo | None
    cpu_error: str
    gpus: list[PciDevice]
    sample_interval_s: float = DEFAULT_SAMPLE_INTERVAL_S
    gpu_busy: Mapping[str, bool] | None = None
    """bdf → whether the GPU was busy while sampled; None when nobody knows (then link speed is not judged)."""
    lxc_config_paths: tuple[str, ...] = ("/etc/pve/lxc", "/var/lib/lxc")
    """Where N12's host side looks for container configs (docs/reference/healthchecks.md §3.4); host paths under the
    root."""
    sleep: Callable[[float], None] = field(default=lambda _s: None)

    def guest_status(self, status: Status) -> Status:
        """C1-C9 rule: inside a VM or container, what the guest cannot change is reported as info."""
        if self.virt.guest and status in (Status.WARN, Status.FAIL):
            return Status.INFO
        return status

    def host_global_status(self, status: Status) -> Status:
        """Host-wide sysctls read in a container belong to the host: the container cannot change them."""
        if self.virt.container and status in (Status.WARN, Status.FAIL):
            return Status.INFO
        return status


def build_context(
    root: HostRoot,
    *,
    sample_interval_s: float = DEFAULT_SAMPLE_INTERVAL_S,
    gpu_busy: Mapping[str, bool] | None = None,
    sleep: Callable[[float], None] | None = None,
) -> HostContext:
    """Read the facts every check shares (cpuinfo, virtualization, GPUs in sysfs)."""
    import time

    cpu: CpuInfo | None = None
    cpu_error = ""
    try:
        cpu = parse_cpuinfo(root.read_text("/proc/cpuinfo"))
    except (OSError, ValueError) as exc:
        cpu_error = f"/proc/cpuinfo: {exc}"
    return HostContext(
        root=root,
        virt=detect_virt(root, cpu),
        cpu=cpu,
        cpu_error=cpu_error,
        gpus=find_gpus(root),
        sample_interval_s=sample_interval_s,
        gpu_busy=gpu_busy,
        sleep=sleep if sleep is not None else time.sleep,
    )


CheckFn = Callable[[HostContext], list[CheckResult]]

GUARDED_ERRORS = (OSError, ValueError, PciConfigError, KeyError, IndexError)
"""What unreadable or malformed input raises; anything else is a bug and propagates."""


def unless_root(root: HostRoot | None, advice: str, otherwise: str = "") -> str:
    """`advice` to run as root, or `otherwise` when decodetop already runs as root on the live host.

    Over a copied tree the advice stands: it is for whoever collects on that host.
    """
    if root is not None and root.is_live and os.geteuid() == 0:
        return otherwise
    return advice


def unknown_result(
    check_id: str, title: str, exc: BaseException, subject: str = "host", *, root: HostRoot | None = None
) -> CheckResult:
    """The `unknown` finding for input a check could not read, with the reason ("run as root" only if not root)."""
    return CheckResult(
        check_id=check_id,
        title=title,
        status=Status.UNKNOWN,
        observed=f"cannot evaluate: {exc}",
        expected="readable input",
        why="The file this check reads is missing, unreadable or malformed.",
        fix=unless_root(
            root,
            "Run as root on the host, or send `decodetop check --collect` output for review.",
            "Send `decodetop check --collect` output for review: the file is there but not in the form expected.",
        ),
        subject=subject,
    )


class per_gpu:  # noqa: N801 - used as a statement: `with per_gpu(results, "P3", title, gpu):`
    """Per-GPU guard: garbage in one GPU's files makes that GPU's finding unknown and leaves the others."""

    def __init__(
        self, results: list[CheckResult], check_id: str, title: str, gpu: PciDevice, *, root: HostRoot | None = None
    ) -> None:
        self.results = results
        self.root = root
        self.check_id = f"{check_id}:{gpu.bdf}"
        self.title = title
        self.subject = f"GPU {gpu.bdf}"

    def __enter__(self) -> per_gpu:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object) -> bool:
        if exc is not None and isinstance(exc, GUARDED_ERRORS):
            self.results.append(unknown_result(self.check_id, self.title, exc, self.subject, root=self.root))
            return True
        return False


def guarded(check_id: str, title: str) -> Callable[[CheckFn], CheckFn]:
    """Wrap a check so garbage input (OSError, ValueError, PciConfigError) becomes one `unknown` with the reason."""

    def wrap(fn: CheckFn) -> CheckFn:
        @functools.wraps(fn)
        def inner(ctx: HostContext) -> list[CheckResult]:
            try:
                return fn(ctx)
            except GUARDED_ERRORS as exc:
                return [unknown_result(check_id, title, exc, root=ctx.root)]

        inner.check_id = check_id  # type: ignore[attr-defined]
        return inner

    return wrap
