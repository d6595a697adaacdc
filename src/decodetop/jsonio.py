"""Provides the one JSON loader for every file decodetop reads: configs, baselines, history lines, recordings,
traces, plan JSON and ``--diff`` inputs.

Python's `json` accepts things a file from a user or from another machine must not be allowed to do to us: a
document nested 100,000 levels deep raises `RecursionError`; an integer of 5,000 digits raises a bare `ValueError`
(CPython's int/str conversion limit) or, where that limit is off, takes quadratic time; ``NaN`` and ``Infinity``
(and ``1e999``, which parses to infinity) slip through as numbers; an integer of 310 to 4,300 digits is no float
(``float()`` of it raises `OverflowError`, which a reader's ``except ValueError`` misses); invalid UTF-8, a FIFO or
``/dev/zero`` hang or fill memory before any parsing starts. Every reader goes through here, and every one of those
turns into one `decodetop.errors.UserInputError` line naming the file (and the line, for JSON-lines files) and the
problem.

Stdlib only.
"""

from __future__ import annotations

import errno
import fcntl
import json
import math
import os
import stat
import sys
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

from decodetop.errors import UserInputError

DEFAULT_MAX_BYTES = 64 * 1024 * 1024
"""Largest JSON file read whole. The biggest files decodetop writes are history (capped at 16 MiB, see
`decodetop.history.MAX_BYTES`) and plan/budget documents of a few hundred KiB; recordings and traces are read line
by line or through their own bounds."""
MAX_INT_DIGITS = 4300
"""Longest integer literal accepted: CPython's default int/str conversion limit
(https://docs.python.org/3/library/stdtypes.html#int-max-str-digits), applied here even where it is switched off."""
MAX_LINE_BYTES = 4 * 1024 * 1024
"""Longest line of a JSON-lines file (history, recordings) parsed; a longer one counts as a bad line unread."""

_TYPE_WORDS: dict[type, str] = {
    dict: "an object",
    list: "a list",
    str: "a string",
    int: "a number",
    float: "a number",
    bool: "true/false",
    type(None): "null",
}


class JsonInputError(UserInputError):
    """A JSON file or line that cannot be used; the message is one line naming the file, the line and the problem."""

    def __init__(self, source: str, problem: str, line_number: int | None = None) -> None:
        self.source = source
        """The file (or other source) as named in the message."""
        self.problem = problem
        """The problem alone, without the source: for callers that count bad lines."""
        self.line_number = line_number
        """1-based line of a JSON-lines file, or None for a whole document."""
        where = source if line_number is None else f"{source} line {line_number}"
        super().__init__(f"{where}: {problem}")


class _NotFiniteError(ValueError):
    """NaN, Infinity or an overflowing float literal."""


class _TooManyDigitsError(ValueError):
    """An integer literal longer than MAX_INT_DIGITS."""


def _reject_constant(name: str) -> float:
    raise _NotFiniteError(f"{name} is not a finite number")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _NotFiniteError(f"{text[:20]}{'…' if len(text) > 20 else ''} is out of range for a number")
    return value


def _bounded_int(text: str) -> int:
    digits = len(text) - (1 if text.startswith("-") else 0)
    if digits > MAX_INT_DIGITS:
        raise _TooManyDigitsError(f"a number with {digits} digits (more than {MAX_INT_DIGITS})")
    value = int(text)
    if abs(value) > sys.float_info.max:  # every reader makes numbers floats: float() of it raises OverflowError
        raise _NotFiniteError(f"a number with {digits} digits is out of range for a number")
    return value


def type_word(value: object) -> str:
    """ "an object", "a list", "a string"… for messages about the wrong JSON type."""
    return _TYPE_WORDS.get(type(value), type(value).__name__)


def strict_decoder(*, allow_nan: bool = False) -> json.JSONDecoder:
    """A `json.JSONDecoder` for readers that decode piece by piece (`raw_decode`): huge integers and out-of-range
    floats raise ValueError, and so do NaN/Infinity unless `allow_nan` (a reader that skips and counts them);
    deep nesting still raises RecursionError. `problem_of` words any of them."""
    if allow_nan:
        return json.JSONDecoder(parse_int=_bounded_int)
    return json.JSONDecoder(parse_constant=_reject_constant, parse_float=_finite_float, parse_int=_bounded_int)


def problem_of(exc: BaseException) -> str:
    """The one-line problem (without the file) for an exception raised while decoding JSON."""
    return _problem(exc)


