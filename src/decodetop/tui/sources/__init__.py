"""Provides the interfaces the UI reads through (telemetry, probes, budget, checks) and the bundle the app gets;
the package's modules are the real ones, one per source, each beside the module that turns its data into views.

The app calls these only from worker threads (blocking calls) or as cheap, non-blocking ones from the event loop
(`start`, `cancel`), so the event loop never waits on a probe, an NVML call or a file. Tests and
snapshots pass their own implementations; `decodetop.tui.launch` builds the real ones (`telemetry`, `probes`,
`budget`, `checks`, `server`) over the packages beneath.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from decodetop.collectors.checks.result import CheckResult
from decodetop.collectors.serving import ServerStatus, ServerStep
from decodetop.history import Fingerprint, History
from decodetop.pipeline.context import BudgetContext
from decodetop.pipeline.gpu_guard import GpuGuard
from decodetop.pipeline.observed import TracedStep
from decodetop.settings import Settings
from decodetop.tui.baseline import BASELINE_NAME
from decodetop.tui.model import BudgetView, ProbeCurves, ProbeView, TelemetryFrame
from decodetop.tui.sources.server import ServerPoller
from decodetop.tui.taps import Taps
from decodetop.tui.trace_source import TraceOptions

ProgressCallback = Callable[[float | None, str], None]
"""(fraction done 0..1 or None, one-line note); called from the probe worker thread."""


class TelemetrySource(Protocol):
    """A telemetry collector running its own thread and calling back once per tick."""

    def start(self, on_frame: Callable[[TelemetryFrame], None]) -> None:
        """Start collecting (non-blocking); `on_frame` is called from the collector's thread."""

    def close(self) -> None:
        """Stop the thread and wait for it (bounded)."""


@dataclass(frozen=True)
class ProbeOutcome:
    """What a finished probe gives the UI: its row, a JSON body (as the history keeps it), the raw result for the
    budget, and a problem of the run's callbacks to say (the history could not be written)."""

    view: ProbeView
    payload: Mapping[str, Any] = field(default_factory=dict)
    result: object = None
    problem: str = ""


class ProbeSource(Protocol):
    """The probe group: one blocking run at a time, cancellable from the event loop. A live group runs each probe
    through the one plan runner (`decodetop.pipeline.plan_runner`): the GPU guard, telemetry paused for
    latency-sensitive probes, the history and the taps as its callbacks."""

    def plan(self, settings: Settings) -> list[ProbeView]:
        """The probes to run for `settings`' model, in order (may block briefly: called in a worker)."""

    def run(self, probe_id: str, on_progress: ProgressCallback) -> ProbeOutcome:
        """Run one probe to the end (blocking); failures come back as an outcome, not an exception."""

    def restore(self, probe_id: str, payload: Mapping[str, Any], measured_at_s: float) -> ProbeOutcome | None:
        """Rebuild an outcome from a history entry (None if the payload is not understood)."""

    def cancel(self) -> None:
        """Cancel the running probe (non-blocking; the run returns a cancelled outcome)."""

    def close(self) -> None:
        """End every rank (bounded wait)."""


class BudgetSource(Protocol):
    """Composes the budget from probe results (pure computation, fast)."""

    def models(self) -> Sequence[tuple[str, str]]:
        """Model presets as (name, one-line description) for the picker."""

    def compose(self, settings: Settings, results: Mapping[str, object], now_s: float) -> BudgetView:
        """The budget for `settings` from the probe results so far (keyed by probe id)."""

    def curves(self, results: Mapping[str, object]) -> ProbeCurves:
        """Chart series taken from the probe results."""

    def note_server(self, answer: ServerStep | ServerStatus) -> None:
        """The --server poller's latest answer (any thread): the observed step follows the one rule."""

    def note_trace(self, traced: TracedStep | None) -> None:
        """A loaded trace's decode steps (any thread): an observation too (`decodetop.pipeline.observed`)."""

    def context(self, settings: Settings, results: Mapping[str, object], now_s: float) -> BudgetContext:
        """What the composition of the budget for `settings` reads: the what-if screen predicts variants from it."""

    def accepts(self, fingerprint: Fingerprint | None, settings: Settings) -> bool:
        """Whether a stored record with `fingerprint` may feed the budget for `settings` (same host, devices,
        versions and scenario; never a record of unknown origin)."""


class ChecksSource(Protocol):
    """Host health checks and baselines."""

    def run(self) -> list[CheckResult]:
        """Run every check (blocking: reads files, NVML)."""


@dataclass
class Sources:
    """Everything the app reads through, plus the clock and the history file."""

    telemetry: TelemetrySource
    probes: ProbeSource
    budget: BudgetSource
    checks: ChecksSource
    history: History | None = None
    clock: Callable[[], float] = time.time
    """Wall clock for ages; snapshot tests pass a fixed one."""
    run_probes_at_start: bool = True
    """Queue the whole probe plan at start (False with --no-probes and --demo)."""
    notes: tuple[str, ...] = ()
    """Lines to show once at start (where data comes from, what is off)."""
    taps: Taps | None = None
    """--record / --prometheus outputs, fed from worker threads."""
    server: ServerPoller | None = None
    """--server: the serving engine's observed step."""
    trace: TraceOptions | None = None
    """--trace and the capture key's server: the traced bar's sources."""
    gpu_guard: GpuGuard | None = None
    """Whether other processes (a serving engine) hold the probe group's GPUs, and the user's consent to probe
    them anyway; None where nothing runs on a GPU (CPU ranks, --no-probes, a replay)."""
    baseline_name: str = BASELINE_NAME
    """The history key of the baseline `s` saves and the screen marks changes against (the demo keeps its own)."""
    settings: Settings | None = None
    """The settings the sources were built for, where they differ from those given (a replay restores the scenario
    of its recording); None: the ones given."""
