"""Provides `GpuCheck`, what one GPU check always says (id, title, expected, why, fix), and the subject and id
suffix of a per-GPU finding: shared by the NVIDIA driver check (`gpu_driver`) and the other GPU checks (`gpu`)."""

from __future__ import annotations

from dataclasses import dataclass

from decodetop.collectors.checks.result import CheckResult, Status
from decodetop.collectors.telemetry import GpuSnapshot


def gpu_subject(g: GpuSnapshot) -> str:
    """'GPU0 0000:03:00.0': the subject of a per-GPU finding."""
    return f"GPU{g.index} {g.pci_bus_id}" if g.pci_bus_id else f"GPU{g.index}"


def gpu_key(g: GpuSnapshot) -> str:
    """The id suffix of a per-GPU finding: its bus id, else 'gpu<index>'."""
    return g.pci_bus_id or f"gpu{g.index}"


@dataclass(frozen=True)
class GpuCheck:
    """What one GPU check always says, written once: id, title, what is expected, why it matters, how to fix it.

    The host checks get theirs from the `guarded` decorator; a GPU check builds every finding through `result`.
    """

    check_id: str
    title: str
    expected: str
    why: str = ""
    fix: str = ""

    def result(
        self,
        status: Status,
        observed: str,
        *,
        subject: str,
        on: str = "",
        facts: dict[str, str] | None = None,
        fix: str | None = None,
    ) -> CheckResult:
        """A finding; `on` suffixes the id (':<bus id>', ':GPU0-GPU1'); `fix` replaces the usual one."""
        return CheckResult(
            check_id=f"{self.check_id}:{on}" if on else self.check_id,
            title=self.title,
            status=status,
            observed=observed,
            expected=self.expected,
            why=self.why,
            fix=self.fix if fix is None else fix,
            subject=subject,
            facts=facts or {},
        )

    def for_gpu(
        self,
        g: GpuSnapshot,
        status: Status,
        observed: str,
        *,
        facts: dict[str, str] | None = None,
        fix: str | None = None,
    ) -> CheckResult:
        """A finding about GPU `g` (id `<check>:<bus id>`)."""
        return self.result(status, observed, subject=gpu_subject(g), on=gpu_key(g), facts=facts, fix=fix)
