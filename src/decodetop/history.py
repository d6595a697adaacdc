"""Provides the results history: every probe result and baseline, one JSON object per line, under the state dir.

The live UI appends each finished probe and each saved baseline, and reads the file back at start so the last
values show at once with their age. Several processes may share one state dir (two UIs, a shared NFS home): every
write takes an advisory lock (`fcntl.flock` on ``history.jsonl.lock`` beside the file), re-reads the file, adds the
new entry to what is there and rewrites it atomically (`decodetop.atomic`), so no writer erases another's entries
and an interrupted write leaves the old file whole.

A failed load is never followed by a truncating write. A file that cannot be parsed (bad JSON, nesting too deep,
huge numbers, not UTF-8, a line longer than `decodetop.jsonio.MAX_LINE_BYTES`) is renamed aside byte for byte
(``history.jsonl.corrupt-<UTC time>``), the lines that did parse are written to a fresh file, and the problem is
reported as one line in `HistoryLoad.problem`. A file that cannot be read at all (permissions, an I/O error, a
directory or FIFO in its place) is left as it is and every later write in the session is refused with that reason
(`HistoryUnavailableError`).

State files are never followed through a symbolic link: a `history.jsonl` or `history.jsonl.lock` that is a link
(in a shared state dir, whoever can write the directory could point it at another of the user's files) is left as it
is, the history is not read and nothing is written (`decodetop.jsonio.SYMLINK_REFUSED` says why). Temporary files
of a writer killed mid-write (``.history.jsonl.*.tmp``) are removed by the next writer, under the lock.

The rolling caps (`MAX_ENTRIES`, `MAX_BYTES`) drop the oldest probe results; a baseline is kept until a newer
baseline of the same name and fingerprint replaces it, however many probe results come after it.

Each entry may carry a `Fingerprint` saying where it was measured (host, device, versions, scenario), so a reader
can take only the records that match the current setup; entries written before fingerprints existed load with
``fingerprint=None`` ("origin unknown").

Stdlib only.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import json
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from decodetop import paths
from decodetop.atomic import remove_stale_temps, write_bytes_atomic
from decodetop.errors import UserInputError
from decodetop.jsonio import MAX_LINE_BYTES, SYMLINK_REFUSED, JsonInputError, parse_json, read_bounded
from decodetop.quantity import UNIX_TIME_S

HISTORY_FILE_NAME = "history.jsonl"
LOCK_SUFFIX = ".lock"
"""The advisory lock file sits beside the history: ``history.jsonl.lock``."""
FORMAT_VERSION = 1
MAX_ENTRIES = 5000
"""Probe entries kept when the file is rewritten; the oldest go first (baselines are kept apart from the cap)."""
MAX_BYTES = 16 * 1024 * 1024
"""And at most this much JSON (each append rewrites the file atomically, so it must stay small)."""
MAX_READ_BYTES = 4 * MAX_BYTES
"""A history file larger than this was not written by decodetop's rewrite cap: it is set aside unread."""

KIND_PROBE = "probe"
KIND_BASELINE = "baseline"

DEVICE_KINDS = ("cuda", "cpu")
"""`Fingerprint.device_kind` values: probe ranks on CUDA GPUs, or CPU ranks (gloo)."""


class HistoryUnavailableError(OSError):
    """The history file could not be read at load, so nothing is written to it this session (it is left alone)."""


