"""Provides a streaming reader for PyTorch profiler traces (Chrome trace JSON, plain or gzipped) in bounded memory.

The `traceEvents` array is decoded one event at a time with `json.JSONDecoder.raw_decode` over a sliding text
buffer, so a trace of hundreds of MB never sits in memory whole. Of each event only what the analysis needs is kept,
in typed columns (`array.array`), with names interned once: GPU activities (kernels, memcpy, memset), host ranges
(cpu_op, user_annotation and `nn.Module: ...` python_function frames), CUDA runtime/driver calls with their
correlation ids, and GPU-side user annotations.

A trace is a file from outside: every size is capped with a one-line error naming the limit, so a small crafted
file cannot cost minutes or gigabytes. The bytes read once decompressed (`MAX_TRACE_BYTES`), one event
(`MAX_EVENT_CHARS`), one name (`MAX_NAME_CHARS`), the distinct names kept (`MAX_DISTINCT_NAMES`) and their
characters together (`MAX_NAMES_CHARS`). Runs of blanks are skipped at C speed, and an event cut by the buffer's
edge is decoded again only after the buffer has doubled, so no input makes reading quadratic. A number no float
holds (an integer of hundreds of digits) counts as a bad time, as NaN does.
"""

from __future__ import annotations

import codecs
import gzip
import json
import re
import sys
import zlib
from array import array
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from decodetop import jsonio
from decodetop.errors import UserInputError
from decodetop.quantity import as_float

CHUNK_BYTES = 1 << 18
"""Bytes read per refill (256 KiB): large enough to amortise the buffer splice, small next to any trace."""

MAX_TRACE_BYTES = 2 << 30
"""Most bytes read from one trace once decompressed (2 GiB): reading and attributing a trace takes ~75 s per GB on
a 2-core machine (benchmarks/results/traces/trace_load_cpu2.json); a capture of a few decode steps is tens to
hundreds of MB. A gzip bomb (1 GiB of blanks in 1 MB) stops here, counted in what it unpacks to."""
MAX_EVENT_CHARS = 4 << 20
"""One event (or top-level value) larger than this (4 Mi characters) means the file is not a trace we understand:
a profiler event is a name, a few numbers and small args (tests/fixtures/traces: under 2 KiB each)."""
MAX_NAME_CHARS = 1 << 20
"""Longest name kept (1 Mi characters). C++ template kernel names run to a few thousand characters; longer ones are
shown shortened (`decodetop.traces.compare.short_name`)."""
MAX_DISTINCT_NAMES = 100_000
"""Most distinct names (kernels, operators, module frames, shapes) in one trace. A decode step has hundreds; a
trace with millions is crafted, and attributing each name costs time (200,000 take ~6 s here)."""
MAX_CATEGORIES = 1000
"""Distinct event categories counted by name; the rest count as "(other)" (a profiler writes a dozen)."""
MAX_NAMES_CHARS = 64 << 20
"""Most characters of all distinct names together (64 Mi): names stay in memory for the whole analysis."""
MAX_BLANK_RUN = 64 << 20
"""Most blanks in a row (64 Mi): an indented trace has a few dozen; gigabytes of them are a gzip bomb."""
_BLANKS_THEN = re.compile(r"[ \t\n\r]*")
"""A run of JSON blanks: skipped in one match instead of a character at a time."""

GPU_KERNEL, GPU_MEMCPY, GPU_MEMSET = 0, 1, 2
"""Kinds of GPU activity in `Trace.gpu_kind`."""

HOST_OP, HOST_ANNOTATION, HOST_MODULE = 0, 1, 2
"""Kinds of host range in `Trace.host_kind`: cpu_op, user_annotation (record_function), nn.Module frame."""

NO_ID = -1
"""Missing correlation id, shape or device."""

