"""Telemetry snapshots from real H200 recordings: values, units, reasons, rates, costs, and the collector thread."""

from __future__ import annotations

import threading

import pytest

from decodetop.collectors.fake_nvml import FakeNvmlBackend, err, fake_nvml, load_recording, ok
from decodetop.collectors.nvml import NVML_ERROR_LIBRARY_NOT_FOUND, NoNvmlBackend, Nvml
from decodetop.collectors.telemetry import (
    CLOCK_EVENT_REASONS,
    TelemetryCollector,
    TelemetrySampler,
    TelemetrySnapshot,
    cpus_from_affinity,
    decode_clock_event_reasons,
    normalize_bus_id,
)


def _sampler(name: str, **kwargs: object) -> tuple[TelemetrySampler, FakeNvmlBackend]:
    backend = FakeNvmlBackend(load_recording(name), clock=None, **kwargs)  # type: ignore[arg-type]
    return TelemetrySampler(Nvml(backend)), backend


@pytest.mark.parametrize(
    ("mask", "names"),
    [
        (0x0, ()),
        (0x1, ("GpuIdle",)),
        (0x4, ("SwPowerCap",)),
        (0x8 | 0x40, ("HwSlowdown", "HwThermalSlowdown")),
        (0x80 | 0x20, ("SwThermalSlowdown", "HwPowerBrakeSlowdown")),
        (0x4 | 0x1000, ("SwPowerCap", "Unknown(0x1000)")),
        (0x100 | 0x200 | 0x400, ("DisplayClockSetting", "BoardLimit", "Reliability")),
    ],
)
def test_clock_event_reasons_decode(mask: int, names: tuple[str, ...]) -> None:
    assert decode_clock_event_reasons(mask) == names


def test_reason_table_bits_are_distinct_single_bits() -> None:
    bits = [r.bit for r in CLOCK_EVENT_REASONS]
    assert len(set(bits)) == len(bits)
    assert all(b & (b - 1) == 0 for b in bits)
    assert {r.name for r in CLOCK_EVENT_REASONS if r.severity == "fail"} == {
        "HwSlowdown",
        "HwThermalSlowdown",
        "HwPowerBrakeSlowdown",
    }


def test_bus_id_and_affinity_helpers() -> None:
    assert normalize_bus_id("00000000:3B:00.0") == "0000:3b:00.0"
    assert normalize_bus_id("0000:3b:00.0") == "0000:3b:00.0"
    assert cpus_from_affinity([0b1011, 1]) == (0, 1, 3, 64)


def test_idle_snapshot_matches_the_recording_in_units() -> None:
    rec = load_recording("h200x1-idle")
    sampler, _ = _sampler("h200x1-idle")
    snap = sampler.sample()
    assert snap.nvml_available and snap.source == "fake: h200x1-idle"
    assert snap.system.driver_version == rec.outcome("nvmlSystemGetDriverVersion()")["ok"]
    cuda = rec.outcome("nvmlSystemGetCudaDriverVersion()")["ok"]
    assert snap.system.cuda_driver_version == f"{cuda // 1000}.{(cuda % 1000) // 10}"
    (g,) = snap.gpus
    assert g.name == "NVIDIA H200"
    assert g.pci_bus_id == normalize_bus_id(rec.outcome("nvmlDeviceGetPciInfo(gpu0)")["ok"]["busId"])
    assert g.sm_clock_mhz == rec.outcome("nvmlDeviceGetClockInfo(gpu0,1)")["ok"]
    assert g.sm_clock_max_mhz == rec.outcome("nvmlDeviceGetMaxClockInfo(gpu0,1)")["ok"]
    assert g.power_w == rec.outcome("nvmlDeviceGetPowerUsage(gpu0)")["ok"] / 1000
    assert g.power_limit_enforced_w == rec.outcome("nvmlDeviceGetEnforcedPowerLimit(gpu0)")["ok"] / 1000
    assert g.mem_total_bytes == rec.outcome("nvmlDeviceGetMemoryInfo(gpu0)")["ok"]["total"]
    assert g.clock_event_reasons == ("GpuIdle",)
    assert (g.pcie_gen, g.pcie_width, g.pcie_gen_max, g.pcie_width_max) == (5, 16, 5, 16)
    assert g.ecc_enabled is True and g.remapped_rows_pending is False
    assert g.persistence_mode is True
    # What the H200 VM does not support is None with the reason, not a crash.
    assert g.numa_node_id is None and "not supported" in g.unavailable["numa_node_id"]
    assert g.retired_pages_pending is None and "retired_pages_pending" in g.unavailable
    assert g.nvlink_active_links is None and "nvlink_active_links" in g.unavailable
    assert "sm_clock_mhz" not in g.unavailable
    # First tick: no rate yet, and says so.
    assert g.pcie_tx_bytes_per_s is None and "first tick" in g.unavailable["pcie_tx_bytes_per_s"]
    assert snap.tick_cost_s >= 0 and snap.tick_cost_per_gpu_s == snap.tick_cost_s
    assert snap.static_cost_s > 0 and snap.nvml_calls > 0


