"""Provides atomic file writes (temp file in the same directory, fsync, rename), so a crash never leaves half a file.

A file that already exists keeps its permission bits, and a path that is a symbolic link is written through: the
link's final target is replaced and the link stays a link (a settings file kept in a dotfiles repository and
linked into the config dir stays linked).
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import tempfile
from pathlib import Path

DEFAULT_MODE = 0o644
"""Permission bits of a file that did not exist before (owner writes, everyone reads), as most editors create."""


def _final_target(path: Path) -> Path:
    """`path` with every symbolic link along it followed (a dangling link gives the path it points at)."""
    return Path(os.path.realpath(path)) if path.is_symlink() else path


def write_bytes_atomic(path: Path, data: bytes, mode: int = DEFAULT_MODE, *, follow_links: bool = True) -> None:
    """Replace `path` with `data` in one rename; readers see the old or the new file, never a mix.

    `mode` applies to a new file only: an existing file keeps its permission bits. Anything but a regular file in
    the way (a device, a FIFO, a directory) raises OSError and is left as it is. Without `follow_links` (state
    files: history, baselines) a symbolic link in the way raises OSError (ELOOP) and is left as it is."""
    if not follow_links and Path(path).is_symlink():
        raise OSError(errno.ELOOP, f"{path} is a symbolic link; state files are never written through a link")
    target = _final_target(Path(path))
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        info = target.stat()
    except FileNotFoundError:
        keep_mode = mode
    else:
        if not stat.S_ISREG(info.st_mode):  # never replace a device, a FIFO or a socket (/dev/null through a link)
            raise OSError(errno.EEXIST, f"{target} exists and is not a regular file; not replaced")
        keep_mode = stat.S_IMODE(info.st_mode)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp_name, keep_mode)
        os.replace(tmp_name, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp_name)
        raise


def write_text_atomic(path: Path, text: str, mode: int = DEFAULT_MODE, *, follow_links: bool = True) -> None:
    """Text flavour of `write_bytes_atomic` (UTF-8)."""
    write_bytes_atomic(path, text.encode("utf-8"), mode, follow_links=follow_links)


def remove_stale_temps(path: Path) -> list[Path]:
    """Remove the temporary files `write_bytes_atomic` left beside `path` when its process was killed mid-write
    (SIGKILL, a power cut); returns those removed. Call it only while holding the lock every writer of `path` holds:
    then no temp file beside it belongs to a live writer."""
    removed: list[Path] = []
    prefix = f".{path.name}."
    try:
        found = list(path.parent.iterdir())
    except OSError:
        return removed
    for stale in found:
        if not (stale.name.startswith(prefix) and stale.name.endswith(".tmp")):
            continue
        with contextlib.suppress(OSError):
            if stat.S_ISREG(os.lstat(stale).st_mode):
                stale.unlink()
                removed.append(stale)
    return removed
