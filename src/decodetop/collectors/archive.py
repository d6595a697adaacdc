"""Provides the `decodetop check --collect` archive: `RecordingRoot` and `write_collect_tarball` pack exactly the
files the checks read; `unpack_collected` reads such an archive back, safely, for `decodetop check --root FILE`.

What is recorded: every file read (PCI `config` as `config.hex` text), every directory listed (unread entries as
empty placeholders of the right type), every symlink crossed, device numbers (`dev/.rdev`), open-probe outcomes
(`dev/.open`), the kernel log (`dev/kmsg`) and second samples of counters (`.later/`). /proc/1/environ is reduced
to its `container=` entry: the rest of init's environment may hold secrets.

Layout: `decodetop-collect/root/<host tree>` and `decodetop-collect/findings.json`.

Reading treats the archive as hostile (it may come from anyone): never `extractall`; only regular files,
directories and symlinks; no hard links, devices, FIFOs or sparse files; symlinks made last and only pointing
inside the tree; capped member count, file size and total size; no chown, chmod or utime. docs/hostile-input.md
lists every refusal.
"""

from __future__ import annotations

import contextlib
import errno as errno_mod
import gzip
import io
import json
import os
import signal
import stat
import tarfile
import tempfile
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO, Protocol

from decodetop.collectors.hostroot import (
    KMSG_FILE,
    KMSG_UNREADABLE_FILE,
    LATER_DIR,
    MAX_FILE_BYTES,
    OPEN_SIDE_FILE,
    OUTCOME_PREFIX,
    RDEV_SIDE_FILE,
    DeviceNumber,
    HostReadError,
    HostRoot,
    KmsgUnreadableError,
    OpenProbe,
)
from decodetop.errors import UserInputError

if TYPE_CHECKING:
    from _typeshed import WriteableBuffer

ARCHIVE_TOP = "decodetop-collect"
ROOT_IN_ARCHIVE = f"{ARCHIVE_TOP}/root"
_MAX_LINK_DEPTH = 40
"""Same bound as the kernel's MAXSYMLINKS."""


@dataclass
class _Recording:
    files: dict[str, bytes] = field(default_factory=dict)
    dirs: set[str] = field(default_factory=set)
    placeholders: dict[str, str] = field(default_factory=dict)
    """path → 'file' or 'dir': entries seen in a listing or an existence test but never read."""
    links: dict[str, str] = field(default_factory=dict)
    rdev: dict[str, DeviceNumber] = field(default_factory=dict)
    opens: dict[str, OpenProbe] = field(default_factory=dict)
    kmsg: list[str] | None = None
    kmsg_error: str | None = None
    """`ERRNO message` where the host's kernel log could not be read (packed as KMSG_UNREADABLE_FILE)."""
    later: dict[str, bytes] = field(default_factory=dict)
    outcomes: dict[str, str] = field(default_factory=dict)
    """name → the one line `HostRoot.record_outcome` was given (NVML's init outcome)."""


def _redact_environ(data: bytes) -> bytes:
    """Keep only `container=` from init's environment (the one entry the checks use)."""
    kept = [item for item in data.split(b"\0") if item.startswith(b"container=")]
    return b"\0".join(kept) + (b"\0" if kept else b"")