_GPU_CATS = {"kernel": GPU_KERNEL, "gpu_memcpy": GPU_MEMCPY, "memcpy": GPU_MEMCPY, "gpu_memset": GPU_MEMSET}
_GPU_CATS["memset"] = GPU_MEMSET
_HOST_CATS = {"cpu_op": HOST_OP, "operator": HOST_OP, "user_annotation": HOST_ANNOTATION}
_RUNTIME_CATS = {"cuda_runtime", "cuda_driver", "runtime", "driver"}
_KEPT_META = {"schemaVersion", "deviceProperties", "distributedInfo", "baseTimeNanoseconds", "displayTimeUnit"}
_SHAPED_OPS = ("mm", "linear", "matmul", "gemm", "bmm")
"""cpu_op names whose `Input Dims` are kept (GEMM shapes decide projections vs MLP vs lm_head)."""


@dataclass
class Trace:
    """The compact columns kept from one trace file. Times are microseconds on the trace's own clock."""

    path: Path
    names: list[str] = field(default_factory=list)
    # GPU activities
    gpu_kind: array[int] = field(default_factory=lambda: array("b"))
    gpu_name: array[int] = field(default_factory=lambda: array("i"))
    gpu_ts_us: array[float] = field(default_factory=lambda: array("d"))
    gpu_dur_us: array[float] = field(default_factory=lambda: array("d"))
    gpu_device: array[int] = field(default_factory=lambda: array("q"))
    gpu_stream: array[int] = field(default_factory=lambda: array("q"))
    gpu_corr: array[int] = field(default_factory=lambda: array("q"))
    # host ranges
    host_kind: array[int] = field(default_factory=lambda: array("b"))
    host_name: array[int] = field(default_factory=lambda: array("i"))
    host_ts_us: array[float] = field(default_factory=lambda: array("d"))
    host_dur_us: array[float] = field(default_factory=lambda: array("d"))
    host_thread: array[int] = field(default_factory=lambda: array("i"))
    host_shape: array[int] = field(default_factory=lambda: array("i"))
    # CUDA runtime / driver calls (launches)
    rt_name: array[int] = field(default_factory=lambda: array("i"))
    rt_ts_us: array[float] = field(default_factory=lambda: array("d"))
    rt_thread: array[int] = field(default_factory=lambda: array("i"))
    rt_corr: array[int] = field(default_factory=lambda: array("q"))
    # GPU-side user annotations (record_function ranges projected onto the GPU timeline)
    ga_name: array[int] = field(default_factory=lambda: array("i"))
    ga_ts_us: array[float] = field(default_factory=lambda: array("d"))
    ga_dur_us: array[float] = field(default_factory=lambda: array("d"))
    ga_device: array[int] = field(default_factory=lambda: array("q"))
    meta: dict[str, Any] = field(default_factory=dict)
    categories: Counter[str] = field(default_factory=Counter)
    bytes_read: int = 0
    """Bytes of the file once decompressed."""
    events_total: int = 0
    bad_times: int = 0
    """Events left out because their timestamp or duration is NaN, infinite or negative (counted, never used)."""
    _ids: dict[str, int] = field(default_factory=dict, repr=False)
    _threads: dict[tuple[object, object], int] = field(default_factory=dict, repr=False)
    _names_chars: int = field(default=0, repr=False)

    def intern(self, name: str) -> int:
        """The id of `name` in `names`, adding it once; a name or a set of names over the caps is a one-line
        `UserInputError` (`MAX_NAME_CHARS`, `MAX_DISTINCT_NAMES`, `MAX_NAMES_CHARS`)."""
        got = self._ids.get(name)
        if got is None:
            self._check_new_name(name)
            got = self._ids[name] = len(self.names)
            self.names.append(name)
            self._names_chars += len(name)
        return got

    def _check_new_name(self, name: str) -> None:
        if len(name) > MAX_NAME_CHARS:
            raise UserInputError(
                f"{self.path}: a name of {len(name):,} characters, over the {MAX_NAME_CHARS:,}-character limit "
                "of one name: not a profiler trace decodetop reads"
            )
        if len(self.names) >= MAX_DISTINCT_NAMES:
            raise UserInputError(
                f"{self.path}: more than {MAX_DISTINCT_NAMES:,} distinct names (kernels, operators, modules), over "
                "the limit: not a trace of a few decode steps"
            )
        if self._names_chars + len(name) > MAX_NAMES_CHARS:
            raise UserInputError(
                f"{self.path}: its distinct names hold more than {MAX_NAMES_CHARS:,} characters, over the limit: "
                "not a trace of a few decode steps"
            )

    def thread_id(self, pid: object, tid: object) -> int:
        """A small integer for a (pid, tid) pair, whatever types the trace used for them."""
        key = (pid, tid)
        got = self._threads.get(key)
        if got is None:
            if len(self._threads) >= MAX_DISTINCT_NAMES:
                raise UserInputError(
                    f"{self.path}: more than {MAX_DISTINCT_NAMES:,} distinct threads (pid, tid), over the limit: "
                    "not a trace of a few decode steps"
                )
            got = self._threads[key] = len(self._threads)
        return got

    @property
    def n_gpu(self) -> int:
        """Number of GPU activities kept."""
        return len(self.gpu_name)

    @property
    def n_host(self) -> int:
        """Number of host ranges kept."""
        return len(self.host_name)


