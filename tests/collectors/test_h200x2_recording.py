"""The NVML recording of the 2 × H200 (NVLink) machine, replayed: pairs, P2P and NVLink as the real driver gave them."""

from __future__ import annotations

from decodetop.collectors.checks.gpu import gpu_checks
from decodetop.collectors.checks.result import Status
from decodetop.collectors.fake_nvml import fake_nvml, load_recording
from decodetop.collectors.telemetry import TelemetrySampler


def test_two_h200s_show_eighteen_nvlinks_each_and_p2p_between_them() -> None:
    snap = TelemetrySampler(fake_nvml(load_recording("h200x2-load"))).sample(processes=False)
    assert [g.name for g in snap.gpus] == ["NVIDIA H200", "NVIDIA H200"]
    assert [g.nvlink_active_links for g in snap.gpus] == [18, 18]  # nvidia-smi topo -m: NV18
    [pair] = snap.pairs
    assert (pair.gpu_a, pair.gpu_b) == (0, 1)
    assert pair.p2p_status is not None
    assert pair.p2p_status["read"] == 0  # NVML_P2P_STATUS_OK
    assert pair.p2p_status["nvlink"] == 0


def test_gpu_checks_pass_nvlink_and_p2p_on_the_recorded_pair() -> None:
    results = {r.check_id: r for r in gpu_checks(None, fake_nvml(load_recording("h200x2-idle")), window_s=0)}
    assert results["N10"].status is Status.PASS, results["N10"].observed
    p2p = [r for cid, r in results.items() if cid.startswith("N9:")]
    assert p2p
    assert all(r.status is Status.PASS for r in p2p), [r.observed for r in p2p]
