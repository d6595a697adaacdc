"""Provides record/replay of a decodetop session as gzip-compressed JSON lines, and the JSON (de)serialisation of
its dataclasses.

A recording is one JSON object per line, appended as things happen, gzip-compressed (`zcat rec.jsonl.gz` shows it)::

    {"v":2,"t":1764422301.118,"kind":"meta","type":null,"data":{"format":"decodetop-recording",...}}
    {"v":2,"t":1764422302.120,"kind":"telemetry","type":"...TelemetrySnapshot","seq":1,"data":{...}}
    {"v":2,"t":1764422303.121,"kind":"telemetry","type":"...TelemetrySnapshot","seq":2,"delta":[[["gpus",0,"power_w"],312.5],...]}
    {"v":2,"t":1764422310.402,"kind":"checks","type":"decodetop.collectors.checks.result.CheckResult","data":[...]}

`t` is wall-clock Unix seconds; `kind` says what the payload is, and with it the class that rebuilds it
(`KIND_TYPES`: a fixed table, never a class looked up by the name a file gives); `type` names the dataclass the
payload came from (a list payload holds several of it) and must agree with the kind. Telemetry ticks carry their
number in the session (`seq`) and either the whole snapshot (`data`, a keyframe every `KEYFRAME_EVERY_TICKS`) or
what changed since the tick before (`delta`, `recording_delta`): about 40 KB a tick at 8 GPUs becomes a few
hundred bytes (docs/benchmarks.md, "Recording size"). The file's bytes (`recording_file`): one gzip member per
session, a sync flush after every line, so a crash loses at most the line being written; an exclusive lock while a
session records, so two processes never write into one file.

`read_recording` reads these and the plain JSON lines earlier versions wrote (layout 1, every line whole). It skips
a truncated, corrupt, mistyped (`"type": null` on a probe result) or overlong line (`jsonio.MAX_LINE_BYTES`), and a
tick whose tick before is lost (up to the next keyframe), counts them and says so in one line, and never fails on
them; damaged compressed data keeps what came before it. `decode_replay` does the same for a payload that does not
fit its class. A gzip bomb stops at `recording_file.MAX_DECOMPRESSED_BYTES`, deltas that rebuild more than
`MAX_REPLAY_BYTES` stop there too: one line naming the file.

Serialisation walks the dataclass fields, one codec both ways (enums by value, tuples as lists, non-finite floats as
null, since JSON has no NaN), and rebuilds by the fields' type hints.
"""

from __future__ import annotations

import collections.abc
import contextlib
import dataclasses
import enum
import json
import math
import os
import platform
import threading
import time
import types
import typing
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePath
from typing import Any, TypeVar

from decodetop import __version__, jsonio
from decodetop.budget.compose import Budget
from decodetop.collectors.checks.result import CheckResult
from decodetop.collectors.serving import ServerStep
from decodetop.collectors.telemetry import TelemetrySnapshot
from decodetop.errors import DecodetopError, UserInputError
from decodetop.export.recording_delta import KEYFRAME_EVERY_TICKS, DeltaError, apply, diff
from decodetop.export.recording_file import LineCompressor, RecordingBytes, open_for_append
from decodetop.probes.results import ProbeResult

FORMAT_NAME = "decodetop-recording"
FORMAT_VERSION = 2
"""Version of the line layout written: 2 adds telemetry deltas (`seq` and `delta`, or `data` on a keyframe)."""
READ_VERSIONS = (1, 2)
"""Line layouts a reader accepts (1: every line whole, as decodetop wrote before deltas); others are skipped and
counted."""
MAX_REPLAY_BYTES = 1024 * 1024 * 1024
"""The most a replay holds once its ticks are rebuilt, counted as the plain JSON lines they stand for (each delta
tick as its keyframe): 1 GiB is about 7 hours of telemetry at 8 GPUs (~40 KB a tick); deltas made to rebuild huge
ticks from tiny lines stop here."""

KINDS: tuple[str, ...] = ("meta", "telemetry", "probe_result", "checks", "budget", "observed_step")
"""What a line can hold. "observed_step" is the live server's step (`collectors.serving`)."""

MAX_LISTED_PROBLEMS = 3
"""Corrupt lines named one by one in the warning; the rest are only counted."""

