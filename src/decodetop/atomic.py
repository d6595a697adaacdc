"""Provides atomic file writes (temp file in the same directory, fsync, rename), so a crash never leaves half a file."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path


def write_bytes_atomic(path: Path, data: bytes, mode: int = 0o644) -> None:
    """Replace `path` with `data` in one rename; readers see the old or the new file, never a mix."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp_name, mode)
        os.replace(tmp_name, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp_name)
        raise


def write_text_atomic(path: Path, text: str, mode: int = 0o644) -> None:
    """Text flavour of `write_bytes_atomic` (UTF-8)."""
    write_bytes_atomic(path, text.encode("utf-8"), mode)


def append_line_atomic(path: Path, line: str) -> None:
    """Append one line by rewriting the file atomically: an interrupted append never truncates what was there."""
    path = Path(path)
    old = path.read_bytes() if path.exists() else b""
    if old and not old.endswith(b"\n"):
        old += b"\n"
    write_bytes_atomic(path, old + line.rstrip("\n").encode("utf-8") + b"\n")
