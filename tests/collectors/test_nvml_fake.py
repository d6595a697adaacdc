"""The fake NVML replays real H200 recordings exactly; a call no recording holds is refused (FUNCTION_NOT_FOUND), and
the test that made it fails."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from decodetop.collectors.fake_nvml import (
    RECORDING_FORMAT,
    FakeNvmlBackend,
    Recording,
    bundled_recordings,
    fake_nvml,
    load_recording,
    ok,
)
from decodetop.collectors.nvml import (
    NA,
    NVML_ERROR_FUNCTION_NOT_FOUND,
    NVML_ERROR_LIB_RM_VERSION_MISMATCH,
    NVML_ERROR_NOT_SUPPORTED,
    GpuRef,
    Nvml,
)
from decodetop.errors import UserInputError


def test_bundled_recordings_come_from_a_real_h200() -> None:
    assert {"h200x1-idle", "h200x1-load", "h200x1-procs-load"} <= set(bundled_recordings())
    for name in ("h200x1-idle", "h200x1-load", "h200x1-procs-load"):
        rec = load_recording(name)
        assert rec.gpu_count == 1
        assert len(rec.samples) >= 3
        assert rec.outcome("nvmlDeviceGetName(gpu0)") == ok("NVIDIA H200")
        assert rec.meta["recorder"] == "benchmarks/recorders/record_nvml.py"
        assert (RECORDER_DIR / "record_nvml.py").is_file()  # the script a recording names exists there
        assert rec.meta["phase"] in name


RECORDER_DIR = Path(__file__).resolve().parents[2] / "benchmarks" / "recorders"


def test_fake_answers_exactly_what_was_recorded() -> None:
    rec = load_recording("h200x1-load")
    nvml = fake_nvml(rec, clock=None)
    assert (
        nvml.query("nvmlDeviceGetMaxClockInfo", GpuRef(0), 1) == rec.outcome("nvmlDeviceGetMaxClockInfo(gpu0,1)")["ok"]
    )
    numa = nvml.query("nvmlDeviceGetNumaNodeId", GpuRef(0))
    assert isinstance(numa, NA) and numa.code == NVML_ERROR_NOT_SUPPORTED  # recorded: as on the real H200 VM
    out_of_range = nvml.query("nvmlDeviceGetName", GpuRef(5))
    assert isinstance(out_of_range, NA)


@pytest.mark.nvml_unrecorded
def test_a_call_no_recording_holds_is_refused_and_counted() -> None:
    backend = FakeNvmlBackend(load_recording("h200x1-load"), clock=None)
    nvml = Nvml(backend)
    unknown = nvml.query("nvmlDeviceGetSomethingNobodyCalled", GpuRef(0))
    assert isinstance(unknown, NA) and unknown.code == NVML_ERROR_FUNCTION_NOT_FOUND  # not a made-up "not supported"
    other_args = nvml.query("nvmlDeviceGetClockInfo", GpuRef(0), 7)  # the function is recorded, these args are not
    assert isinstance(other_args, NA) and other_args.code == NVML_ERROR_FUNCTION_NOT_FOUND
    assert backend.unrecorded == ["nvmlDeviceGetSomethingNobodyCalled(gpu0)", "nvmlDeviceGetClockInfo(gpu0,7)"]


def test_a_function_a_recording_declares_missing_is_refused_but_expected() -> None:
    rec = load_recording("h200x1-load")
    assert "nvmlDeviceGetProcessUtilization" in rec.not_recorded  # recorded before decodetop asked it
    backend = FakeNvmlBackend(rec, clock=None)
    answer = Nvml(backend).query("nvmlDeviceGetProcessUtilization", GpuRef(0), 0)
    assert isinstance(answer, NA) and answer.code == NVML_ERROR_FUNCTION_NOT_FOUND
    assert "recorded before" in answer.reason and backend.unrecorded == []


def test_a_test_whose_code_makes_an_unrecorded_call_fails(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The suite's own fixture (tests/conftest.py) turns a refusal the code copes with into a failing test."""
    pytester.makeini("[pytest]\nmarkers =\n    nvml_unrecorded: on purpose\n")
    pytester.makepyfile(
        test_planted="""
from decodetop.collectors.fake_nvml import fake_nvml
from decodetop.collectors.nvml import GpuRef

def test_copes_with_a_refusal():
    fake_nvml("h200x1-load", clock=None).query("nvmlDeviceGetSomethingNobodyCalled", GpuRef(0))
"""
    )
    root = Path(__file__).resolve().parents[2]  # the plugin is tests/helpers/nvml_strict.py
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(root), str(root / "src")]))
    result = pytester.runpytest_subprocess(
        "-p", "tests.helpers.nvml_strict", "-p", "no:cacheprovider", "-p", "no:xdist"
    )
    result.assert_outcomes(passed=1, errors=1)
    result.stdout.fnmatch_lines(["*NVML calls no recording holds*nvmlDeviceGetSomethingNobodyCalled(gpu0)*"])