class RecordingRoot(HostRoot):
    """A `HostRoot` that remembers every path the checks touch, so they can be packed for review.

    Meant for the live host; over a copied tree it re-packs what the checks read there (used by the tests).
    """

    def __init__(self, base: str | os.PathLike[str] = "/") -> None:
        super().__init__(base)
        self.recording = _Recording()

    # -- recording helpers ------------------------------------------------------------------------------------

    def _real(self, host_path: str) -> str:
        """Canonical host path ('/sys/devices/...') of `host_path`, recording each symlink crossed on the way."""
        self._record_links(host_path, 0)
        return HostRoot.realpath(self, host_path)

    def _record_links(self, host_path: str, depth: int) -> None:
        if depth > _MAX_LINK_DEPTH:
            return
        parts = self._norm(host_path).split("/")
        base = str(self.base).rstrip("/")
        for i in range(1, len(parts) + 1):
            prefix = "/" + "/".join(parts[:i])
            full = Path(base + prefix)
            if full.is_symlink():
                parent_real = str(full.parent.resolve()).removeprefix(base)
                link_at = (parent_real.rstrip("/") + "/" + parts[i - 1]).lstrip("/")
                if link_at not in self.recording.links:
                    target = str(full.readlink())
                    self.recording.links[link_at] = target
                    joined = target if target.startswith("/") else str(Path(prefix).parent / target)
                    self._record_links(os.path.normpath(joined), depth + 1)

    # -- overridden reads -------------------------------------------------------------------------------------

    def read_bytes(self, rel: str, max_bytes: int | None = None) -> bytes:
        """Read and record."""
        real = self._real(rel)
        data = super().read_bytes(rel, max_bytes)
        if real == "/proc/1/environ":
            self.recording.files[real.lstrip("/")] = _redact_environ(data)
        else:
            self.recording.files[real.lstrip("/")] = data
        return data

    def read_text_later(self, rel: str) -> str:
        """Second sample, recorded under `.later/`."""
        real = self._real(rel)
        text = super().read_text_later(rel)
        self.recording.later[real.lstrip("/")] = text.encode("utf-8")
        return text

    def listdir(self, rel: str) -> list[str]:
        """List and record the directory with typed placeholders for its entries."""
        real = self._real(rel)
        names = super().listdir(rel)
        key = real.lstrip("/")
        self.recording.dirs.add(key)
        full_dir = str(self.base).rstrip("/") + real
        for name in names:
            child = f"{key}/{name}" if key else name
            full = Path(full_dir) / name
            if full.is_symlink():
                self._record_links(f"{real}/{name}", 0)
            elif full.is_dir():
                self.recording.placeholders.setdefault(child, "dir")
            else:
                self.recording.placeholders.setdefault(child, "file")
        return names

    def exists(self, rel: str) -> bool:
        """Test and record a placeholder for what exists."""
        found = super().exists(rel)
        if found:
            real = self._real(rel)
            self.recording.placeholders.setdefault(
                real.lstrip("/"), "dir" if Path(str(self.base).rstrip("/") + real).is_dir() else "file"
            )
        return found

    def is_dir(self, rel: str) -> bool:
        """Test and record."""
        found = super().is_dir(rel)
        if found:
            self.recording.placeholders.setdefault(self._real(rel).lstrip("/"), "dir")
        return found

    def realpath(self, rel: str) -> str:
        """Resolve and record the symlinks crossed."""
        self._record_links(rel, 0)
        return super().realpath(rel)

    def stat_rdev(self, rel: str) -> DeviceNumber | None:
        """Stat and record into dev/.rdev."""
        number = super().stat_rdev(rel)
        if number is not None:
            self.recording.rdev[self._norm(rel).removeprefix("dev/")] = number
        return number

    def open_probe(self, rel: str) -> OpenProbe:
        """Probe and record into dev/.open."""
        outcome = super().open_probe(rel)
        self.recording.opens[self._norm(rel).removeprefix("dev/")] = outcome
        return outcome

    def record_outcome(self, name: str, line: str) -> None:
        """Keep the outcome for the side file `.<name>`."""
        self.recording.outcomes[name] = line

    def read_kmsg(self) -> list[str]:
        """Read and record the kernel log, or why it could not be read (a replay says the same)."""
        try:
            records = super().read_kmsg()
        except KmsgUnreadableError as exc:
            name = errno_mod.errorcode.get(exc.errno or 0, "EIO")
            self.recording.kmsg_error = f"{name} {exc}"
            raise
        self.recording.kmsg = records
        return records

    # -- packing ----------------------------------------------------------------------------------------------

    def tree_members(self) -> dict[str, tuple[str, bytes | str]]:
        """Archive members (path under the tree → ('file', bytes) | ('dir', '') | ('link', target))."""
        rec = self.recording
        members: dict[str, tuple[str, bytes | str]] = {}
        for path, data in rec.files.items():
            if path.startswith("sys/devices/") and path.endswith("/config"):
                members[path + ".hex"] = ("file", _hexdump(data))
            else:
                members[path] = ("file", data)
        for path, target in rec.links.items():
            members[path] = ("link", target)
        for path in rec.dirs:
            if path and path not in members:
                members[path] = ("dir", "")
        for path, kind in rec.placeholders.items():
            if path and path not in members and path + ".hex" not in members:
                members[path] = ("dir", "") if kind == "dir" else ("file", b"")
        if rec.kmsg is None and members.get(KMSG_FILE) == ("file", b""):
            del members[KMSG_FILE]  # the device node seen in a listing is no empty log: a replay says "not collected"
        members.update(self._side_files())
        for path, data in rec.later.items():
            members[f"{LATER_DIR}/{path}"] = ("file", data)
        _parents_stay_dirs(members)
        return members

    def _side_files(self) -> dict[str, tuple[str, bytes | str]]:
        """dev/.rdev, dev/.open, dev/kmsg and the `.<name>` outcomes: what plain files cannot carry (see hostroot)."""
        rec = self.recording
        out: dict[str, tuple[str, bytes | str]] = {}
        if rec.rdev:
            lines = [f"{name} {n.kind} {n.major} {n.minor}" for name, n in sorted(rec.rdev.items())]
            out[RDEV_SIDE_FILE] = ("file", ("\n".join(lines) + "\n").encode())
        if rec.opens:
            lines = [f"{name} {'ok' if o.ok else o.errno_name}" for name, o in sorted(rec.opens.items())]
            out[OPEN_SIDE_FILE] = ("file", ("\n".join(lines) + "\n").encode())
        if rec.kmsg is not None:
            out[KMSG_FILE] = ("file", ("\n".join(rec.kmsg) + "\n").encode())
        for name, line in sorted(rec.outcomes.items()):
            out[OUTCOME_PREFIX + name] = ("file", (line + "\n").encode())
        if rec.kmsg_error is not None:
            out[KMSG_UNREADABLE_FILE] = ("file", (rec.kmsg_error.replace("\n", " ") + "\n").encode())
        return out


