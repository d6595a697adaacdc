"""GPU checks over real H200 recordings, with broken states derived by overriding recorded calls."""

from __future__ import annotations

from pathlib import Path

import pytest

from decodetop.collectors.checks.gpu import gpu_checks
from decodetop.collectors.checks.result import CheckResult, Status
from decodetop.collectors.fake_nvml import FakeNvmlBackend, Recording, err, load_recording, ok
from decodetop.collectors.hostroot import HostRoot
from decodetop.collectors.nvml import (
    NVML_ERROR_DRIVER_NOT_LOADED,
    NVML_ERROR_LIB_RM_VERSION_MISMATCH,
    NVML_ERROR_LIBRARY_NOT_FOUND,
    NoNvmlBackend,
    Nvml,
)

BUS = "0000:00:06.0"  # the recorded H200's PCI address (NVML 00000000:00:06.0)
DRIVER = "580.159.04"


def _root(tmp_path: Path, *, module: str = DRIVER, cpulist: str = "0-15", numa: str = "-1", nodes: int = 1) -> HostRoot:
    """A copied-host tree with what the GPU checks read (values as on the recorded H200 VM by default)."""
    files = {
        "sys/module/nvidia/version": f"{module}\n",
        "proc/driver/nvidia/version": (
            f"NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  {module}  Release Build  (dvs-builder@U22)\n"
            "GCC version:  gcc version 12.3.0\n"
        ),
        f"sys/bus/pci/devices/{BUS}/local_cpulist": f"{cpulist}\n",
        f"sys/bus/pci/devices/{BUS}/numa_node": f"{numa}\n",
        "proc/1/comm": "systemd\n",
    }
    for i in range(nodes):
        files[f"sys/devices/system/node/node{i}/cpulist"] = "0-15\n"
    for rel, text in files.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return HostRoot(tmp_path)


def _run(
    rec: Recording, root: HostRoot | None = None, *, under_load: bool = False, window_s: float = 0.5
) -> list[CheckResult]:
    backend = FakeNvmlBackend(rec, clock=None)
    # The window's second sample is the recording's next sample: "sleeping" advances the fake.
    return gpu_checks(root, Nvml(backend), under_load=under_load, window_s=window_s, sleep=lambda _s: backend.advance())


def _by_id(results: list[CheckResult], prefix: str) -> CheckResult:
    matches = [r for r in results if r.check_id == prefix or r.check_id.startswith(prefix + ":")]
    assert len(matches) == 1, [r.check_id for r in results]
    return matches[0]


def test_idle_h200_passes_with_host_files(tmp_path: Path) -> None:
    results = _run(load_recording("h200x1-idle"), _root(tmp_path))
    ids = {r.check_id.split(":")[0] for r in results}
    assert {"N1", "P2", "P6", "N2", "N3", "N4", "N5", "N6", "N7", "N10", "N11"} <= ids
    assert all(r.title and r.observed and r.expected for r in results)
    assert _by_id(results, "N1").status is Status.PASS
    assert DRIVER in _by_id(results, "N1").observed
    assert _by_id(results, "P2").check_id == f"P2:{BUS}"
    assert _by_id(results, "P2").status is Status.PASS
    assert _by_id(results, "N3").status is Status.PASS
    assert "GpuIdle" in _by_id(results, "N3").observed
    assert _by_id(results, "N5").status is Status.PASS
    assert _by_id(results, "N6").status is Status.INFO  # not supported on Hopper: row remapping instead
    assert _by_id(results, "N7").status is Status.PASS
    assert _by_id(results, "N11").status is Status.PASS
    assert _by_id(results, "N10").status is Status.INFO  # this VM's single H200 reports no NVLink
    numa = _by_id(results, "P6")
    assert numa.status is Status.INFO and "0-15" in numa.observed  # numa_node -1 on a one-node VM: harmless
    assert not [r for r in results if r.status in (Status.FAIL, Status.WARN)]


def test_sustained_power_cap_under_load_warns() -> None:
    results = _run(load_recording("h200x1-load"), under_load=True)
    n3 = _by_id(results, "N3")
    assert n3.status is Status.WARN
    assert "SwPowerCap" in n3.observed and "power cap" in n3.observed
    assert "SwPowerCap 100%" in n3.observed  # share of the window, from the accumulated-time counter
    # The same samples judged as idle: no verdict on power capping.
    assert _by_id(_run(load_recording("h200x1-load")), "N3").status is Status.PASS


@pytest.mark.parametrize("bit", [0x8, 0x40, 0x80])
def test_hardware_slowdown_bits_fail(bit: int) -> None:
    rec = load_recording("h200x1-load").with_calls({"nvmlDeviceGetCurrentClocksEventReasons(gpu0)": ok(0x4 | bit)})
    n3 = _by_id(_run(rec, under_load=True), "N3")
    assert n3.status is Status.FAIL
    assert "hardware slowdown" in n3.observed


