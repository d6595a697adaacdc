"""Provides a recording's bytes on disk: gzip written a line at a time under a lock, and read back bounded.

A recording is gzip-compressed JSON lines (`zcat rec.jsonl.gz` shows them). Each session appends its own gzip
member (RFC 1952 allows several in a row; `zcat` reads them all). Every line ends with a sync flush, so what is on
disk always decompresses up to the last whole line: a session killed mid-way (no gzip trailer) still replays up to
its last tick. The writer holds an exclusive `flock` on the file while it records, so a second process recording to
the same file is refused at once instead of interleaving its compressed bytes with the first one's.

Reading (`RecordingBytes`) takes plain JSON lines (what decodetop wrote before recordings were compressed) or gzip,
by the file's first bytes. Decompression is bounded (`MAX_DECOMPRESSED_BYTES`: a gzip bomb stops there, one line
naming the file); damaged compressed data keeps the lines before it, skips to the next session's gzip member where
there is one, and says so in one line.
"""

from __future__ import annotations

import errno
import fcntl
import os
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

from decodetop import jsonio
from decodetop.errors import UserInputError

GZIP_MAGIC = b"\x1f\x8b"
_GZIP_MEMBER_START = b"\x1f\x8b\x08"
"""The magic and the deflate method byte: where a later session's member starts."""
_GZIP_WBITS = 31
"""zlib's window bits for a gzip wrapper with the largest window (zlib manual: 16 + 15)."""
MAX_DECOMPRESSED_BYTES = 1024 * 1024 * 1024
"""The most a replay decompresses (1 GiB): delta lines of 8 GPUs run ~1.4 KB a tick uncompressed, so this is days of
telemetry; 1 GiB of blanks in 1 MB of gzip (a bomb) stops here."""
_CHUNK_BYTES = 64 * 1024
_RESYNC_LOOKBACK_BYTES = 16
"""How far before the failing byte a later session's member may start: deflate fails within a few bytes of a gzip
header it is fed as data."""
_OUT_CHUNK_BYTES = 1024 * 1024
"""The most one decompression step returns: a bomb is counted as it unpacks, never held whole."""


def open_for_append(path: Path) -> BinaryIO:
    """`path` opened to append a gzip member, locked for this process; UserInputError (one line) when it cannot be
    opened, another process records to it, or it holds something else than a compressed recording."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
    except OSError as exc:
        raise UserInputError(f"--record {path}: cannot open for appending ({exc.strerror or exc})") from None
    handle = os.fdopen(fd, "ab", buffering=0)
    try:
        _lock(path, fd)
        _check_appendable(path)
    except BaseException:
        handle.close()
        raise
    return handle


def _lock(path: Path, fd: int) -> None:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            raise UserInputError(
                f"--record {path}: another process is recording to it; record to another file"
            ) from None
        raise UserInputError(f"--record {path}: cannot lock ({exc.strerror or exc})") from None


def _check_appendable(path: Path) -> None:
    """An empty file or a compressed recording takes another session; anything else is left as it is."""
    try:
        with path.open("rb") as handle:
            head = handle.read(2)
    except OSError as exc:
        raise UserInputError(f"--record {path}: cannot read ({exc.strerror or exc})") from None
    if not head or head == GZIP_MAGIC:
        return
    if head[:1] == b"{":
        raise UserInputError(
            f"--record {path}: holds an uncompressed recording of an earlier decodetop; recordings are gzip now and "
            "are not appended to it: record to another file (that one still replays)"
        )
    raise UserInputError(f"--record {path}: exists and is not a decodetop recording; not appended to")


class LineCompressor:
    """One gzip member, a line at a time: each `line` returns bytes that end on a sync flush, so a reader gets every
    whole line written so far; `finish` returns the member's end (its CRC and length)."""

    def __init__(self) -> None:
        self._zlib = zlib.compressobj(6, zlib.DEFLATED, _GZIP_WBITS)

    def line(self, text: str) -> bytes:
        """The compressed bytes of one line (a newline is added)."""
        return self._zlib.compress(text.encode("utf-8") + b"\n") + self._zlib.flush(zlib.Z_SYNC_FLUSH)

    def finish(self) -> bytes:
        """The member's last bytes."""
        return self._zlib.flush(zlib.Z_FINISH)


