"""Provides N1, the NVIDIA driver and NVML check: where NVML does not answer (a failing N1 when NVIDIA GPUs are on
the PCI bus — vendor 0x10de, class 0x03xx in sysfs — the host whose driver did not load after a kernel upgrade — or
when the library and the kernel module disagree, NVML_ERROR_LIB_RM_VERSION_MISMATCH; info only where no GPU is
there), over a copied host tree (`tree_gpu_checks`: the NVML outcome the collecting host recorded, `.nvml`, judged
the same way; without one, NVIDIA GPUs in the tree and no NVIDIA driver fail), and where it answers, the driver
versions NVML, /sys/module and /proc show against each other and the runtime's CUDA (`check_driver`)."""

from __future__ import annotations

import re

from decodetop.collectors.checks.gpu_check import GpuCheck
from decodetop.collectors.checks.result import CheckResult, Status
from decodetop.collectors.hostroot import HostRoot
from decodetop.collectors.nvml import NOT_AN_NVML_ERROR, NVML_ERROR_LIB_RM_VERSION_MISMATCH, NvmlStatus
from decodetop.collectors.pci import PciDevice, find_gpus
from decodetop.collectors.telemetry import TelemetrySnapshot

PROC_VERSION_RE = re.compile(r"Kernel Module(?: for [^ ]+)?\s+(\d+(?:\.\d+)+)")
"""`/proc/driver/nvidia/version`: "NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.159.04  ..." or
"NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build ..."."""


def driver_from_proc(text: str | None) -> str | None:
    """The driver version in /proc/driver/nvidia/version's text (None: no text, or no version in it)."""
    if not text:
        return None
    match = PROC_VERSION_RE.search(text)
    return match.group(1) if match else None


N1_MISMATCH = GpuCheck(
    "N1",
    "NVIDIA driver / NVML consistency",
    "the NVML library (libnvidia-ml) and the loaded kernel module are the same driver version",
    "The user-space driver was upgraded but the old kernel module is still loaded: NVML and CUDA refuse to work "
    "until they match.",
    "Reboot, or unload and reload the nvidia kernel modules (stop every GPU process first).",
)
N1_NO_NVML = GpuCheck(
    "N1",
    "NVIDIA driver / NVML",
    "NVML (libnvidia-ml.so.1 from the NVIDIA driver, and nvidia-ml-py) answers",
    "Without NVML decodetop cannot read GPU clocks, links, power or errors; host checks still run.",
    "On a GPU host: install the NVIDIA driver (it ships libnvidia-ml.so.1) and nvidia-ml-py, and load the nvidia "
    "kernel module. Without a GPU there is nothing to fix.",
)
N1_GPUS_UNUSABLE = GpuCheck(
    "N1",
    "NVIDIA driver / NVML",
    "NVML (libnvidia-ml.so.1 from the NVIDIA driver) answers for every NVIDIA GPU on the PCI bus",
    "The GPUs are on the bus but nothing can use them: NVML, CUDA and every serving engine need the NVIDIA driver. "
    "After a kernel upgrade this is the driver module DKMS did not rebuild for the new kernel.",
    "Load the driver for the running kernel: dkms autoinstall -k $(uname -r) (or reinstall the driver package), then "
    "modprobe nvidia, and read the kernel log for NVRM errors. Inside a container: start it with the GPUs and the "
    "driver's libraries (the NVIDIA Container Toolkit: --gpus all, NVIDIA_VISIBLE_DEVICES).",
)
N1_NO_GPU = GpuCheck(
    "N1",
    "NVIDIA GPUs",
    "at least one GPU",
    "Nothing to check on the GPU side.",
    "Check that the GPUs are passed through to this VM/container (NVIDIA_VISIBLE_DEVICES, device cgroup, "
    "/dev/nvidia*).",
)
N1_DRIVER = GpuCheck(
    "N1",
    "NVIDIA driver / CUDA / library consistency",
    "NVML, /sys/module/nvidia/version and /proc/driver/nvidia/version agree; driver CUDA ≥ runtime CUDA",
    "A driver upgraded without a reboot leaves the old kernel module loaded; CUDA then fails to start, and a "
    "runtime newer than the driver's CUDA fails with 'driver too old'.",
    "Reboot (or reload the nvidia modules) after a driver upgrade; install a driver whose CUDA version is at least "
    "the one torch / the serving engine was built with.",
)