def test_thermal_counter_growth_fails_even_when_the_bit_is_clear() -> None:
    rec = load_recording("h200x1-idle")
    rec = rec.with_field_values(0, {270: 1_000_000}, samples=[0]).with_field_values(0, {270: 400_000_000}, samples=[1])
    assert _by_id(_run(rec), "N3").status is Status.FAIL


def test_software_thermal_slowdown_warns() -> None:
    rec = load_recording("h200x1-idle").with_calls({"nvmlDeviceGetCurrentClocksEventReasons(gpu0)": ok(0x20)})
    assert _by_id(_run(rec), "N3").status is Status.WARN


def test_down_trained_link_fails_and_idle_speed_is_only_info() -> None:
    narrow = load_recording("h200x1-load").with_calls({"nvmlDeviceGetCurrPcieLinkWidth(gpu0)": ok(8)})
    p2 = _by_id(_run(narrow, under_load=True), "P2")
    assert p2.status is Status.FAIL and "x8 of x16" in p2.observed
    slow = load_recording("h200x1-idle").with_calls({"nvmlDeviceGetCurrPcieLinkGeneration(gpu0)": ok(1)})
    assert _by_id(_run(slow), "P2").status is Status.INFO
    assert _by_id(_run(slow, under_load=True), "P2").status is Status.WARN
    slot = load_recording("h200x1-idle").with_calls(
        {"nvmlDeviceGetMaxPcieLinkGeneration(gpu0)": ok(4), "nvmlDeviceGetCurrPcieLinkGeneration(gpu0)": ok(4)}
    )
    p2_slot = _by_id(_run(slot), "P2")
    assert p2_slot.status is Status.WARN and "slot or riser" in p2_slot.observed


@pytest.mark.parametrize(
    ("overrides", "status", "words"),
    [
        ({"nvmlDeviceGetTotalEccErrors(gpu0,1,0)": ok(2)}, Status.FAIL, "uncorrected volatile 2"),
        ({"nvmlDeviceGetTotalEccErrors(gpu0,1,1)": ok(5)}, Status.WARN, "aggregate 5"),
        ({"nvmlDeviceGetEccMode(gpu0)": ok([1, 0])}, Status.WARN, "pending"),
        ({"nvmlDeviceGetEccMode(gpu0)": ok([0, 0])}, Status.WARN, "ECC off"),
        ({"nvmlDeviceGetEccMode(gpu0)": err(3)}, Status.INFO, "not readable"),
    ],
)
def test_ecc_states(overrides: dict[str, dict[str, object]], status: Status, words: str) -> None:
    n5 = _by_id(_run(load_recording("h200x1-idle").with_calls(overrides)), "N5")
    assert n5.status is status
    assert words in n5.observed


@pytest.mark.parametrize(
    ("rows", "status"),
    [([0, 0, 0, 0], Status.PASS), ([3, 1, 1, 0], Status.WARN), ([3, 9, 0, 1], Status.FAIL)],
)
def test_row_remap_states(rows: list[int], status: Status) -> None:
    rec = load_recording("h200x1-idle").with_calls({"nvmlDeviceGetRemappedRows(gpu0)": ok(rows)})
    n7 = _by_id(_run(rec), "N7")
    assert n7.status is status
    assert f"{rows[0]} correctable" in n7.observed


def test_retired_pages_pending_warns_where_supported() -> None:
    rec = load_recording("h200x1-idle").with_calls({"nvmlDeviceGetRetiredPagesPendingStatus(gpu0)": ok(1)})
    assert _by_id(_run(rec), "N6").status is Status.WARN


def test_replay_growth_in_the_window_warns() -> None:
    rec = load_recording("h200x1-idle").with_calls({"nvmlDeviceGetPcieReplayCounter(gpu0)": ok(12)}, samples=[1])
    n11 = _by_id(_run(rec), "N11")
    assert n11.status is Status.WARN and "+12" in n11.observed
    assert _by_id(_run(rec, window_s=0), "N11").status is Status.INFO  # one reading: no window


def test_persistence_off_and_lowered_power_limit() -> None:
    rec = load_recording("h200x1-load").with_calls(
        {"nvmlDeviceGetPersistenceMode(gpu0)": ok(0), "nvmlDeviceGetEnforcedPowerLimit(gpu0)": ok(500_000)}
    )
    results = _run(rec, under_load=True)
    assert _by_id(results, "N2").status is Status.WARN
    n4 = _by_id(results, "N4")
    assert n4.status is Status.WARN and "power limit below default" in n4.observed  # SwPowerCap is active