def _parents_stay_dirs(members: dict[str, tuple[str, bytes | str]]) -> None:
    """A directory that is also a parent of a recorded link target must stay a directory, not a placeholder file."""
    parents = {"/".join(p.split("/")[:i]) for p in members for i in range(1, p.count("/") + 1)}
    for parent in parents:
        entry = members.get(parent)
        if entry is not None and entry[0] == "file" and not entry[1]:
            members[parent] = ("dir", "")


def _hexdump(data: bytes) -> bytes:
    """Config space as hex text, 16 bytes a line (what HostRoot decodes from `config.hex`)."""
    lines = [data[i : i + 16].hex(" ") for i in range(0, len(data), 16)]
    return ("\n".join(lines) + "\n").encode()


class _TarWriter:
    """Adds members under `decodetop-collect/root/`, each parent directory once, all dated `mtime`."""

    def __init__(self, tar: tarfile.TarFile, mtime: int) -> None:
        self.tar = tar
        self.mtime = mtime
        self.dirs_added: set[str] = set()

    def add_dir(self, path: str) -> None:
        """Directory `path` (relative to the tree's root, '' for the root) and every parent not added yet."""
        parts = path.split("/") if path else []
        for i in range(len(parts) + 1):
            sub = "/".join(parts[:i])
            if sub in self.dirs_added:
                continue
            self.dirs_added.add(sub)
            info = tarfile.TarInfo(f"{ROOT_IN_ARCHIVE}/{sub}" if sub else ROOT_IN_ARCHIVE)
            info.type = tarfile.DIRTYPE
            info.mode = 0o755
            info.mtime = self.mtime
            self.tar.addfile(info)

    def add(self, path: str, kind: str, payload: bytes | str) -> None:
        """One member of `RecordingRoot.tree_members`."""
        if "/" in path:
            self.add_dir(path.rsplit("/", 1)[0])
        if kind == "dir":
            self.add_dir(path)
            return
        info = tarfile.TarInfo(f"{ROOT_IN_ARCHIVE}/{path}")
        info.mtime = self.mtime
        if kind == "link":
            info.type = tarfile.SYMTYPE
            info.linkname = str(payload)
            self.tar.addfile(info)
            return
        self.add_bytes(info, payload if isinstance(payload, bytes) else str(payload).encode())

    def add_bytes(self, info: tarfile.TarInfo, data: bytes) -> None:
        """A regular file member holding `data`."""
        info.size = len(data)
        info.mode = 0o644
        info.mtime = self.mtime
        self.tar.addfile(info, io.BytesIO(data))