# --- no NVML ------------------------------------------------------------------------------------------------


def no_nvml(root: HostRoot | None, status: NvmlStatus) -> list[CheckResult]:
    """N1 when NVML does not answer: fail where the library and the module disagree or where NVIDIA GPUs are on the
    PCI bus (they cannot be used); info only on a host without them."""
    module = root.try_read_text("/sys/module/nvidia/version") if root is not None else None
    proc = root.try_read_text("/proc/driver/nvidia/version") if root is not None else None
    module_v = module.strip() if module else None
    proc_v = driver_from_proc(proc)
    facts = {"nvml": status.reason, "module_version": module_v or "", "proc_version": proc_v or ""}
    if status.code == NVML_ERROR_LIB_RM_VERSION_MISMATCH:
        return [
            N1_MISMATCH.result(
                Status.FAIL,
                f"nvmlInit: {status.reason}; loaded kernel module {module_v or proc_v or 'unknown'}",
                subject="driver",
                facts=facts,
            )
        ]
    driver = f"kernel module {module_v or proc_v} is loaded" if module_v or proc_v else "no nvidia kernel module loaded"
    on_bus = pci_gpus(root)
    if on_bus:
        facts["pci_gpus"] = str(len(on_bus))
        return [
            N1_GPUS_UNUSABLE.result(
                Status.FAIL,
                f"{on_the_bus(on_bus)} but NVML unavailable: {status.reason} ({driver})",
                subject="driver",
                facts=facts,
            )
        ]
    observed = f"NVML unavailable: {status.reason}"
    if module_v or proc_v:
        observed += f" ({driver})"
    return [N1_NO_NVML.result(Status.INFO, observed, subject="driver", facts=facts)]


def pci_gpus(root: HostRoot | None) -> list[PciDevice]:
    """The NVIDIA GPUs sysfs shows on the PCI bus (none where sysfs cannot be read)."""
    if root is None:
        return []
    try:
        return find_gpus(root)
    except (OSError, ValueError):
        return []


def on_the_bus(gpus: list[PciDevice]) -> str:
    """'2 NVIDIA GPUs on the PCI bus (0000:03:00.0, 0000:04:00.0)'."""
    names = ", ".join(g.bdf for g in gpus[:4]) + (f", … {len(gpus) - 4} more" if len(gpus) > 4 else "")
    return f"{len(gpus)} NVIDIA GPU{'s' if len(gpus) != 1 else ''} on the PCI bus ({names})"


NVML_OUTCOME = "nvml"
"""The name NVML's init outcome is recorded under in a collected tree (`.nvml`: `ok`, or `unavailable CODE
REASON`)."""


def nvml_outcome_line(status: NvmlStatus) -> str:
    """What a collected tree keeps of NVML's init: 'ok', or 'unavailable 9 NVIDIA driver not loaded'."""
    if status.available:
        return "ok"
    code = status.code if status.code is not None else NOT_AN_NVML_ERROR
    return f"unavailable {code} {' '.join(status.reason.split())}"


def _recorded_status(line: str) -> NvmlStatus | None:
    """The NVML outcome a tree recorded (`nvml_outcome_line`), None when the line is not one."""
    if line == "ok":
        return NvmlStatus(True, "", None, "recorded when the tree was collected")
    word, _, rest = line.partition(" ")
    code_text, _, reason = rest.partition(" ")
    if word != "unavailable" or not code_text.lstrip("-").isdigit():
        return None
    return NvmlStatus(False, reason or "no reason recorded", int(code_text), "recorded when the tree was collected")


