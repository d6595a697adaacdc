"""Provides the small parsers the host checks share: cpulists, /proc/devices, device-cgroup v1 rules, THP brackets,
the kernel cmdline, kernel-log records and NVIDIA Xid lines.

Every parser raises `ValueError` with a short reason on input it cannot read; the checks turn that into an
`unknown` finding that names the file.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_CPULIST_MAX_CPU = 1 << 16
"""Refuse cpulists past 65536 CPUs: the kernel's NR_CPUS tops out at 8192 today, so more is garbage, not a host."""


def parse_int(text: str, what: str) -> int:
    """One integer from a sysfs/procfs file (`what` names the file in the error)."""
    value = text.strip()
    try:
        return int(value, 10)
    except ValueError:
        raise ValueError(f"{what}: expected an integer, got {value[:40]!r}") from None


_NAME_MAX_CHARS = 64
"""Longest sysfs name kept: the kernel's CPUIDLE_NAME_LEN is 16 (include/linux/cpuidle.h), so more is not a name."""


def parse_name(text: str, what: str) -> str:
    """A sysfs name as the kernel writes it: any text on one line, spaces included ('haltpoll idle').

    The trailing newline goes; characters that are not printable show as '?'; empty is an error.
    """
    line = text.rstrip("\n")
    if not line.strip():
        raise ValueError(f"{what}: empty")
    if "\n" in line:
        raise ValueError(f"{what}: expected one line, got {line[:60]!r}")
    shown = "".join(ch if ch.isprintable() else "?" for ch in line[:_NAME_MAX_CHARS])
    return shown + ("…" if len(line) > _NAME_MAX_CHARS else "")


def parse_word(text: str, what: str) -> str:
    """One word from a sysfs file; empty or several words is an error."""
    words = text.split()
    if len(words) != 1:
        raise ValueError(f"{what}: expected one word, got {text.strip()[:60]!r}")
    return words[0]


def parse_cpulist(text: str) -> frozenset[int]:
    """'0-15,64-79' → the CPU numbers (kernel cpulist format, `bitmap_parselist`); '' → empty set."""
    value = text.strip()
    if not value:
        return frozenset()
    cpus: set[int] = set()
    for chunk in value.split(","):
        part = chunk.strip()
        match = re.fullmatch(r"(\d+)(?:-(\d+)(?::(\d+)/(\d+))?)?", part)
        if match is None:
            raise ValueError(f"bad cpulist item {part[:30]!r}")
        lo = int(match.group(1))
        hi = int(match.group(2)) if match.group(2) is not None else lo
        if hi < lo or hi >= _CPULIST_MAX_CPU:
            raise ValueError(f"bad cpulist range {part[:30]!r}")
        if match.group(3) is not None:
            # Kernel "groups" syntax a-b:used/group_size (bitmap_parselist, Documentation/admin-guide/kernel-parameters)
            used, size = int(match.group(3)), int(match.group(4))
            if size == 0 or used > size:
                raise ValueError(f"bad cpulist group {part[:30]!r}")
            cpus.update(c for c in range(lo, hi + 1) if (c - lo) % size < used)
        else:
            cpus.update(range(lo, hi + 1))
    return frozenset(cpus)


def format_cpulist(cpus: frozenset[int] | set[int]) -> str:
    """The inverse of `parse_cpulist` for plain ranges: {0,1,2,5} → '0-2,5'."""
    ordered = sorted(cpus)
    parts: list[str] = []
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        parts.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(parts)


@dataclass(frozen=True)
class ProcDevices:
    """Registered device majors from /proc/devices."""

    char: tuple[tuple[int, str], ...]
    block: tuple[tuple[int, str], ...]

    def char_major(self, name: str) -> int | None:
        """Major of the character driver named `name`, or None when it is not registered."""
        for major, driver in self.char:
            if driver == name:
                return major
        return None


def parse_proc_devices(text: str) -> ProcDevices:
    """Parse /proc/devices: a 'Character devices:' section then 'Block devices:', rows '<major> <name>'."""
    if "Character devices:" not in text:
        raise ValueError("no 'Character devices:' header")
    sections: dict[str, list[tuple[int, str]]] = {"char": [], "block": []}
    current: str | None = None
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            continue
        if line == "Character devices:":
            current = "char"
            continue
        if line == "Block devices:":
            current = "block"
            continue
        if current is None:
            raise ValueError(f"row before any section header: {line[:40]!r}")
        fields = line.split(None, 1)
        if len(fields) != 2 or not fields[0].isdigit():
            raise ValueError(f"bad row {line[:40]!r}")
        sections[current].append((int(fields[0]), fields[1]))
    return ProcDevices(tuple(sections["char"]), tuple(sections["block"]))