def write_collect_tarball(root: RecordingRoot, out_path: Path, findings: object) -> int:
    """Pack what `root` recorded plus the findings into `out_path` (tar.gz, written atomically); returns the
    member count."""
    members = root.tree_members()
    out_path = Path(out_path)
    if out_path.is_dir():
        raise UserInputError(f"--collect {out_path}: is a directory, give a file name ending in .tar.gz")
    out_path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{out_path.name}.", suffix=".tmp", dir=out_path.parent)
    os.close(fd)
    try:
        with _sigterm_raises(), tarfile.open(tmp, "w:gz") as tar:
            writer = _TarWriter(tar, int(time.time()))
            writer.add_dir("")
            for path in sorted(members):
                writer.add(path, *members[path])
            blob = (json.dumps(findings, indent=1, ensure_ascii=False) + "\n").encode()
            writer.add_bytes(tarfile.TarInfo(f"{ARCHIVE_TOP}/findings.json"), blob)
        os.replace(tmp, out_path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return len(members)


# -- reading an archive back ----------------------------------------------------------------------------------

MAX_MEMBERS = 50_000
"""Members one archive may hold. `--collect` writes about 65 members per CPU plus ~100 for the rest (the 16-CPU
fixture hosts built by tests/fixtures/hosts/build_fixtures.py pack 1,060-1,190), so 50,000 covers a 768-thread host
(2 x 192-core Zen 5c with SMT) with room to spare, and a 200,000-member archive is refused after reading headers."""

MAX_MEMBER_BYTES = MAX_FILE_BYTES
"""One file's size: `HostRoot` reads no file larger than this, so a larger member could never be used."""

MAX_TOTAL_BYTES = 256 * 1024 * 1024
"""All files together. A collected host is mostly small sysfs files (a 16-CPU fixture host packs ~1 MiB); the
largest real members, /proc/interrupts and the kernel log of a big host, are a few MiB each. 256 MiB keeps a
decompression bomb from filling the temp directory's disk."""

_MAX_STREAM_BYTES = 2 * MAX_TOTAL_BYTES
"""Decompressed bytes read from an archive at most: the files plus their 512-byte headers and padding."""

_PATH_MAX = 4096
"""Linux's PATH_MAX (include/uapi/linux/limits.h): no member name or link target is longer."""

MAX_EXTENDED_HEADER_BYTES = 64 * 1024
"""Largest pax extended header or GNU long name/link record read. Such a record carries a path (at most `_PATH_MAX`
bytes) and a few numbers; tarfile reads one whole into memory before any member check can run, so a crafted
200 MiB one is refused from its size alone."""


class _ExtendedHeaderTooLargeError(Exception):
    """A pax or GNU long-name record larger than `MAX_EXTENDED_HEADER_BYTES` (refused before it is read)."""

    def __init__(self, name: str, size: int) -> None:
        super().__init__(name, size)
        self.name = name
        self.size = size


class _CappedTarInfo(tarfile.TarInfo):
    """A TarInfo whose extended records (pax headers, GNU long names) are refused by size before tarfile reads them."""

    _EXTENDED = (tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK, tarfile.XHDTYPE, tarfile.XGLTYPE, b"X")

    def _proc_member(self, tarfile_: tarfile.TarFile) -> tarfile.TarInfo:
        if self.type in self._EXTENDED and self.size > MAX_EXTENDED_HEADER_BYTES:
            raise _ExtendedHeaderTooLargeError(self.name, self.size)
        result: tarfile.TarInfo = super()._proc_member(tarfile_)  # type: ignore[misc]
        return result


_CHUNK_BYTES = 1024 * 1024
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_NEW_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_MODE = 0o644
_DIR_MODE = 0o755
_ROOT_PARTS = tuple(ROOT_IN_ARCHIVE.split("/"))
_OUTSIDE_ROOT = {ARCHIVE_TOP: "dir", ROOT_IN_ARCHIVE: "dir", f"{ARCHIVE_TOP}/findings.json": "file"}
"""The only members allowed outside `decodetop-collect/root/`, with the one type each may have."""


class _Readable(Protocol):
    """What a decompressor offers: `read(n)`."""

    def read(self, size: int = -1, /) -> bytes: ...


class _BoundedStream(io.RawIOBase):
    """A read-only byte stream that fails once more than `limit` bytes came through (a decompression bomb)."""

    def __init__(self, inner: _Readable, limit: int, archive: Path) -> None:
        super().__init__()
        self._inner = inner
        self._left = limit
        self._archive = archive
        self._limit = limit

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: WriteableBuffer) -> int:
        view = memoryview(buffer).cast("B")
        data = self._inner.read(min(len(view), self._left + 1))
        if len(data) > self._left:
            raise UserInputError(
                f"{self._archive}: decompresses to more than {self._limit:,} bytes; not a --collect archive"
            )
        self._left -= len(data)
        view[: len(data)] = data
        return len(data)