@dataclass(frozen=True)
class Fingerprint:
    """Where a record was measured: the host, its devices and software, and the scenario it was measured for.

    Two records can feed the same budget only when their fingerprints are equal. Fields that do not apply (a GPU
    name on CPU ranks, the NCCL version without NCCL) are None."""

    host_id: str
    """A stable name for the machine (e.g. its hostname)."""
    device_kind: str
    """"cuda" or "cpu" (`DEVICE_KINDS`)."""
    gpu_name: str | None
    """The GPU's marketing name as the driver reports it ("NVIDIA H200"), None on CPU ranks."""
    gpu_count: int
    """GPUs (or CPU ranks) in the probe group."""
    driver_version: str | None
    """NVIDIA driver version, None on CPU ranks."""
    cuda_version: str | None
    """CUDA runtime version torch was built with, None without CUDA."""
    torch_version: str | None
    """torch.__version__ in the probe ranks."""
    nccl_version: str | None
    """NCCL version, None without NCCL."""
    decodetop_version: str
    """decodetop's version that measured it."""
    scenario: str
    """The scenario the record belongs to (model, TP, EP, batch, context, KV dtype, launch mode), as one string
    built by the budget's scenario layer; equal strings mean the same scenario."""

    def __post_init__(self) -> None:
        if self.device_kind not in DEVICE_KINDS:
            raise ValueError(f"fingerprint device_kind must be one of {', '.join(DEVICE_KINDS)}")
        if isinstance(self.gpu_count, bool) or not isinstance(self.gpu_count, int) or self.gpu_count < 0:
            raise ValueError("fingerprint gpu_count must be a non-negative integer")

    def to_dict(self) -> dict[str, Any]:
        """The JSON-ready form (every field, None as null)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Fingerprint:
        """Parse the JSON form; raise ValueError naming the first bad or missing field."""
        values: dict[str, Any] = {}
        for spec in dataclasses.fields(cls):
            if spec.name not in data:
                raise ValueError(f"fingerprint lacks {spec.name!r}")
            value = data[spec.name]
            if spec.name == "gpu_count":
                if isinstance(value, bool) or not isinstance(value, int):
                    raise ValueError("fingerprint gpu_count is not an integer")
            elif spec.name in _OPTIONAL_TEXT:
                if value is not None and not isinstance(value, str):
                    raise ValueError(f"fingerprint {spec.name} is not text or null")
            elif not isinstance(value, str):
                raise ValueError(f"fingerprint {spec.name} is not text")
            values[spec.name] = value
        return cls(**values)

    def describe(self) -> str:
        """One short line for "other scenarios" lists: device, count, versions and scenario."""
        if self.device_kind == "cpu":
            device = f"{self.gpu_count} CPU rank{'s' if self.gpu_count != 1 else ''}"
        else:
            device = f"{self.gpu_count} × {self.gpu_name or 'GPU'}"
        versions = ", ".join(
            f"{name} {value}"
            for name, value in (
                ("driver", self.driver_version),
                ("CUDA", self.cuda_version),
                ("torch", self.torch_version),
            )
            if value
        )
        return f"{self.host_id}: {device}" + (f" ({versions})" if versions else "") + f" · {self.scenario}"


_OPTIONAL_TEXT = frozenset({"gpu_name", "driver_version", "cuda_version", "torch_version", "nccl_version"})


def local_host_id() -> str:
    """This machine's name as `Fingerprint.host_id` expects it (the hostname; "unknown-host" if it has none)."""
    return socket.gethostname() or "unknown-host"


