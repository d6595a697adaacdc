"""Provides the result type every health check yields, and how statuses combine into an exit code."""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass, field


class Status(str, enum.Enum):
    """Outcome of one check. Ordered by severity for sorting and for the exit code."""

    PASS = "pass"
    INFO = "info"
    WARN = "warn"
    FAIL = "fail"
    UNKNOWN = "unknown"

    @property
    def severity(self) -> int:
        """Sort key: failing first when sorted descending."""
        return _SEVERITY[self]


_SEVERITY = {Status.PASS: 0, Status.INFO: 1, Status.UNKNOWN: 2, Status.WARN: 3, Status.FAIL: 4}


@dataclass(frozen=True)
class CheckResult:
    """One finding: what was read, what was expected, why it matters and how to fix it."""

    check_id: str
    """Stable id from docs/reference/healthchecks.md, e.g. "C1", "P3", "N12"; suffixed per subject
    ("P1:0000:3b:00.0")."""
    title: str
    status: Status
    observed: str
    expected: str
    why: str = ""
    fix: str = ""
    subject: str = ""
    """What the check looked at: "host", a GPU ("GPU0 0000:3b:00.0"), a bridge, a device node."""
    facts: dict[str, str] = field(default_factory=dict)
    """Values worth diffing against a baseline (kernel, governor, link state...)."""


def exit_code(results: list[CheckResult]) -> int:
    """Monitoring-plugin convention: 0 ok, 1 warning, 2 critical, 3 unknown (critical wins over unknown)."""
    statuses = {r.status for r in results}
    if Status.FAIL in statuses:
        return 2
    if Status.WARN in statuses:
        return 1
    if Status.UNKNOWN in statuses:
        return 3
    return 0


_FAMILY_RE = re.compile(r"([A-Za-z]+)(\d*)")


def _id_key(check_id: str) -> tuple[str, int]:
    """The natural sort key of a check's family: 'C2' < 'C13', 'N1-N11' with N1; the subject is left out."""
    match = _FAMILY_RE.match(check_id.partition(":")[0])
    if match is None:
        return (check_id, 0)
    return (match.group(1), int(match.group(2)) if match.group(2) else 0)


DISPLAY_ORDER = {Status.FAIL: 0, Status.WARN: 1, Status.UNKNOWN: 2, Status.PASS: 3, Status.INFO: 4}
"""Row order of every surface: what needs action first, then what could not be checked, then passes; facts (info,
reported only) last."""


def sort_for_display(results: list[CheckResult] | tuple[CheckResult, ...]) -> list[CheckResult]:
    """The one row order of every surface (`decodetop check`, its --json and --collect findings, the health
    panel): by `DISPLAY_ORDER`, then by id in natural order (C1, C2, C13, N1, N12), then as the checks produced them
    (a check's subjects in GPU and bridge order)."""
    order = {id(r): i for i, r in enumerate(results)}
    return sorted(results, key=lambda r: (DISPLAY_ORDER[r.status], *_id_key(r.check_id), order[id(r)]))
