"""Golden findings for the host trees built by tests/fixtures/hosts/build_fixtures.py (node_exporter's e2e pattern).

Each scenario's committed `expected.json` holds (check_id, status, observed, facts) for every finding. To update
after a reviewed change:
`DECODETOP_UPDATE_GOLDEN=1 .venv/bin/python -m pytest tests/collectors/test_checks_fixtures.py`,
then read `git diff tests/fixtures/hosts/*/expected.json`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from decodetop.collectors.checks.host import run_all_checks, run_host_checks
from decodetop.collectors.checks.result import CheckResult, Status, exit_code
from decodetop.collectors.hostroot import HostRoot
from tests.conftest import HOST_FIXTURES, HOST_SCENARIOS, load_host_generator

UPDATE = os.environ.get("DECODETOP_UPDATE_GOLDEN") == "1"


@pytest.fixture()
def run(hosts: Path) -> Callable[[str], list[CheckResult]]:
    """All checks over scenario `name`'s tree."""
    return lambda name: run_all_checks(HostRoot(hosts / name / "root"), sample_interval_s=0.0)


def _by_id(results: list[CheckResult]) -> dict[str, CheckResult]:
    return {r.check_id: r for r in results}


def test_every_scenario_has_golden_findings_and_no_stray_ones() -> None:
    assert HOST_SCENARIOS == (
        "epyc-driver-missing",
        "epyc-motivating",
        "epyc-well-tuned",
        "firecracker-h200-vm",
        "kvm-haltpoll-vm",
        "lxc-stale-uvm-major",
    )
    assert sorted(p.parent.name for p in HOST_FIXTURES.glob("*/expected.json")) == list(HOST_SCENARIOS)


def test_generator_is_deterministic(hosts: Path, tmp_path: Path) -> None:
    """A second build is byte-for-byte the first (contents, symlink targets, layout): the golden files pin it."""

    def snapshot(base: Path) -> dict[str, bytes | str]:
        out: dict[str, bytes | str] = {}
        for path in sorted(base.rglob("*")):
            rel = str(path.relative_to(base))
            out[rel] = f"-> {path.readlink()}" if path.is_symlink() else "dir" if path.is_dir() else path.read_bytes()
        return out

    load_host_generator().build("kvm-haltpoll-vm", tmp_path / "again")
    assert snapshot(tmp_path / "again") == snapshot(hosts / "kvm-haltpoll-vm" / "root")


@pytest.mark.parametrize("name", HOST_SCENARIOS)
def test_golden_findings(run: Callable[[str], list[CheckResult]], name: str) -> None:
    results = run(name)
    got = {
        "exit_code": exit_code(results),
        "results": [
            {"check_id": r.check_id, "status": r.status.value, "observed": r.observed, "facts": r.facts}
            for r in results
        ],
    }
    golden = HOST_FIXTURES / name / "expected.json"
    if UPDATE:
        golden.write_text(json.dumps(got, indent=1, ensure_ascii=False) + "\n")
    expected = json.loads(golden.read_text())
    assert got == expected


def test_motivating_host_findings(run: Callable[[str], list[CheckResult]]) -> None:
    results = run("epyc-motivating")
    r = _by_id(results)
    assert r["C1"].status == Status.WARN and "acpi-cpufreq" in r["C1"].observed
    assert r["C2"].status == Status.WARN and "0x1A" in r["C2"].observed
    assert r["C4"].status == Status.WARN and "schedutil" in r["C4"].observed
    assert r["C8"].status == Status.WARN and "C2" in r["C8"].observed
    assert r["C10"].status == Status.WARN
    assert r["C13"].status == Status.WARN and r["C13"].observed.startswith("4")
    assert r["P3:0000:03:00.0"].status == Status.WARN and "MaxReadReq 512 B" in r["P3:0000:03:00.0"].observed
    # Idle GPUs: link speed is not judged.
    assert r["P1:0000:03:00.0"].status == Status.INFO and "recheck under load" in r["P1:0000:03:00.0"].observed
    assert exit_code(results) == 1


def test_motivating_host_link_judged_under_load(hosts: Path) -> None:
    root = HostRoot(hosts / "epyc-motivating" / "root")
    busy = {"0000:03:00.0": True, "0000:04:00.0": True}
    r = _by_id(run_host_checks(root, sample_interval_s=0.0, gpu_busy=busy))
    assert r["P1:0000:03:00.0"].status == Status.WARN


def test_well_tuned_host_is_clean(run: Callable[[str], list[CheckResult]]) -> None:
    results = run("epyc-well-tuned")
    assert exit_code(results) == 0
    r = _by_id(results)
    assert "PM-QoS" in r["C8"].observed
    # The NVSwitch-like function (vendor 0x10de, class 0x0680) is not taken for a GPU.
    assert not any("00:08.0" in cid for cid in r)