@dataclass(frozen=True)
class HistoryEntry:
    """One stored record: a probe's result or a baseline, with the wall-clock time it was taken."""

    kind: str
    """"probe" or "baseline"."""
    key: str
    """Probe id for results ("allreduce", "gemm"...); the baseline's name for baselines ("default")."""
    recorded_at_s: float
    """Unix time (seconds) when the value was measured or saved."""
    payload: Mapping[str, Any] = field(default_factory=dict)
    """The JSON-ready body (a probe result's dict, a baseline's checks and values)."""
    fingerprint: Fingerprint | None = None
    """Where it was measured; None for entries written without one ("origin unknown")."""

    def to_json(self) -> str:
        """One line of JSON (no newline)."""
        obj: dict[str, Any] = {
            "v": FORMAT_VERSION,
            "kind": self.kind,
            "key": self.key,
            "at": self.recorded_at_s,
            "data": self.payload,
        }
        if self.fingerprint is not None:
            obj["fp"] = self.fingerprint.to_dict()
        return dumps_compact(obj)

    @classmethod
    def from_json(cls, line: str) -> HistoryEntry:
        """Parse one line; raise ValueError saying what is wrong with it."""
        try:
            obj = parse_json(line, source="history line")
        except JsonInputError as exc:
            raise ValueError(exc.problem) from None
        return cls.from_object(obj)

    @classmethod
    def from_object(cls, obj: object) -> HistoryEntry:
        """Build an entry from one parsed line; raise ValueError saying what is wrong with it."""
        if not isinstance(obj, dict):
            raise ValueError("not a JSON object")
        kind, key, at, data = obj.get("kind"), obj.get("key"), obj.get("at"), obj.get("data", {})
        if not isinstance(kind, str) or not kind:
            raise ValueError("missing 'kind'")
        if not isinstance(key, str) or not key:
            raise ValueError("missing 'key'")
        if isinstance(at, bool) or not isinstance(at, (int, float)) or not UNIX_TIME_S.accepts(float(at)):
            raise ValueError(f"missing or bad 'at' time (must be a number {UNIX_TIME_S.range_text})")
        if not isinstance(data, dict):
            raise ValueError("'data' is not an object")
        fp_obj = obj.get("fp")
        fingerprint: Fingerprint | None = None
        if fp_obj is not None:
            if not isinstance(fp_obj, dict):
                raise ValueError("'fp' is not an object")
            fingerprint = Fingerprint.from_dict(fp_obj)
        return cls(kind=kind, key=key, recorded_at_s=float(at), payload=data, fingerprint=fingerprint)

    def age_s(self, now_s: float) -> float:
        """Seconds since the entry was recorded (0 for entries from the future, e.g. after a clock step)."""
        return max(0.0, now_s - self.recorded_at_s)


def dumps_compact(obj: object) -> str:
    """Sorted, compact JSON without NaN or Infinity (a history line)."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=False)


@dataclass(frozen=True)
class HistoryLoad:
    """What reading the history file found."""

    entries: tuple[HistoryEntry, ...]
    """Every entry that parsed, oldest first."""
    problem: str | None = None
    """One line describing a corrupt or unreadable file, or None."""
    set_aside_path: Path | None = None
    """Where the corrupt file was moved, if it was."""
    writable: bool = True
    """False when the file could not be read: it is left alone and nothing is written to it this session."""


@dataclass(frozen=True)
class FingerprintSeen:
    """One fingerprint present in the history, for "other scenarios" lists."""

    fingerprint: Fingerprint | None
    """None stands for entries of unknown origin (written before fingerprints)."""
    entries: int
    """How many entries carry it."""
    newest_at_s: float
    """Unix time of its newest entry."""


def default_history_path() -> Path:
    """`history.jsonl` under the user's state dir (DECODETOP_STATE_DIR overrides)."""
    return paths.state_dir() / HISTORY_FILE_NAME


def format_age(age_s: float) -> str:
    """Compact age: "now", "42s", "5m", "3h", "2d"."""
    if age_s < 1:
        return "now"
    if age_s < 60:
        return f"{int(age_s)}s"
    if age_s < 3600:
        return f"{int(age_s // 60)}m"
    if age_s < 86400:
        return f"{int(age_s // 3600)}h"
    return f"{int(age_s // 86400)}d"


def format_ago(age_s: float) -> str:
    """ "5m ago", or "just now" (never "now ago"): the one wording of an age on every surface."""
    text = format_age(age_s)
    return "just now" if text == "now" else f"{text} ago"


def format_age_coarse(age_s: float) -> str:
    """`format_age` in 10 s steps under a minute ("now", "10s" … "50s"): a live screen showing it changes at most
    every 10 s (each change repaints a table)."""
    if age_s < 60:
        return "now" if age_s < 10 else f"{int(age_s // 10) * 10}s"
    return format_age(age_s)


@dataclass
class _Disk:
    """What one read of the file found."""

    lines: list[str]
    entries: list[HistoryEntry]
    bad_lines: int = 0
    first_error: str | None = None
    unreadable: str | None = None
    """Why the file could not be read at all (then nothing may be written)."""
    missing: bool = False


def _parse_line(line: str) -> HistoryEntry:
    """One history line as an entry; ValueError saying what is wrong (too long, not JSON, not an entry). Whatever
    else a crafted line makes the parsing raise is a bad line too, never an error out of `load`."""
    if len(line) > MAX_LINE_BYTES:
        raise ValueError(f"line longer than {MAX_LINE_BYTES // (1024 * 1024)} MiB")
    try:
        return HistoryEntry.from_json(line)
    except ValueError:
        raise
    except Exception as exc:  # an OverflowError, a TypeError deep in a field: the line is bad, the file is not
        raise ValueError(f"not a history entry ({type(exc).__name__})") from None


