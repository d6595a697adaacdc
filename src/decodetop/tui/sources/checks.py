"""Provides the health-check sources: `HostChecks` on the live host and `RecordedChecks` from a recording."""

from __future__ import annotations

from collections.abc import Sequence

from decodetop.collectors.checks.host import run_all_checks
from decodetop.collectors.checks.result import CheckResult
from decodetop.collectors.nvml import Nvml
from decodetop.inert import inert_data


class RecordedChecks:
    """`ChecksSource` giving the checks a recording holds."""

    def __init__(self, checks: Sequence[CheckResult]) -> None:
        self.checks = list(checks)

    def run(self) -> list[CheckResult]:
        """The recorded checks (their text inert: a recording is outside data)."""
        return [inert_data(check) for check in self.checks]


class HostChecks:
    """`ChecksSource` over `decodetop.collectors.checks.host.run_all_checks` on the live host."""

    def __init__(self, nvml: Nvml | None = None) -> None:
        self.nvml = nvml

    def run(self) -> list[CheckResult]:
        """Every host and GPU check (blocking; called in a worker)."""
        return [inert_data(check) for check in run_all_checks(nvml=self.nvml)]  # host files are outside text