def test_lxc_stale_major_spells_out_the_symptom(run: Callable[[str], list[CheckResult]]) -> None:
    results = run("lxc-stale-uvm-major")
    r = _by_id(results)
    n12 = r["N12"]
    assert n12.status == Status.FAIL
    assert "EPERM" in n12.observed and "stale major 510" in n12.observed
    assert "NVML works but CUDA init fails" in n12.why
    # Unprivileged container: 64 bytes of config space, reported as needing host root, not guessed.
    assert r["P3:0000:03:00.0"].status == Status.UNKNOWN and "host root" in r["P3:0000:03:00.0"].observed
    # What the container cannot change is info.
    assert r["C10"].status == Status.INFO and r["C8"].status == Status.INFO
    assert exit_code(results) == 2


def test_firecracker_vm_says_not_exposed(run: Callable[[str], list[CheckResult]]) -> None:
    results = run("firecracker-h200-vm")
    r = _by_id(results)
    assert r["C16"].observed.startswith("VM (firecracker)")
    for cid in ("C1", "C4", "C8"):
        assert r[cid].status == Status.INFO and "not exposed in this VM" in r[cid].observed
    assert r["P1:0000:00:06.0"].status == Status.PASS
    assert exit_code(results) == 0


def test_xid_in_kernel_log(copy_host: Callable[[str], Path]) -> None:
    tree = copy_host("firecracker-h200-vm")
    with (tree / "dev/kmsg").open("a") as log:
        log.write("4,950,3012345,-;NVRM: Xid (PCI:0000:00:07): 13, pid=4711, name=python3, Graphics Exception\n")
    r = _by_id(run_host_checks(HostRoot(tree), sample_interval_s=0.0))
    assert r["N8"].status == Status.WARN and "Xid 13" in r["N8"].observed
    with (tree / "dev/kmsg").open("a") as log:
        log.write("3,951,3012399,-;NVRM: Xid (PCI:0000:00:06): 79, pid=0, GPU has fallen off the bus.\n")
    r = _by_id(run_host_checks(HostRoot(tree), sample_interval_s=0.0))
    assert r["N8"].status == Status.FAIL and r["N8"].facts["xids"] == "13,79"


def test_cgroup_v1_devices_list(copy_host: Callable[[str], Path]) -> None:
    """The LXC story under cgroup v1: devices.list still allows the old uvm major 510 only."""
    tree = copy_host("lxc-stale-uvm-major")
    (tree / "sys/fs/cgroup/cgroup.controllers").unlink()
    (tree / "proc/3321/cgroup").write_text("12:devices:/lxc/101\n0::/\n")
    devices = tree / "sys/fs/cgroup/devices/lxc/101"
    devices.mkdir(parents=True)
    (devices / "devices.list").write_text("c 195:* rwm\nc 510:* rwm\nc 1:3 rwm\nc 5:* rwm\n")
    r = _by_id(run_host_checks(HostRoot(tree), sample_interval_s=0.0))
    assert r["N12"].status == Status.FAIL
    assert "/dev/nvidia-uvm 509:0 not allowed rw by /sys/fs/cgroup/devices/lxc/101/devices.list" in r["N12"].observed
    (devices / "devices.list").write_text("a *:* rwm\n")
    (tree / "dev/.rdev").write_text("nvidia0 c 195 0\nnvidiactl c 195 255\nnvidia-uvm c 509 0\n")
    (tree / "dev/nvidia-uvm-tools").unlink()
    r = _by_id(run_host_checks(HostRoot(tree), sample_interval_s=0.0))
    assert r["N12"].status == Status.PASS


def test_host_side_lxc_configs(copy_host: Callable[[str], Path]) -> None:
    """§3.4: on the Proxmox host, a container rule for the old major is reported against /proc/devices."""
    tree = copy_host("epyc-motivating")  # live nvidia-uvm is 510 here
    pve = tree / "etc/pve/lxc"
    pve.mkdir(parents=True)
    (pve / "101.conf").write_text(
        "arch: amd64\nlxc.cgroup2.devices.allow: c 195:* rwm\nlxc.cgroup2.devices.allow: c 509:* rwm\n"
        "lxc.mount.entry: /dev/nvidia-uvm dev/nvidia-uvm none bind,optional,create=file\n"
    )
    (pve / "102.conf").write_text(
        "lxc.cgroup2.devices.allow: c 195:* rwm\nlxc.cgroup2.devices.allow: c 510:* rwm\n"
        "lxc.cgroup2.devices.allow: c 511:* rwm\n"
    )
    plain = tree / "var/lib/lxc/web"
    plain.mkdir(parents=True)
    (plain / "config").write_text("lxc.cgroup.devices.allow = a\n")
    results = run_host_checks(HostRoot(tree), sample_interval_s=0.0)
    r = _by_id(results)
    bad = r["N12:/etc/pve/lxc/101.conf"]
    assert bad.status == Status.FAIL
    assert "nvidia-uvm 510" in bad.observed and "unregistered majors: 509" in bad.observed
    assert r["N12:/etc/pve/lxc/102.conf"].status == Status.PASS
    assert r["N12:/var/lib/lxc/web/config"].status == Status.PASS


