"""Provides AppBase: the live UI's state and the screen updates that key actions (`tui.bindings`) and message
handlers (`tui.handlers`) share; `tui.app.DecodetopApp` puts them together.

The work lives in controllers, off the event loop: `ProbeRunner` (plan and runs), `StoredResults` (the history),
`BudgetComposer` (the composition), `GpuConsent` (GPUs other processes hold). Here they are wired to the widgets.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING

from textual.app import App, ComposeResult
from textual.geometry import Size
from textual.notifications import SeverityLevel
from textual.widgets import Static, TabbedContent

from decodetop.collectors.checks.result import CheckResult
from decodetop.inert import inert
from decodetop.pipeline.gpu_guard import HeldGpus
from decodetop.settings import Settings
from decodetop.themes import THEME_NAMES, drop_other_themes, register_themes, theme_variable_defaults
from decodetop.tui import layout
from decodetop.tui.baseline import budget_moves, changed_since
from decodetop.tui.budget_composer import BudgetComposer
from decodetop.tui.consent import GpuConsent, held_note
from decodetop.tui.crash import CrashReport
from decodetop.tui.inert_text import inert_text
from decodetop.tui.messages import ChecksReady
from decodetop.tui.model import HealthView, ProbeView, TelemetryFrame
from decodetop.tui.probe_queue import ProbeQueue
from decodetop.tui.probe_runner import ProbeRunner
from decodetop.tui.sources import Sources
from decodetop.tui.status import StatusState, status_text
from decodetop.tui.stored_results import StoredResults
from decodetop.tui.widgets.budget_bar import BudgetBar
from decodetop.tui.widgets.budget_history import BudgetHistory
from decodetop.tui.widgets.health_panel import HealthPanel
from decodetop.tui.widgets.probe_table import ProbeTable
from decodetop.tui.widgets.status_line import StatusLine
from decodetop.tui.widgets.telemetry_history import TelemetryHistory
from decodetop.tui.widgets.traced_bar import TracedBar

if TYPE_CHECKING:
    from decodetop.history import HistoryEntry
    from decodetop.tui.widgets.charts import Charts


class AppBase(App[int]):
    """The live UI's state over injected `Sources`, and the updates every part of the app makes to the screen."""

    COMPACT_BELOW_ROWS = layout.COMPACT_BELOW_ROWS
    WIDE_FROM = layout.WIDE_FROM
    MIN_SIZE = layout.MIN_SIZE
    HORIZONTAL_BREAKPOINTS = layout.HORIZONTAL_BREAKPOINTS
    VERTICAL_BREAKPOINTS = layout.VERTICAL_BREAKPOINTS

    def __init__(
        self,
        sources: Sources,
        settings: Settings,
        settings_path: Path | None = None,
        *,
        save_theme: bool = True,
        age_refresh_s: float = 1.0,
    ) -> None:
        super().__init__()
        self.sources = sources
        """Where data comes from (the real sources, or fixed ones in tests)."""
        self.settings = settings
        """Current settings (flags over the file); `m`, `p` and `t` change them."""
        self.settings_path = settings_path
        """Where `t`/`m` save settings; None means the default path."""
        self.save_theme = save_theme
        """False in tests and when the user passed --theme (a flag is not a preference to remember)."""
        self.age_refresh_s = age_refresh_s
        self.runner = ProbeRunner(self, sources, settings=lambda: self.settings, now=self.now, show=self.show_probe)
        self.stored = StoredResults(sources.history, sources.budget.accepts, sources.baseline_name)
        self.composer = BudgetComposer(self, sources.budget, self.now)
        self.consent = GpuConsent(self, sources.gpu_guard)
        self.crash_report = CrashReport()
        """The first exception nothing handled: its log, and the one line `decodetop` ends with (tui/crash.py)."""
        self.checks: list[CheckResult] = []
        self.telemetry = TelemetryHistory()
        self.budgets = BudgetHistory()
        """The observed step and each component over time (the charts)."""
        self.last_frame: TelemetryFrame | None = None
        self.closing = False
        self.status_notes: list[str] = list(sources.notes)
        self._status_text = ""
        self.server_note = ""
        """The live server's last answer, one line (--server)."""
        self.server_seen: tuple[float | None, bool] = (None, False)
        """The step and whether it was a status, of the server's last answer (the budget recomposes on a change)."""
        self.trace_note = ""
        """The traced bar's last progress or outcome, one line."""
        self.charts: Charts | None = None
        """The charts, once their tab was first shown."""
        self._held_text = ""
        self.folded = False
        """The budget box folded to its one-line verdict (the fold key)."""
        self._gpu_note: str | None = None
        self._sources_closed = False
        register_themes(self)
        self.theme = settings.theme if settings.theme in self.available_themes else THEME_NAMES[0]
        drop_other_themes(self)

    def get_theme_variable_defaults(self) -> dict[str, str]:
        """decodetop's variables for themes that lack them (Textual's built-ins)."""
        return theme_variable_defaults()

    def compose(self) -> ComposeResult:
        """The main screen (`tui.layout`)."""
        yield from layout.compose_screen(self.sources)

    def now(self) -> float:
        """The app's clock (fixed in snapshot tests)."""
        return self.sources.clock()

    def notify(
        self,
        message: str,
        *,
        title: str = "",
        severity: SeverityLevel = "information",
        timeout: float | None = None,
        markup: bool = False,
    ) -> None:
        """A toast; its text is never markup and every control in it is marked: a notification names files, servers
        and errors whose text comes from outside (a `[/x]` in it would end the app, an ESC would reach the
        terminal). `markup` is accepted for Textual's signature and ignored."""
        del markup
        super().notify(inert(message), title=inert(title), severity=severity, timeout=timeout, markup=False)

    # -- what tests and the status line read -------------------------------------------------------------------

    @property
    def probe_views(self) -> dict[str, ProbeView]:
        """Every probe's row, by id."""
        return self.runner.views

    @property
    def results(self) -> dict[str, object]:
        """The latest good raw result of each probe (what the budget composes from)."""
        return self.runner.results

    @property
    def running_probe(self) -> str | None:
        """The probe running now."""
        return self.runner.running

    @property
    def queue(self) -> ProbeQueue:
        """The probes waiting to run."""
        return self.runner.queue

    @property
    def baseline(self) -> HistoryEntry | None:
        """The stored baseline (`s`), if any."""
        return self.stored.baseline

    @property
    def held(self) -> HeldGpus | None:
        """Other processes hold the probe group's GPUs and the user has not consented (probes wait for a key)."""
        return self.consent.held

    @property
    def budget_settled(self) -> bool:
        """True when the bar shows the latest composition asked for (tests and snapshots wait on it)."""
        return self.composer.settled

    # -- screen updates ----------------------------------------------------------------------------------------

    def show_probe(self, view: ProbeView) -> None:
        """Draw one probe row."""
        table = self.query_one(ProbeTable)
        table.now_s = self.now()
        table.show(view)

    def restore_stored(self) -> None:
        """Show the stored results of planned probes that this session has not measured."""
        self.runner.restore_all(lambda probe_id: self.stored.matching(probe_id, self.settings))

    def plan_probes(self) -> None:
        """Plan the current scenario's probes (run at once where the sources say so and the GPUs are free)."""
        self.runner.plan(self.sources.run_probes_at_start, self.consent.held_now)

    def recompose_budget(self) -> None:
        """Compose the budget off the event loop (the first composition imports and builds the inventory)."""
        self.stored.split(self.settings)
        self.composer.request(self.settings, self.runner.results)

    def mark_budget(self) -> None:
        """Show the latest composition with the components that moved since the baseline marked (Δ)."""
        view = self.composer.view
        if view is not None:
            self.query_one(BudgetBar).budget = dataclasses.replace(view, moved=budget_moves(view, self.stored.baseline))
            self.query_one(TracedBar).budget = view
            self.query_one("#budget-box").border_title = f"per-token budget · {view.title}"
            self.fit_box()

    def fit_box(self, size: Size | None = None) -> None:
        """Give the budget box the rows its tiers earn on this screen (`tui.layout.fit_budget_box`)."""
        note_rows = self._held_text.count("\n") + 1 if self._held_text else 0
        layout.fit_budget_box(self, size, folded=self.folded, note_rows=note_rows)

    def show_health(self, problem: str = "") -> None:
        """The health table (and its side copy), with the checks changed since the baseline marked."""
        baseline = self.stored.baseline
        view = HealthView(
            checks=tuple(self.checks),
            changed_ids=changed_since(self.checks, baseline),
            baseline_at_s=None if baseline is None else baseline.recorded_at_s,
            problem=problem,
        )
        for panel in self.query(HealthPanel):
            panel.show(view, self.now())

    def show_held(self) -> None:
        """The serving-time view's header: why probes did not start, and what the budget shows instead."""
        held = self.consent.held
        newest = None if held is None else self.stored.newest_feeding(self.settings, self.runner.views)
        compact = self.query_one(BudgetBar).compact  # every row counts: one line, cut to the width
        text = held_note(held, newest, self.now(), one_line_width=self.size.width - 2 if compact else None)
        if text != self._held_text:
            self._held_text = text
            note = self.query_one("#held-note", Static)
            note.update(inert_text(text, lines=True))  # process names: any user picks them
            note.display = bool(text)
            self.fit_box()

    def set_status(self) -> None:
        """The status line, redrawn only when its text changes."""
        state = StatusState(
            settings=self.settings,
            running_probe=self.runner.running,
            queued=len(self.runner.queue),
            frame=self.last_frame,
            held=self.consent.held is not None,
            others=self.stored.others,
            server_note=self.server_note,
            trace_note=self.trace_note,
            notes=self.status_notes,
        )
        text = status_text(state)
        if text != self._status_text:
            self._status_text = text
            self.query_one("#status", StatusLine).text = text

    def charts_shown(self) -> Charts | None:
        """The charts when their tab is the one on screen (they re-plot only then)."""
        if self.charts is not None and self.query_one(TabbedContent).active == "charts":
            return self.charts
        return None

    def telemetry_now(self) -> float:
        """The newest telemetry frame's time (a replay's frames keep theirs), else the clock: where the GPU history
        ends."""
        return self.last_frame.taken_at_s if self.last_frame is not None else self.now()

    # -- checks ------------------------------------------------------------------------------------------------

    def run_checks(self) -> None:
        """Run the host checks in a worker; `ChecksReady` brings them."""
        self.run_worker(self._checks, name="checks", group="checks", exclusive=True, thread=True, exit_on_error=False)

    def _checks(self) -> None:
        try:
            checks = self.sources.checks.run()
        except Exception as exc:  # checks must never take the UI down
            self.post_message(ChecksReady(checks=[], problem=f"health checks failed: {type(exc).__name__}: {exc}"))
            return
        if self.sources.taps is not None:
            self.sources.taps.on_checks(checks, self.now())
        self.post_message(ChecksReady(checks=checks))
