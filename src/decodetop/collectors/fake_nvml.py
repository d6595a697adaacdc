"""Provides the fake NVML backend: it replays what a real machine's NVML answered, call for call.

A recording (`benchmarks/recorders/record_nvml.py` makes them; the bundled ones live in
`collectors/recordings/*.json`) maps each call key (`nvml.call_key`, e.g. `nvmlDeviceGetClockInfo(gpu0,1)`) to
`{"ok": value}` or `{"error": code, "message": ...}`, for a few samples taken one tick apart. The fake answers
exactly that, so code tested against it meets the same values, shapes and errors as on the real machine.

A call no sample holds is refused with NVML_ERROR_FUNCTION_NOT_FOUND, as an NVML library without that function
answers, never with a made-up "not supported": the fake cannot know what the machine would have said. The key is
kept in `unrecorded` and handed to `FakeNvmlBackend.on_unrecorded` (the test suite fails a test that made such a
call). A recording made before decodetop asked some function names it, with why, under `meta["not_recorded"]`:
such calls are refused the same way but expected; a field of nvmlDeviceGetFieldValues is named there as
`field <id>` (e.g. `field 138`, the NVLink TX counter, which recordings before decodetop read it lack).

Samples advance with the clock (one per recorded interval, looping) or by `advance()`, so counters grow and rates
move as they did. `replicate_to=N` shows a recording of fewer GPUs as N GPUs (GPU i replays recorded GPU i mod n)
for an 8-GPU demo; the source label says so. Tests derive broken states from a real recording with
`Recording.with_calls(...)` (a down-trained link, ECC errors, a pending row remap) instead of inventing data.
"""

from __future__ import annotations

import copy
import itertools
import json
import re
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, ClassVar, NoReturn

from decodetop import jsonio
from decodetop.collectors.nvml import (
    NVML_ERROR_FUNCTION_NOT_FOUND,
    Arg,
    FieldId,
    GpuRef,
    Nvml,
    NvmlError,
    call_key,
    field_text,
)
from decodetop.errors import UserInputError

RECORDING_FORMAT = "decodetop-nvml-recording/1"
RECORDINGS_DIR = Path(__file__).resolve().parent / "recordings"
DEFAULT_RECORDING = "h200x1-load"
_FIELD_KEY = re.compile(r"^nvmlDeviceGetFieldValues\(gpu(\d+),\[([0-9,:]*)\]\)$")
"""A field-values call key: its GPU and its fields (`197`, or `138:3` for field 138 at scope 3, `nvml.call_key`)."""
PAIR_FUNCTIONS: tuple[str, ...] = ("nvmlDeviceGetTopologyCommonAncestor", "nvmlDeviceGetP2PStatus")
"""The calls about two GPUs: a recording shown as more GPUs than it has holds none for the extra pairs."""
_PAIRS_NOT_RECORDED = dict.fromkeys(PAIR_FUNCTIONS, "a recording shown as more GPUs holds no pair of the copies")
_DEFAULT_PERIOD_S = 1.0
"""Replay interval when a recording has fewer than two timed samples (the collector's default tick)."""

Outcome = Mapping[str, Any]
"""`{"ok": value}` or `{"error": code, "message": text}`."""


def ok(value: object) -> dict[str, object]:
    """A successful outcome, for overriding a recording in tests."""
    return {"ok": value}


def err(code: int, message: str = "") -> dict[str, object]:
    """A failed outcome (an NVML error code), for overriding a recording in tests."""
    return {"error": code, "message": message}


