"""The NVML choke point: failures become values, init is lazy and once, the real binding's shapes become plain."""

from __future__ import annotations

import ctypes
import logging
import sys
import threading

import pytest

from decodetop.collectors import nvml as nvml_mod
from decodetop.collectors.fake_nvml import FakeNvmlBackend, err, load_recording, ok
from decodetop.collectors.nvml import (
    NA,
    NOT_AN_NVML_ERROR,
    NVML_ERROR_DRIVER_NOT_LOADED,
    NVML_ERROR_FUNCTION_NOT_FOUND,
    NVML_ERROR_LIB_RM_VERSION_MISMATCH,
    NVML_ERROR_LIBRARY_NOT_FOUND,
    NVML_ERROR_NO_PERMISSION,
    NVML_ERROR_NOT_SUPPORTED,
    GpuRef,
    NoNvmlBackend,
    Nvml,
    NvmlError,
    PynvmlBackend,
    RecordingBackend,
    call_key,
    plain,
)


class ScriptedBackend:
    """A backend whose answers a test sets per function; counts init calls."""

    def __init__(self, answers: dict[str, object], init_error: int | None = None) -> None:
        self.label = "scripted"
        self.answers = answers
        self.init_error = init_error
        self.inits = 0

    def init(self) -> None:
        self.inits += 1
        if self.init_error is not None:
            raise NvmlError(self.init_error)

    def shutdown(self) -> None:
        pass

    def call(self, fn: str, args: tuple[object, ...]) -> object:
        answer = self.answers[fn]
        if isinstance(answer, BaseException):
            raise answer
        return answer


def test_call_key_formats_gpus_ints_and_field_lists() -> None:
    assert call_key("nvmlDeviceGetClockInfo", (GpuRef(0), 1)) == "nvmlDeviceGetClockInfo(gpu0,1)"
    assert call_key("nvmlDeviceGetFieldValues", (GpuRef(3), (197, 198))) == "nvmlDeviceGetFieldValues(gpu3,[197,198])"
    assert call_key("nvmlDeviceGetCount", ()) == "nvmlDeviceGetCount()"
    assert call_key("nvmlDeviceGetP2PStatus", (GpuRef(1), GpuRef(0), 2)) == "nvmlDeviceGetP2PStatus(gpu1,gpu0,2)"


@pytest.mark.parametrize(
    ("code", "words"),
    [
        (NVML_ERROR_NOT_SUPPORTED, "not supported"),
        (NVML_ERROR_NO_PERMISSION, "no permission"),
        (NVML_ERROR_FUNCTION_NOT_FOUND, "function not found"),
    ],
)
def test_failures_become_na_values_with_reason(code: int, words: str) -> None:
    nvml = Nvml(ScriptedBackend({"nvmlDeviceGetNumaNodeId": NvmlError(code)}))
    value = nvml.query("nvmlDeviceGetNumaNodeId", GpuRef(0))
    assert isinstance(value, NA)
    assert not value
    assert value.code == code
    assert words in value.reason
    assert str(value).startswith("N/A (")


def test_binding_bug_becomes_na_not_exception() -> None:
    # pynvml's NVML_P2P_CAPS_INDEX_READ is the tuple (0,): ctypes raises ArgumentError inside the binding.
    nvml = Nvml(ScriptedBackend({"nvmlDeviceGetP2PStatus": ctypes.ArgumentError("argument 3: wrong type")}))
    value = nvml.query("nvmlDeviceGetP2PStatus", GpuRef(0), GpuRef(1), 0)
    assert isinstance(value, NA)
    assert value.code == NOT_AN_NVML_ERROR
    assert "ArgumentError" in value.reason


def test_missing_function_is_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    nvml = Nvml(ScriptedBackend({"nvmlDeviceGetFoo": NvmlError(NVML_ERROR_FUNCTION_NOT_FOUND)}))
    with caplog.at_level(logging.INFO, logger="decodetop.collectors.nvml"):
        for _ in range(5):
            nvml.query("nvmlDeviceGetFoo", GpuRef(0))
    assert sum("nvmlDeviceGetFoo" in r.getMessage() for r in caplog.records) == 1
    stats = nvml.call_stats()["nvmlDeviceGetFoo"]
    assert (stats.calls, stats.errors) == (5, 5)