def test_load_snapshot_rates_and_reason_shares() -> None:
    sampler, backend = _sampler("h200x1-load")
    sampler.sample()
    backend.advance()
    snap = sampler.sample()
    (g,) = snap.gpus
    assert g.clock_event_reasons == ("SwPowerCap",)  # a 700 W H200 running bf16 matmuls sits on its power cap
    assert g.clock_event_share["SwPowerCap"] > 0.9
    assert g.clock_event_share["HwThermalSlowdown"] == 0
    assert g.gpu_util_pct is not None and g.gpu_util_pct >= 90
    assert g.pcie_rate_source == "counters"
    assert g.pcie_tx_bytes_per_s is not None and g.pcie_tx_bytes_per_s > 1e8  # the load copies H2D/D2H
    assert g.pcie_rate_is_lower_bound  # 32-bit counters on this driver
    assert static_is_cached(snap)
    assert g.processes is not None and len(g.processes) == 1 and g.processes[0].kind == "compute"


def static_is_cached(snap: TelemetrySnapshot) -> bool:
    return snap.static_cost_s == 0.0


def test_counter_rate_counts_one_32bit_wrap() -> None:
    rec = load_recording("h200x1-idle")
    wrapped = rec.with_field_values(0, {197: 2**32 - 1000}, samples=[0], value_type=1)
    wrapped = wrapped.with_field_values(0, {197: 1000}, samples=[1], value_type=1)
    backend = FakeNvmlBackend(wrapped, clock=None)
    sampler = TelemetrySampler(Nvml(backend))
    a = sampler.sample().gpus[0]
    backend.advance()
    b = sampler.sample().gpus[0]
    assert a.pcie_tx_bytes_total == 2**32 - 1000
    # The other fields keep the recorded NVML timestamps, so the rate divides 2000 bytes by their interval.
    dt_s = (b.counters_timestamp_us - a.counters_timestamp_us) / 1e6  # type: ignore[operator]
    assert b.pcie_tx_bytes_per_s == pytest.approx(2000 / dt_s)
    # A 64-bit counter that goes back was reset: no rate rather than a wrong one.
    reset = rec.with_field_values(0, {197: 5000}, samples=[0]).with_field_values(0, {197: 10}, samples=[1])
    backend = FakeNvmlBackend(reset, clock=None)
    sampler = TelemetrySampler(Nvml(backend))
    sampler.sample()
    backend.advance()
    assert sampler.sample().gpus[0].pcie_tx_bytes_per_s is None


def test_throughput_fallback_when_counters_unsupported() -> None:
    rec = load_recording("h200x1-load")
    broken = {
        k: {"error": 3, "message": ""} for k in rec.samples[0] if k.startswith("nvmlDeviceGetFieldValues(gpu0,[197")
    }
    nvml = fake_nvml(rec.with_calls(broken), clock=None)
    g = TelemetrySampler(nvml).sample().gpus[0]
    assert g.pcie_rate_source == "sampled"
    kb = rec.outcome("nvmlDeviceGetPcieThroughput(gpu0,0)")["ok"]
    assert g.pcie_tx_bytes_per_s == kb * 1024
    assert g.clock_event_time_ns == {} and "clock_event_time_ns" in g.unavailable


def test_no_nvml_gives_an_empty_snapshot_with_the_reason() -> None:
    snap = TelemetrySampler(Nvml(NoNvmlBackend(NVML_ERROR_LIBRARY_NOT_FOUND))).sample()
    assert not snap.nvml_available
    assert "not found" in snap.nvml_reason
    assert snap.gpus == () and snap.source == "none"


def test_replicated_demo_has_eight_gpus_and_labels_it() -> None:
    snap = TelemetrySampler(fake_nvml("h200x1-load", replicate_to=8, clock=None)).sample()
    assert len(snap.gpus) == 8
    assert "replicated 1→8" in snap.source
    assert len(snap.pairs) == 28  # every pair, though a 1-GPU recording has no pair data
    assert snap.pairs[0].topology_level is None and "topology_level" in snap.pairs[0].unavailable


def test_pairs_read_p2p_with_int_indices() -> None:
    rec = load_recording("h200x1-idle").replicated(2)
    rec = rec.with_calls(
        {
            "nvmlDeviceGetTopologyCommonAncestor(gpu0,gpu1)": ok(50),
            **{f"nvmlDeviceGetP2PStatus(gpu0,gpu1,{i})": ok(0 if i < 2 else 5) for i in range(5)},
        }
    )
    backend = FakeNvmlBackend(rec, clock=None)
    snap = TelemetrySampler(Nvml(backend)).sample()
    (pair,) = snap.pairs
    assert (pair.topology_level, pair.topology_name) == (50, "SYS")
    assert pair.p2p_status == {"read": 0, "write": 0, "nvlink": 5, "atomics": 5, "pci": 5}
    assert pair.p2p_name("nvlink") == "NOT_SUPPORTED"
    assert "nvmlDeviceGetP2PStatus(gpu0,gpu1,0)" in backend.calls  # the int 0, never pynvml's tuple (0,)