KIND_TYPES: Mapping[str, type[Any]] = {
    "telemetry": TelemetrySnapshot,
    "probe_result": ProbeResult,
    "checks": CheckResult,
    "budget": Budget,
    "observed_step": ServerStep,
}
"""The class each kind's payload rebuilds into ("meta" is a plain object). A line's `type` must name it (by class
name, so a class moved to another module still reads)."""
FORMER_TYPE_NAMES: Mapping[str, frozenset[str]] = {"observed_step": frozenset({"ObservedStep"})}
"""Class names a kind's lines carried before a rename (`collectors.serving.ServerStep` was `ObservedStep`):
recordings written then still read."""
T = TypeVar("T")


# --- serialisation -------------------------------------------------------------------------------------------


def to_jsonable(obj: Any) -> Any:
    """A JSON-ready value for `obj`: dataclass fields, enums by value, tuples/sets as lists, paths as strings,
    non-finite floats as None. Raises TypeError naming an unknown type."""
    if obj is None or isinstance(obj, (bool, str, enum.Enum, int, float)):
        return _jsonable_scalar(obj)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_jsonable(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, Mapping):
        return {_key(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, set, frozenset)):
        items = sorted(obj, key=repr) if isinstance(obj, (set, frozenset)) else obj
        return [to_jsonable(v) for v in items]
    if isinstance(obj, PurePath):
        return str(obj)
    raise TypeError(f"cannot record a {type(obj).__qualname__} as JSON")


def _jsonable_scalar(obj: bool | str | enum.Enum | int | float | None) -> Any:
    """A scalar as JSON holds it: an enum by its value, an int subclass as int, a non-finite float as None."""
    if obj is None or isinstance(obj, (bool, str)):
        return obj
    if isinstance(obj, enum.Enum):
        return to_jsonable(obj.value)
    if isinstance(obj, int):
        return int(obj)
    return obj if math.isfinite(obj) else None


def _key(key: Any) -> str:
    if isinstance(key, enum.Enum):
        return str(key.value)
    if isinstance(key, (str, int, float, bool)):
        return str(key)
    raise TypeError(f"cannot record a mapping key of type {type(key).__qualname__}")


def type_name(obj: Any) -> str | None:
    """The dotted name `decode_event` uses to rebuild `obj` (the element type for a list), or None."""
    if isinstance(obj, (list, tuple)) and obj:
        names = {type_name(v) for v in obj}
        return names.pop() if len(names) == 1 else None
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        cls = type(obj)
        return f"{cls.__module__}.{cls.__qualname__}"
    return None


def from_jsonable(cls: type[Any], data: Any) -> Any:
    """Rebuild a value of type `cls` from `to_jsonable` output: dataclass fields by their type hints (unknown keys
    ignored, missing ones take their defaults). ValueError (one line) for anything that does not fit, whatever the
    class's own checks raise: a payload read from a file must never crash the reader."""
    try:
        return _convert(cls, data)
    except (TypeError, KeyError, AttributeError, NameError, OverflowError, RecursionError, DecodetopError) as exc:
        raise ValueError(
            f"cannot rebuild {cls.__qualname__}: {str(exc).splitlines()[0] if str(exc) else exc!r}"
        ) from exc


_SEQUENCES: tuple[Any, ...] = (
    tuple,
    list,
    set,
    frozenset,
    collections.abc.Sequence,
    collections.abc.MutableSequence,
    collections.abc.Set,
    collections.abc.MutableSet,
    collections.abc.Collection,
    collections.abc.Iterable,
)
_MAPPINGS: tuple[Any, ...] = (dict, collections.abc.Mapping, collections.abc.MutableMapping)


def _convert(hint: Any, value: Any) -> Any:
    """`value`, parsed from JSON, as the type `hint` names; ValueError or TypeError saying where it is not one."""
    if hint is Any or hint is object:
        return value
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin is typing.Union or (hasattr(types, "UnionType") and isinstance(hint, types.UnionType)):
        return _convert_union(args, value)
    if origin is typing.Literal or hint is type(None):
        return _convert_constant(origin, args, value)
    if origin in _SEQUENCES or origin in _MAPPINGS or hint in (tuple, list, dict):
        return _convert_container(hint, origin, args, value)
    if isinstance(hint, type):
        return _convert_class(hint, value)
    return value