@dataclass(frozen=True)
class DeviceRule:
    """One device-cgroup v1 rule, `type major:minor access` (cgroup-v1/devices.rst); None is the `*` wildcard."""

    kind: str
    major: int | None
    minor: int | None
    access: str

    def covers(self, kind: str, major: int, minor: int, need: str = "rw") -> bool:
        """Whether this rule allows access `need` to device (kind, major, minor)."""
        if self.kind not in ("a", kind):
            return False
        if self.major is not None and self.major != major:
            return False
        if self.minor is not None and self.minor != minor:
            return False
        return all(ch in self.access for ch in need)

    def __str__(self) -> str:
        major = "*" if self.major is None else str(self.major)
        minor = "*" if self.minor is None else str(self.minor)
        return f"{self.kind} {major}:{minor} {self.access}"


def parse_device_rule(text: str) -> DeviceRule:
    """'c 195:* rwm' → DeviceRule; 'a' alone means 'a *:* rwm' (the kernel's shorthand)."""
    fields = text.split()
    if fields == ["a"]:
        return DeviceRule("a", None, None, "rwm")
    if len(fields) != 3 or fields[0] not in ("a", "b", "c"):
        raise ValueError(f"bad device rule {text.strip()[:40]!r}")
    numbers = fields[1].split(":")
    if len(numbers) != 2:
        raise ValueError(f"bad major:minor in {text.strip()[:40]!r}")
    parsed: list[int | None] = []
    for number in numbers:
        if number == "*":
            parsed.append(None)
        elif number.isdigit():
            parsed.append(int(number))
        else:
            raise ValueError(f"bad major:minor in {text.strip()[:40]!r}")
    if not fields[2] or any(ch not in "rwm" for ch in fields[2]):
        raise ValueError(f"bad access {fields[2][:10]!r} in device rule")
    return DeviceRule(fields[0], parsed[0], parsed[1], fields[2])


def parse_devices_list(text: str) -> tuple[DeviceRule, ...]:
    """Parse a cgroup-v1 `devices.list` (one rule a line)."""
    return tuple(parse_device_rule(line) for line in text.splitlines() if line.strip())


def parse_thp_bracket(text: str) -> str:
    """'always [madvise] never' → 'madvise' (mm/huge_memory.c prints the active choice in brackets)."""
    found = re.findall(r"\[([^\[\]\s]+)\]", text)
    if len(found) != 1:
        raise ValueError(f"expected exactly one [bracketed] choice, got {text.strip()[:60]!r}")
    return str(found[0])


def parse_cmdline(text: str) -> list[tuple[str, str | None]]:
    """Kernel cmdline → [(key, value or None)]; stops at '--' (the rest belongs to init)."""
    params: list[tuple[str, str | None]] = []
    for token in text.split():
        if token == "--":
            break
        key, sep, value = token.partition("=")
        params.append((key, value if sep else None))
    return params


def cmdline_value(params: list[tuple[str, str | None]], key: str) -> str | None:
    """The last value given for `key` (the kernel takes the last), '' for a bare flag, None when absent."""
    found: str | None = None
    for name, value in params:
        if name == key:
            found = "" if value is None else value
    return found


def kmsg_text(record: str) -> str:
    """'6,1234,5678,-;message' (/dev/kmsg format) → 'message'; dmesg-style lines pass through."""
    head, sep, rest = record.partition(";")
    if sep and re.fullmatch(r"\d+,\d+,\d+,[^;]*", head):
        return rest
    return record


_XID_RE = re.compile(r"NVRM: Xid \(PCI:([0-9a-fA-F:.]+)\): (\d+),")
"""docs/reference/healthchecks.md §1 N8: the driver's Xid line."""


@dataclass(frozen=True)
class XidEvent:
    """One Xid reported by the NVIDIA driver in the kernel log."""

    pci: str
    code: int
    line: str


def parse_xids(records: list[str]) -> list[XidEvent]:
    """Every Xid line among kernel-log records."""
    events: list[XidEvent] = []
    for record in records:
        text = kmsg_text(record)
        match = _XID_RE.search(text)
        if match:
            events.append(XidEvent(match.group(1).lower(), int(match.group(2)), text.strip()))
    return events