def read_trace(path: str | Path, *, max_bytes: int = MAX_TRACE_BYTES) -> Trace:
    """Read a Chrome/PyTorch-profiler trace file (`.json` or `.json.gz`) into compact columns, at most `max_bytes`
    once decompressed.

    Raises UserInputError with one line naming the file and the problem for anything that is not a complete trace.
    """
    path = Path(path)
    trace = Trace(path=path)
    try:
        raw = jsonio.open_regular(path)  # a FIFO or device is refused without blocking
    except UserInputError as exc:
        raise UserInputError(str(exc).replace(": cannot read: ", ": cannot open trace: ", 1)) from None
    with raw:
        try:
            head = raw.read(2)
            raw.seek(0)
            binary: BinaryIO = gzip.GzipFile(fileobj=raw, mode="rb") if head == b"\x1f\x8b" else raw  # type: ignore[assignment]
            stream = _Stream(binary, path, max_bytes)
            try:
                _parse(stream, trace)
            finally:
                trace.bytes_read = stream.bytes_read
        except (gzip.BadGzipFile, zlib.error) as exc:
            raise UserInputError(f"{path}: corrupt gzip data ({exc})") from None
        except EOFError:
            raise UserInputError(f"{path}: truncated gzip file (the compressed stream ends early)") from None
        except UnicodeDecodeError as exc:
            raise UserInputError(f"{path}: not UTF-8 text at byte {exc.start}: not a JSON trace") from None
        except OSError as exc:
            raise UserInputError(f"{path}: cannot read trace: {exc}") from None
    return trace