def tree_gpu_checks(root: HostRoot) -> list[CheckResult]:
    """N1 over a copied host tree: NVML's outcome as the collecting host recorded it, judged as on that host (a
    failure with NVIDIA GPUs in the tree is critical); without a record, a tree with NVIDIA GPUs and no NVIDIA driver
    fails; otherwise one info line (NVML describes this machine, not that tree)."""
    line = root.recorded_outcome(NVML_OUTCOME)
    status = _recorded_status(line) if line is not None else None
    if status is not None and not status.available:
        return no_nvml(root, status)
    on_bus = pci_gpus(root)
    no_driver = not root.exists("/sys/module/nvidia") and not root.exists("/proc/driver/nvidia/version")
    if status is None and on_bus and no_driver:
        return [
            N1_GPUS_UNUSABLE.result(
                Status.FAIL,
                f"{on_the_bus(on_bus)} but no NVIDIA driver in the tree (no /sys/module/nvidia, no "
                "/proc/driver/nvidia/version): NVML and CUDA cannot work",
                subject="driver",
                facts={"pci_gpus": str(len(on_bus)), "module_version": "", "proc_version": ""},
            )
        ]
    answered = "NVML answered when the tree was collected; " if status is not None else ""
    return [gpu_checks_unavailable(answered + "NVML describes this machine, not a copied host tree")]


def gpu_checks_unavailable(reason: str) -> CheckResult:
    """The one info line that stands for N1-N11 and P2 when they cannot run."""
    return CheckResult(
        "N1-N11",
        "GPU checks (NVML)",
        Status.INFO,
        f"skipped: {reason}",
        "NVML readable for N1-N11 and P2",
        "Driver, persistence, throttle reasons, ECC, row remapping, NVLink and P2P come from NVML.",
        subject="GPUs",
    )


# --- N1 -----------------------------------------------------------------------------------------------------


def check_driver(root: HostRoot | None, snap: TelemetrySnapshot, runtime_cuda: str | None) -> CheckResult:
    nvml_v = snap.system.driver_version
    module = root.try_read_text("/sys/module/nvidia/version") if root is not None else None
    module_v = module.strip() if module else None
    proc_v = driver_from_proc(root.try_read_text("/proc/driver/nvidia/version") if root is not None else None)
    seen = {"NVML": nvml_v, "/sys/module/nvidia/version": module_v, "/proc/driver/nvidia/version": proc_v}
    known = {k: v for k, v in seen.items() if v}
    observed = ", ".join(f"{k} {v}" for k, v in known.items()) or "no version readable"
    cuda = snap.system.cuda_driver_version
    observed += f"; driver CUDA {cuda or 'unknown'}"
    facts = {k: v or "" for k, v in seen.items()}
    facts["cuda_driver"] = cuda or ""
    status = Status.PASS
    problems: list[str] = []
    if len(set(known.values())) > 1:
        status = Status.FAIL
        problems.append("versions differ")
    if runtime_cuda and cuda and _version_tuple(cuda) < _version_tuple(runtime_cuda):
        status = Status.FAIL
        problems.append(f"driver CUDA {cuda} is older than the runtime's {runtime_cuda}")
        facts["cuda_runtime"] = runtime_cuda
    if not known:
        status = Status.UNKNOWN
    elif root is None and status is Status.PASS:
        status = Status.INFO
        problems.append("kernel-module version not read (no host root)")
    elif len(known) < 2 and status is Status.PASS:  # one version alone cannot be consistent or not
        status = Status.INFO
        problems.append("only one version readable: consistency not judged")
    if problems:
        observed += " (" + "; ".join(problems) + ")"
    return N1_DRIVER.result(status, observed, subject="driver", facts=facts)


def _version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", text))