def _convert_union(args: tuple[Any, ...], value: Any) -> Any:
    """The first member of the union that takes `value`; null as None where the union allows it, else as NaN for a
    float."""
    if value is None:
        if type(None) in args:
            return None
        if float in args:
            return math.nan
        raise ValueError("null where a value is required")
    errors: list[str] = []
    for arg in args:
        if arg is type(None):
            continue
        try:
            return _convert(arg, value)
        except (ValueError, TypeError) as exc:
            errors.append(str(exc))
    raise ValueError("; ".join(errors) or "no type matched")


def _convert_constant(origin: Any, args: tuple[Any, ...], value: Any) -> Any:
    """`value` where it is one of a Literal's values (`origin` Literal), or null for NoneType."""
    if origin is typing.Literal:
        if value not in args:
            raise ValueError(f"{value!r} is not one of {args!r}")
        return value
    if value is not None:
        raise ValueError(f"expected null, got {value!r}")
    return None


def _convert_container(hint: Any, origin: Any, args: tuple[Any, ...], value: Any) -> Any:
    """A JSON object as a mapping, or a JSON list as the sequence or set type `hint` names, items converted."""
    if origin in _MAPPINGS or hint is dict:
        if not isinstance(value, dict):
            raise ValueError(f"expected an object, got {type(value).__name__}")
        key_hint, value_hint = args if len(args) == 2 else (Any, Any)
        return {_convert_key(key_hint, k): _convert(value_hint, v) for k, v in value.items()}
    if not isinstance(value, list):
        raise ValueError(f"expected a list, got {type(value).__name__}")
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        return tuple(_convert(args[0], v) for v in value)
    if origin is tuple and args:
        if len(args) != len(value):
            raise ValueError(f"expected {len(args)} items, got {len(value)}")
        return tuple(_convert(a, v) for a, v in zip(args, value, strict=True))
    items = [_convert(args[0] if args else Any, v) for v in value]
    if origin in (list, collections.abc.MutableSequence) or hint is list:
        return items
    if origin in (set, collections.abc.Set, collections.abc.MutableSet):
        return set(items)
    return frozenset(items) if origin is frozenset else tuple(items)


def _convert_class(hint: type[Any], value: Any) -> Any:
    """`value` as an enum member, a dataclass, a JSON scalar of the exact type, or a path."""
    if issubclass(hint, enum.Enum):
        return hint(value)
    if dataclasses.is_dataclass(hint):
        return _dataclass_from(hint, value)
    if hint in (float, int, bool, str):
        return _convert_scalar(hint, value)
    if issubclass(hint, PurePath):
        return hint(value)
    return value


def _convert_scalar(hint: type[Any], value: Any) -> Any:
    """`value` checked to be the JSON scalar `hint` names (null as NaN for a float; no bool for a number)."""
    if hint is float:
        if value is None:
            return math.nan
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"expected a number, got {value!r}")
        return float(value)
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"expected an integer, got {value!r}")
    elif hint is bool:
        if not isinstance(value, bool):
            raise ValueError(f"expected true/false, got {value!r}")
    elif not isinstance(value, str):
        raise ValueError(f"expected a string, got {value!r}")
    return value


def _convert_key(hint: Any, key: str) -> Any:
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return hint(key)
    if hint is int:
        return int(key)
    if hint is float:
        return float(key)
    return key


_HINTS: dict[type[Any], dict[str, Any]] = {}


def _type_hints(cls: type[Any]) -> dict[str, Any]:
    """A dataclass's resolved field types, once per class (resolving them was most of a replay's load time)."""
    hints = _HINTS.get(cls)
    if hints is None:
        hints = _HINTS[cls] = typing.get_type_hints(cls)
    return hints


def _dataclass_from(cls: type[Any], value: Any) -> Any:
    if not isinstance(value, dict):
        raise ValueError(f"{cls.__qualname__}: expected an object, got {type(value).__name__}")
    hints = _type_hints(cls)
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if not f.init or f.name not in value:
            continue
        try:
            kwargs[f.name] = _convert(hints.get(f.name, Any), value[f.name])
        except ValueError as exc:
            raise ValueError(f"{cls.__qualname__}.{f.name}: {exc}") from None
    try:
        return cls(**kwargs)
    except TypeError as exc:
        raise ValueError(f"{cls.__qualname__}: {exc}") from None