@dataclass(frozen=True)
class Recording:
    """What one machine's NVML answered: a few samples of call key → outcome."""

    label: str
    description: str
    gpu_count: int
    samples: tuple[Mapping[str, Outcome], ...]
    sample_times_s: tuple[float, ...]
    init_error: Outcome | None = None
    meta: Mapping[str, Any] = field(default_factory=dict)
    """Where and how it was recorded (host, driver, pynvml version, phase, load)."""

    @property
    def not_recorded(self) -> Mapping[str, str]:
        """NVML function → why this recording holds none of its calls (`meta["not_recorded"]`)."""
        declared = self.meta.get("not_recorded")
        return declared if isinstance(declared, dict) else {}

    def with_calls(self, overrides: Mapping[str, Outcome], *, samples: Iterable[int] | None = None) -> Recording:
        """A copy with some call outcomes replaced (in every sample, or only in `samples`)."""
        chosen = set(range(len(self.samples))) if samples is None else set(samples)
        new_samples = []
        for i, sample in enumerate(self.samples):
            if i in chosen:
                merged = dict(sample)
                merged.update({k: dict(v) for k, v in overrides.items()})
                new_samples.append(merged)
            else:
                new_samples.append(dict(sample))
        return replace(self, samples=tuple(new_samples))

    def with_field_values(
        self,
        gpu: int,
        values: Mapping[int, int],
        *,
        samples: Iterable[int] | None = None,
        value_type: int = 3,
    ) -> Recording:
        """A copy where NVML field ids of one GPU read the given values (in every sample, or only in `samples`).

        `value_type` is the nvmlValueType_t: 3 unsigned long long (default), 1 unsigned int (a 32-bit counter).
        """
        overrides = {
            f"nvmlDeviceGetFieldValues(gpu{gpu},[{fid}])": ok(
                [
                    {
                        "fieldId": fid,
                        "scopeId": 0,
                        "timestamp": 0,
                        "valueType": value_type,
                        "nvmlReturn": 0,
                        "value": value,
                    }
                ]
            )
            for fid, value in values.items()
        }
        return self.with_calls(overrides, samples=samples)

    def replicated(self, gpus: int) -> Recording:
        """A copy that shows `gpus` GPUs, GPU k answering what recorded GPU k mod n answered, the system calls as
        recorded (pairs not included: add them with `with_calls`; the copy declares them not recorded). The label
        says it was replicated."""
        n = self.gpu_count
        if n < 1 or gpus < 1:
            raise UserInputError(f"NVML recording {self.label}: cannot replicate {n} GPUs to {gpus}")
        pattern = re.compile(r"gpu(\d+)")
        new_samples: list[Mapping[str, Outcome]] = []
        for sample in self.samples:
            out: dict[str, Outcome] = {}
            for key, outcome in sample.items():
                gpus_in_key = [int(m) for m in pattern.findall(key)]
                if key == "nvmlDeviceGetCount()":
                    out[key] = ok(gpus)
                elif not gpus_in_key:
                    out[key] = outcome  # the system's own calls: driver, CUDA and NVML versions
                elif len(gpus_in_key) != 1:
                    continue  # pair calls of the original GPUs do not carry over
                else:
                    for target in range(gpus):
                        if target % n == gpus_in_key[0]:
                            out[pattern.sub(f"gpu{target}", key)] = _as_copy(key, outcome, target // n)
            new_samples.append(out)
        return replace(
            self,
            label=f"{self.label} (replicated {n}→{gpus} GPUs)",
            gpu_count=gpus,
            samples=tuple(new_samples),
            meta={**self.meta, "not_recorded": {**self.not_recorded, **_PAIRS_NOT_RECORDED}},
        )

    def with_init_error(self, code: int, message: str = "") -> Recording:
        """A copy whose nvmlInit fails with `code` (e.g. 18, library/kernel-module version mismatch)."""
        return replace(self, init_error=err(code, message))

    def outcome(self, key: str, sample: int = 0) -> Outcome | None:
        """The recorded outcome of a call key in one sample (None if not recorded there)."""
        return self.samples[sample].get(key)

    def to_json(self) -> dict[str, Any]:
        """The JSON document this recording is stored as."""
        return {
            "format": RECORDING_FORMAT,
            "label": self.label,
            "description": self.description,
            "gpu_count": self.gpu_count,
            "init_error": dict(self.init_error) if self.init_error is not None else None,
            "meta": dict(self.meta),
            "samples": [
                {"t_s": t, "calls": {k: dict(v) for k, v in s.items()}}
                for t, s in zip(self.sample_times_s, self.samples, strict=True)
            ],
        }


def _as_copy(key: str, outcome: Outcome, copy_index: int) -> Outcome:
    """A replicated GPU's answer: the recorded one, except that copy k > 0 sits on its own PCI bus (bus + k) and
    has its own UUID (last digits k), as distinct GPUs of a real host do."""
    if copy_index == 0 or "ok" not in outcome:
        return outcome
    value = outcome["ok"]
    if key.startswith("nvmlDeviceGetPciInfo(") and isinstance(value, dict):
        bus = (int(value.get("bus", 0)) + copy_index) % 256  # PCI bus numbers are 8 bits
        moved = dict(value)
        moved["bus"] = bus
        for field_name in ("busId", "busIdLegacy"):
            text = value.get(field_name)
            if isinstance(text, str) and text.count(":") == 2:
                domain, _, rest = text.split(":")
                moved[field_name] = f"{domain}:{bus:02x}:{rest}"
        return {"ok": moved}
    if key.startswith("nvmlDeviceGetUUID(") and isinstance(value, str) and len(value) > 4:
        return {"ok": f"{value[:-4]}{copy_index:04x}"}
    return outcome


def _check_outcome(origin: str, key: str, outcome: object) -> Outcome:
    if not isinstance(outcome, dict) or not (("ok" in outcome) ^ ("error" in outcome)):
        raise UserInputError(f"{origin}: call {key!r} must map to {{'ok': value}} or {{'error': code}}")
    if "error" in outcome and (not isinstance(outcome["error"], int) or isinstance(outcome["error"], bool)):
        raise UserInputError(f"{origin}: call {key!r} has a non-integer error code {outcome['error']!r}")
    return outcome


def parse_recording(data: object, origin: str) -> Recording:
    """Validate a recording's JSON document; a malformed one gives one UserInputError line naming `origin`."""
    if not isinstance(data, dict):
        raise UserInputError(f"{origin}: an NVML recording must be a JSON object")
    if data.get("format") != RECORDING_FORMAT:
        raise UserInputError(
            f"{origin}: not an NVML recording (format {data.get('format')!r}, want {RECORDING_FORMAT})"
        )
    samples_in = data.get("samples")
    if not isinstance(samples_in, list) or not samples_in:
        raise UserInputError(f"{origin}: 'samples' must be a non-empty list")
    samples: list[Mapping[str, Outcome]] = []
    times: list[float] = []
    for i, sample in enumerate(samples_in):
        if not isinstance(sample, dict) or not isinstance(sample.get("calls"), dict):
            raise UserInputError(f"{origin}: sample {i} must be an object with a 'calls' object")
        t = sample.get("t_s", float(i))
        if not isinstance(t, (int, float)) or isinstance(t, bool):
            raise UserInputError(f"{origin}: sample {i} has a non-numeric t_s {t!r}")
        samples.append({str(k): _check_outcome(origin, str(k), v) for k, v in sample["calls"].items()})
        times.append(float(t))
    gpu_count = data.get("gpu_count", 0)
    if not isinstance(gpu_count, int) or isinstance(gpu_count, bool) or gpu_count < 0:
        raise UserInputError(f"{origin}: 'gpu_count' must be a non-negative integer, got {gpu_count!r}")
    init_error = data.get("init_error")
    if init_error is not None:
        init_error = _check_outcome(origin, "nvmlInit", init_error)
    meta = data.get("meta") or {}
    if not isinstance(meta, dict):
        raise UserInputError(f"{origin}: 'meta' must be an object")
    declared = meta.get("not_recorded", {})
    if not isinstance(declared, dict) or not all(isinstance(v, str) for v in declared.values()):
        raise UserInputError(f"{origin}: 'meta.not_recorded' must map NVML function names to why they are missing")
    return Recording(
        label=str(data.get("label") or Path(origin).stem),
        description=str(data.get("description") or ""),
        gpu_count=gpu_count,
        samples=tuple(samples),
        sample_times_s=tuple(times),
        init_error=init_error,
        meta=meta,
    )


def bundled_recordings() -> list[str]:
    """Names of the recordings shipped with decodetop ("h200x1-idle", "h200x1-load", ...)."""
    return sorted(p.stem for p in RECORDINGS_DIR.glob("*.json"))


def load_recording(name_or_path: str | Path) -> Recording:
    """A bundled recording by name, or a recording file by path; bad input → one UserInputError line."""
    path = Path(name_or_path)
    if not path.suffix and not path.exists():
        path = RECORDINGS_DIR / f"{name_or_path}.json"
        if not path.exists():
            names = ", ".join(bundled_recordings()) or "none"
            raise UserInputError(f"NVML recording {name_or_path!r} not found (bundled: {names})")
    try:
        text = jsonio.read_bounded(path).decode("utf-8")  # a FIFO or device is refused unread
    except UnicodeDecodeError as exc:
        raise UserInputError(f"{path}: cannot read NVML recording: {exc}") from None
    try:
        data = jsonio.loads(text, source=str(path))  # nesting, huge numbers, NaN: one line naming the file
    except json.JSONDecodeError as exc:
        raise UserInputError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno})") from exc
    return parse_recording(data, str(path))