def test_init_is_lazy_and_happens_once_across_threads() -> None:
    backend = ScriptedBackend({"nvmlDeviceGetCount": 2})
    nvml = Nvml(backend)
    assert backend.inits == 0
    barrier = threading.Barrier(8)
    counts: list[int] = []

    def worker() -> None:
        barrier.wait()
        counts.append(nvml.device_count())

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert backend.inits == 1
    assert counts == [2] * 8


@pytest.mark.parametrize(
    ("code", "words"),
    [
        (NVML_ERROR_LIBRARY_NOT_FOUND, "not found"),
        (NVML_ERROR_DRIVER_NOT_LOADED, "driver not loaded"),
        (NVML_ERROR_LIB_RM_VERSION_MISMATCH, "versions differ"),
    ],
)
def test_init_failure_is_a_no_gpu_state(code: int, words: str) -> None:
    nvml = Nvml(NoNvmlBackend(code))
    status = nvml.status()
    assert not status.available
    assert status.code == code
    assert words in status.reason
    assert nvml.device_count() == 0
    value = nvml.query("nvmlDeviceGetName", GpuRef(0))
    assert isinstance(value, NA)
    assert value.reason == status.reason


def test_pynvml_backend_without_the_library_reports_not_found() -> None:
    """On this CPU machine libnvidia-ml.so.1 is absent: the real backend says so, it does not raise."""
    pytest.importorskip("pynvml")
    nvml = Nvml(PynvmlBackend())
    status = nvml.status()
    if status.available:  # pragma: no cover - only on a GPU machine
        pytest.skip("NVML is available here")
    assert status.code in (NVML_ERROR_LIBRARY_NOT_FOUND, NVML_ERROR_DRIVER_NOT_LOADED)
    assert status.source == "nvml"


def test_pynvml_not_installed_is_library_not_found(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml → ImportError
    status = Nvml(PynvmlBackend()).status()
    assert not status.available
    assert status.code == NVML_ERROR_LIBRARY_NOT_FOUND
    assert "nvidia-ml-py" in status.reason


def test_plain_converts_pynvml_structures() -> None:
    pynvml = pytest.importorskip("pynvml")
    mem = pynvml.c_nvmlMemory_t()
    mem.total, mem.free, mem.used = 10, 3, 7
    assert plain(mem) == {"total": 10, "free": 3, "used": 7}
    values = (pynvml.c_nvmlFieldValue_t * 2)()
    values[0].fieldId, values[0].valueType, values[0].nvmlReturn = 197, 1, 0
    values[0].value.uiVal = 4_000_000_000
    values[1].fieldId, values[1].valueType, values[1].nvmlReturn = 74, 3, 0
    values[1].value.ullVal = 2**40
    out = plain(values)
    assert isinstance(out, list)
    assert out[0]["value"] == 4_000_000_000 and out[0]["fieldId"] == 197
    assert out[1]["value"] == 2**40 and out[1]["valueType"] == 3
    affinity = (ctypes.c_ulonglong * 2)(0xFF, 1)
    assert plain(affinity) == [255, 1]
    friendly = pynvml.nvmlFriendlyObject({"pid": 5, "usedGpuMemory": None})
    assert plain(friendly) == {"pid": 5, "usedGpuMemory": None}
    assert plain(b"NVIDIA H200") == "NVIDIA H200"


def test_recording_backend_records_values_and_errors_that_the_fake_replays() -> None:
    recording = load_recording("h200x1-idle")
    recorder = RecordingBackend(FakeNvmlBackend(recording, clock=None))
    nvml = Nvml(recorder)
    assert nvml.query("nvmlDeviceGetName", GpuRef(0)) == "NVIDIA H200"
    assert isinstance(nvml.query("nvmlDeviceGetNumaNodeId", GpuRef(0)), NA)
    assert recorder.outcomes["nvmlDeviceGetName(gpu0)"] == ok("NVIDIA H200")
    assert recorder.outcomes["nvmlDeviceGetNumaNodeId(gpu0)"]["error"] == NVML_ERROR_NOT_SUPPORTED
    assert err(3)["error"] == 3


def test_close_allows_a_fresh_init() -> None:
    backend = ScriptedBackend({"nvmlDeviceGetCount": 1})
    nvml = Nvml(backend)
    assert nvml.device_count() == 1
    nvml.close()
    assert nvml.device_count() == 1
    assert backend.inits == 2


def test_module_reason_table_covers_the_init_codes() -> None:
    for code in nvml_mod.UNAVAILABLE_INIT_CODES:
        assert code in nvml_mod.ERROR_REASONS