def _decompressed(handle: BinaryIO) -> _Readable:
    """The tar stream inside `handle`: gzip (what --collect writes), bzip2, xz, or plain tar."""
    head = handle.read(6)
    handle.seek(0)
    if head.startswith(b"\x1f\x8b"):
        return gzip.GzipFile(fileobj=handle, mode="rb")
    if head.startswith(b"BZh"):
        import bz2

        return bz2.BZ2File(handle)
    if head.startswith(b"\xfd7zXZ\x00"):
        import lzma

        return lzma.LZMAFile(handle)
    return handle


class _DirFds:
    """Open directory descriptors along the current member's parent path, made without following any symlink."""

    def __init__(self, base_fd: int) -> None:
        self.base_fd = base_fd
        self.stack: list[tuple[str, int]] = []

    def open(self, dirs: tuple[str, ...]) -> int:
        """A descriptor of directory `dirs` (relative to the base), creating what is missing."""
        keep = 0
        while keep < min(len(self.stack), len(dirs)) and self.stack[keep][0] == dirs[keep]:
            keep += 1
        self._close_from(keep)
        for name in dirs[keep:]:
            parent = self.stack[-1][1] if self.stack else self.base_fd
            with contextlib.suppress(FileExistsError):
                os.mkdir(name, _DIR_MODE, dir_fd=parent)
            # O_NOFOLLOW | O_DIRECTORY: a symlink or a file in the way fails (ELOOP, ENOTDIR) instead of being followed.
            self.stack.append((name, os.open(name, _DIR_FLAGS, dir_fd=parent)))
        return self.stack[-1][1] if self.stack else self.base_fd

    def _close_from(self, index: int) -> None:
        for _name, fd in self.stack[index:]:
            os.close(fd)
        del self.stack[index:]

    def close(self) -> None:
        """Close every descriptor still open."""
        self._close_from(0)