def expected_type_name(kind: str) -> str | None:
    """The class name a line of `kind` must carry in `type` (None for "meta")."""
    cls = KIND_TYPES.get(kind)
    return None if cls is None else cls.__qualname__


# --- events --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RecordedEvent:
    """One line of a recording."""

    t_unix_s: float
    kind: str
    payload: Any
    """The JSON data as read (a dict, or a list of dicts for kinds like "checks")."""
    type_name: str | None
    line_no: int


@dataclass(frozen=True)
class Replay:
    """A recording read back: its events in file order, how many lines were skipped, and what to tell the user."""

    path: Path
    events: tuple[RecordedEvent, ...]
    corrupt_lines: int
    warnings: tuple[str, ...]

    @property
    def meta(self) -> Mapping[str, Any]:
        """The first "meta" line's data (format, decodetop version, host, started), or {}."""
        for event in self.events:
            if event.kind == "meta" and isinstance(event.payload, dict):
                return event.payload
        return {}

    @property
    def duration_s(self) -> float:
        """Wall time from the first to the last event."""
        if not self.events:
            return 0.0
        return max(0.0, self.events[-1].t_unix_s - self.events[0].t_unix_s)

    def of_kind(self, kind: str) -> tuple[RecordedEvent, ...]:
        """Events of one kind, in order."""
        return tuple(e for e in self.events if e.kind == kind)

    def counts(self) -> dict[str, int]:
        """Number of events per kind."""
        out: dict[str, int] = {}
        for e in self.events:
            out[e.kind] = out.get(e.kind, 0) + 1
        return out

    @property
    def summary(self) -> str:
        """One line: what was read and what was skipped."""
        kinds = ", ".join(f"{n} {k}" for k, n in sorted(self.counts().items()) if k != "meta") or "no events"
        skipped = f"; {self.corrupt_lines} corrupt line{'s' if self.corrupt_lines != 1 else ''} skipped"
        return f"{self.path.name}: {kinds} over {self.duration_s:.0f} s{skipped if self.corrupt_lines else ''}"


def decode_event(event: RecordedEvent, cls: type[Any] | None = None) -> Any:
    """Rebuild the object an event recorded: as `cls`, or as its kind's class (`KIND_TYPES`). A list payload gives a
    tuple; "meta" gives its raw object. ValueError (one line) when the payload does not fit the class."""
    target = cls if cls is not None else KIND_TYPES.get(event.kind)
    if target is None:
        return event.payload
    if isinstance(event.payload, list):
        return tuple(from_jsonable(target, item) for item in event.payload)
    return from_jsonable(target, event.payload)


# --- writing -------------------------------------------------------------------------------------------------