def test_driver_version_mismatch_between_nvml_and_module(tmp_path: Path) -> None:
    n1 = _by_id(_run(load_recording("h200x1-idle"), _root(tmp_path, module="570.86.15")), "N1")
    assert n1.status is Status.FAIL and "differ" in n1.observed
    runtime = gpu_checks(
        _root(tmp_path),
        Nvml(FakeNvmlBackend(load_recording("h200x1-idle"), clock=None)),
        window_s=0,
        runtime_cuda="13.2",
    )
    assert _by_id(runtime, "N1").status is Status.FAIL


def test_numa_affinity_disagreement_and_missing_node_on_two_sockets(tmp_path: Path) -> None:
    p6 = _by_id(_run(load_recording("h200x1-idle"), _root(tmp_path, cpulist="0-7")), "P6")
    assert p6.status is Status.WARN and "disagree" in p6.observed
    p6_two = _by_id(_run(load_recording("h200x1-idle"), _root(tmp_path / "two", nodes=2)), "P6")
    assert p6_two.status is Status.WARN and "2-node" in p6_two.observed


def _two_gpus(**pair: dict[str, object]) -> Recording:
    rec = load_recording("h200x1-idle").replicated(2)
    return rec.with_calls(pair)


def test_pairs_topology_and_p2p() -> None:
    good = _two_gpus(
        **{"nvmlDeviceGetTopologyCommonAncestor(gpu0,gpu1)": ok(0)},
        **{f"nvmlDeviceGetP2PStatus(gpu0,gpu1,{i})": ok(0) for i in range(5)},
    )
    results = _run(good)
    assert _by_id(results, "P7").check_id == "P7:GPU0-GPU1"
    assert "INTERNAL" in _by_id(results, "P7").observed
    assert _by_id(results, "N9").status is Status.PASS
    bad = _two_gpus(
        **{"nvmlDeviceGetTopologyCommonAncestor(gpu0,gpu1)": ok(50)},
        **{f"nvmlDeviceGetP2PStatus(gpu0,gpu1,{i})": ok(3) for i in range(5)},
    )
    results = _run(bad)
    assert "SYS" in _by_id(results, "P7").observed
    n9 = _by_id(results, "N9")
    assert n9.status is Status.WARN and "IOH_TOPOLOGY_NOT_SUPPORTED" in n9.observed


def test_nvlink_short_link_fails() -> None:
    links = {
        **{
            f"nvmlDeviceGetFieldValues(gpu{g},[91])": ok([{"fieldId": 91, "nvmlReturn": 0, "value": 18}])
            for g in (0, 1)
        },
        **{f"nvmlDeviceGetNvLinkState(gpu{g},{link})": ok(1) for g in (0, 1) for link in range(18)},
    }
    results = _run(_two_gpus(**links))
    assert _by_id(results, "N10").status is Status.PASS
    assert "GPU0 18/18" in _by_id(results, "N10").observed
    links["nvmlDeviceGetNvLinkState(gpu1,7)"] = ok(0)
    n10 = _by_id(_run(_two_gpus(**links)), "N10")
    assert n10.status is Status.FAIL and "GPU1 17/18" in n10.observed


@pytest.mark.parametrize(
    ("code", "words"),
    [(NVML_ERROR_LIBRARY_NOT_FOUND, "not found"), (NVML_ERROR_DRIVER_NOT_LOADED, "driver not loaded")],
)
def test_no_nvml_is_one_info_result(tmp_path: Path, code: int, words: str) -> None:
    """Without an NVIDIA GPU on the PCI bus a missing NVML is a fact, not a fault."""
    results = gpu_checks(_root(tmp_path), Nvml(NoNvmlBackend(code)))
    assert len(results) == 1
    assert results[0].status is Status.INFO
    assert words in results[0].observed
    assert DRIVER in results[0].observed  # the loaded module is named, from /sys/module/nvidia/version
    assert gpu_checks(None, Nvml(NoNvmlBackend(code)))[0].status is Status.INFO


def _on_the_bus(root: HostRoot, bdf: str = BUS) -> HostRoot:
    """`root` with an H200 on the PCI bus as sysfs shows it (vendor 0x10de, class 0x030200)."""
    device = root.base / "sys/bus/pci/devices" / bdf
    device.mkdir(parents=True, exist_ok=True)
    for name, value in (("vendor", "0x10de"), ("device", "0x2335"), ("class", "0x030200")):
        (device / name).write_text(value + "\n")
    return root


