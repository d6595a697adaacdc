"""Provides `decodetop check --collect FILE.tar.gz`: run the checks through a recording root and pack exactly the
files they read into a tarball that `decodetop check --root` reproduces the findings from.

What is recorded: every file read (PCI `config` as `config.hex` text), every directory listed (unread entries as
empty placeholders of the right type), every symlink crossed, device numbers (`dev/.rdev`), open-probe outcomes
(`dev/.open`), the kernel log (`dev/kmsg`) and second samples of counters (`.later/`). /proc/1/environ is reduced
to its `container=` entry: the rest of init's environment may hold secrets.

Layout: `decodetop-collect/root/<host tree>` and `decodetop-collect/findings.json`.
"""

from __future__ import annotations

import io
import json
import os
import tarfile
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from decodetop.collectors.hostroot import (
    KMSG_FILE,
    LATER_DIR,
    OPEN_SIDE_FILE,
    RDEV_SIDE_FILE,
    DeviceNumber,
    HostReadError,
    HostRoot,
    OpenProbe,
)
from decodetop.errors import UserInputError

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
    later: dict[str, bytes] = field(default_factory=dict)


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

    def read_kmsg(self) -> list[str]:
        """Read and record the kernel log."""
        records = super().read_kmsg()
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
            if not path or path in members or path + ".hex" in members:
                continue
            members[path] = ("dir", "") if kind == "dir" else ("file", b"")
        if rec.rdev:
            lines = [f"{name} {n.kind} {n.major} {n.minor}" for name, n in sorted(rec.rdev.items())]
            members[RDEV_SIDE_FILE] = ("file", ("\n".join(lines) + "\n").encode())
        if rec.opens:
            lines = [f"{name} {'ok' if o.ok else o.errno_name}" for name, o in sorted(rec.opens.items())]
            members[OPEN_SIDE_FILE] = ("file", ("\n".join(lines) + "\n").encode())
        if rec.kmsg is not None:
            members[KMSG_FILE] = ("file", ("\n".join(rec.kmsg) + "\n").encode())
        for path, data in rec.later.items():
            members[f"{LATER_DIR}/{path}"] = ("file", data)
        # A directory that is also a parent of a recorded link target must stay a directory, not a placeholder file.
        parents = {"/".join(p.split("/")[:i]) for p in members for i in range(1, p.count("/") + 1)}
        for parent in parents:
            entry = members.get(parent)
            if entry is not None and entry[0] == "file" and not entry[1]:
                members[parent] = ("dir", "")
        return members


def _hexdump(data: bytes) -> bytes:
    """Config space as hex text, 16 bytes a line (what HostRoot decodes from `config.hex`)."""
    lines = [data[i : i + 16].hex(" ") for i in range(0, len(data), 16)]
    return ("\n".join(lines) + "\n").encode()


def write_collect_tarball(root: RecordingRoot, out_path: Path, findings: object) -> int:
    """Pack what `root` recorded plus the findings into `out_path` (tar.gz); returns the member count."""
    members = root.tree_members()
    now = int(time.time())
    out_path = Path(out_path)
    if out_path.is_dir():
        raise UserInputError(f"--collect {out_path}: is a directory, give a file name ending in .tar.gz")
    out_path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{out_path.name}.", suffix=".tmp", dir=out_path.parent)
    os.close(fd)
    try:
        with tarfile.open(tmp, "w:gz") as tar:
            dirs_added: set[str] = set()

            def add_dir(path: str) -> None:
                parts = path.split("/")
                for i in range(1, len(parts) + 1):
                    sub = "/".join(parts[:i])
                    if sub in dirs_added:
                        continue
                    dirs_added.add(sub)
                    info = tarfile.TarInfo(f"{ROOT_IN_ARCHIVE}/{sub}" if sub else ROOT_IN_ARCHIVE)
                    info.type = tarfile.DIRTYPE
                    info.mode = 0o755
                    info.mtime = now
                    tar.addfile(info)

            add_dir("")
            for path in sorted(members):
                kind, payload = members[path]
                if "/" in path:
                    add_dir(path.rsplit("/", 1)[0])
                if kind == "dir":
                    add_dir(path)
                    continue
                info = tarfile.TarInfo(f"{ROOT_IN_ARCHIVE}/{path}")
                info.mtime = now
                if kind == "link":
                    info.type = tarfile.SYMTYPE
                    info.linkname = str(payload)
                    tar.addfile(info)
                else:
                    data = payload if isinstance(payload, bytes) else str(payload).encode()
                    info.size = len(data)
                    info.mode = 0o644
                    tar.addfile(info, io.BytesIO(data))
            blob = (json.dumps(findings, indent=1, ensure_ascii=False) + "\n").encode()
            info = tarfile.TarInfo(f"{ARCHIVE_TOP}/findings.json")
            info.size = len(blob)
            info.mtime = now
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(blob))
        os.replace(tmp, out_path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return len(members)


def unpack_collected(archive: Path, dest: Path) -> Path:
    """Unpack a `--collect` tarball into `dest` safely and return the host-tree root inside it."""
    try:
        with tarfile.open(archive, "r:*") as tar:
            for member in tar.getmembers():
                name = member.name
                if name.startswith("/") or ".." in name.split("/"):
                    raise UserInputError(f"{archive}: member {name!r} escapes the archive")
                if member.issym() and member.linkname.startswith("/"):
                    continue  # absolute links resolve under the root anyway; keep them as they are
            tar.extractall(dest, filter="tar")
    except (tarfile.TarError, OSError) as exc:
        raise UserInputError(f"{archive}: not a readable decodetop --collect tarball ({exc})") from exc
    tree = dest / ROOT_IN_ARCHIVE
    if not tree.is_dir():
        raise UserInputError(f"{archive}: no {ROOT_IN_ARCHIVE}/ inside; was it made by `decodetop check --collect`?")
    return tree


__all__ = [
    "ARCHIVE_TOP",
    "ROOT_IN_ARCHIVE",
    "HostReadError",
    "RecordingRoot",
    "unpack_collected",
    "write_collect_tarball",
]
