"""Provides `HostRoot`: the one choke point for every read of /proc, /sys, /dev and /etc.

A root is either the live host (`/`) or a directory holding a copied host tree (a fixture, or a tree unpacked from
`decodetop check --collect`). Under a copied tree three things cannot be plain files, so they come from side files
(docs/reference/healthchecks.md §4):

- PCI config space: `config` may be stored as `config.hex` (hex text, whitespace ignored), because text archives
  and review tarballs carry text better than binary.
- Device numbers: `dev/.rdev` lists `NAME TYPE MAJOR MINOR` per node (`nvidia-uvm c 510 0`), NAME relative to /dev.
- The cgroup-v2 open probe: `dev/.open` lists `NAME OUTCOME` where OUTCOME is `ok` or an errno name (`EPERM`).
- The kernel log: `dev/kmsg` is a text file, one record per line, in /dev/kmsg's own format; where the host could not
  read it, `dev/.kmsg-unreadable` holds `ERRNO message` instead, and a replay raises that same error.
- A second sample of counters (cpuidle `usage`): `.later/<path>` holds the value read one interval after `<path>`.
- What the collecting host answered beyond its files (`record_outcome`/`recorded_outcome`): `.<name>` holds one line,
  e.g. `.nvml` the outcome of NVML's init there (`ok`, or `unavailable CODE REASON`).

Symlinks inside a copied tree are resolved against the tree, never against the real `/`: an absolute link target
(`/sys/devices/...`) means that path under the root.

Every read is bounded and reads regular files only (sysfs and /proc pseudo-files are regular): a FIFO or a device
node is never opened for reading, and no file yields more than `MAX_FILE_BYTES`. /dev/kmsg is the one device read,
through `read_kmsg`.
"""

from __future__ import annotations

import errno as errno_mod
import fnmatch
import os
import stat
from dataclasses import dataclass
from pathlib import Path

_MAX_LINK_HOPS = 40
"""Same bound as the kernel's MAXSYMLINKS (40): a loop in a copied tree ends with ELOOP, not a hang."""

_KMSG_MAX_RECORDS = 200_000
"""Stop reading /dev/kmsg after this many records: the kernel ring buffer holds far fewer (a few MiB at most)."""

MAX_FILE_BYTES = 64 * 1024 * 1024
"""The most any one file read yields. The largest files the checks read are a few MiB on big hosts: /proc/interrupts
of a 768-thread machine is ~1,000 lines of 768 eleven-character columns (~8 MiB); a copied kernel log is at most
`_KMSG_MAX_RECORDS` lines. A larger file is refused rather than read into memory."""

_READ_CHUNK_BYTES = 64 * 1024

_FILE_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISLNK, "a symlink"),
)

RDEV_SIDE_FILE = "dev/.rdev"
OPEN_SIDE_FILE = "dev/.open"
KMSG_FILE = "dev/kmsg"
KMSG_UNREADABLE_FILE = "dev/.kmsg-unreadable"
"""Why /dev/kmsg could not be read on the host (`ERRNO message`, one line): a replay says the same, never that
the log held no record."""
LATER_DIR = ".later"
OUTCOME_PREFIX = "."
"""A recorded outcome `name` lives in the side file `.<name>` at the top of a copied tree."""


class HostReadError(OSError):
    """A read under the root failed; the message names the host path (as seen from inside the root) and why."""

    def __str__(self) -> str:
        return str(self.strerror) if self.strerror else super().__str__()


class KmsgUnreadableError(HostReadError):
    """The kernel log could not be read on the host itself: live, or as a collected archive recorded it."""


@dataclass(frozen=True)
class DeviceNumber:
    """A device node's identity: type ('c' char, 'b' block) and major/minor numbers."""

    kind: str
    major: int
    minor: int