class RecordingBytes:
    """A recording's lines, plain or gzip, read as a stream; `problems` collects what went wrong in the compressed
    data (one line each), `compressed` says which it was."""

    def __init__(self, path: Path, *, max_decompressed_bytes: int | None = None) -> None:
        self.path = path
        self.max_decompressed_bytes = (
            MAX_DECOMPRESSED_BYTES if max_decompressed_bytes is None else max_decompressed_bytes
        )
        self.compressed = False
        self.problems: list[str] = []

    def lines(self) -> Iterator[bytes | None]:
        """Each line without its newline; None for a line over `jsonio.MAX_LINE_BYTES` (skipped unread). The last
        piece is yielded even without a newline (a line cut mid-write)."""
        handle = _open_regular(self.path)
        with handle:
            head = handle.read(2)
            handle.seek(0)
            if head != GZIP_MAGIC:
                yield from _split_lines(iter(lambda: handle.read(_CHUNK_BYTES), b""))
                return
            self.compressed = True
            yield from _split_lines(self._decompressed(handle))

    def _decompressed(self, handle: BinaryIO) -> Iterator[bytes]:
        """The decompressed bytes of every gzip member in turn, bounded; damaged data skipped to the next member. A
        last member without its end (a session killed, or still recording) gives what it holds."""
        total = 0
        consumed = 0  # compressed bytes handled before `data`
        fed_this_member = 0
        inflater = zlib.decompressobj(_GZIP_WBITS)
        data = b""
        while True:
            if not data and not (data := handle.read(_CHUNK_BYTES)):
                break
            before = inflater.copy()
            try:
                out = inflater.decompress(data, _OUT_CHUNK_BYTES)
            except zlib.error as exc:
                good, at = _up_to_damage(before, data)
                total += len(good)
                yield good
                why = str(exc).removeprefix("Error -3 while decompressing data: ")
                resumed = self._resync(handle, data, consumed, at, why)
                if resumed is None:
                    return
                data, consumed = resumed
                inflater, fed_this_member = zlib.decompressobj(_GZIP_WBITS), 0
                yield b"\n"  # the line cut by the damage ends here; the next session's lines start clean
                continue
            total += len(out)
            if total > self.max_decompressed_bytes:
                raise UserInputError(
                    f"--replay {self.path}: more than {self.max_decompressed_bytes:,} bytes once decompressed, over "
                    "the limit decodetop replays (a gzip bomb, or a recording of many days: record shorter sessions)"
                )
            if out:
                yield out
            rest = inflater.unused_data if inflater.eof else inflater.unconsumed_tail
            fed_this_member += len(data) - len(rest)
            consumed += len(data) - len(rest)
            data = rest
            if inflater.eof:
                inflater, fed_this_member = zlib.decompressobj(_GZIP_WBITS), 0
        if fed_this_member and total == 0:
            self.problems.append(f"{self.path.name}: truncated gzip data (it ends before its first line)")

    def _resync(
        self, handle: BinaryIO, data: bytes, consumed: int, damage_at: int, why: str
    ) -> tuple[bytes, int] | None:
        """The bytes from the next gzip member's start after the damage at `data[damage_at]` (noted in `problems`)
        and their offset in the file, or None where no member follows."""
        at = f"{self.path.name}: compressed data cut or damaged after byte {consumed + damage_at:,} ({why})"
        base, search_from = consumed, max(1, damage_at - _RESYNC_LOOKBACK_BYTES)
        while (start := data.find(_GZIP_MEMBER_START, search_from)) < 0:
            chunk = handle.read(_CHUNK_BYTES)
            if not chunk:
                self.problems.append(f"{at}; the rest of the file was not read")
                return None
            keep = data[-(len(_GZIP_MEMBER_START) - 1) :]
            base += len(data) - len(keep)
            data, search_from = keep + chunk, 0
        self.problems.append(f"{at}; skipped {base + start - consumed:,} bytes to the next session")
        return data[start:], base + start


def _up_to_damage(inflater: Any, data: bytes) -> tuple[bytes, int]:
    """What `inflater` gives from `data` before the byte that fails, and that byte's index: fed byte by byte (only
    after a failure, so the lines before the damage are kept; zlib drops the output of a call that fails)."""
    out: list[bytes] = []
    for index in range(len(data)):
        try:
            out.append(inflater.decompress(data[index : index + 1]))
        except zlib.error:
            return b"".join(out), index
    return b"".join(out), len(data)


def _open_regular(path: Path) -> BinaryIO:
    """`path` opened for reading, refused in one line unless it is a regular file."""
    if path.exists() and not path.is_dir() and not path.is_file():  # a FIFO would block, a device never end
        raise UserInputError(f"--replay {path}: not a regular file")
    try:
        return path.open("rb")
    except FileNotFoundError:
        raise UserInputError(f"--replay {path}: no such file") from None
    except IsADirectoryError:
        raise UserInputError(f"--replay {path}: is a directory") from None
    except OSError as exc:
        raise UserInputError(f"--replay {path}: cannot read ({exc.strerror or exc})") from None


def _split_lines(chunks: Iterator[bytes]) -> Iterator[bytes | None]:
    """The lines of a byte stream; a line over `jsonio.MAX_LINE_BYTES` is None and never held whole."""
    limit = jsonio.MAX_LINE_BYTES
    buffer = b""
    skipping = False
    for chunk in chunks:
        buffer += chunk
        start = 0
        while (end := buffer.find(b"\n", start)) >= 0:
            if not skipping:
                yield None if end - start > limit else buffer[start:end]
            skipping, start = False, end + 1
        buffer = buffer[start:]
        if len(buffer) > limit:
            if not skipping:
                yield None
            skipping, buffer = True, b""
    if buffer and not skipping:
        yield buffer