_SHOWN_CHARS = 120
"""Names and link targets are cut to this many characters in messages (a crafted one may be 4 KiB long)."""


def _short(text: str) -> str:
    return text if len(text) <= _SHOWN_CHARS else text[:_SHOWN_CHARS] + "…"


@dataclass
class _Tally:
    """Running totals of one pass over an archive."""

    count: int = 0
    total_bytes: int = 0
    seen: dict[tuple[str, ...], str] = field(default_factory=dict)
    parents: set[tuple[str, ...]] = field(default_factory=set)
    links: list[tuple[tuple[str, ...], str, str]] = field(default_factory=list)
    """(path parts, member name, target to create) of every symlink, made after everything else."""


class _Unpacker:
    """Checks every member of a --collect archive and, on the second pass, writes it under a destination fd."""

    def __init__(self, archive: Path) -> None:
        self.archive = archive

    def refuse(self, name: str, problem: str) -> UserInputError:
        """The one-line error naming the member (repr: a newline in a name stays on the line)."""
        return UserInputError(f"{self.archive}: member {_short(name)!r} {problem}; not a decodetop --collect archive")

    def parts(self, member: tarfile.TarInfo) -> tuple[str, ...]:
        """The member's path components, refused when absolute, climbing with '..', or outside the layout."""
        name = member.name
        if len(name.encode("utf-8", "surrogateescape")) > _PATH_MAX:
            raise self.refuse(name, f"has a name longer than {_PATH_MAX} bytes")
        parts = tuple(p for p in name.split("/") if p not in ("", "."))
        if name.startswith("/") or ".." in parts or not parts:
            raise self.refuse(name, "escapes the archive (absolute or '..')")
        path = "/".join(parts)
        if path in _OUTSIDE_ROOT:
            want = _OUTSIDE_ROOT[path]
            if (want == "dir" and not member.isdir()) or (want == "file" and not member.isreg()):
                raise self.refuse(name, f"must be a {'directory' if want == 'dir' else 'regular file'}")
        elif parts[: len(_ROOT_PARTS)] != _ROOT_PARTS:
            raise self.refuse(name, f"is outside {ROOT_IN_ARCHIVE}/")
        return parts

    def kind(self, member: tarfile.TarInfo) -> str:
        """'file', 'dir' or 'link'; anything else (hard links, devices, FIFOs, sparse files) is refused."""
        if member.issparse():
            raise self.refuse(member.name, "is a sparse file")
        if member.isreg():
            return "file"
        if member.isdir():
            return "dir"
        if member.issym():
            return "link"
        what = {
            tarfile.LNKTYPE: f"is a hard link (to {_short(member.linkname)!r})",
            tarfile.CHRTYPE: "is a character device",
            tarfile.BLKTYPE: "is a block device",
            tarfile.FIFOTYPE: "is a FIFO",
        }.get(member.type, f"has tar type {member.type!r}")
        raise self.refuse(member.name, what + "; only regular files, directories and symlinks are allowed")

    def link_target(self, parts: tuple[str, ...], member: tarfile.TarInfo) -> str:
        """The target to create: relative, never climbing out of the tree, never '..' after a name.

        An absolute target (`/sys/devices/...`) means that path under the tree's root, so it is rewritten relative
        to the link. '..' only as leading components keeps the climb on real directories (every parent of a member
        is a real directory), so lexical checking equals what the kernel resolves, however long a chain of links.
        """
        target = member.linkname
        if not target or "\0" in target or len(target.encode("utf-8", "surrogateescape")) > _PATH_MAX:
            raise self.refuse(member.name, "is a symlink with an empty or overlong target")
        tparts = [p for p in target.split("/") if p not in ("", ".")]
        depth = len(parts) - 1 - len(_ROOT_PARTS)  # directories between the tree's root and the link
        if depth < 0:
            raise self.refuse(member.name, "is a symlink outside the host tree")
        if target.startswith("/"):
            if ".." in tparts:
                raise self.refuse(member.name, f"is a symlink to {_short(target)!r}, which climbs with '..'")
            return "/".join([".."] * depth + tparts) or "."
        climb = 0
        while climb < len(tparts) and tparts[climb] == "..":
            climb += 1
        if ".." in tparts[climb:]:
            raise self.refuse(member.name, f"is a symlink to {_short(target)!r}, with '..' after a name")
        if climb > depth:
            raise self.refuse(member.name, f"is a symlink to {_short(target)!r}, outside the host tree")
        return "/".join(tparts) or "."

    def admit(self, member: tarfile.TarInfo, tally: _Tally) -> tuple[tuple[str, ...], str]:
        """Check one member against the rules and the running totals; its path parts and kind."""
        tally.count += 1
        if tally.count > MAX_MEMBERS:
            raise self.refuse(member.name, f"is past the limit of {MAX_MEMBERS:,} members")
        parts = self.parts(member)
        kind = self.kind(member)
        if parts in tally.seen and (kind != "dir" or tally.seen[parts] != "dir"):
            raise self.refuse(member.name, "appears twice")
        tally.seen[parts] = kind
        tally.parents.add(parts[:-1])
        if kind == "link":
            tally.links.append((parts, member.name, self.link_target(parts, member)))
        elif kind == "file":
            if member.size > MAX_MEMBER_BYTES:
                raise self.refuse(member.name, f"is {member.size:,} bytes, over the {MAX_MEMBER_BYTES:,}-byte limit")
            tally.total_bytes += member.size
            if tally.total_bytes > MAX_TOTAL_BYTES:
                raise self.refuse(member.name, f"takes the files past {MAX_TOTAL_BYTES:,} bytes in all")
        return parts, kind

    def run(self, tar: tarfile.TarFile, dest_fd: int | None) -> None:
        """One pass over the archive: check every member; write it too when `dest_fd` is given."""
        tally = _Tally()
        dirs = _DirFds(dest_fd) if dest_fd is not None else None
        try:
            for member in tar:
                parts, kind = self.admit(member, tally)
                if dirs is not None and kind == "file":
                    self._write_file(tar, member, parts, dirs)
                elif dirs is not None and kind == "dir":
                    with self._guard(member.name):
                        dirs.open(parts)
            self.check_links_are_leaves(tally.links, tally.parents)
            if dirs is not None:
                # Symlinks last: nothing is ever written through one.
                for at, name, target in tally.links:
                    with self._guard(name):
                        os.symlink(target, at[-1], dir_fd=dirs.open(at[:-1]))
        finally:
            if dirs is not None:
                dirs.close()

    def check_links_are_leaves(
        self, links: list[tuple[tuple[str, ...], str, str]], parents: set[tuple[str, ...]]
    ) -> None:
        """No member lies under a symlink member: paths are never meant to pass through one."""
        prefixes = {parent[:i] for parent in parents for i in range(1, len(parent) + 1)}
        for parts, name, _target in links:
            if parts in prefixes:
                raise self.refuse(name, "is a symlink that other members are placed under")

    @contextlib.contextmanager
    def _guard(self, name: str) -> Iterator[None]:
        """Turn a clash with another member (a name taken, a non-directory in the path) into the one-line error."""
        try:
            yield
        except FileExistsError:
            raise self.refuse(name, "clashes with another member of the same name") from None
        except OSError as exc:
            if exc.errno in (errno_mod.ELOOP, errno_mod.ENOTDIR):
                raise self.refuse(name, "lies under a member that is not a directory") from None
            raise

    def _write_file(self, tar: tarfile.TarFile, member: tarfile.TarInfo, parts: tuple[str, ...], dirs: _DirFds) -> None:
        source = tar.extractfile(member)
        if source is None:
            raise self.refuse(member.name, "has no data")
        with self._guard(member.name):
            fd = os.open(parts[-1], _NEW_FILE_FLAGS, _FILE_MODE, dir_fd=dirs.open(parts[:-1]))
        with os.fdopen(fd, "wb") as out:
            left = member.size
            while left > 0:
                chunk = source.read(min(_CHUNK_BYTES, left))
                if not chunk:
                    raise self.refuse(member.name, "is cut short")
                out.write(chunk)
                left -= len(chunk)