class _Stream:
    """A sliding text window over a byte stream, with the few JSON-token helpers the top level needs."""

    _WS = " \t\n\r"

    def __init__(self, binary: BinaryIO, path: Path, max_bytes: int = MAX_TRACE_BYTES) -> None:
        self._binary = binary
        self._utf8 = codecs.getincrementaldecoder("utf-8")()
        self.path = path
        self.max_bytes = max_bytes
        self.bytes_read = 0
        self.buf = ""
        self.pos = 0
        self.offset = 0  # characters dropped from the front of buf so far
        self.eof = False
        # NaN durations are skipped and counted later. Python's own cap on integer digits (4300 by default) refuses
        # the huge integers the strict decoder's parse_int hook guards against, at C speed: where that cap is on,
        # the plain decoder reads a trace ~30 % faster (benchmarks/traces/trace_load.py); where it is off, the hook
        # does.
        limit = sys.get_int_max_str_digits()
        fast = 0 < limit <= jsonio.MAX_INT_DIGITS
        self._decoder = json.JSONDecoder() if fast else jsonio.strict_decoder(allow_nan=True)

    def fill(self, at_least: int = CHUNK_BYTES) -> bool:
        """Append at least one chunk (`at_least` bytes, in chunks); False at end of input."""
        if self.eof:
            return False
        data = self._binary.read(max(CHUNK_BYTES, at_least))
        self.bytes_read += len(data)
        if self.bytes_read > self.max_bytes:
            raise UserInputError(
                f"{self.path}: more than {self.max_bytes:,} bytes once decompressed, over the limit decodetop reads "
                "a trace to: capture fewer steps"
            )
        text = self._utf8.decode(data, final=not data)
        if not data:
            self.eof = True
        if self.pos:
            self.offset += self.pos
            self.buf = self.buf[self.pos :]
            self.pos = 0
        self.buf += text
        return bool(data)

    def peek(self) -> str:
        """The next non-space character ('' at end of input), leaving `pos` on it."""
        blanks = 0
        while True:
            buf, pos = self.buf, self.pos
            if pos < len(buf) and buf[pos] in self._WS:
                match = _BLANKS_THEN.match(buf, pos)
                end = match.end() if match else pos
                blanks += end - pos
                pos = end
            self.pos = pos
            if pos < len(buf):
                return buf[pos]
            if blanks > MAX_BLANK_RUN:
                raise UserInputError(
                    f"{self.path}: more than {MAX_BLANK_RUN:,} blank characters in a row at {self.where()}, over "
                    "the limit: not a trace"
                )
            if not self.fill():
                return ""

    def where(self) -> str:
        """Position for error messages."""
        return f"character {self.offset + self.pos}"

    def value(self, what: str) -> Any:
        """Decode one JSON value at the current position, reading more input until it is complete."""
        self.peek()
        while True:
            try:
                obj, end = self._decoder.raw_decode(self.buf, self.pos)
            except json.JSONDecodeError as exc:
                pending = len(self.buf) - self.pos
                if not self.eof and pending < MAX_EVENT_CHARS:
                    self.fill(at_least=pending)  # the buffer doubles before the next try: linear, not quadratic
                    continue
                if self.eof and exc.pos >= len(self.buf) - 1:
                    raise UserInputError(f"{self.path}: truncated: the file ends inside {what}") from None
                if not self.eof:
                    raise UserInputError(
                        f"{self.path}: {what} is larger than {MAX_EVENT_CHARS >> 20} Mi characters: not a trace"
                    ) from None
                raise UserInputError(
                    f"{self.path}: malformed JSON in {what} at character {self.offset + exc.pos}: {exc.msg}"
                ) from None
            except (RecursionError, ValueError) as exc:  # nesting too deep, a number with thousands of digits
                raise UserInputError(f"{self.path}: {what} at {self.where()}: {jsonio.problem_of(exc)}") from None
            if end == len(self.buf) and not self.eof:  # a number cut at the chunk edge would parse short
                self.fill()
                continue
            self.pos = end
            return obj

    def take(self, char: str, what: str) -> None:
        """Consume `char` or fail with a one-line error."""
        got = self.peek()
        if got != char:
            if not got:
                raise UserInputError(f"{self.path}: truncated: the file ends inside {what} (expected {char!r})")
            raise UserInputError(f"{self.path}: malformed JSON in {what} at {self.where()}: expected {char!r}")
        self.pos += 1


def _parse(stream: _Stream, trace: Trace) -> None:
    first = stream.peek()
    if not first:
        raise UserInputError(f"{stream.path}: empty file: not a trace")
    if first == "[":
        _parse_events(stream, trace)
        return
    if first != "{":
        raise UserInputError(
            f"{stream.path}: not a JSON trace (starts with {first!r}; expected a Chrome trace object with traceEvents)"
        )
    stream.pos += 1
    seen_events = False
    while True:
        nxt = stream.peek()
        if nxt == "}":
            stream.pos += 1
            break
        if not nxt:
            raise UserInputError(f"{stream.path}: truncated: the file ends inside the top-level object")
        seen_events = _parse_member(stream, trace) or seen_events
        _after_member(stream)
    if not seen_events:
        raise UserInputError(f"{stream.path}: JSON without a 'traceEvents' array: not a PyTorch/Chrome profiler trace")