def test_load_from_recorded_nvml_judges_link_speed(copy_host: Callable[[str], Path]) -> None:
    """The fake NVML replays the H200 VM (bus 0000:00:06.0, like the Firecracker fixture): busy only under load."""
    from decodetop.collectors.checks.host import nvml_gpu_busy
    from decodetop.collectors.fake_nvml import fake_nvml

    assert nvml_gpu_busy(fake_nvml("h200x1-idle")) == {"0000:00:06.0": False}
    busy = nvml_gpu_busy(fake_nvml("h200x1-load"))
    assert busy == {"0000:00:06.0": True}
    tree = copy_host("firecracker-h200-vm")
    gpu = tree / "sys/devices/pci0000:00/0000:00:06.0"
    (gpu / "current_link_speed").write_text("2.5 GT/s PCIe\n")
    r = _by_id(run_host_checks(HostRoot(tree), sample_interval_s=0.0, gpu_busy=busy))
    assert r["P1:0000:00:06.0"].status == Status.WARN and "under load" in r["P1:0000:00:06.0"].observed
    r = _by_id(run_host_checks(HostRoot(tree), sample_interval_s=0.0, gpu_busy={"0000:00:06.0": False}))
    assert r["P1:0000:00:06.0"].status == Status.INFO and "idle, recheck under load" in r["P1:0000:00:06.0"].observed


def test_gpu_checks_are_wired_in_on_the_live_root(hosts: Path) -> None:
    from decodetop.collectors.checks.host import run_gpu_checks
    from decodetop.collectors.fake_nvml import fake_nvml

    results = run_gpu_checks(HostRoot(), fake_nvml("h200x1-load"), under_load=True)
    ids = {r.check_id.split(":")[0] for r in results}
    assert "N1" in ids and "N1-N11" not in ids
    skipped = run_gpu_checks(HostRoot(hosts / "epyc-motivating" / "root"), fake_nvml("h200x1-load"))
    assert [r.check_id for r in skipped] == ["N1-N11"] and "copied host tree" in skipped[0].observed


def test_merge_prefers_nvml_for_p6_p7_and_never_duplicates_ids() -> None:
    from decodetop.collectors.checks.host import merge_results

    host = [
        CheckResult("P6:0000:00:06.0", "affinity", Status.INFO, "sysfs", ""),
        CheckResult("P7:0000:00:06.0-0000:00:07.0", "pair", Status.INFO, "PHB", ""),
        CheckResult("P1:0000:00:06.0", "link", Status.PASS, "x16", ""),
    ]
    gpu = [CheckResult("P6:0000:00:06.0", "affinity", Status.INFO, "nvml", "")]
    merged = merge_results(host, gpu)
    assert [(r.check_id, r.observed) for r in merged] == [
        ("P7:0000:00:06.0-0000:00:07.0", "PHB"),
        ("P1:0000:00:06.0", "x16"),
        ("P6:0000:00:06.0", "nvml"),
    ]
    gpu.append(CheckResult("P7:GPU0-GPU1", "pair", Status.INFO, "NV18", ""))
    assert [r.check_id for r in merge_results(host, gpu)] == ["P1:0000:00:06.0", "P6:0000:00:06.0", "P7:GPU0-GPU1"]
    unknown_gpu = [CheckResult("P7:GPU0-GPU1", "pair", Status.UNKNOWN, "n/a", "")]
    assert [r.check_id for r in merge_results(host, unknown_gpu)][:3] == [h.check_id for h in host]


def test_live_run_has_unique_ids_with_recorded_nvml() -> None:
    from decodetop.collectors.checks.host import run_all_checks
    from decodetop.collectors.fake_nvml import fake_nvml

    results = run_all_checks(HostRoot(), nvml=fake_nvml("h200x1-load"), sample_interval_s=0.0)
    ids = [r.check_id for r in results]
    assert len(ids) == len(set(ids))


def test_haltpoll_guest_reads_two_word_state_names(
    run: Callable[[str], list[CheckResult]], copy_host: Callable[[str], Path]
) -> None:
    """KVM guests with cpuidle-haltpoll name state 1 "haltpoll idle": C8 reads it as written, never unknown."""
    r = _by_id(run("kvm-haltpoll-vm"))
    assert r["C7"].observed == "driver haltpoll, governor haltpoll"
    assert r["C8"].status == Status.PASS and r["C8"].observed == "no state deeper than 1 µs"
    assert exit_code(list(r.values())) in (0, 1)
    tree = copy_host("kvm-haltpoll-vm")
    for cpu in range(16):
        (tree / f"sys/devices/system/cpu/cpu{cpu}/cpuidle/state1/latency").write_text("10\n")
    c8 = _by_id(run_host_checks(HostRoot(tree), sample_interval_s=0.0))["C8"]
    assert c8.status == Status.INFO  # a guest cannot change its idle states
    assert c8.observed.startswith("haltpoll idle (10 µs) enabled on 16/16 CPUs, +4960 entries")
    assert c8.facts["deep_cstates_enabled"] == "haltpoll idle"