class Recorder:
    """Appends events to a recording, one JSON line each, gzip-compressed and flushed line by line; safe to call
    from several threads. Telemetry goes as deltas against the tick before (`recording_delta`), a whole snapshot
    every `keyframe_every` ticks.

    Opening takes the file's lock (`recording_file.open_for_append`: a second process recording to it is refused)
    and writes a "meta" line. A write that fails later (disk full) does not raise into the caller: the recorder
    stops, and `error` holds the one line saying why.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        meta: Mapping[str, Any] | None = None,
        clock: Callable[[], float] = time.time,
        keyframe_every: int = KEYFRAME_EVERY_TICKS,
    ) -> None:
        self.path = Path(path)
        self._clock = clock
        self._lock = threading.Lock()
        self.error: str | None = None
        self.lines_written = 0
        self.bytes_written = 0
        self.keyframe_every = max(1, keyframe_every)
        self._ticks = 0
        self._last_tick: Any = None
        if self.path.is_dir():
            raise UserInputError(f"--record {self.path}: is a directory")
        self._handle: typing.BinaryIO | None = open_for_append(self.path)
        self._compressor = LineCompressor()
        header: dict[str, Any] = {
            "format": FORMAT_NAME,
            "format_version": FORMAT_VERSION,
            "decodetop_version": __version__,
            "host": platform.node(),
            "pid": os.getpid(),
        }
        header.update(meta or {})
        self.record("meta", header)

    def record(self, kind: str, payload: Any, t: float | None = None) -> bool:
        """Append one event: `payload` is a dict, a dataclass or a list of them. Returns False when not written
        (the recorder is closed or failed). An unknown kind or a payload JSON cannot hold is a programming error
        and raises ValueError/TypeError."""
        if kind not in KINDS:
            raise ValueError(f"unknown recording kind {kind!r}; expected one of {', '.join(KINDS)}")
        stamp = self._clock() if t is None else float(t)
        line: dict[str, Any] = {"v": FORMAT_VERSION, "t": stamp, "kind": kind, "type": type_name(payload)}
        data = to_jsonable(payload)
        with self._lock:
            if self._handle is None:
                return False
            if kind == "telemetry":
                line.update(self._tick_fields(data))
            else:
                line["data"] = data
            text = json.dumps(line, allow_nan=False, ensure_ascii=False, separators=(",", ":"))
            return self._write_locked(self._compressor.line(text))

    def _tick_fields(self, data: Any) -> dict[str, Any]:
        """A telemetry line's `seq` and its `data` (a keyframe) or `delta` (what changed since the tick before)."""
        self._ticks += 1
        previous, self._last_tick = self._last_tick, data
        if previous is None or (self._ticks - 1) % self.keyframe_every == 0:
            return {"seq": self._ticks, "data": data}
        return {"seq": self._ticks, "delta": diff(previous, data)}

    def _write_locked(self, chunk: bytes) -> bool:
        assert self._handle is not None
        try:
            self._handle.write(chunk)
            self._handle.flush()
        except OSError as exc:
            self.error = f"--record {self.path}: writing failed ({exc.strerror or exc}); recording stopped"
            self._close_locked(finish=False)
            return False
        self.lines_written += 1
        self.bytes_written += len(chunk)
        return True

    def _close_locked(self, *, finish: bool = True) -> None:
        handle, self._handle = self._handle, None
        if handle is None:
            return
        try:
            if finish:
                handle.write(self._compressor.finish())
            handle.close()  # releases the lock
        except OSError as exc:
            self.error = self.error or f"--record {self.path}: closing failed ({exc.strerror or exc})"
            with contextlib.suppress(OSError):
                handle.close()

    @property
    def closed(self) -> bool:
        """Whether no more lines will be written."""
        return self._handle is None

    def close(self) -> None:
        """Write the gzip member's end and close (idempotent)."""
        with self._lock:
            self._close_locked()

    def __enter__(self) -> Recorder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# --- reading -------------------------------------------------------------------------------------------------


def _parse_line(raw: bytes) -> tuple[dict[str, Any] | None, str]:
    """(the line's object, "") for a good line; (None, why) for a bad one."""
    obj, why = _line_object(raw)
    if obj is None:
        return None, why
    why = _stamp_problem(obj) or _kind_problem(obj)
    if why:
        return None, why
    return obj, ""


def _line_object(raw: bytes) -> tuple[dict[str, Any] | None, str]:
    """The line as a JSON object, or (None, why it is not one)."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return None, "not UTF-8"
    try:
        obj = jsonio.loads(text, source="recording line")
    except json.JSONDecodeError as exc:
        return None, f"not JSON ({exc.msg})"
    except jsonio.JsonInputError as exc:  # nesting, huge numbers, NaN: a corrupt line, counted and skipped
        return None, exc.problem
    if not isinstance(obj, dict):
        return None, "not a JSON object"
    return obj, ""


def _stamp_problem(obj: dict[str, Any]) -> str:
    """Why the line's format version or time stamp is not readable ("" when both are)."""
    version = obj.get("v")
    if isinstance(version, bool) or version not in READ_VERSIONS:
        return f"line format version {version!r} (this decodetop reads {', '.join(map(str, READ_VERSIONS))})"
    t = obj.get("t")
    if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t):
        return "no time stamp"
    return ""


def _kind_problem(obj: dict[str, Any]) -> str:
    """Why the line's kind, type name or data is not what a recording holds ("" when they are)."""
    kind = obj.get("kind")
    if not isinstance(kind, str):
        return "no kind"
    if kind not in KINDS:
        return f"unknown kind {kind!r}"
    tname = obj.get("type")
    if tname is not None and not isinstance(tname, str):
        return "type is not a string"
    tick = _tick_problem(obj, tname)
    if tick is not None:
        return tick
    if "data" not in obj:
        return "no data"
    return _data_problem(kind, obj["data"], tname)