def _parse_member(stream: _Stream, trace: Trace) -> bool:
    """One `"key": value` of the top-level object; True when it was the traceEvents array."""
    key = stream.value("a top-level key")
    if not isinstance(key, str):
        raise UserInputError(f"{stream.path}: malformed JSON at {stream.where()}: object key is not a string")
    stream.take(":", f"the top-level key {key!r}")
    if key == "traceEvents":
        if stream.peek() != "[":
            raise UserInputError(f"{stream.path}: 'traceEvents' is not an array: not a Chrome trace")
        _parse_events(stream, trace)
        return True
    value = stream.value(f"the top-level value {key!r}")
    if key in _KEPT_META:
        trace.meta[key] = value
    return False


def _after_member(stream: _Stream) -> None:
    """Consume the ',' after a top-level member, or leave the closing '}' for the loop."""
    sep = stream.peek()
    if sep == ",":
        stream.pos += 1
    elif sep != "}":
        if not sep:
            raise UserInputError(f"{stream.path}: truncated: the file ends inside the top-level object")
        raise UserInputError(f"{stream.path}: malformed JSON at {stream.where()}: expected ',' or '}}'")


def _parse_events(stream: _Stream, trace: Trace) -> None:
    stream.take("[", "traceEvents")
    if stream.peek() == "]":
        stream.pos += 1
        return
    index = 0
    while True:
        event = stream.value(f"event #{index}")
        if not isinstance(event, dict):
            raise UserInputError(f"{stream.path}: event #{index} is not a JSON object: not a Chrome trace")
        _keep(event, trace)
        index += 1
        sep = stream.peek()
        if sep == ",":
            stream.pos += 1
        elif sep == "]":
            stream.pos += 1
            break
        elif not sep:
            raise UserInputError(
                f"{stream.path}: truncated: traceEvents ends after {index} events without its closing ']'"
            )
        else:
            raise UserInputError(f"{stream.path}: malformed JSON after event #{index - 1} at {stream.where()}")
    trace.events_total = index


def _num(value: object) -> float | None:
    """A time field as a float, or None (a bool, an object, an integer no float holds: `decodetop.quantity`)."""
    return as_float(value)


_INT_LIMIT = 1 << 62
"""Ids beyond this do not fit the 64-bit columns; such an id is treated as missing."""


def _int(value: object, default: int = NO_ID) -> int:
    if isinstance(value, str):
        digits = "".join(ch for ch in value if ch.isdigit())[:18]
        return int(digits) if digits else default
    if isinstance(value, int) and not isinstance(value, bool) and -_INT_LIMIT < value < _INT_LIMIT:
        return value
    return default


_GPU, _HOST, _RUNTIME, _ANNOTATION = range(4)
"""Which columns of `Trace` an event goes to."""