@dataclass(frozen=True)
class OpenProbe:
    """Outcome of opening a device node read-write and closing it at once (docs/reference/healthchecks.md §3, cgroup
    v2)."""

    ok: bool
    errno_name: str
    """'' when ok, else the errno's symbolic name (EPERM, EACCES, ENXIO, ENODEV, ENOENT...)."""
    detail: str = ""


class HostRoot:
    """Reads host files below a base directory; `HostRoot()` is the live host."""

    def __init__(self, base: str | os.PathLike[str] = "/") -> None:
        path = Path(base)
        if not path.is_dir():
            raise HostReadError(errno_mod.ENOTDIR, f"host root {path} is not a directory")
        self.base = path.resolve()
        self.is_live = self.base == Path("/")
        self.proc = self.base / "proc"
        self.sys = self.base / "sys"
        self.dev = self.base / "dev"
        self.etc = self.base / "etc"

    def __repr__(self) -> str:
        return f"HostRoot({str(self.base)!r})"

    # -- paths ---------------------------------------------------------------------------------------------------

    @staticmethod
    def _norm(rel: str) -> str:
        """'/sys/x' or 'sys/x' → 'sys/x'; '..' cannot climb above the root."""
        parts: list[str] = []
        for part in rel.split("/"):
            if part in ("", "."):
                continue
            if part == "..":
                if parts:
                    parts.pop()
                continue
            parts.append(part)
        return "/".join(parts)

    def _resolve(self, rel: str) -> Path:
        """The real filesystem path for host path `rel`, with symlinks in a copied tree kept inside the root."""
        norm = self._norm(rel)
        if self.is_live:
            return Path("/" + norm)
        pending = norm.split("/") if norm else []
        done: list[str] = []
        hops = 0
        while pending:
            part = pending.pop(0)
            if part in ("", "."):
                continue
            if part == "..":
                if done:
                    done.pop()
                continue
            candidate = self.base.joinpath(*done, part)
            if candidate.is_symlink():
                hops += 1
                if hops > _MAX_LINK_HOPS:
                    raise HostReadError(errno_mod.ELOOP, f"too many symlinks resolving /{norm} under {self.base}")
                target = str(candidate.readlink())
                if target.startswith("/"):
                    done = []
                pending = [p for p in target.split("/") if p] + pending
                continue
            done.append(part)
        return self.base.joinpath(*done)

    def path(self, rel: str) -> Path:
        """The filesystem path that stands for host path `rel` (symlinks resolved under a copied tree)."""
        return self._resolve(rel)

    def realpath(self, rel: str) -> str:
        """Host-side canonical path of `rel` ('/sys/devices/pci0000:00/...'), as `realpath` would print on the host."""
        if self.is_live:
            return os.path.realpath("/" + self._norm(rel))
        resolved = self._resolve(rel)
        return "/" + str(resolved.relative_to(self.base)) if resolved != self.base else "/"

    def exists(self, rel: str) -> bool:
        """Whether host path `rel` exists (a `config.hex` side file counts as `config`)."""
        try:
            target = self._resolve(rel)
        except OSError:
            return False
        if target.exists():
            return True
        return not self.is_live and target.with_name(target.name + ".hex").exists()

    def is_dir(self, rel: str) -> bool:
        """Whether host path `rel` is a directory."""
        try:
            return self._resolve(rel).is_dir()
        except OSError:
            return False

    # -- reads -------------------------------------------------------------------------------------------------

    def read_bytes(self, rel: str, max_bytes: int | None = None) -> bytes:
        """Raw bytes of host file `rel`; under a copied tree, `rel.hex` is decoded when `rel` itself is absent.

        `max_bytes` returns at most that prefix; without it a file over `MAX_FILE_BYTES` raises HostReadError.
        """
        host = "/" + self._norm(rel)
        target = self._resolve(rel)
        try:
            return self._read_regular(target, host, max_bytes)
        except FileNotFoundError:
            hex_path = target.with_name(target.name + ".hex")
            if not self.is_live:
                try:
                    text = self._read_regular(hex_path, host + ".hex", None).decode("ascii", errors="replace")
                except FileNotFoundError:
                    pass
                else:
                    try:
                        data = bytes.fromhex("".join(text.split()))
                    except ValueError as exc:
                        raise HostReadError(errno_mod.EINVAL, f"{host}.hex is not hex text: {exc}") from exc
                    return data if max_bytes is None else data[:max_bytes]
            raise HostReadError(errno_mod.ENOENT, f"{host} does not exist") from None
        except HostReadError:
            raise
        except OSError as exc:
            raise HostReadError(exc.errno or errno_mod.EIO, f"cannot read {host}: {exc.strerror or exc}") from exc

    def _read_regular(self, target: Path, host: str, max_bytes: int | None) -> bytes:
        """Read a regular file, at most MAX_FILE_BYTES (+1 to tell it is larger); anything else is never opened.

        Under a copied tree the path is already resolved inside the root, so a symlink at its end is refused too
        (O_NOFOLLOW). FileNotFoundError passes through for the `.hex` fallback.
        """
        before = target.stat() if self.is_live else target.lstat()
        kind = next((what for test, what in _FILE_KINDS if test(before.st_mode)), "")
        if kind or not stat.S_ISREG(before.st_mode):
            raise HostReadError(errno_mod.EINVAL, f"{host} is {kind or 'not a regular file'}; not read")
        flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC | (0 if self.is_live else os.O_NOFOLLOW)
        fd = os.open(target, flags)
        try:
            opened = os.fstat(fd)
            if (opened.st_dev, opened.st_ino) != (before.st_dev, before.st_ino) or not stat.S_ISREG(opened.st_mode):
                raise HostReadError(errno_mod.EAGAIN, f"{host} changed while being opened; not read")
            want = MAX_FILE_BYTES + 1 if max_bytes is None else min(max_bytes, MAX_FILE_BYTES)
            chunks: list[bytes] = []
            got = 0
            while got < want:
                chunk = os.read(fd, min(_READ_CHUNK_BYTES, want - got))
                if not chunk:
                    break
                chunks.append(chunk)
                got += len(chunk)
        finally:
            os.close(fd)
        if max_bytes is None and got > MAX_FILE_BYTES:
            raise HostReadError(errno_mod.EFBIG, f"{host} is larger than {MAX_FILE_BYTES:,} bytes; not read")
        return b"".join(chunks)

    def read_text(self, rel: str) -> str:
        """Text of host file `rel` (UTF-8, undecodable bytes replaced)."""
        return self.read_bytes(rel).decode("utf-8", errors="replace")

    def read_text_later(self, rel: str) -> str:
        """The second sample of counter file `rel`: live, a fresh read; a copied tree, `.later/<rel>` when present."""
        if not self.is_live:
            resolved = self._resolve(rel)
            later = f"{LATER_DIR}/{resolved.relative_to(self.base)}"
            if self._resolve(later).is_file():
                return self.read_text(later)
        return self.read_text(rel)

    def has_later_sample(self) -> bool:
        """Whether a copied tree carries a second sample (`.later/`); always True live (sample it now)."""
        return self.is_live or (self.base / LATER_DIR).is_dir()

    def try_read_text(self, rel: str) -> str | None:
        """Text of `rel`, or None when it cannot be read (absent, no permission)."""
        try:
            return self.read_text(rel)
        except OSError:
            return None

    def listdir(self, rel: str) -> list[str]:
        """Sorted entry names of directory `rel` (side files of a copied tree, `.rdev`/`.open`, left out)."""
        host = "/" + self._norm(rel)
        try:
            names = [p.name for p in self._resolve(rel).iterdir()]
        except OSError as exc:
            raise HostReadError(exc.errno or errno_mod.EIO, f"cannot list {host}: {exc.strerror or exc}") from exc
        if not self.is_live:
            names = [n[:-4] if n.endswith(".hex") and n[:-4] not in names else n for n in names]
            names = [n for n in names if n not in (".rdev", ".open")]
        return sorted(set(names))

    def try_listdir(self, rel: str) -> list[str]:
        """Like `listdir`, but an unreadable or absent directory gives []."""
        try:
            return self.listdir(rel)
        except OSError:
            return []

    def glob(self, pattern: str) -> list[str]:
        """Host paths matching a shell pattern ('/sys/devices/system/cpu/cpu[0-9]*/cpufreq'), sorted.

        Only the last components may hold wildcards in any number; each level is listed through the root, so
        symlinked directories (sysfs) are followed the way the host would.
        """
        parts = [p for p in self._norm(pattern).split("/") if p]
        found = [""]
        for part in parts:
            nxt: list[str] = []
            for prefix in found:
                if any(ch in part for ch in "*?["):
                    for name in self.try_listdir(prefix or "/"):
                        if fnmatch.fnmatchcase(name, part):
                            nxt.append(f"{prefix}/{name}")
                else:
                    candidate = f"{prefix}/{part}"
                    if self.exists(candidate) or self.is_symlink(candidate):
                        nxt.append(candidate)
            found = nxt
        return sorted(found)

    def is_symlink(self, rel: str) -> bool:
        """Whether host path `rel` is itself a symlink (its parents resolved)."""
        norm = self._norm(rel)
        if not norm:
            return False
        parent, _, name = norm.rpartition("/")
        try:
            return (self._resolve(parent) / name).is_symlink()
        except OSError:
            return False

    # -- device nodes ------------------------------------------------------------------------------------------

    def _side_entries(self, side_file: str) -> dict[str, list[str]]:
        text = self.try_read_text(side_file)
        entries: dict[str, list[str]] = {}
        for line in (text or "").splitlines():
            fields = line.split()
            if not fields or fields[0].startswith("#"):
                continue
            entries[self._norm(fields[0])] = fields[1:]
        return entries

    def stat_rdev(self, rel: str) -> DeviceNumber | None:
        """Device number of node `rel` under /dev; None when it exists but is not a device node.

        Live: `os.stat` (S_ISCHR/S_ISBLK). Copied tree: the `dev/.rdev` side file. Raises HostReadError when
        the node is absent.
        """
        norm = self._norm(rel)
        host = "/" + norm
        if self.is_live:
            try:
                st = Path(host).stat()
            except OSError as exc:
                raise HostReadError(exc.errno or errno_mod.EIO, f"cannot stat {host}: {exc.strerror or exc}") from exc
            if stat.S_ISCHR(st.st_mode):
                return DeviceNumber("c", os.major(st.st_rdev), os.minor(st.st_rdev))
            if stat.S_ISBLK(st.st_mode):
                return DeviceNumber("b", os.major(st.st_rdev), os.minor(st.st_rdev))
            return None
        if not norm.startswith("dev/"):
            raise HostReadError(errno_mod.EINVAL, f"{host}: device numbers are only recorded for /dev")
        entries = self._side_entries(RDEV_SIDE_FILE)
        fields = entries.get(norm[len("dev/") :])
        if fields is None:
            if self.exists(rel):
                return None
            raise HostReadError(errno_mod.ENOENT, f"{host} does not exist")
        if len(fields) != 3 or fields[0] not in ("c", "b") or not (fields[1].isdigit() and fields[2].isdigit()):
            raise HostReadError(errno_mod.EINVAL, f"{RDEV_SIDE_FILE}: bad entry for {host}: {' '.join(fields)!r}")
        return DeviceNumber(fields[0], int(fields[1]), int(fields[2]))

    def device_nodes(self, pattern: str) -> list[str]:
        """Host paths under /dev matching `pattern` ('/dev/nvidia*'), from the side file too under a copied tree."""
        found = set(self.glob(pattern))
        if not self.is_live:
            norm = self._norm(pattern)
            for name in self._side_entries(RDEV_SIDE_FILE):
                if fnmatch.fnmatchcase("dev/" + name, norm):
                    found.add("/dev/" + name)
        return sorted(found)

    def open_probe(self, rel: str) -> OpenProbe:
        """Open node `rel` read-write and close it at once: the only way to see a cgroup-v2 device rule (§3).

        Read-only towards the device: nothing is read, written or ioctl'ed. Under a copied tree the outcome
        comes from the `dev/.open` side file; a node missing from it gives `errno_name='UNRECORDED'`.
        """
        norm = self._norm(rel)
        if self.is_live:
            try:
                fd = os.open("/" + norm, os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
            except OSError as exc:
                name = errno_mod.errorcode.get(exc.errno or 0, str(exc.errno))
                return OpenProbe(False, name, exc.strerror or "")
            os.close(fd)
            return OpenProbe(True, "")
        fields = self._side_entries(OPEN_SIDE_FILE).get(norm[len("dev/") :] if norm.startswith("dev/") else norm)
        if not fields:
            return OpenProbe(False, "UNRECORDED", f"no open outcome recorded for /{norm} in {OPEN_SIDE_FILE}")
        outcome = fields[0]
        if outcome.lower() == "ok":
            return OpenProbe(True, "")
        return OpenProbe(False, outcome.upper(), " ".join(fields[1:]))

    # -- outcomes beyond the files -----------------------------------------------------------------------------

    def record_outcome(self, name: str, line: str) -> None:
        """What the live host answered to something that is not a file (NVML's init): nothing to keep here; a
        recording root keeps it as the side file `.<name>`."""

    def recorded_outcome(self, name: str) -> str | None:
        """The outcome `name` recorded when a copied tree was collected (its side file's first line); None on the
        live host (ask it instead) and where the tree has none (an older or hand-made tree)."""
        if self.is_live:
            return None
        text = self.try_read_text(OUTCOME_PREFIX + name)
        lines = (text or "").strip().splitlines()
        return lines[0].strip() if lines else None

    # -- kernel log --------------------------------------------------------------------------------------------

    def read_kmsg(self) -> list[str]:
        """Kernel log records ('6,1234,5678,-;text'), live from /dev/kmsg without blocking.

        Raises HostReadError when the log is not readable (no CAP_SYSLOG with dmesg_restrict=1, no /dev/kmsg).
        """
        if not self.is_live:
            self._raise_recorded_kmsg_error()
            return self.read_text(KMSG_FILE).splitlines()
        try:
            fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as exc:
            raise KmsgUnreadableError(
                exc.errno or errno_mod.EIO, f"cannot read /dev/kmsg: {exc.strerror or exc}"
            ) from exc
        records: list[str] = []
        try:
            while len(records) < _KMSG_MAX_RECORDS:
                try:
                    chunk = os.read(fd, 8192)
                except BlockingIOError:
                    break
                except OSError as exc:
                    if exc.errno == errno_mod.EPIPE:  # record overwritten while reading: skip it
                        continue
                    if exc.errno == errno_mod.EINVAL and records:
                        break
                    raise KmsgUnreadableError(
                        exc.errno or errno_mod.EIO, f"cannot read /dev/kmsg: {exc.strerror or exc}"
                    ) from exc
                if not chunk:
                    break
                # A record is 'prefix;message' plus optional ' KEY=value' dictionary lines: keep the first line.
                records.append(chunk.decode("utf-8", errors="replace").split("\n", 1)[0])
        finally:
            os.close(fd)
        return records

    def _raise_recorded_kmsg_error(self) -> None:
        """Under a collected tree: the host's own failure to read /dev/kmsg, where the archive recorded one."""
        try:
            recorded = self.path(KMSG_UNREADABLE_FILE).is_file()
        except OSError:
            recorded = False
        if not recorded:
            return
        name, _, message = self.read_text(KMSG_UNREADABLE_FILE).strip().partition(" ")
        code = getattr(errno_mod, name, errno_mod.EIO) if name.isupper() else errno_mod.EIO
        raise KmsgUnreadableError(code, message or "cannot read /dev/kmsg")