@pytest.mark.parametrize(
    ("code", "module", "words"),
    [
        (NVML_ERROR_DRIVER_NOT_LOADED, "", "NVIDIA driver not loaded (no nvidia kernel module loaded)"),
        (NVML_ERROR_LIBRARY_NOT_FOUND, DRIVER, f"not found (kernel module {DRIVER} is loaded)"),
    ],
    ids=["driver-did-not-load", "library-missing"],
)
def test_gpus_on_the_pci_bus_without_nvml_are_critical(tmp_path: Path, code: int, module: str, words: str) -> None:
    """The host decodetop is for, after a kernel upgrade the driver did not survive: NVIDIA GPUs on the bus and no
    NVML is a failing N1 with the reason, never an info line."""
    root = _on_the_bus(_root(tmp_path, module=module))
    if not module:
        (tmp_path / "sys/module/nvidia/version").unlink()
        (tmp_path / "proc/driver/nvidia/version").unlink()
    (only,) = gpu_checks(root, Nvml(NoNvmlBackend(code)))
    assert only.check_id == "N1" and only.status is Status.FAIL
    assert only.observed.startswith(f"1 NVIDIA GPU on the PCI bus ({BUS}) but NVML unavailable: ")
    assert only.observed.endswith(words)
    assert "dkms autoinstall" in only.fix and only.facts["pci_gpus"] == "1"


def test_nvml_seeing_no_gpu_while_the_bus_has_one_fails(tmp_path: Path) -> None:
    rec = load_recording("h200x1-idle").with_calls({"nvmlDeviceGetCount()": ok(0)})
    (only,) = _run(rec, _on_the_bus(_root(tmp_path)), window_s=0)
    assert only.status is Status.FAIL and only.observed.endswith(f"while 1 NVIDIA GPU on the PCI bus ({BUS})")


def test_unknown_numa_node_and_link_maximum_never_pass(tmp_path: Path) -> None:
    """NVML without a NUMA node and a sysfs without one: P6 is unknown on a multi-node host (info on one node); a
    link whose maximum NVML does not give is not judged (P2 unknown)."""
    no_node = {"nvmlDeviceGetNumaNodeId(gpu0)": err(3)}
    root_two = _root(tmp_path / "two", nodes=2)
    (tmp_path / "two" / f"sys/bus/pci/devices/{BUS}/numa_node").unlink()
    p6 = _by_id(_run(load_recording("h200x1-idle").with_calls(no_node), root_two), "P6")
    assert p6.status is Status.UNKNOWN and "NUMA node unknown" in p6.observed
    assert "not reported by NVML or sysfs" in p6.observed
    root_one = _root(tmp_path / "one", nodes=1)
    (tmp_path / "one" / f"sys/bus/pci/devices/{BUS}/numa_node").unlink()
    p6 = _by_id(_run(load_recording("h200x1-idle").with_calls(no_node), root_one), "P6")
    assert p6.status is Status.INFO and "one NUMA node on this host" in p6.observed
    no_max = {"nvmlDeviceGetMaxPcieLinkWidth(gpu0)": err(3), "nvmlDeviceGetMaxPcieLinkGeneration(gpu0)": err(3)}
    p2 = _by_id(_run(load_recording("h200x1-idle").with_calls(no_max)), "P2")
    assert p2.status is Status.UNKNOWN and "maximum is not readable" in p2.observed


def test_library_module_mismatch_fails_n1(tmp_path: Path) -> None:
    rec = load_recording("h200x1-idle").with_init_error(NVML_ERROR_LIB_RM_VERSION_MISMATCH)
    results = gpu_checks(_root(tmp_path), Nvml(FakeNvmlBackend(rec, clock=None)))
    assert len(results) == 1
    assert results[0].check_id == "N1" and results[0].status is Status.FAIL
    assert "reboot" in results[0].fix.lower()


def test_nvml_without_gpus_is_info() -> None:
    rec = load_recording("h200x1-idle").with_calls({"nvmlDeviceGetCount()": ok(0)})
    (only,) = _run(rec, window_s=0)
    assert only.status is Status.INFO and "no GPU" in only.observed


def test_garbage_local_cpulist_is_unread_not_half_read(tmp_path: Path) -> None:
    """P6 reads sysfs local_cpulist with the host checks' parser: garbage means unreadable, never a partial set."""
    from decodetop.collectors.checks.gpu import _sysfs_affinity
    from decodetop.collectors.fake_nvml import fake_nvml
    from decodetop.collectors.telemetry import TelemetrySampler

    snap = TelemetrySampler(fake_nvml("h200x1-idle", clock=None)).sample(processes=False).gpus[0]
    device = tmp_path / "sys/bus/pci/devices" / str(snap.pci_bus_id)
    device.mkdir(parents=True)
    (device / "numa_node").write_text("1\n")
    (device / "local_cpulist").write_text("0-3,8,10-11\n")
    assert _sysfs_affinity(snap, HostRoot(tmp_path)) == ({0, 1, 2, 3, 8, 10, 11}, 1)
    (device / "local_cpulist").write_text("garbage,2\n")
    (device / "numa_node").write_text("x\n")
    assert _sysfs_affinity(snap, HostRoot(tmp_path)) == (None, None)