def _keep(event: dict[str, Any], trace: Trace) -> None:
    """Keep the fields of one event that the analysis uses; ignore the rest (decided before parsing fields)."""
    cat_raw = event.get("cat")
    cat = cat_raw[:100].lower() if isinstance(cat_raw, str) else "(none)"  # a real category is one word
    if cat in trace.categories or len(trace.categories) < MAX_CATEGORIES:
        trace.categories[cat] += 1
    else:
        trace.categories["(other)"] += 1
    if event.get("ph") != "X":
        return
    name = event.get("name")
    if not isinstance(name, str):
        name = str(name)
    where = _where(cat, name)
    if where is None:
        return
    times = _times(event, trace)
    if times is None:
        return
    args = event.get("args")
    if not isinstance(args, dict):
        args = {}
    table, kind = where
    ts, dur = times
    if table == _GPU:
        trace.gpu_kind.append(kind)
        trace.gpu_name.append(trace.intern(name))
        trace.gpu_ts_us.append(ts)
        trace.gpu_dur_us.append(dur)
        trace.gpu_device.append(_int(args.get("device", event.get("pid"))))
        trace.gpu_stream.append(_int(args.get("stream", event.get("tid"))))
        trace.gpu_corr.append(_int(args.get("correlation")))
    elif table == _HOST:
        _keep_host(event, trace, name, kind, args, times)
    elif table == _RUNTIME:
        trace.rt_name.append(trace.intern(name))
        trace.rt_ts_us.append(ts)
        trace.rt_thread.append(trace.thread_id(event.get("pid"), event.get("tid")))
        trace.rt_corr.append(_int(args.get("correlation")))
    else:
        trace.ga_name.append(trace.intern(name))
        trace.ga_ts_us.append(ts)
        trace.ga_dur_us.append(dur)
        trace.ga_device.append(_int(args.get("device", event.get("pid"))))


def _where(cat: str, name: str) -> tuple[int, int] | None:
    """(columns, kind) of an event of category `cat`, or None for events the analysis does not use."""
    gpu_kind = _GPU_CATS.get(cat)
    if gpu_kind is not None:
        return _GPU, gpu_kind
    if cat == "python_function":  # only the nn.Module frames: plain Python frames say nothing about components
        return (_HOST, HOST_MODULE) if name.startswith("nn.Module:") else None
    host_kind = _HOST_CATS.get(cat)
    if host_kind is not None:
        return _HOST, host_kind
    if cat in _RUNTIME_CATS:
        return _RUNTIME, 0
    if cat == "gpu_user_annotation":
        return _ANNOTATION, 0
    return None


MAX_TS_US = 1e18
"""Latest timestamp taken (µs; epoch-based clocks are ~1.7e15 µs today): anything larger is not a time."""
MAX_DUR_US = 1e12
"""Longest duration taken (µs; 11.6 days, where a trace covers seconds)."""


def _times(event: dict[str, Any], trace: Trace) -> tuple[float, float] | None:
    """(ts, dur) in µs; None without a timestamp, or (counted) for a time that is NaN, infinite, negative, no
    float (an integer of hundreds of digits) or beyond `MAX_TS_US` / `MAX_DUR_US`."""
    raw_ts = event.get("ts")
    if raw_ts is None:
        return None
    ts = _num(raw_ts)
    raw_dur = event.get("dur")
    dur = 0.0 if raw_dur is None else _num(raw_dur)
    if ts is None or dur is None:
        if isinstance(raw_ts, str) and ts is None:
            return None  # a timestamp that is no number at all: not an event the analysis uses
        trace.bad_times += 1
        return None
    if not (0 <= ts <= MAX_TS_US and 0 <= dur <= MAX_DUR_US):  # NaN fails both comparisons too
        trace.bad_times += 1  # a NaN, infinite or negative time would poison every sum and sort after it
        return None
    return ts, dur


def _keep_host(  # noqa: PLR0917 - the event's parts, decoded once by the caller
    event: dict[str, Any], trace: Trace, name: str, kind: int, args: dict[str, Any], times: tuple[float, float]
) -> None:
    trace.host_kind.append(kind)
    trace.host_name.append(trace.intern(name))
    trace.host_ts_us.append(times[0])
    trace.host_dur_us.append(times[1])
    trace.host_thread.append(trace.thread_id(event.get("pid"), event.get("tid")))
    shape = NO_ID
    if kind == HOST_OP and "Input Dims" in args and any(part in name for part in _SHAPED_OPS):
        shape = trace.intern(json.dumps(args["Input Dims"], separators=(",", ":")))
    trace.host_shape.append(shape)