def _problem(exc: BaseException) -> str:
    if isinstance(exc, RecursionError):
        return "nested too deeply to read"
    if isinstance(exc, json.JSONDecodeError):
        return f"not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})"
    if isinstance(exc, UnicodeDecodeError):
        return f"not UTF-8 text (bad byte at offset {exc.start})"
    if isinstance(exc, (_NotFiniteError, _TooManyDigitsError)):
        return str(exc)
    if isinstance(exc, ValueError) and "integer string conversion" in str(exc):
        return f"a number with more than {MAX_INT_DIGITS} digits"
    return f"cannot be read as JSON ({type(exc).__name__})"


def parse_json(text: str | bytes, *, source: str, line_number: int | None = None, expect: type | None = None) -> Any:
    """Parse one JSON document (or one line of a JSON-lines file) from `source`.

    Raises `JsonInputError` for anything unusable: bad UTF-8, bad syntax, deep nesting, huge integers, NaN or
    Infinity, or a top-level value that is not of type `expect` (when given)."""
    try:
        if isinstance(text, bytes):
            text = text.decode("utf-8")
        text = text.removeprefix("\ufeff")
        value = json.loads(text, parse_constant=_reject_constant, parse_float=_finite_float, parse_int=_bounded_int)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise JsonInputError(source, _problem(exc), line_number) from None
    if expect is not None and not (isinstance(value, expect) and not (expect is int and isinstance(value, bool))):
        wanted = _TYPE_WORDS.get(expect, expect.__name__)
        raise JsonInputError(source, f"expected {wanted} at the top, found {type_word(value)}", line_number)
    return value


def loads(text: str | bytes, *, source: str, line_number: int | None = None) -> Any:
    """A drop-in for `json.loads` in readers that word syntax errors themselves: `json.JSONDecodeError` passes
    through unchanged, while everything `json.loads` would let through or crash on (deep nesting, huge integers,
    NaN, Infinity, bad UTF-8) becomes a `JsonInputError` naming `source`."""
    try:
        if isinstance(text, bytes):
            text = text.decode("utf-8")
        return json.loads(text, parse_constant=_reject_constant, parse_float=_finite_float, parse_int=_bounded_int)
    except json.JSONDecodeError:
        raise
    except (ValueError, RecursionError) as exc:
        raise JsonInputError(source, _problem(exc), line_number) from None


def dumps_strict(value: object) -> str:
    """The JSON text of `value`, refusing NaN and Infinity (what `parse_json` would refuse to read back)."""
    return json.dumps(value, allow_nan=False)


SYMLINK_REFUSED = "a symbolic link; state files are never read or written through a link"
"""Why a state file (history, its lock, a check baseline) that is a symlink is refused: in a shared state dir,
whoever can write the directory could point it at another of the user's files."""