def _kept_indices(entries: list[HistoryEntry], lines: list[str], max_entries: int, max_bytes: int) -> list[int]:
    """Which entries a rewrite keeps, oldest first: every baseline that is the newest of its name and fingerprint
    (kept until replaced), then the newest other entries while they fit `max_entries` and `max_bytes` (the newest
    one always)."""
    pinned: dict[tuple[str, Fingerprint | None], int] = {}
    for index, entry in enumerate(entries):
        if entry.kind == KIND_BASELINE:
            pinned[(entry.key, entry.fingerprint)] = index  # a later one of the same name replaces it
    keep = set(pinned.values())
    count, size = 0, sum(len(lines[i]) + 1 for i in keep)
    for index in range(len(entries) - 1, -1, -1):
        if index in keep:
            continue
        size += len(lines[index]) + 1
        count += 1
        if count > max_entries or (size > max_bytes and count > 1):
            break
        keep.add(index)
    return sorted(keep)


class History:
    """The history file: load once, append from any thread or process (a thread lock and an advisory file lock
    serialise writers; each write re-reads the file so nothing another writer added is lost)."""

    def __init__(
        self,
        path: Path | None = None,
        max_entries: int = MAX_ENTRIES,
        clock: Callable[[], float] = time.time,
        max_bytes: int = MAX_BYTES,
    ) -> None:
        self.path = path if path is not None else default_history_path()
        """The JSON-lines file."""
        self.max_entries = max_entries
        """Entries kept on rewrite."""
        self.max_bytes = max_bytes
        """Bytes kept on rewrite (the newest entries that fit; the newest one always)."""
        self._clock = clock
        self._lock = threading.Lock()
        self._entries: list[HistoryEntry] = []
        self._lines: list[str] = []
        """Each entry's JSON line, as on disk after this process's last read or write."""
        self._disk_id: tuple[int, int, int, int] | None = None
        """(device, inode, size, mtime ns) of the file as last read or written here: unchanged means no re-read."""
        self._loaded = False
        self.refused: str | None = None
        """Why writes are refused this session (the file could not be read at load), or None."""
        self.last_problem: str | None = None
        """The last corruption found and set aside by a write (a load reports its own in `HistoryLoad`)."""

    @property
    def lock_path(self) -> Path:
        """The advisory lock file beside the history."""
        return self.path.with_name(self.path.name + LOCK_SUFFIX)

    @contextlib.contextmanager
    def _file_lock(self) -> Iterator[None]:
        """Hold the advisory lock shared by every decodetop process using this history file. A lock file that is a
        symbolic link is never opened through (O_NOFOLLOW): `HistoryUnavailableError` saying so."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise HistoryUnavailableError(
                    f"{self.lock_path}: {SYMLINK_REFUSED}; left as it is, nothing is saved"
                ) from None
            raise
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            remove_stale_temps(self.path)  # a writer killed mid-rewrite left its temp file; none is live now
            yield
        finally:
            os.close(fd)  # closing the descriptor releases the lock

    def _stat_id(self) -> tuple[int, int, int, int] | None:
        try:
            info = self.path.stat()
        except OSError:
            return None
        return (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns)

    def _read_disk(self) -> _Disk:
        """Read and parse the file as it is now (the caller holds the locks)."""
        if not os.path.lexists(self.path):
            return _Disk(lines=[], entries=[], missing=True)
        try:
            raw = read_bounded(self.path, max_bytes=MAX_READ_BYTES, follow_links=False)
        except UserInputError as exc:
            message = str(exc).removeprefix(f"{self.path}: cannot read: ")
            if "larger than" in message:  # not written by decodetop (its rewrite is capped): set aside unread
                return _Disk(lines=[], entries=[], bad_lines=1, first_error=f"the file is {message}, not read")
            return _Disk(lines=[], entries=[], unreadable=message)
        disk = _Disk(lines=[], entries=[])
        problems: list[tuple[int, str]] = []
        text_lines: list[str] = []
        for number, chunk in enumerate(raw.split(b"\n"), start=1):
            try:
                text_lines.append(chunk.decode("utf-8"))
            except UnicodeDecodeError as exc:  # that line alone is bad; the others still count
                text_lines.append("")
                problems.append((number, f"not UTF-8 text (bad byte at offset {exc.start})"))
        known = dict(zip(self._lines, self._entries, strict=True))  # lines parsed before are not parsed again
        for number, line in enumerate(text_lines, start=1):
            stripped = line.strip()
            if not stripped:
                continue
            entry = known.get(stripped)
            if entry is None:
                try:
                    entry = _parse_line(stripped)
                except ValueError as exc:
                    problems.append((number, str(exc)))
                    continue
            disk.entries.append(entry)
            disk.lines.append(stripped)  # kept as written: no re-serialising
        if problems:
            number, problem = min(problems)
            disk.bad_lines, disk.first_error = len(problems), f"line {number}: {problem}"
        return disk

    def load(self) -> HistoryLoad:
        """Read the file. A corrupt one is renamed aside and its good lines kept; an unreadable one is left alone
        and writes are refused; returns what was found."""
        with self._lock:
            self._loaded = True
            self.refused = None
            try:
                with self._file_lock():
                    return self._load_locked()
            except HistoryUnavailableError as exc:  # the lock file is a symlink: neither read nor written
                self._entries, self._lines = [], []
                self.refused = str(exc)
                return HistoryLoad(entries=(), problem=self.refused, writable=False)
            except OSError as exc:  # no lock file possible (read-only dir): read only, write nothing
                disk = self._read_disk()
                if disk.unreadable is None and disk.first_error is None:
                    self._entries, self._lines = disk.entries, disk.lines
                    self.refused = f"{self.path}: history cannot be written ({exc.strerror or exc})"
                    return HistoryLoad(entries=tuple(disk.entries), problem=self.refused, writable=False)
                why = disk.unreadable or f"corrupt ({disk.first_error})"
                self.refused = f"{self.path}: history {why} and cannot be set aside ({exc.strerror or exc})"
                self._entries, self._lines = [], []
                return HistoryLoad(entries=(), problem=self.refused + "; left as it is", writable=False)

    def _load_locked(self) -> HistoryLoad:
        disk = self._read_disk()
        if disk.unreadable is not None:
            self._entries, self._lines = [], []
            self.refused = f"{self.path}: cannot read history ({disk.unreadable}); left as it is, nothing is saved"
            return HistoryLoad(entries=(), problem=self.refused, writable=False)
        self._entries, self._lines = disk.entries, disk.lines
        if disk.first_error is None:
            self._disk_id = self._stat_id()
            return HistoryLoad(entries=tuple(disk.entries))
        aside = self._set_aside()
        self._rewrite_locked()
        what = (
            disk.first_error
            if disk.first_error.startswith("the file")
            else f"{disk.bad_lines} bad line{'s' if disk.bad_lines != 1 else ''}, first at {disk.first_error}"
        )
        problem = (
            f"{self.path}: corrupt history ({what}); moved to {aside.name}, kept {len(disk.entries)} good entr"
            f"{'y' if len(disk.entries) == 1 else 'ies'}"
        )
        return HistoryLoad(entries=tuple(self._entries), problem=problem, set_aside_path=aside)

    def _set_aside(self) -> Path:
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(self._clock()))
        aside = self.path.with_name(f"{self.path.name}.corrupt-{stamp}")
        suffix = 1
        while os.path.lexists(aside):
            aside = self.path.with_name(f"{self.path.name}.corrupt-{stamp}-{suffix}")
            suffix += 1
        self.path.rename(aside)  # a rename keeps every byte; the lock keeps two setters-aside apart
        return aside

    def _rewrite_locked(self) -> None:
        kept = _kept_indices(self._entries, self._lines, self.max_entries, self.max_bytes)
        self._entries = [self._entries[i] for i in kept]
        self._lines = [self._lines[i] for i in kept]
        body = "".join(line + "\n" for line in self._lines)
        write_bytes_atomic(self.path, body.encode("utf-8"), follow_links=False)
        self._disk_id = self._stat_id()

    def _refresh_locked(self) -> None:
        """Bring the in-memory entries up to the file as it is now (another process may have written)."""
        if self._disk_id is not None and self._stat_id() == self._disk_id:
            return
        disk = self._read_disk()
        if disk.unreadable is not None:
            self.refused = f"{self.path}: cannot read history ({disk.unreadable}); left as it is, nothing is saved"
            raise HistoryUnavailableError(self.refused)
        self._entries, self._lines = disk.entries, disk.lines
        if disk.first_error is not None:
            aside = self._set_aside()
            self.last_problem = (
                f"{self.path}: corrupt history (first at {disk.first_error}); moved to {aside.name}, "
                f"kept {len(disk.entries)} good entries"
            )

    def append(self, entry: HistoryEntry) -> None:
        """Add one entry: under the file lock, re-read the file, add the entry, rewrite atomically.

        Loads first if `load` was not called; raises `HistoryUnavailableError` (an OSError) when the file could not be
        read, so that it is never replaced by a file that lacks what it held."""
        line = entry.to_json()  # fails on non-JSON payloads before the file is touched
        if not self._loaded:
            self.load()
        with self._lock:
            if self.refused is not None:
                raise HistoryUnavailableError(self.refused)
            with self._file_lock():
                self._refresh_locked()
                self._entries.append(entry)
                self._lines.append(line)
                self._rewrite_locked()

    def record(
        self,
        kind: str,
        key: str,
        payload: Mapping[str, Any],
        recorded_at_s: float | None = None,
        *,
        fingerprint: Fingerprint | None = None,
    ) -> HistoryEntry:
        """Build and append an entry stamped with the clock (or `recorded_at_s`) and `fingerprint`; returns it."""
        entry = HistoryEntry(
            kind=kind,
            key=key,
            recorded_at_s=self._clock() if recorded_at_s is None else recorded_at_s,
            payload=payload,
            fingerprint=fingerprint,
        )
        self.append(entry)
        return entry

    @property
    def entries(self) -> tuple[HistoryEntry, ...]:
        """Every entry, oldest first (the file is loaded on first use)."""
        if not self._loaded:
            self.load()
        with self._lock:
            return tuple(self._entries)

    def latest(self, kind: str, fingerprint: Fingerprint | None = None) -> dict[str, HistoryEntry]:
        """The newest entry of `kind` per key; given a `fingerprint`, only among entries that carry exactly it
        (entries of unknown origin never match one)."""
        newest: dict[str, HistoryEntry] = {}
        for entry in self.entries:
            if entry.kind != kind or (fingerprint is not None and entry.fingerprint != fingerprint):
                continue
            current = newest.get(entry.key)
            if current is None or entry.recorded_at_s >= current.recorded_at_s:
                newest[entry.key] = entry
        return newest

    def fingerprints(self, kind: str | None = None) -> tuple[FingerprintSeen, ...]:
        """Every fingerprint present (None for unknown origin), newest first, with how many entries carry it."""
        counts: dict[Fingerprint | None, int] = {}
        newest: dict[Fingerprint | None, float] = {}
        for entry in self.entries:
            if kind is not None and entry.kind != kind:
                continue
            fp = entry.fingerprint
            counts[fp] = counts.get(fp, 0) + 1
            newest[fp] = max(newest.get(fp, entry.recorded_at_s), entry.recorded_at_s)
        seen = [FingerprintSeen(fingerprint=fp, entries=n, newest_at_s=newest[fp]) for fp, n in counts.items()]
        return tuple(sorted(seen, key=lambda s: s.newest_at_s, reverse=True))

    def other_fingerprints(self, current: Fingerprint | None, kind: str | None = None) -> tuple[FingerprintSeen, ...]:
        """`fingerprints` without `current`: the "other scenarios" whose records never feed the current budget."""
        return tuple(
            seen for seen in self.fingerprints(kind) if seen.fingerprint is None or seen.fingerprint != current
        )