def test_collector_thread_delivers_snapshots_and_stops() -> None:
    got: list[TelemetrySnapshot] = []
    two = threading.Event()

    def on_snapshot(snap: TelemetrySnapshot) -> None:
        got.append(snap)
        if len(got) >= 2:
            two.set()

    collector = TelemetryCollector(fake_nvml("h200x1-load", clock=None), interval_s=0.01, on_snapshot=on_snapshot)
    with collector:
        assert two.wait(10)
    assert not collector.running
    assert got[0].tick == 1 and got[1].tick == 2
    assert collector.latest is got[-1]


def test_latency_probe_skips_process_lists() -> None:
    backend = FakeNvmlBackend(load_recording("h200x1-load"), clock=None)
    collector = TelemetryCollector(Nvml(backend), interval_s=1.0)
    with collector.latency_probe():
        with collector.latency_probe():  # nests
            pass
        assert collector.costly_paused.is_set()
        backend.calls.clear()
        snap = collector.sample_once()
    assert not any("RunningProcesses" in c for c in backend.calls)
    assert not snap.processes_sampled and "latency probe" in snap.processes_note
    assert snap.gpus[0].processes is None
    assert not collector.costly_paused.is_set()
    assert collector.sample_once().gpus[0].processes is not None


def test_collector_survives_a_failing_callback() -> None:
    calls = threading.Event()

    def boom(snap: TelemetrySnapshot) -> None:
        calls.set()
        raise RuntimeError("callback bug")

    collector = TelemetryCollector(fake_nvml("h200x1-idle", clock=None), interval_s=0.01, on_snapshot=boom)
    collector.start()
    assert calls.wait(10)
    collector.stop()
    assert collector.errors >= 1


def test_bad_interval_is_refused() -> None:
    with pytest.raises(ValueError, match="interval"):
        TelemetryCollector(fake_nvml("h200x1-idle", clock=None), interval_s=0)


def test_older_driver_function_names_are_the_fallback() -> None:
    rec = load_recording("h200x1-load").with_calls(
        {
            "nvmlDeviceGetCurrentClocksEventReasons(gpu0)": err(13),  # NVML_ERROR_FUNCTION_NOT_FOUND: older driver
            "nvmlDeviceGetCurrentClocksThrottleReasons(gpu0)": ok(0x4),
            "nvmlDeviceGetComputeRunningProcesses(gpu0)": err(4),
        }
    )
    g = TelemetrySampler(fake_nvml(rec, clock=None)).sample().gpus[0]
    assert g.clock_event_mask == 0x4 and "clock_event_mask" not in g.unavailable
    assert g.processes == () and "compute: no permission" in g.processes_note


def test_slow_settings_are_read_every_nth_tick_and_carried_between() -> None:
    backend = FakeNvmlBackend(load_recording("h200x1-idle"), clock=None)
    sampler = TelemetrySampler(Nvml(backend), slow_every_ticks=3)
    reads: list[int] = []
    snaps = []
    for _ in range(7):
        backend.calls.clear()
        snaps.append(sampler.sample())
        reads.append(sum(c.startswith("nvmlDeviceGetApplicationsClock") for c in backend.calls))
    assert reads == [2, 0, 0, 2, 0, 0, 2]
    assert all(s.gpus[0].app_sm_clock_mhz == snaps[0].gpus[0].app_sm_clock_mhz for s in snaps)
    assert all("retired_pages_pending" in s.gpus[0].unavailable for s in snaps)  # the reason is carried too


def test_each_process_carries_its_recorded_sm_share_every_tick() -> None:
    """h200x1-procs-load: one matmul process (pid 437 there) on the H200; nvmlDeviceGetProcessUtilization gave its
    SM share on each of the five ticks (90, 92, 93, 94, 95 %), and the process list its memory (1.6 GiB)."""
    sampler, backend = _sampler("h200x1-procs-load")
    shares = []
    for _ in range(5):
        (gpu,) = sampler.sample().gpus
        (process,) = gpu.processes or ()
        assert (process.pid, process.used_mem_bytes, process.kind) == (437, 1_721_761_792, "compute")
        shares.append(process.sm_util_pct)
        backend.advance()
    assert shares == [90, 92, 93, 94, 95]
    assert backend.calls.count("nvmlDeviceGetProcessUtilization(gpu0,0)") == 5


def test_a_process_with_no_utilisation_sample_has_no_sm_share() -> None:
    """NVML answers NOT_FOUND when its buffer holds no sample newer than asked (the idle ticks of the recording)."""
    rec = load_recording("h200x1-procs-load")
    idle = rec.with_calls({"nvmlDeviceGetProcessUtilization(gpu0,0)": err(6, "Not Found")})
    sampler = TelemetrySampler(Nvml(FakeNvmlBackend(idle, clock=None)))
    (gpu,) = sampler.sample().gpus
    assert [(p.pid, p.sm_util_pct) for p in gpu.processes or ()] == [(437, None)]