@pytest.mark.nvml_unrecorded
def test_field_values_are_answered_per_field_in_any_batch() -> None:
    nvml = fake_nvml("h200x1-load", clock=None)
    batch = nvml.query("nvmlDeviceGetFieldValues", GpuRef(0), (74, 197, 9999))
    assert [e["fieldId"] for e in batch] == [74, 197, 9999]
    assert batch[0]["nvmlReturn"] == 0 and batch[0]["value"] > 0  # SwPowerCap time: the GPU was power-capped
    assert batch[2]["nvmlReturn"] == NVML_ERROR_FUNCTION_NOT_FOUND  # field 9999 is in no recording: refused


def test_samples_advance_manually_and_with_the_clock() -> None:
    rec = load_recording("h200x1-load")
    backend = FakeNvmlBackend(rec, clock=None)
    nvml = Nvml(backend)
    first = nvml.query("nvmlDeviceGetPowerUsage", GpuRef(0))
    backend.advance()
    second = nvml.query("nvmlDeviceGetPowerUsage", GpuRef(0))
    assert first == rec.outcome("nvmlDeviceGetPowerUsage(gpu0)", 0)["ok"]
    assert second == rec.outcome("nvmlDeviceGetPowerUsage(gpu0)", 1)["ok"]
    now = [100.0]
    timed = FakeNvmlBackend(rec, clock=lambda: now[0], period_s=1.0)
    assert timed.sample_index == 0
    now[0] += 2.5
    assert timed.sample_index == 2
    now[0] += 1.0 * len(rec.samples)
    assert timed.sample_index == 2  # loops


def test_replication_shows_more_gpus_and_says_so() -> None:
    nvml = fake_nvml("h200x1-load", replicate_to=8, clock=None)
    assert nvml.device_count() == 8
    assert "replicated 1→8" in nvml.source
    assert nvml.query("nvmlDeviceGetName", GpuRef(7)) == "NVIDIA H200"
    rec = load_recording("h200x1-idle").replicated(2)
    assert rec.gpu_count == 2
    assert rec.outcome("nvmlDeviceGetName(gpu1)") == ok("NVIDIA H200")
    assert "replicated 1→2" in rec.label


def test_overrides_derive_states_from_a_real_recording() -> None:
    rec = load_recording("h200x1-idle").with_calls({"nvmlDeviceGetCurrPcieLinkWidth(gpu0)": ok(8)})
    assert fake_nvml(rec, clock=None).query("nvmlDeviceGetCurrPcieLinkWidth", GpuRef(0)) == 8
    only_second = load_recording("h200x1-idle").with_calls({"nvmlDeviceGetPcieReplayCounter(gpu0)": ok(9)}, samples=[1])
    assert only_second.outcome("nvmlDeviceGetPcieReplayCounter(gpu0)", 0) == ok(0)
    assert only_second.outcome("nvmlDeviceGetPcieReplayCounter(gpu0)", 1) == ok(9)
    fields = load_recording("h200x1-idle").with_field_values(0, {270: 5_000_000_000})
    batch = fake_nvml(fields, clock=None).query("nvmlDeviceGetFieldValues", GpuRef(0), (270, 74))
    assert batch[0]["value"] == 5_000_000_000
    assert batch[1]["value"] == 0  # the rest still as recorded


def test_init_error_replays() -> None:
    nvml = fake_nvml(load_recording("h200x1-idle").with_init_error(NVML_ERROR_LIB_RM_VERSION_MISMATCH), clock=None)
    status = nvml.status()
    assert not status.available and status.code == NVML_ERROR_LIB_RM_VERSION_MISMATCH


def test_round_trip_through_json(tmp_path: Path) -> None:
    rec = load_recording("h200x1-idle")
    path = tmp_path / "copy.json"
    path.write_text(json.dumps(rec.to_json()), encoding="utf-8")
    again = load_recording(path)
    assert again.samples == rec.samples
    assert again.gpu_count == rec.gpu_count


@pytest.mark.parametrize(
    ("content", "words"),
    [
        ("{not json", "not valid JSON"),
        ("[]", "must be a JSON object"),
        ('{"format": "other"}', "not an NVML recording"),
        (json.dumps({"format": RECORDING_FORMAT, "samples": []}), "non-empty list"),
        (json.dumps({"format": RECORDING_FORMAT, "samples": [{"calls": {"f()": {"value": 1}}}]}), "must map to"),
        (json.dumps({"format": RECORDING_FORMAT, "samples": [{"calls": {"f()": {"error": "x"}}}]}), "non-integer"),
        (
            json.dumps({"format": RECORDING_FORMAT, "gpu_count": -1, "samples": [{"calls": {}}]}),
            "non-negative integer",
        ),
    ],
)
def test_malformed_recordings_give_one_clear_line(tmp_path: Path, content: str, words: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(UserInputError) as info:
        load_recording(path)
    assert words in str(info.value)
    assert str(path) in str(info.value)
    assert "\n" not in str(info.value)


def test_unknown_bundled_name_lists_what_exists() -> None:
    with pytest.raises(UserInputError, match="h200x1-load"):
        load_recording("no-such-recording")


def test_recording_is_immutable_value() -> None:
    rec = load_recording("h200x1-idle")
    assert isinstance(rec, Recording)
    with pytest.raises(AttributeError):
        rec.label = "x"  # type: ignore[misc]
