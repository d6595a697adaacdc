"""Provides the messages worker threads and collectors post to the app (dataclasses; `post_message` is thread-safe)."""

from __future__ import annotations

from dataclasses import dataclass

from textual.message import Message

from decodetop.collectors.checks.result import CheckResult
from decodetop.history import HistoryEntry
from decodetop.pipeline.gpu_guard import HeldGpus
from decodetop.tui.model import BudgetView, ProbeCurves, ProbeView, TelemetryFrame
from decodetop.tui.sources import ProbeOutcome


@dataclass
class TelemetryReady(Message):
    """A new telemetry frame; a newer one replaces an older one still queued (latest snapshot wins)."""

    frame: TelemetryFrame

    def can_replace(self, message: Message) -> bool:
        """Coalesce queued frames."""
        return isinstance(message, TelemetryReady)


@dataclass
class ProbePlanned(Message):
    """The probe plan for the current model (rows to show, in order)."""

    probes: list[ProbeView]
    run_now: bool
    notes: tuple[str, ...] = ()
    """What the plan cannot measure on this group, one line each."""
    held: HeldGpus | None = None
    """Other processes hold the group's GPUs: the plan was not started (the serving-time view)."""


@dataclass
class GpusLooked(Message):
    """Before running probes on a key: whether other processes hold the group's GPUs (None: free)."""

    probe_ids: tuple[str, ...]
    held: HeldGpus | None


@dataclass
class ProbeStarted(Message):
    """A probe began running."""

    probe_id: str


@dataclass
class ProbeProgress(Message):
    """Progress of the running probe; a newer one replaces an older one of the same probe."""

    probe_id: str
    fraction: float | None
    note: str

    def can_replace(self, message: Message) -> bool:
        """Coalesce progress of one probe."""
        return isinstance(message, ProbeProgress) and message.probe_id == self.probe_id


@dataclass
class ProbeFinished(Message):
    """A probe ended (done, failed, timed out, unsupported or cancelled)."""

    probe_id: str
    outcome: ProbeOutcome


@dataclass
class ChecksReady(Message):
    """Health checks ran (or could not: `problem`)."""

    checks: list[CheckResult]
    problem: str = ""


@dataclass
class HistoryLoaded(Message):
    """The history file was read at start."""

    entries: list[HistoryEntry]
    problem: str | None


@dataclass
class BaselineSaved(Message):
    """A baseline was written to the history (or could not be: `problem`)."""

    entry: HistoryEntry | None
    problem: str = ""


@dataclass
class BudgetReady(Message):
    """A budget composition finished (`view` None and `problem` set when it failed); `seq` orders them."""

    seq: int
    view: BudgetView | None
    curves: ProbeCurves | None
    problem: str = ""


@dataclass
class ObservedUpdate(Message):
    """The serving engine's step time (`step_ms`), or why there is none (`summary` only)."""

    step_ms: float | None
    summary: str

    def can_replace(self, message: Message) -> bool:
        """Latest answer wins."""
        return isinstance(message, ObservedUpdate)
