"""NVLink traffic per link: the TX/RX data counters (KiB, the link as the field's scope) read each tick as rates in
GB/s; "n/a" with the reason where the GPU has no NVLink (the one-GPU H200 recorded, where every NVLink call answers
not supported) or the recording holds no counters (the 2-GPU H200, recorded before they were read). The counters
with links come from a synthetic recording built on the 2-GPU one, labelled so."""

from __future__ import annotations

import dataclasses

import pytest

from decodetop.collectors.fake_nvml import Recording, fake_nvml, load_recording, ok
from decodetop.collectors.telemetry import TelemetrySampler
from decodetop.collectors.telemetry.sampler import NVLINK_THROUGHPUT_UNIT_BYTES
from decodetop.tui.screens.gpu_details import gpu_detail_text
from decodetop.tui.sources.telemetry_views import gpu_view

LINKS = 18
TICK_US = 1_000_000
T0_US = 1_795_967_134_000_000
BASE_KIB = 5_000_000_000


def _kib(sample: int, gpu: int, link: int, rx: bool) -> int:
    """A made-up counter: (link + 1) MiB a tick sent, twice that received on GPU 1."""
    per_tick = (link + 1) * 1024 * (2 if rx and gpu == 1 else 1)
    return BASE_KIB + sample * per_tick


def synthetic_links(samples: int = 3, reset_at: int | None = None) -> Recording:
    """h200x2-load (18 active links per GPU) with NVLink data counters added per link, a second per sample."""
    base = load_recording("h200x2-load")
    rec = dataclasses.replace(
        base,
        label="synthetic-h200x2-nvlink",
        description="SYNTHETIC: h200x2-load with made-up NVLink TX/RX counters per link (not measured)",
        samples=tuple(base.samples[i % len(base.samples)] for i in range(samples)),
        sample_times_s=tuple(float(i) for i in range(samples)),
    )
    for sample in range(samples):
        for gpu in range(2):
            fields = ",".join(f"{fid}:{link}" for link in range(LINKS) for fid in (138, 139))
            entries = [
                {
                    "fieldId": fid,
                    "scopeId": link,
                    "timestamp": T0_US + sample * TICK_US,
                    "valueType": 3,
                    "nvmlReturn": 0,
                    "value": 7 if sample == reset_at else _kib(sample, gpu, link, fid == 139),
                }
                for link in range(LINKS)
                for fid in (138, 139)
            ]
            key = f"nvmlDeviceGetFieldValues(gpu{gpu},[{fields}])"
            rec = rec.with_calls({key: ok(entries)}, samples=[sample])
    return rec


def _ticks(rec: Recording, count: int) -> list[object]:
    nvml = fake_nvml(rec, clock=None)
    sampler = TelemetrySampler(nvml)
    out = []
    for _ in range(count):
        out.append(sampler.sample(processes=False))
        nvml.backend.advance()  # type: ignore[attr-defined]
    return out


def test_per_link_rates_from_the_counters() -> None:
    first, second = _ticks(synthetic_links(), 2)
    gpu = first.gpus[0]  # type: ignore[attr-defined]
    assert gpu.nvlink_tx_kib_total[17] == BASE_KIB and gpu.nvlink_tx_bytes_per_s == {}
    assert gpu.unavailable["nvlink_tx_bytes_per_s"] == "first tick: no rate yet"
    g0, g1 = second.gpus  # type: ignore[attr-defined]
    assert g0.nvlink_tx_bytes_per_s[0] == pytest.approx(1024 * NVLINK_THROUGHPUT_UNIT_BYTES)  # 1 MiB/s on link 0
    assert g0.nvlink_tx_bytes_per_s[17] == pytest.approx(18 * 1024 * 1024)
    assert g1.nvlink_rx_bytes_per_s[17] == pytest.approx(36 * 1024 * 1024)
    assert "nvlink_tx_bytes_per_s" not in g0.unavailable
    view = gpu_view(g1)
    mib = 1024 * 1024 / 1e9
    assert view.nvlink_tx_gbps == pytest.approx(sum(range(1, 19)) * mib)
    assert view.nvlink_rx_gbps == pytest.approx(2 * sum(range(1, 19)) * mib)
    assert view.nvlink_link_gbps[0] == (0, pytest.approx(mib), pytest.approx(2 * mib)) and view.nvlink_note == ""
    text = gpu_detail_text(view, [view]).plain
    assert "TX / RX  0.18 / 0.36 GB/s over all links" in text
    assert "L17 0.02 / 0.04" in text and "(per link: TX / RX GB/s)" in text


def test_a_counter_that_went_back_gives_no_rate() -> None:
    ticks = _ticks(synthetic_links(reset_at=1), 2)
    gpu = ticks[1].gpus[0]  # type: ignore[attr-defined]
    assert gpu.nvlink_tx_bytes_per_s == {}
    assert gpu.unavailable["nvlink_tx_bytes_per_s"] == "the counters went back (reset)"


def test_the_h200_without_nvlink_says_so() -> None:
    rec = load_recording("h200x1-nvlink-load")
    # what the driver answered (recorded on the H200): the counters are not supported there, per link and in all
    answer = rec.outcome("nvmlDeviceGetFieldValues(gpu0,[138,139])")
    assert answer is not None and {e["nvmlReturn"] for e in answer["ok"]} == {3}
    (gpu,) = _ticks(rec, 1)[0].gpus  # type: ignore[attr-defined]
    assert gpu.nvlink_tx_bytes_per_s == {}
    assert gpu.unavailable["nvlink_tx_bytes_per_s"] == "no NVLink link answered (no NVLink on this GPU)"
    view = gpu_view(gpu)
    assert view.nvlink_tx_gbps is None
    assert "traffic  n/a (no NVLink link answered (no NVLink on this GPU))" in gpu_detail_text(view, [view]).plain


def test_links_without_recorded_counters_are_na_with_the_reason() -> None:
    (gpu, _) = _ticks(load_recording("h200x2-load"), 1)[0].gpus  # type: ignore[attr-defined]
    assert gpu.nvlink_active_links == 18 and gpu.nvlink_tx_bytes_per_s == {}
    assert gpu.unavailable["nvlink_tx_bytes_per_s"].startswith("NVLink throughput counters: function not found")
