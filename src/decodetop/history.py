"""Provides the results history: every probe result and baseline, one JSON object per line, under the state dir.

The live UI appends each finished probe and each saved baseline, and reads the file back at start so the last
values show at once with their age. Appends rewrite the file atomically (`decodetop.atomic`), so an interrupted
write leaves the old file whole. A file that cannot be parsed is never truncated: it is renamed aside
(``history.jsonl.corrupt-<UTC time>``), the lines that did parse are written to a fresh file, and the problem is
reported as one line in `HistoryLoad.problem`.

Stdlib only.
"""

from __future__ import annotations

import json
import math
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from decodetop import paths
from decodetop.atomic import write_bytes_atomic

HISTORY_FILE_NAME = "history.jsonl"
FORMAT_VERSION = 1
MAX_ENTRIES = 5000
"""Entries kept when the file is rewritten; the oldest go first."""
MAX_BYTES = 16 * 1024 * 1024
"""And at most this much JSON (each append rewrites the file atomically, so it must stay small)."""

KIND_PROBE = "probe"
KIND_BASELINE = "baseline"


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

    def to_json(self) -> str:
        """One line of JSON (no newline)."""
        return json.dumps(
            {"v": FORMAT_VERSION, "kind": self.kind, "key": self.key, "at": self.recorded_at_s, "data": self.payload},
            sort_keys=True,
            separators=(",", ":"),
            allow_nan=False,
        )

    @classmethod
    def from_json(cls, line: str) -> HistoryEntry:
        """Parse one line; raise ValueError saying what is wrong with it."""
        obj = json.loads(line)
        if not isinstance(obj, dict):
            raise ValueError("not a JSON object")
        kind, key, at, data = obj.get("kind"), obj.get("key"), obj.get("at"), obj.get("data", {})
        if not isinstance(kind, str) or not kind:
            raise ValueError("missing 'kind'")
        if not isinstance(key, str) or not key:
            raise ValueError("missing 'key'")
        if isinstance(at, bool) or not isinstance(at, (int, float)) or not math.isfinite(at):
            raise ValueError("missing or bad 'at' time")
        if not isinstance(data, dict):
            raise ValueError("'data' is not an object")
        return cls(kind=kind, key=key, recorded_at_s=float(at), payload=data)

    def age_s(self, now_s: float) -> float:
        """Seconds since the entry was recorded (0 for entries from the future, e.g. after a clock step)."""
        return max(0.0, now_s - self.recorded_at_s)


@dataclass(frozen=True)
class HistoryLoad:
    """What reading the history file found."""

    entries: tuple[HistoryEntry, ...]
    """Every entry that parsed, oldest first."""
    problem: str | None = None
    """One line describing a corrupt file, or None."""
    set_aside_path: Path | None = None
    """Where the corrupt file was moved, if it was."""


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


def format_age_coarse(age_s: float) -> str:
    """`format_age` in 10 s steps under a minute ("now", "10s" … "50s"): a live screen showing it changes at most
    every 10 s (each change repaints a table)."""
    if age_s < 60:
        return "now" if age_s < 10 else f"{int(age_s // 10) * 10}s"
    return format_age(age_s)


class History:
    """The history file: load once, append from any thread (a lock serialises writers in this process)."""

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
        """Each entry's JSON line, kept so an append serialises one entry, not the whole history."""
        self._loaded = False

    def load(self) -> HistoryLoad:
        """Read the file. A corrupt one is renamed aside and its good lines kept; returns what was found."""
        with self._lock:
            self._loaded = True
            try:
                raw = self.path.read_bytes()
            except FileNotFoundError:
                self._entries, self._lines = [], []
                return HistoryLoad(entries=())
            except OSError as exc:
                self._entries, self._lines = [], []
                return HistoryLoad(entries=(), problem=f"{self.path}: cannot read history ({exc.strerror})")
            entries: list[HistoryEntry] = []
            lines: list[str] = []
            first_error: str | None = None
            bad_lines = 0
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                text = ""
                first_error = "not UTF-8 text"
                bad_lines = 1
            for number, line in enumerate(text.splitlines(), start=1):
                if not line.strip():
                    continue
                try:
                    entries.append(HistoryEntry.from_json(line))
                    lines.append(line.strip())
                except ValueError as exc:  # json.JSONDecodeError is a ValueError
                    bad_lines += 1
                    if first_error is None:
                        first_error = f"line {number}: {exc}"
            self._entries, self._lines = entries, lines
            if first_error is None:
                return HistoryLoad(entries=tuple(entries))
            aside = self._set_aside()
            self._rewrite_locked()
            problem = (
                f"{self.path}: corrupt history ({bad_lines} bad line{'s' if bad_lines != 1 else ''}, first at "
                f"{first_error}); moved to {aside.name}, kept {len(entries)} good entr"
                f"{'y' if len(entries) == 1 else 'ies'}"
            )
            return HistoryLoad(entries=tuple(entries), problem=problem, set_aside_path=aside)

    def _set_aside(self) -> Path:
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(self._clock()))
        aside = self.path.with_name(f"{self.path.name}.corrupt-{stamp}")
        suffix = 1
        while aside.exists():
            aside = self.path.with_name(f"{self.path.name}.corrupt-{stamp}-{suffix}")
            suffix += 1
        os.replace(self.path, aside)
        return aside

    def _rewrite_locked(self) -> None:
        keep = min(len(self._lines), self.max_entries)
        size = 0
        for count, line in enumerate(reversed(self._lines), start=1):
            size += len(line) + 1
            if count > keep or (size > self.max_bytes and count > 1):
                keep = count - 1
                break
        self._entries = self._entries[len(self._entries) - keep :] if keep else []
        self._lines = self._lines[len(self._lines) - keep :] if keep else []
        body = "".join(line + "\n" for line in self._lines)
        write_bytes_atomic(self.path, body.encode("utf-8"))

    def append(self, entry: HistoryEntry) -> None:
        """Add one entry and rewrite the file atomically. Loads first if `load` was not called."""
        line = entry.to_json()  # fails on non-JSON payloads before the file is touched
        if not self._loaded:
            self.load()
        with self._lock:
            self._entries.append(entry)
            self._lines.append(line)
            self._rewrite_locked()

    def record(
        self, kind: str, key: str, payload: Mapping[str, Any], recorded_at_s: float | None = None
    ) -> HistoryEntry:
        """Build and append an entry stamped with the clock (or `recorded_at_s`); returns it."""
        entry = HistoryEntry(
            kind=kind, key=key, recorded_at_s=self._clock() if recorded_at_s is None else recorded_at_s, payload=payload
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

    def latest(self, kind: str) -> dict[str, HistoryEntry]:
        """The newest entry of `kind` per key."""
        newest: dict[str, HistoryEntry] = {}
        for entry in self.entries:
            if entry.kind == kind:
                current = newest.get(entry.key)
                if current is None or entry.recorded_at_s >= current.recorded_at_s:
                    newest[entry.key] = entry
        return newest