def _tick_problem(obj: dict[str, Any], tname: str | None) -> str | None:
    """For a telemetry line of layout 2: why its tick number or its delta's type is wrong ("" for a good delta
    line); None where the line is checked as any other (a keyframe, an older layout)."""
    if obj["kind"] != "telemetry" or obj["v"] < 2:
        return None
    seq = obj.get("seq")
    if isinstance(seq, bool) or not isinstance(seq, int):
        return "a tick without its number"
    if "data" in obj or "delta" not in obj:
        return None
    return _data_problem("telemetry", {}, tname)


def _data_problem(kind: str, data: object, tname: str | None) -> str:
    """Why `data` is not what a `kind` line of type `tname` holds ("" when it is)."""
    expected = expected_type_name(kind)
    if expected is None:
        if not isinstance(data, dict):
            return f"{kind} data is not an object"
    elif not (data == [] and tname is None) and (tname is None or not _names_kind(kind, tname.rpartition(".")[2])):
        return f"type {json.dumps(tname)} is not what a {kind} line holds ({expected})"
    elif not isinstance(data, (dict, list)) or (isinstance(data, list) and kind != "checks"):
        return f"{kind} data is not an object"
    return ""


def _names_kind(kind: str, class_name: str) -> bool:
    """Whether `class_name` is what a line of `kind` holds: its class, or the name that class had before."""
    return class_name == expected_type_name(kind) or class_name in FORMER_TYPE_NAMES.get(kind, frozenset())


class _Ticks:
    """Rebuilds each telemetry line's snapshot: a keyframe as it is, a delta applied to the tick before it. A delta
    whose tick before is missing (a damaged line) is skipped, and so is every tick until the next keyframe."""

    def __init__(self) -> None:
        self.seq: int | None = None
        self.data: Any = None
        self.keyframe_bytes = 0

    def resolve(self, obj: dict[str, Any], raw_bytes: int) -> tuple[Any, str]:
        """The line's payload (its snapshot rebuilt), or (None, why)."""
        kind = obj["kind"]
        if kind == "meta":
            self.seq = None  # a new session: its ticks start again
        if kind != "telemetry" or "seq" not in obj:
            return obj["data"], ""
        seq = obj["seq"]
        if "data" in obj:
            self.seq, self.data, self.keyframe_bytes = seq, obj["data"], raw_bytes
            return self.data, ""
        if self.seq is None or seq != self.seq + 1:
            self.seq = None
            return None, "a tick's changes without the tick before them (skipped up to the next whole tick)"
        try:
            data = apply(self.data, obj["delta"])
        except DeltaError as exc:
            self.seq = None
            return None, f"a tick's changes do not fit the tick before ({exc})"
        self.seq, self.data = seq, data
        return data, ""


def iter_recording(
    path: str | os.PathLike[str], problems: list[str] | None = None
) -> Iterator[tuple[int, RecordedEvent | None, str]]:
    """(line number, event or None, why) for every non-empty line, read as a stream (for large recordings), plain
    or gzip, each telemetry tick rebuilt whole. What went wrong in compressed data is appended to `problems`.
    UserInputError (one line) when the file cannot be read, decompresses past `MAX_DECOMPRESSED_BYTES`, or holds
    more than `MAX_REPLAY_BYTES` of events once its ticks are rebuilt."""
    p = Path(path)
    source = RecordingBytes(p)
    ticks = _Ticks()
    replayed = 0
    line_no = 0
    try:
        for raw in source.lines():
            line_no += 1
            if raw is None:
                yield line_no, None, f"line longer than {jsonio.MAX_LINE_BYTES // (1024 * 1024)} MiB"
                continue
            stripped = raw.strip()
            if not stripped:
                continue
            obj, why = _parse_line(stripped)
            payload = None
            if obj is not None:
                payload, why = ticks.resolve(obj, len(stripped))
            if obj is None or why:
                yield line_no, None, why
                continue
            replayed += len(stripped) + (ticks.keyframe_bytes if "delta" in obj else 0)
            if replayed > MAX_REPLAY_BYTES:
                raise UserInputError(
                    f"--replay {p}: more than {MAX_REPLAY_BYTES:,} bytes of events once its ticks are rebuilt "
                    "(hours of telemetry at 8 GPUs), over the limit decodetop replays: replay a shorter recording"
                )
            yield line_no, RecordedEvent(float(obj["t"]), obj["kind"], payload, obj.get("type"), line_no), ""
    finally:
        if problems is not None:
            problems.extend(source.problems)