def _open_tar(handle: BinaryIO, archive: Path) -> tarfile.TarFile:
    handle.seek(0)
    stream = _BoundedStream(_decompressed(handle), _MAX_STREAM_BYTES, archive)
    # Stream mode ("r|"): headers are read in order and never sought back to; nothing is extracted by tarfile.
    return tarfile.open(fileobj=io.BufferedReader(stream), mode="r|", tarinfo=_CappedTarInfo)


def unpack_collected(archive: Path, dest: Path) -> Path:
    """Unpack a `--collect` tarball into directory `dest` (made when missing) and return the host tree inside it.

    Two passes: the first checks every member (types, names, link targets, sizes, count) and writes nothing; the
    second checks again while writing, member by member, relative to directory descriptors opened without following
    symlinks, with O_EXCL on every file and the symlinks made last. Nothing is chowned, chmodded or re-timed.
    """
    archive = Path(archive)
    unpacker = _Unpacker(archive)
    try:
        # O_NONBLOCK: a FIFO given as the archive is refused below instead of blocking this open.
        fd = os.open(archive, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
        with os.fdopen(fd, "rb") as handle:
            if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
                raise UserInputError(f"{archive}: not a regular file; a --collect archive is a .tar.gz file")
            with _open_tar(handle, archive) as tar:
                unpacker.run(tar, None)
            dest.mkdir(parents=True, exist_ok=True)
            dest_fd = os.open(dest, _DIR_FLAGS)
            try:
                with _open_tar(handle, archive) as tar:
                    unpacker.run(tar, dest_fd)
            finally:
                os.close(dest_fd)
    except _ExtendedHeaderTooLargeError as exc:
        raise unpacker.refuse(
            exc.name,
            f"is an extended header (pax or GNU long name) of {exc.size:,} bytes, over the "
            f"{MAX_EXTENDED_HEADER_BYTES:,}-byte limit (refused unread)",
        ) from None
    except (tarfile.TarError, OSError, EOFError, zlib.error, ValueError) as exc:
        raise UserInputError(f"{archive}: not a readable decodetop --collect tarball ({exc})") from exc
    tree = dest / ROOT_IN_ARCHIVE
    try:
        is_dir = stat.S_ISDIR(os.lstat(tree).st_mode)
    except FileNotFoundError:
        is_dir = False
    if not is_dir:
        raise UserInputError(f"{archive}: no {ROOT_IN_ARCHIVE}/ inside; was it made by `decodetop check --collect`?")
    return tree


@contextlib.contextmanager
def unpacked(archive: Path) -> Iterator[Path]:
    """The host tree of `archive` in a temporary directory that is removed afterwards, on SIGTERM as on SIGINT."""
    with contextlib.ExitStack() as stack:
        stack.enter_context(_sigterm_raises())
        tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="decodetop-root-"))
        yield unpack_collected(archive, Path(tmp))


@contextlib.contextmanager
def _sigterm_raises() -> Iterator[None]:
    """While inside, SIGTERM raises SystemExit(143) so `finally` blocks (temp-dir removal) run, as for Ctrl-C."""

    def on_term(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)

    try:
        previous = signal.signal(signal.SIGTERM, on_term)
    except ValueError:  # not the main thread: signals cannot be caught here
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


__all__ = [
    "ARCHIVE_TOP",
    "ROOT_IN_ARCHIVE",
    "HostReadError",
    "RecordingRoot",
    "unpack_collected",
    "unpacked",
    "write_collect_tarball",
]