class FakeNvmlBackend:
    """An NVML backend that answers from a `Recording`; a call no sample holds is refused (FUNCTION_NOT_FOUND)."""

    on_unrecorded: ClassVar[Callable[[str], None] | None] = None
    """Called with the key of every call no recording holds and none declares missing (tests fail on it)."""

    def __init__(
        self,
        recording: Recording,
        *,
        replicate_to: int | None = None,
        clock: Callable[[], float] | None = time.monotonic,
        period_s: float | None = None,
    ) -> None:
        if replicate_to is not None and replicate_to < 1:
            raise UserInputError(f"fake NVML: replicate_to must be at least 1, got {replicate_to}")
        self.recording = recording
        self.replicate_to = replicate_to
        self.clock = clock
        times = recording.sample_times_s
        gaps = sorted(b - a for a, b in itertools.pairwise(times) if b > a)
        self.period_s = period_s if period_s is not None else (gaps[len(gaps) // 2] if gaps else _DEFAULT_PERIOD_S)
        self._offset = 0
        self._t0 = clock() if clock is not None else 0.0
        self._fields = [self._index_fields(s) for s in recording.samples]
        label = f"fake: {recording.label}"
        n = recording.gpu_count
        if replicate_to is not None and replicate_to != n:
            label += f" (replicated {n}→{replicate_to} GPUs)"
        self.label = label
        self.calls: list[str] = []
        """Every call key asked, in order (what a test can assert the telemetry code did)."""
        self.unrecorded: list[str] = []
        """Call keys refused because no sample holds them and the recording does not declare them missing."""

    @staticmethod
    def _index_fields(sample: Mapping[str, Outcome]) -> dict[tuple[int, int, int], dict[str, Any]]:
        """(gpu, field id, scope id) → recorded field entry; single-field keys win over batched ones. A field asked
        without a scope is scope 0, as pynvml leaves it."""
        found: list[tuple[int, str, Outcome]] = []
        for key, outcome in sample.items():
            match = _FIELD_KEY.match(key)
            if match and "ok" in outcome and isinstance(outcome["ok"], list):
                ids = [i for i in match.group(2).split(",") if i]
                found.append((len(ids), key, outcome))
        index: dict[tuple[int, int, int], dict[str, Any]] = {}
        for _, key, outcome in sorted(found, key=lambda t: -t[0]):
            match = _FIELD_KEY.match(key)
            assert match is not None
            gpu = int(match.group(1))
            for entry in outcome["ok"]:
                if isinstance(entry, dict) and isinstance(entry.get("fieldId"), int):
                    scope = entry.get("scopeId")
                    index[(gpu, entry["fieldId"], scope if isinstance(scope, int) else 0)] = entry
        return index

    @property
    def sample_index(self) -> int:
        """Which recorded sample answers now."""
        n = len(self.recording.samples)
        elapsed = 0
        if self.clock is not None and self.period_s > 0:
            elapsed = int((self.clock() - self._t0) / self.period_s)
        return (self._offset + elapsed) % n

    def advance(self, steps: int = 1) -> None:
        """Move on to the next recorded sample (looping), for tests and step-by-step demos."""
        self._offset += steps

    def init(self) -> None:
        """Fail the way the recorded machine's nvmlInit did, if it did."""
        if self.recording.init_error is not None:
            error = self.recording.init_error
            raise NvmlError(int(error["error"]), str(error.get("message", "")))

    def shutdown(self) -> None:
        """Nothing to release."""

    def _map_args(self, args: tuple[Arg, ...]) -> tuple[Arg, ...]:
        n = self.recording.gpu_count
        if n <= 0:
            return args
        mapped: list[Arg] = []
        for arg in args:
            if isinstance(arg, GpuRef):
                target = arg.index % n
                # Two distinct GPUs must stay distinct (a pair call), even when both fold onto one recorded GPU.
                if mapped and isinstance(mapped[-1], GpuRef) and mapped[-1].index == target and n > 1:
                    previous = args[len(mapped) - 1]
                    if isinstance(previous, GpuRef) and previous.index != arg.index:
                        target = (target + 1) % n
                mapped.append(GpuRef(target))
            else:
                mapped.append(arg)
        return tuple(mapped)

    def _lookup(self, key: str, sample: int) -> Outcome | None:
        samples = self.recording.samples
        outcome = samples[sample].get(key)
        if outcome is not None:
            return outcome
        for i in list(range(sample - 1, -1, -1)) + list(range(sample + 1, len(samples))):
            outcome = samples[i].get(key)
            if outcome is not None:
                return outcome
        return None

    def call(self, fn: str, args: tuple[Arg, ...]) -> object:
        """Answer from the recording."""
        self.calls.append(call_key(fn, args))
        if fn == "nvmlDeviceGetCount" and self.replicate_to is not None and not args:
            return self.replicate_to
        count = self.replicate_to if self.replicate_to is not None else self.recording.gpu_count
        for arg in args:
            if isinstance(arg, GpuRef) and not 0 <= arg.index < count:
                raise NvmlError(2, f"no GPU {arg.index} in this recording")  # NVML_ERROR_INVALID_ARGUMENT
        mapped = self._map_args(args)
        sample = self.sample_index
        if fn == "nvmlDeviceGetFieldValues" and len(mapped) == 2 and isinstance(mapped[1], tuple):
            gpu = mapped[0]
            assert isinstance(gpu, GpuRef)
            failed = self._failed_fields(sample, gpu.index, {_field_of(f)[0] for f in mapped[1]})
            if failed is not None:  # a batch of these fields failed as a whole there (or a test says so)
                raise NvmlError(int(failed["error"]), str(failed.get("message", "")))
            return [self._field(sample, gpu.index, fid) for fid in mapped[1]]
        outcome = self._lookup(call_key(fn, mapped), sample)
        if outcome is None:
            self._refuse(fn, call_key(fn, args))
        if "error" in outcome:
            raise NvmlError(int(outcome["error"]), str(outcome.get("message", "")))
        refs = [arg for arg in args if isinstance(arg, GpuRef)]
        n = self.recording.gpu_count
        if len(refs) == 1 and n > 0:
            outcome = _as_copy(fn + "(", outcome, refs[0].index // n)
        return copy.deepcopy(outcome["ok"])

    def _refuse(self, fn: str, key: str) -> NoReturn:
        """Refuse a call no sample holds, as an NVML library lacking `fn` would; count it unless declared."""
        why = self.recording.not_recorded.get(fn)
        if why is None and self.replicate_to is not None and fn in PAIR_FUNCTIONS:
            why = _PAIRS_NOT_RECORDED[fn]
        if why is None:
            self._count_unrecorded(key)
            why = f"no sample of recording {self.recording.label!r} holds {key}"
        raise NvmlError(NVML_ERROR_FUNCTION_NOT_FOUND, f"fake NVML: {why}")

    def _failed_fields(self, sample: int, gpu: int, fids: set[int]) -> Outcome | None:
        """The error of a recorded nvmlDeviceGetFieldValues call of `gpu` that asked any of `fids`, if one failed."""
        for key, outcome in self.recording.samples[sample].items():
            match = _FIELD_KEY.match(key)
            asked = {int(i.partition(":")[0]) for i in match.group(2).split(",") if i} if match else set()
            if match and "error" in outcome and int(match.group(1)) == gpu and fids & asked:
                return outcome
        return None

    def _count_unrecorded(self, key: str) -> None:
        self.unrecorded.append(key)
        hook = type(self).on_unrecorded
        if hook is not None:
            hook(key)

    def _field(self, sample: int, gpu: int, field_id: FieldId) -> dict[str, Any]:
        fid, scope = _field_of(field_id)
        entry = self._fields[sample].get((gpu, fid, scope))
        if entry is None:
            for other in self._fields:
                entry = other.get((gpu, fid, scope))
                if entry is not None:
                    break
        if entry is None:  # refused per field, as the call refuses a function (see `_refuse`)
            if f"field {fid}" not in self.recording.not_recorded:  # declared: recorded before decodetop asked it
                self._count_unrecorded(f"nvmlDeviceGetFieldValues(gpu{gpu},[{field_text(field_id)}])")
            return {
                "fieldId": fid,
                "scopeId": scope,
                "timestamp": 0,
                "valueType": 3,
                "nvmlReturn": NVML_ERROR_FUNCTION_NOT_FOUND,
                "value": None,
            }
        return dict(entry)


def _field_of(field_id: FieldId) -> tuple[int, int]:
    """(field id, scope id) of a field asked with or without a scope (scope 0, as pynvml leaves it)."""
    return (int(field_id[0]), int(field_id[1])) if isinstance(field_id, tuple) else (int(field_id), 0)


def fake_nvml(
    recording: str | Path | Recording = DEFAULT_RECORDING,
    *,
    replicate_to: int | None = None,
    clock: Callable[[], float] | None = time.monotonic,
) -> Nvml:
    """An `Nvml` choke point over the fake backend (a bundled recording's name, a path, or a `Recording`)."""
    rec = recording if isinstance(recording, Recording) else load_recording(recording)
    return Nvml(FakeNvmlBackend(rec, replicate_to=replicate_to, clock=clock))