def read_recording(path: str | os.PathLike[str]) -> Replay:
    """Read a recording (gzip, or plain JSON lines as earlier versions wrote): every good line in order; truncated
    or corrupt lines skipped and counted, never fatal; damaged compressed data kept up to the damage, said in one
    line.

    Raises UserInputError (one line) only when the file cannot be read, or when no line at all is a recording
    line (the user pointed at something else).
    """
    p = Path(path)
    events: list[RecordedEvent] = []
    problems: list[str] = []
    damage: list[str] = []
    corrupt = 0
    for line_no, event, why in iter_recording(p, damage):
        if event is None:
            corrupt += 1
            if len(problems) < MAX_LISTED_PROBLEMS:
                problems.append(f"line {line_no}: {why}")
            continue
        events.append(event)
    if not events and (corrupt or damage):
        first = damage[0].removeprefix(f"{p.name}: ") if damage else problems[0]
        raise UserInputError(f"--replay {p}: not a decodetop recording ({first}; no readable line)")
    warnings: list[str] = list(damage)
    if corrupt:
        more = f", and {corrupt - len(problems)} more" if corrupt > len(problems) else ""
        warnings.append(
            f"{p.name}: skipped {corrupt} corrupt line{'s' if corrupt != 1 else ''} ({'; '.join(problems)}{more})"
        )
    if not events:
        warnings.append(f"{p.name}: the recording is empty")
    elif not any(e.kind == "meta" for e in events):
        warnings.append(f"{p.name}: no meta line; recorded by another tool or cut at the start")
    return Replay(path=p, events=tuple(events), corrupt_lines=corrupt, warnings=tuple(warnings))


def write_events(path: str | os.PathLike[str], events: Sequence[tuple[float, str, Any]]) -> None:
    """Write a recording at once (tests, tools): (t_unix_s, kind, payload) each, after a meta line stamped with
    the first event's time."""
    first = events[0][0] if events else time.time()
    with Recorder(path, clock=lambda: first) as rec:
        for t, kind, payload in events:
            rec.record(kind, payload, t=t)


@dataclass(frozen=True)
class DecodedEvent:
    """An event and the object rebuilt from it (the raw payload where the line names no class)."""

    event: RecordedEvent
    value: Any


@dataclass(frozen=True)
class DecodedReplay:
    """A replay with every event rebuilt; events whose payload no longer fits their class are skipped and counted."""

    replay: Replay
    items: tuple[DecodedEvent, ...]
    undecodable: int
    warnings: tuple[str, ...]

    @property
    def skipped(self) -> int:
        """Corrupt lines plus undecodable events: everything a replay could not show."""
        return self.replay.corrupt_lines + self.undecodable

    def values(self, cls: type[T]) -> list[T]:
        """The decoded objects of one class, in file order (a list payload's items one by one)."""
        out: list[T] = []
        for item in self.items:
            for value in item.value if isinstance(item.value, tuple) else (item.value,):
                if isinstance(value, cls):
                    out.append(value)
        return out


def decode_replay(replay: Replay) -> DecodedReplay:
    """Rebuild every event of a replay (for the UI). A payload that does not fit its class (a recording from
    another decodetop version) is skipped, counted and named in one warning line; never fatal."""
    items: list[DecodedEvent] = []
    problems: list[str] = []
    undecodable = 0
    for event in replay.events:
        try:
            value = decode_event(event)
        except ValueError as exc:
            undecodable += 1
            if len(problems) < MAX_LISTED_PROBLEMS:
                problems.append(f"line {event.line_no} ({event.kind}): {str(exc).splitlines()[0][:160]}")
            continue
        items.append(DecodedEvent(event, value))
    warnings = list(replay.warnings)
    if undecodable:
        more = f", and {undecodable - len(problems)} more" if undecodable > len(problems) else ""
        warnings.append(
            f"{replay.path.name}: skipped {undecodable} event{'s' if undecodable != 1 else ''} whose data does not "
            f"fit its kind (damaged, or from another decodetop version) ({'; '.join(problems)}{more})"
        )
    return DecodedReplay(replay=replay, items=tuple(items), undecodable=undecodable, warnings=tuple(warnings))