def read_bounded(path: Path | str, *, max_bytes: int = DEFAULT_MAX_BYTES, follow_links: bool = True) -> bytes:
    """Read a regular file whole, at most `max_bytes`; anything else is a `UserInputError`
    ``"<path>: cannot read: <reason>"``.

    A FIFO, a device such as ``/dev/zero`` or a directory is refused from its `fstat` before a byte is read (the
    open is non-blocking, so a FIFO without a writer does not hang). Without `follow_links` (state files) a
    symbolic link is refused too (`O_NOFOLLOW`), with `SYMLINK_REFUSED` as the reason."""
    target = Path(path)

    def refuse(reason: str) -> UserInputError:
        return UserInputError(f"{target}: cannot read: {reason}")

    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow_links else os.O_NOFOLLOW)
    try:
        fd = os.open(target, flags)
    except OSError as exc:
        if exc.errno == errno.ELOOP and not follow_links:
            raise refuse(SYMLINK_REFUSED) from None
        raise refuse(exc.strerror or errno.errorcode.get(exc.errno or 0, "error")) from None
    try:
        info = os.fstat(fd)
        if stat.S_ISDIR(info.st_mode):
            raise refuse(os.strerror(errno.EISDIR))
        if not stat.S_ISREG(info.st_mode):
            raise refuse(f"{file_kind(info.st_mode)}, not a regular file")
        too_large = f"larger than {max_bytes} bytes"
        if info.st_size > max_bytes:
            raise refuse(too_large)
        chunks: list[bytes] = []
        total = 0
        while total <= max_bytes:
            chunk = os.read(fd, min(1024 * 1024, max_bytes + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
        if total > max_bytes:  # grew while being read
            raise refuse(too_large)
        return b"".join(chunks)
    except OSError as exc:
        raise refuse(exc.strerror or "error") from None
    finally:
        os.close(fd)


GZIP_MAGIC = b"\x1f\x8b"
"""The first two bytes of a gzip member (RFC 1952, section 2.3.1: https://www.rfc-editor.org/rfc/rfc1952)."""


def read_maybe_gzip(path: Path | str, *, max_bytes: int = DEFAULT_MAX_BYTES) -> bytes:
    """`read_bounded`, and where the file is gzip-compressed (its first bytes are `GZIP_MAGIC`, whatever its name)
    the bytes it decompresses to, at most `max_bytes` of them: a crafted member that inflates beyond that (a
    "zip bomb") is refused after `max_bytes` + 1 bytes, never inflated whole. Benchmark results are stored this way
    to keep the repository small. A truncated or corrupt member, or bytes after it, is a `UserInputError`
    ``"<path>: cannot read: <reason>"``."""
    raw = read_bounded(path, max_bytes=max_bytes)
    if not raw.startswith(GZIP_MAGIC):
        return raw

    def refuse(reason: str) -> UserInputError:
        return UserInputError(f"{path}: cannot read: {reason}")

    inflater = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)  # 16 +: a gzip header and trailer (zlib manual)
    try:
        out = inflater.decompress(raw, max_bytes + 1)
    except zlib.error as exc:
        raise refuse(f"corrupt gzip data ({exc})") from None
    if len(out) > max_bytes or inflater.unconsumed_tail:
        raise refuse(f"decompresses to more than {max_bytes} bytes")
    if not inflater.eof:
        raise refuse("truncated gzip data")
    if inflater.unused_data:
        raise refuse("bytes after the gzip data")
    return out


def open_regular(path: Path | str) -> BinaryIO:
    """Open a regular file for reading in binary mode, for readers that stream (traces, recordings). A FIFO, a
    device or a directory is refused from its `fstat` (the open does not block): `UserInputError`
    ``"<path>: cannot read: <reason>"``."""
    target = Path(path)
    try:
        fd = os.open(target, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise UserInputError(f"{target}: cannot read: {exc.strerror or exc}") from None
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise UserInputError(f"{target}: cannot read: {os.strerror(errno.EISDIR)}")
        if not stat.S_ISREG(mode):
            raise UserInputError(f"{target}: cannot read: {file_kind(mode)}, not a regular file")
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def bounded_lines(handle: BinaryIO, max_line_bytes: int = MAX_LINE_BYTES) -> Iterator[bytes | None]:
    """The lines of a binary stream, each read with at most `max_line_bytes` in memory; a longer line is skipped to
    its end and given as None (the caller counts it as a bad line)."""
    while True:
        line = handle.readline(max_line_bytes + 1)
        if not line:
            return
        if len(line) <= max_line_bytes or line.endswith(b"\n"):
            yield line
            continue
        while line and not line.endswith(b"\n"):  # drop the rest of the over-long line, a chunk at a time
            line = handle.readline(max_line_bytes + 1)
        yield None


def file_kind(mode: int) -> str:
    """ "a directory", "a FIFO", "a character device"… for messages about a path that is not a regular file."""
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def load_json(path: Path | str, *, expect: type | None = dict, max_bytes: int = DEFAULT_MAX_BYTES) -> Any:
    """Read and parse a whole JSON file; its top level must be of type `expect` (an object unless told)."""
    raw = read_bounded(path, max_bytes=max_bytes)
    return parse_json(raw, source=str(path), expect=expect)


def load_json_object(path: Path | str, *, max_bytes: int = DEFAULT_MAX_BYTES) -> dict[str, Any]:
    """`load_json` for the usual case: a file whose top level is an object."""
    value: dict[str, Any] = load_json(path, expect=dict, max_bytes=max_bytes)
    return value


def iter_json_lines(
    text: str, *, source: str, expect: type | None = dict, max_line_bytes: int = MAX_LINE_BYTES
) -> Iterator[tuple[int, Any | JsonInputError]]:
    """Each non-blank line of a JSON-lines text as (line number, parsed value or the error for that line).

    Bad lines are handed back, not raised, so a reader can count and skip them; a line longer than
    `max_line_bytes` is reported without being parsed."""
    for number, line in enumerate(text.split("\n"), start=1):  # "\n" only: JSON strings may hold U+2028
        if not line.strip():
            continue
        if len(line) > max_line_bytes:
            yield number, JsonInputError(source, f"line longer than {max_line_bytes // (1024 * 1024)} MiB", number)
            continue
        try:
            yield number, parse_json(line, source=source, line_number=number, expect=expect)
        except JsonInputError as exc:
            yield number, exc
