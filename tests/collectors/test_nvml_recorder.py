"""The recorder (benchmarks/recorders/record_nvml.py) run over the fake: what it writes replays as what it read."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

import pytest

from decodetop.collectors.fake_nvml import fake_nvml, load_recording
from decodetop.collectors.nvml import PynvmlBackend
from decodetop.collectors.telemetry import TelemetrySampler

RECORDER = Path(__file__).resolve().parents[2] / "benchmarks" / "recorders" / "record_nvml.py"


def _recorder() -> ModuleType:
    spec = importlib.util.spec_from_file_location("record_nvml", RECORDER)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_recorder_output_replays_like_its_source(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    recorder = _recorder()
    rc = recorder.main(
        [
            "--out",
            str(tmp_path),
            "--label",
            "copy",
            "--backend",
            "fake:h200x1-load",
            "--samples",
            "2",
            "--interval",
            "0",
        ]
    )
    assert rc == 0
    assert "gpu_checks" in capsys.readouterr().out  # the checks' calls are recorded too
    made = load_recording(tmp_path / "copy-idle.json")
    assert made.gpu_count == 1 and len(made.samples) == 2
    assert made.meta["phase"] == "idle" and len(made.meta["tick_costs"]) == 2
    original = load_recording("h200x1-load")
    for key in ("nvmlDeviceGetName(gpu0)", "nvmlDeviceGetNumaNodeId(gpu0)", "nvmlDeviceGetMaxClockInfo(gpu0,1)"):
        assert made.outcome(key) == original.outcome(key)
    a = TelemetrySampler(fake_nvml(made, clock=None)).sample().gpus[0]
    b = TelemetrySampler(fake_nvml(original, clock=None)).sample().gpus[0]
    assert (a.sm_clock_mhz, a.power_w, a.clock_event_reasons, a.unavailable.keys()) == (
        b.sm_clock_mhz,
        b.power_w,
        b.clock_event_reasons,
        b.unavailable.keys(),
    )
    assert json.loads((tmp_path / "copy-load.json").read_text())["label"] == "copy-load"


@pytest.mark.gpu
def test_real_nvml_smoke() -> None:
    """On a GPU machine: the real backend gives a snapshot with clocks for every GPU."""
    from decodetop.collectors.nvml import Nvml

    nvml = Nvml(PynvmlBackend())
    if not nvml.status().available:
        pytest.skip(f"no NVML here: {nvml.status().reason}")
    snap = TelemetrySampler(nvml).sample()
    assert snap.gpus and all(g.sm_clock_max_mhz for g in snap.gpus)
