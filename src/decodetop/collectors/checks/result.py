"""Provides the result type every health check yields, and how statuses combine into an exit code."""

from __future__ import annotations

import enum
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
