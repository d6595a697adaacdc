"""One change to the well-tuned host's tree, one finding: each rule of docs/reference/healthchecks.md fires on its own
input."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from decodetop.collectors.checks.host import run_host_checks
from decodetop.collectors.checks.result import CheckResult, Status
from decodetop.collectors.hostroot import HostRoot

PCI = "sys/devices/pci0000:00/0000:00:01.1/0000:01:00.0"
GPU0 = f"{PCI}/0000:02:00.0/0000:03:00.0"
CPU = "sys/devices/system/cpu"


def _patch_config(tree: Path, device: str, offset: int, value: int) -> None:
    """Write a little-endian u16 into a device's config.hex (16 bytes a line)."""
    path = tree / device / "config.hex"
    data = bytearray(bytes.fromhex("".join(path.read_text().split())))
    data[offset : offset + 2] = value.to_bytes(2, "little")
    path.write_text("\n".join(data[i : i + 16].hex(" ") for i in range(0, len(data), 16)) + "\n")


def _write(rel: str, text: str) -> Callable[[Path], None]:
    def apply(tree: Path) -> None:
        (tree / rel).parent.mkdir(parents=True, exist_ok=True)
        (tree / rel).write_text(text)

    return apply


def _boost_mixed(tree: Path) -> None:
    for i in range(16):
        (tree / f"{CPU}/cpufreq/policy{i}/boost").write_text("0\n" if i == 5 else "1\n")


def _acs_redirect(tree: Path) -> None:
    _patch_config(tree, f"{PCI}/0000:02:00.0", 0x150 + 6, 0x001D)  # SV RR CR UF


def _mps_128(tree: Path) -> None:
    _patch_config(tree, GPU0, 0x78 + 8, 0x5910)  # MRRS 4096, MPS code 0


def _numa_unknown(tree: Path) -> None:
    (tree / "sys/devices/system/node/node1").mkdir()
    (tree / GPU0 / "numa_node").write_text("-1\n")


def _no_module(tree: Path) -> None:
    shutil.rmtree(tree / "sys/module/nvidia")
    (tree / "proc/driver/nvidia/version").unlink()


def _intel_idle_conflict(tree: Path) -> None:
    (tree / f"{CPU}/cpuidle/current_driver").write_text("intel_idle\n")
    (tree / "proc/cmdline").write_text("BOOT_IMAGE=/vmlinuz ro processor.max_cstate=1\n")


def _swap(tree: Path) -> None:
    (tree / "proc/sys/vm/swappiness").write_text("60\n")
    (tree / "proc/swaps").write_text(
        "Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority\n/swap.img  file\t\t8388604\t\t0\t\t-2\n"
    )


MUTATIONS: list[tuple[str, Callable[[Path], None], str, Status, str]] = [
    ("cap", _write(f"{CPU}/cpufreq/policy3/scaling_max_freq", "2000000\n"), "C4", Status.WARN, "capped: policy3"),
    ("boost", _boost_mixed, "C6", Status.WARN, "mixed: off on policy5"),
    (
        "epp",
        _write(f"{CPU}/cpufreq/policy0/energy_performance_preference", "balance_power\n"),
        "C5",
        Status.WARN,
        "balance_power",
    ),
    ("pstate", _write(f"{CPU}/amd_pstate/status", "passive\n"), "C2", Status.WARN, "passive"),
    ("idle", _intel_idle_conflict, "C9", Status.WARN, "no effect with intel_idle"),
    (
        "thp",
        _write("sys/kernel/mm/transparent_hugepage/enabled", "[always] madvise never\n"),
        "C11",
        Status.INFO,
        "[always]",
    ),
    ("swap", _swap, "C12", Status.INFO, "1 swap device"),
    ("paranoid", _write("proc/sys/kernel/perf_event_paranoid", "2\n"), "C13", Status.INFO, "2"),
    ("module", _no_module, "C14", Status.FAIL, "no nvidia module loaded"),
    ("mismatch", _write("sys/module/nvidia/version", "575.57.08\n"), "C14", Status.FAIL, "!= /proc/driver"),
    ("width", _write(f"{GPU0}/current_link_width", "8\n"), "P1:0000:03:00.0", Status.FAIL, "x8 (max 32.0 GT/s x16)"),
    ("mps", _mps_128, "P3:0000:03:00.0", Status.WARN, "MaxPayload 128 B != path 256 B"),
    ("acs", _acs_redirect, "P4:0000:03:00.0", Status.WARN, "ReqRedir+ CmpltRedir+"),
    ("iommu", _write("sys/kernel/iommu_groups/23/type", "DMA\n"), "P5:0000:03:00.0", Status.WARN, "type DMA"),
    ("numa", _numa_unknown, "P6:0000:03:00.0", Status.WARN, "numa_node -1"),
    (
        "stale",
        _write("dev/.rdev", "nvidia0 c 195 0\nnvidia1 c 195 1\nnvidiactl c 195 255\nnvidia-uvm c 510 0\n"),
        "N12",
        Status.FAIL,
        "stale major 510",
    ),
    (
        "eacces",
        _write(
            "dev/.open",
            "nvidia0 ok\nnvidia1 ok\nnvidiactl ok\nnvidia-uvm EACCES\nnvidia-uvm-tools ok\n"
            "nvidia-caps/nvidia-cap1 EACCES\nnvidia-caps/nvidia-cap2 EACCES\n",
        ),
        "N12",
        Status.INFO,
        "EACCES",
    ),
]


@pytest.mark.parametrize(("label", "mutate", "check_id", "status", "text"), MUTATIONS, ids=[m[0] for m in MUTATIONS])
def test_mutation(
    copy_host: Callable[[str], Path],
    label: str,
    mutate: Callable[[Path], None],
    check_id: str,
    status: Status,
    text: str,
) -> None:
    tree = copy_host("epyc-well-tuned")
    before = {r.check_id: r for r in run_host_checks(HostRoot(tree), sample_interval_s=0.0)}
    assert before[check_id].status in (Status.PASS, Status.INFO), before[check_id]
    assert text not in before[check_id].observed
    mutate(tree)
    after: dict[str, CheckResult] = {r.check_id: r for r in run_host_checks(HostRoot(tree), sample_interval_s=0.0)}
    assert after[check_id].status == status, after[check_id]
    assert text in after[check_id].observed, after[check_id].observed
