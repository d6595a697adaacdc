"""Provides DecodetopApp: the live UI (budget bar, probes, GPUs, health, charts) over injected `Sources`.

Threads: the telemetry collector runs its own thread and posts `TelemetryReady`; one long-lived thread worker
takes probe ids from a `ProbeQueue` and runs them one at a time (blocking calls into the probe group); short
thread workers read the history, plan the probes, run the checks and write files. Results come back as messages,
so the event loop only draws. Quitting cancels the running probe, closes the probe group and the collector
(in a worker, so the screen stays live while ranks exit), then exits.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from textual import events, on, work
from textual.app import App, ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Container, Horizontal, Vertical
from textual.geometry import Size
from textual.widgets import DataTable, Footer, Input, Static, TabbedContent, TabPane
from textual.worker import get_current_worker

from decodetop.budget.diff import diff_budgets
from decodetop.collectors.checks.model import CheckResult
from decodetop.collectors.serving import ObservedStep as ServerObserved
from decodetop.collectors.serving import ServerStatus
from decodetop.errors import UserInputError
from decodetop.history import KIND_BASELINE, KIND_PROBE, HistoryEntry, format_ago
from decodetop.settings import Settings, save_changes
from decodetop.themes import THEME_NAMES, drop_other_themes, next_theme, register_themes, theme_variable_defaults
from decodetop.tui.adapters import ControllerProbes
from decodetop.tui.gpu_guard import HeldGpus
from decodetop.tui.launch import HEADLESS_HINT, MIN_COLUMNS, MIN_ROWS
from decodetop.tui.messages import (
    BaselineSaved,
    BudgetReady,
    ChecksReady,
    GpusLooked,
    HistoryLoaded,
    ObservedUpdate,
    ProbeFinished,
    ProbePlanned,
    ProbeProgress,
    ProbeStarted,
    TelemetryReady,
)
from decodetop.tui.model import (
    BudgetMove,
    BudgetView,
    HealthView,
    ProbeCurves,
    ProbeState,
    ProbeView,
    TelemetryFrame,
)
from decodetop.tui.other_scenarios import OtherScenario, origin_text, other_scenarios, others_summary
from decodetop.tui.probe_queue import ProbeQueue
from decodetop.tui.screens.budget_details import BudgetDetails, BudgetDetailsScreen, stored_line
from decodetop.tui.screens.confirm_probes import ConfirmProbesScreen
from decodetop.tui.screens.details import CheckDetailScreen, ProbeDetailScreen
from decodetop.tui.screens.gpu_details import GpuDetailScreen
from decodetop.tui.screens.help import HelpScreen
from decodetop.tui.screens.model_picker import ModelPickerScreen
from decodetop.tui.screens.tp_picker import TpChoice, TpPickerScreen, tp_options
from decodetop.tui.screens.trace_kernels import TraceKernelsScreen
from decodetop.tui.sources import ProbeOutcome, Sources
from decodetop.tui.widgets.budget_bar import BudgetBar
from decodetop.tui.widgets.gpu_table import GpuTable
from decodetop.tui.widgets.health_panel import HealthPanel
from decodetop.tui.widgets.probe_table import ProbeTable
from decodetop.tui.widgets.process_table import ProcessTable
from decodetop.tui.widgets.status_line import StatusLine
from decodetop.tui.widgets.telemetry_history import TelemetryHistory
from decodetop.tui.widgets.traced_bar import OpenTraceKernels, TracedBar, TraceStatus

if TYPE_CHECKING:
    from decodetop.tui.widgets.charts import Charts

POP_TIMEOUT_S = 0.2
"""How often the idle probe worker looks at its cancel flag."""
BASELINE_NAME = "default"
TABS = ("probes", "gpus", "health", "charts")

HELP_TEXT = {
    "quit": "quit: cancels the running probe, ends every probe rank and the telemetry thread",
    "help": "this list",
    "rerun": "re-run the selected probe (asks first where other processes hold the GPUs: a serving engine)",
    "rerun_all": "re-run every probe of the plan (asks first where other processes hold the GPUs)",
    "budget_details": "budget details: where each figure came from, other scenarios stored (never mixed in)",
    "cancel_probe": "cancel the running probe and empty the queue",
    "save_baseline": "save the checks, probe values and budget as the baseline (changes are marked Δ)",
    "pick_model": "choose the model: the probe plan and the budget follow",
    "cycle_theme": "next theme: dark, light, high-contrast (remembered in settings.toml)",
    "capture_trace": "capture a profiler trace of a few decode steps from --server: the traced bar (enter: kernels)",
    "show_tab('probes')": "probes tab",
    "show_tab('gpus')": "GPUs tab",
    "show_tab('health')": "health tab",
    "show_tab('charts')": "charts tab",
    "pick_tp": "choose the tensor-parallel degree: the probe plan and the budget follow",
    "cycle_sort": "sort the GPU table: by GPU, utilisation, memory, power, temperature (or click a header)",
    "filter": "filter the probe, GPU, process and health tables (enter keeps it, escape clears it)",
}
"""What `?` says for each binding (the footer keeps the short descriptions)."""

EXTRA_KEYS: tuple[tuple[str, str], ...] = (
    ("enter", "details of the selected probe, GPU or check"),
    ("↑ ↓ / pgup pgdn", "move in a table"),
    ("tab", "move focus"),
    ("ctrl+p", "command palette"),
)


def baseline_payload(
    checks: list[CheckResult], probes: Mapping[str, ProbeView], budget: BudgetView | None = None
) -> dict[str, Any]:
    """What a baseline stores: each check's status, observed value and facts; each probe's value; the budget's
    components with their spread (what `budget_moves` compares against)."""
    payload: dict[str, Any] = {
        "checks": {
            c.check_id: {"status": c.status.value, "observed": c.observed, "facts": dict(c.facts)} for c in checks
        },
        "probes": {pid: v.value_text for pid, v in probes.items() if v.value_text},
    }
    if budget is not None:
        payload["budget"] = budget.to_budget_dict()
    return payload


def budget_moves(budget: BudgetView, baseline: HistoryEntry | None) -> tuple[BudgetMove, ...]:
    """The components of `budget` that moved beyond their noise since the baseline's budget
    (`decodetop.budget.diff`), largest increase first. None without a stored budget, for another model, or when the
    stored budget does not read (a baseline from before budgets were stored, a hand-edited file)."""
    stored = None if baseline is None else baseline.payload.get("budget")
    if not isinstance(stored, Mapping):
        return ()
    try:
        diff = diff_budgets(stored, budget.to_budget_dict(), baseline_name="baseline", current_name="budget")
    except UserInputError:
        return ()
    if diff.baseline_model != diff.current_model:
        return ()  # another model's budget: its components are not this one's
    return tuple(BudgetMove(d.component, d.delta_ms) for d in diff.moved if d.delta_ms is not None)


def changed_since(checks: list[CheckResult], baseline: HistoryEntry | None) -> frozenset[str]:
    """Ids of checks whose status or observed value differs from the baseline (new checks count as changed)."""
    if baseline is None:
        return frozenset()
    stored = baseline.payload.get("checks", {})
    if not isinstance(stored, dict):
        return frozenset()
    changed = set()
    for check in checks:
        old = stored.get(check.check_id)
        if (
            not isinstance(old, dict)
            or old.get("status") != check.status.value
            or old.get("observed") != check.observed
        ):
            changed.add(check.check_id)
    return frozenset(changed)


class DecodetopApp(App[int]):
    """The live UI."""

    CSS_PATH = "app.tcss"
    TITLE = "decodetop"
    ENABLE_COMMAND_PALETTE = True
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("q", "quit", "quit"),
        Binding("question_mark", "help", "keys", key_display="?"),
        Binding("r", "rerun", "re-run"),
        Binding("R", "rerun_all", "all", key_display="R"),
        Binding("x", "cancel_probe", "cancel"),
        Binding("s", "save_baseline", "baseline"),
        Binding("m", "pick_model", "model"),
        Binding("p", "pick_tp", "TP"),
        Binding("t", "cycle_theme", "theme"),
        Binding("c", "capture_trace", "trace", show=False),
        Binding("b", "budget_details", "budget", show=False),
        Binding("1", "show_tab('probes')", "probes", show=False),
        Binding("2", "show_tab('gpus')", "GPUs", show=False),
        Binding("3", "show_tab('health')", "health", show=False),
        Binding("4", "show_tab('charts')", "charts", show=False),
        Binding("o", "cycle_sort", "sort", show=False),
        Binding("slash", "filter", "filter", key_display="/", show=False),
    ]

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
        """Where data comes from (real adapters, or fixed ones in tests)."""
        self.settings = settings
        """Current settings (flags over the file); `m` and `t` change them."""
        self.settings_path = settings_path
        """Where `t`/`m` save settings; None means the default path."""
        self.save_theme = save_theme
        """False in tests and when the user passed --theme (a flag is not a preference to remember)."""
        self.age_refresh_s = age_refresh_s
        self.probe_views: dict[str, ProbeView] = {}
        """Every probe's row, by id."""
        self.results: dict[str, object] = {}
        """The latest good raw result of each probe (what the budget composes from)."""
        self.checks: list[CheckResult] = []
        self.baseline: HistoryEntry | None = None
        self.telemetry = TelemetryHistory()
        self.last_frame: TelemetryFrame | None = None
        self.queue = ProbeQueue()
        self.running_probe: str | None = None
        self.closing = False
        self._history_latest: dict[str, HistoryEntry] = {}
        self._history_probes: list[HistoryEntry] = []
        """Every stored probe result; only those whose fingerprint the budget accepts are restored."""
        self._status_notes: list[str] = list(sources.notes)
        self._status_text = ""
        self._budget_seq = 0
        self._sources_closed = False
        self.server_note = ""
        self.trace_note = ""
        """The traced bar's last progress or outcome, one line."""
        """The live server's last answer, one line (--server)."""
        self._budget_shown = -1
        self._budget_view: BudgetView | None = None
        """The latest composition, before the baseline's moves are marked on it."""
        self.curves = ProbeCurves()
        """The chart curves of the latest composition."""
        self.charts: Charts | None = None
        """The charts, once their tab was first shown."""
        self._gpu_note: str | None = None
        self.held: HeldGpus | None = None
        """Other processes hold the probe group's GPUs and the user has not consented: probes wait for a key."""
        self._held_text = ""
        self.other_scenarios: tuple[OtherScenario, ...] = ()
        """Stored probe records the budget does not take (another scenario, host or device; unknown origin)."""
        register_themes(self)
        self.theme = settings.theme if settings.theme in self.available_themes else THEME_NAMES[0]
        drop_other_themes(self)

    # -- layout ----------------------------------------------------------------------------------------------------

    def get_theme_variable_defaults(self) -> dict[str, str]:
        """decodetop's variables for themes that lack them (Textual's built-ins)."""
        return theme_variable_defaults()

    def compose(self) -> ComposeResult:
        """Budget on top, the tables and charts in tabs below, a status line and the footer."""
        with Container(id="budget-box"):
            yield Static("", id="held-note", markup=False)
            yield BudgetBar(id="budget")
            yield TracedBar(self.sources.trace, id="traced")
        with Horizontal(id="main"):
            with TabbedContent(initial="probes", id="tabs"):
                with TabPane("Probes 1", id="probes"):
                    yield ProbeTable(id="probe-table")
                with TabPane("GPUs 2", id="gpus"):
                    yield Static("", id="gpu-note", classes="gpu-note")
                    yield GpuTable(id="gpu-table")
                    yield ProcessTable(id="process-table")
                with TabPane("Health 3", id="health"):
                    yield HealthPanel(id="health-panel")
                with TabPane("Charts 4", id="charts"):
                    # mounted on first view: plotext costs ~0.1 s to import and each re-plot is pure Python
                    yield Static("charts load when this tab opens", id="charts-placeholder")
            with Vertical(id="side"):
                yield Static("", id="side-gpu-note", classes="gpu-note")
                yield GpuTable(id="side-gpu-table")
                yield HealthPanel(id="side-health-panel")
        yield Input(placeholder="filter: GPU, bus id, process, check… (enter keeps, escape clears)", id="filter")
        yield Static("", id="too-small")
        yield StatusLine(id="status")
        yield Footer()

    def on_mount(self) -> None:
        """Draw the empty frame at once, then start everything in the background."""
        self.query_one("#budget-box").border_title = "per-token budget"
        self._fit_layout(self.size)
        self._recompose_budget()
        self._set_status()
        self.sources.telemetry.start(self._on_frame_from_thread)
        self._load_history()
        self._plan_probes(run_now=self.sources.run_probes_at_start)
        self._probe_loop()
        self._run_checks()
        if self.sources.server is not None:
            self.sources.server.start(self._on_server_answer)
        if self.age_refresh_s > 0:
            self.set_interval(self.age_refresh_s, self._refresh_ages)
        self.query_one(TracedBar).now_s = self.now()
        self.query_one(TracedBar).start(self.settings.model)
        self.query_one(ProbeTable).focus()

    COMPACT_BELOW_ROWS = 40
    """Terminals shorter than this get the compact budget legend (so 80×24 keeps room for the tables)."""

    WIDE_FROM = (150, 40)
    """From this size (columns, rows) the GPU table and health panel also show beside the tabs."""

    WIDE_FOOTER_FROM = 120
    """Narrower terminals get Textual's compact footer (one space between keys), so every key fits at 80."""

    MIN_SIZE = (MIN_COLUMNS, MIN_ROWS)
    """Below this (columns, rows) the screen says "too small" instead of drawing a cut layout: the compact budget
    (border, title, bar, two legend rows, note: 6 rows), the tab strip (2), three table rows with the header (4),
    the status line and the footer (2) need 14 rows; 60 columns hold the six headline GPU columns."""

    HORIZONTAL_BREAKPOINTS = [  # noqa: RUF012 (Textual declares it on App as a list)
        (0, "-cols-tiny"),
        (MIN_SIZE[0], "-cols-ok"),
        (WIDE_FROM[0], "-cols-wide"),
    ]
    """Screen classes from the width Textual passes with each resize (the new size, never the old one)."""
    VERTICAL_BREAKPOINTS = [  # noqa: RUF012 (Textual declares it on App as a list)
        (0, "-rows-tiny"),
        (MIN_SIZE[1], "-rows-ok"),
        (WIDE_FROM[1], "-rows-tall"),
    ]
    """Screen classes from the height; app.tcss lays the screen out from these classes alone."""

    def on_resize(self, event: events.Resize) -> None:
        """Compact legend on short terminals (the side panels follow the breakpoint classes in app.tcss)."""
        self._fit_layout(event.size)

    def _fit_layout(self, size: Size) -> None:
        self.query_one(BudgetBar).compact = size.height < self.COMPACT_BELOW_ROWS
        if self.held is not None:
            self._show_held()
        footer = self.query_one(Footer)
        footer.compact = size.width < self.WIDE_FOOTER_FROM
        palette = size.width >= self.WIDE_FOOTER_FROM  # narrower: ctrl+p still works, `?` lists it
        if footer.show_command_palette != palette:
            footer.show_command_palette = palette
            footer.refresh(recompose=True)
        too_small = size.width < self.MIN_SIZE[0] or size.height < self.MIN_SIZE[1]
        self.query_one("#too-small", Static).update(
            f"terminal too small: {size.width}×{size.height}, decodetop needs {self.MIN_SIZE[0]}×{self.MIN_SIZE[1]}"
            f"; make it larger, or {HEADLESS_HINT}"
            if too_small
            else ""
        )

    def now(self) -> float:
        """The app's clock (fixed in snapshot tests)."""
        return self.sources.clock()

    # -- telemetry ---------------------------------------------------------------------------------------------

    def _on_frame_from_thread(self, frame: TelemetryFrame) -> None:
        self.post_message(TelemetryReady(frame))

    @on(TelemetryReady)
    def _show_frame(self, message: TelemetryReady) -> None:
        if self.closing:  # late messages while the app shuts down: the widgets may be gone
            return
        frame = message.frame
        first_gpus = bool(frame.gpus) and (self.last_frame is None or not self.last_frame.gpus)
        self.last_frame = frame
        if first_gpus:
            self._recompose_budget()  # the roofline can use the GPU's own figures now
        self.query_one(ProcessTable).show(frame)
        for table in self.query(GpuTable):
            table.show(frame)
        self.telemetry.add(frame)
        note = frame.source_note
        if not frame.gpus:
            note = f"no GPU telemetry: {frame.unavailable_reason or 'no GPU found'}"
        if note != self._gpu_note:
            self._gpu_note = note
            for static in self.query(".gpu-note").results(Static):
                static.update(note)
                static.set_class(bool(frame.gpus), "-source")  # only where the data comes from: can give way
        if self.charts is not None and self.query_one(TabbedContent).active == "charts":
            self.charts.show_history(self.telemetry, frame.taken_at_s)
        self._set_status()

    def _on_server_answer(self, answer: ServerObserved | ServerStatus) -> None:
        """Poller thread: pass the answer on to the taps and the screen."""
        if self.sources.taps is not None:
            self.sources.taps.on_observed(answer)
        step = answer.step_ms if isinstance(answer, ServerObserved) else None
        self.post_message(ObservedUpdate(step, answer.summary))

    @on(ObservedUpdate)
    def _observed_update(self, message: ObservedUpdate) -> None:
        if self.closing:
            return
        self.server_note = message.summary
        if message.step_ms is not None and message.step_ms > 0 and message.step_ms != self.settings.observed_ms:
            self.settings = dataclasses.replace(self.settings, observed_ms=message.step_ms)
            self._recompose_budget()
        self._set_status()

    # -- history -------------------------------------------------------------------------------------------------

    @work(thread=True, exit_on_error=False, group="files")
    def _load_history(self) -> None:
        history = self.sources.history
        if history is None:
            self.post_message(HistoryLoaded(entries=[], problem=None))
            return
        loaded = history.load()
        self.post_message(HistoryLoaded(entries=list(loaded.entries), problem=loaded.problem))

    @on(HistoryLoaded)
    def _apply_history(self, message: HistoryLoaded) -> None:
        if self.closing:  # late messages while the app shuts down: the widgets may be gone
            return
        if message.problem:
            self._status_notes.append(message.problem)
            self.notify(message.problem, title="history", severity="warning", timeout=15)
        latest: dict[str, HistoryEntry] = {}
        baseline: HistoryEntry | None = None
        for entry in message.entries:
            if entry.kind == KIND_PROBE:
                latest[entry.key] = entry
            elif entry.kind == KIND_BASELINE and entry.key == BASELINE_NAME:
                baseline = entry
        self._history_latest = latest
        self._history_probes = [e for e in message.entries if e.kind == KIND_PROBE]
        if baseline is not None:
            self.baseline = baseline
        for probe_id in list(self.probe_views):
            self._restore_from_history(probe_id)
        self._recompose_budget()
        self._show_health()
        self._show_held()
        self._set_status()

    def _matching_history(self, probe_id: str) -> HistoryEntry | None:
        """The newest stored result of `probe_id` measured on this setup for this scenario (fingerprints compared by
        the budget source); records from elsewhere or of unknown origin never feed the budget."""
        found = [
            e
            for e in self._history_probes
            if e.key == probe_id and self.sources.budget.accepts(e.fingerprint, self.settings)
        ]
        return max(found, key=lambda e: e.recorded_at_s) if found else None

    def _restore_from_history(self, probe_id: str) -> None:
        entry = self._matching_history(probe_id)
        view = self.probe_views.get(probe_id)
        if entry is None or view is None or probe_id in self.results:
            return
        outcome = self.sources.probes.restore(probe_id, entry.payload, entry.recorded_at_s)
        if outcome is None:
            return
        if outcome.result is not None:
            self.results[probe_id] = outcome.result
        restored = dataclasses.replace(
            outcome.view,
            state=view.state if view.state in (ProbeState.QUEUED, ProbeState.RUNNING) else outcome.view.state,
            progress=view.progress,
            from_history=True,
            measured_at_s=entry.recorded_at_s,
        )
        self._update_probe(restored)

    # -- probes ----------------------------------------------------------------------------------------------------

    @work(thread=True, exit_on_error=False, group="plan", exclusive=True)
    def _plan_probes(self, run_now: bool) -> None:
        try:
            views = self.sources.probes.plan(self.settings)
        except Exception as exc:  # a bad model config must not close the UI
            self.call_from_thread(self.notify, f"probe plan: {exc}", severity="error", timeout=15)
            views = []
        probes = self.sources.probes
        notes = probes.plan_notes if isinstance(probes, ControllerProbes) else ()
        held = self._held_now() if run_now and views else None
        self.post_message(ProbePlanned(probes=views, run_now=run_now and held is None, notes=notes, held=held))

    @on(ProbePlanned)
    def _apply_plan(self, message: ProbePlanned) -> None:
        if self.closing:  # late messages while the app shuts down: the widgets may be gone
            return
        for note in message.notes[:1]:
            self._status_notes.append(f"plan: {note}")
        self.held = message.held
        table = self.query_one(ProbeTable)
        kept = {v.probe_id: self.probe_views[v.probe_id] for v in message.probes if v.probe_id in self.probe_views}
        self.probe_views = {v.probe_id: kept.get(v.probe_id, v) for v in message.probes}
        table.replace_all(list(self.probe_views.values()))
        for probe_id in self.probe_views:
            self._restore_from_history(probe_id)
        if message.run_now:
            for probe_id in self.probe_views:
                self._enqueue(probe_id)
        self._recompose_budget()
        self._show_held()
        self._set_status()

    def _enqueue(self, probe_id: str) -> None:
        if probe_id == self.running_probe or self.closing:
            return
        if self.queue.push(probe_id):
            view = self.probe_views[probe_id]
            self._update_probe(dataclasses.replace(view, state=ProbeState.QUEUED, progress=None, progress_note=""))

    def _update_probe(self, view: ProbeView) -> None:
        self.probe_views[view.probe_id] = view
        table = self.query_one(ProbeTable)
        table.now_s = self.now()
        table.show(view)

    @work(thread=True, exit_on_error=False, group="probe-loop", exclusive=True)
    def _probe_loop(self) -> None:
        worker = get_current_worker()
        probes = self.sources.probes
        while not worker.is_cancelled and not self.queue.closed:
            probe_id = self.queue.pop(POP_TIMEOUT_S)
            if probe_id is None:
                continue
            self.running_probe = probe_id
            self.post_message(ProbeStarted(probe_id))
            quiet = probes.is_latency_probe(probe_id)
            if quiet:
                self.sources.telemetry.set_quiet(True)
            try:

                def progress(fraction: float | None, note: str, probe_id: str = probe_id) -> None:
                    self.post_message(ProbeProgress(probe_id, fraction, note))

                outcome = probes.run(probe_id, progress)
            except Exception as exc:  # an adapter bug must show as a failed probe, not kill the loop
                import traceback

                view = ProbeView(
                    probe_id=probe_id,
                    title=probe_id,
                    state=ProbeState.FAILED,
                    error=f"{type(exc).__name__}: {exc}",
                    traceback=traceback.format_exc(),
                )
                outcome = ProbeOutcome(view=view)
            finally:
                if quiet:
                    self.sources.telemetry.set_quiet(False)
                self.running_probe = None
            if outcome.view.measured_at_s is None:
                outcome = dataclasses.replace(outcome, view=dataclasses.replace(outcome.view, measured_at_s=self.now()))
            taps = self.sources.taps
            if taps is not None and outcome.result is not None:
                taps.on_probe_result(outcome.result)
            history = self.sources.history
            if history is not None and outcome.payload and not self.closing:
                try:
                    history.record(
                        KIND_PROBE,
                        probe_id,
                        outcome.payload,
                        recorded_at_s=outcome.view.measured_at_s,
                        fingerprint=self.sources.budget.fingerprint(self.settings, outcome.result),
                    )
                except (OSError, ValueError) as exc:
                    self.call_from_thread(self.notify, f"history: cannot save {probe_id}: {exc}", severity="warning")
            self.post_message(ProbeFinished(probe_id, outcome))

    @on(ProbeStarted)
    def _probe_started(self, message: ProbeStarted) -> None:
        if self.closing:  # late messages while the app shuts down: the widgets may be gone
            return
        view = self.probe_views.get(message.probe_id)
        if view is not None:
            self._update_probe(dataclasses.replace(view, state=ProbeState.RUNNING, progress=0.0, progress_note=""))
        self._set_status()

    @on(ProbeProgress)
    def _probe_progress(self, message: ProbeProgress) -> None:
        if self.closing:  # late messages while the app shuts down: the widgets may be gone
            return
        view = self.probe_views.get(message.probe_id)
        if view is not None and view.state is ProbeState.RUNNING:
            self._update_probe(dataclasses.replace(view, progress=message.fraction, progress_note=message.note))

    @on(ProbeFinished)
    def _probe_finished(self, message: ProbeFinished) -> None:
        if self.closing:  # late messages while the app shuts down: the widgets may be gone
            return
        outcome = message.outcome
        old = self.probe_views.get(message.probe_id)
        view = outcome.view
        if old is not None and not view.title:
            view = dataclasses.replace(view, title=old.title)
        if view.state is not ProbeState.DONE and old is not None and old.value_text and not view.value_text:
            # keep showing the last good value (with its age) under the new state
            view = dataclasses.replace(
                view, value_text=old.value_text, measured_at_s=old.measured_at_s, from_history=old.from_history
            )
        if message.probe_id in self.probe_views or old is None:
            self._update_probe(view)
        if view.state is ProbeState.DONE and outcome.result is not None:
            self.results[message.probe_id] = outcome.result
            self._recompose_budget()
        self._set_status()

    # -- checks and baseline -------------------------------------------------------------------------------------

    @work(thread=True, exit_on_error=False, group="checks", exclusive=True)
    def _run_checks(self) -> None:
        try:
            checks = self.sources.checks.run()
        except Exception as exc:  # checks must never take the UI down
            self.post_message(ChecksReady(checks=[], problem=f"health checks failed: {type(exc).__name__}: {exc}"))
            return
        if self.sources.taps is not None:
            self.sources.taps.on_checks(checks, self.now())
        self.post_message(ChecksReady(checks=checks))

    @on(ChecksReady)
    def _apply_checks(self, message: ChecksReady) -> None:
        if self.closing:  # late messages while the app shuts down: the widgets may be gone
            return
        self.checks = message.checks
        self._show_health(problem=message.problem)

    def _show_health(self, problem: str = "") -> None:
        view = HealthView(
            checks=tuple(self.checks),
            changed_ids=changed_since(self.checks, self.baseline),
            baseline_at_s=None if self.baseline is None else self.baseline.recorded_at_s,
            problem=problem,
        )
        for panel in self.query(HealthPanel):
            panel.show(view, self.now())

    def action_save_baseline(self) -> None:
        """`s`: save the current checks, probe values and budget as the baseline."""
        self._save_baseline(baseline_payload(self.checks, self.probe_views, self._budget_view))

    @work(thread=True, exit_on_error=False, group="files")
    def _save_baseline(self, payload: dict[str, Any]) -> None:
        history = self.sources.history
        if history is None:
            self.post_message(BaselineSaved(entry=None, problem="no history file in this session"))
            return
        try:
            entry = history.record(KIND_BASELINE, BASELINE_NAME, payload, recorded_at_s=self.now())
        except (OSError, ValueError) as exc:
            self.post_message(BaselineSaved(entry=None, problem=f"baseline not saved: {exc}"))
            return
        self.post_message(BaselineSaved(entry=entry))

    @on(BaselineSaved)
    def _baseline_saved(self, message: BaselineSaved) -> None:
        if self.closing:  # late messages while the app shuts down: the widgets may be gone
            return
        if message.entry is None:
            self.notify(message.problem, severity="error")
            return
        self.baseline = message.entry
        self._show_health()
        self._mark_budget()
        self.notify(f"baseline saved ({len(self.checks)} checks)", timeout=3)

    # -- budget ----------------------------------------------------------------------------------------------------

    def _recompose_budget(self) -> None:
        """Compose the budget off the event loop (the first composition imports and builds the inventory)."""
        self._split_history()
        self._budget_seq += 1
        self._compose_budget(self._budget_seq, self.settings, dict(self.results))

    @work(thread=True, exit_on_error=False, group="budget")
    def _compose_budget(self, seq: int, settings: Settings, results: dict[str, object]) -> None:
        try:
            view = self.sources.budget.compose(settings, results, self.now())
            curves = self.sources.budget.curves(results)
        except Exception as exc:  # a model the budget cannot handle: say so, keep running
            self.post_message(BudgetReady(seq, None, None, f"budget: {type(exc).__name__}: {exc}"))
            return
        self.post_message(BudgetReady(seq, view, curves))

    @on(BudgetReady)
    def _show_budget(self, message: BudgetReady) -> None:
        if self.closing or message.seq != self._budget_seq:
            return  # shutting down, or a newer composition is on its way
        if message.view is None:
            self._status_notes.append(message.problem)
            self._set_status()
            return
        self._budget_shown = message.seq
        self._budget_view = message.view
        bar = self.query_one(BudgetBar)
        bar.now_s = self.now()
        self._mark_budget()
        if message.curves is not None:
            self.curves = message.curves
            if self.charts is not None and self.query_one(TabbedContent).active == "charts":
                self.charts.show_curves(message.curves)

    def _mark_budget(self) -> None:
        """Show the latest composition with the components that moved since the baseline marked (Δ)."""
        view = self._budget_view
        if view is not None:
            self.query_one(BudgetBar).budget = dataclasses.replace(view, moved=budget_moves(view, self.baseline))
            self.query_one(TracedBar).budget = view

    @property
    def budget_settled(self) -> bool:
        """True when the bar shows the latest composition asked for (tests and snapshots wait on it)."""
        return self._budget_shown == self._budget_seq

    def _refresh_ages(self) -> None:
        now = self.now()
        if self.held is not None:
            self._show_held()
        self.query_one(BudgetBar).tick(now)
        self.query_one(TracedBar).now_s = now
        self.query_one(ProbeTable).refresh_ages(now)

    # -- status line -----------------------------------------------------------------------------------------------

    def _set_status(self) -> None:
        parts = [f"model {self.settings.model}"]
        if self.settings.tp is not None:
            parts.append(f"tp {self.settings.tp}")
        if self.running_probe:
            parts.append(f"probing {self.running_probe}")
        waiting = len(self.queue)
        if waiting:
            parts.append(f"{waiting} queued")
        frame = self.last_frame
        if frame is not None and not frame.gpus:
            parts.append("no GPU telemetry")
        elif frame is not None and frame.sample_ms is not None:
            parts.append(f"NVML {frame.sample_ms:.1f} ms/tick")
        if self.held is not None:
            parts.append("GPUs in use: probes wait for R")
        if self.other_scenarios:
            parts.append(f"{others_summary(self.other_scenarios)} (b)")
        if self.server_note:
            parts.append(self.server_note)
        if self.trace_note:
            parts.append(self.trace_note)
        parts.extend(self._status_notes[-2:])
        text = " · ".join(parts)
        if text != self._status_text:
            self._status_text = text
            self.query_one("#status", StatusLine).text = text

    # -- actions ---------------------------------------------------------------------------------------------------

    def action_show_tab(self, tab: str) -> None:
        """1-4: switch tabs."""
        tabs = self.query_one(TabbedContent)
        tabs.active = tab
        focus = {
            "probes": "#probe-table",
            "gpus": "#gpu-table",
            "health": "#health-panel #health-table",
        }.get(tab)
        if focus:
            self.query_one(focus).focus()

    @on(TabbedContent.TabActivated)
    async def _tab_activated(self, event: TabbedContent.TabActivated) -> None:
        """The charts are built the first time their tab shows, and re-plotted each time it does."""
        if event.pane.id != "charts":
            return
        curves = self.curves
        if self.charts is None:
            from decodetop.tui.widgets.charts import Charts

            self.charts = Charts(curves, self.telemetry, self.now(), id="charts-grid")
            await self.query_one("#charts-placeholder").remove()
            await event.pane.mount(self.charts)
            return
        self.charts.show_curves(curves)
        self.charts.show_history(self.telemetry, self.now())

    def action_help(self) -> None:
        """`?`: list every key."""
        keys = []
        for binding in self.BINDINGS:
            if isinstance(binding, Binding):
                what = HELP_TEXT.get(binding.action, binding.description or binding.action)
                keys.append((binding.key_display or binding.key, what))
        keys.extend(EXTRA_KEYS)
        self.push_screen(HelpScreen(keys))

    def _selected_probe(self) -> str | None:
        return self.query_one(ProbeTable).selected_id

    def action_rerun(self) -> None:
        """`r`: re-run the selected probe (asking first where other processes hold the GPUs)."""
        probe_id = self._selected_probe()
        if probe_id is None:
            self.notify("no probe selected", severity="warning", timeout=3)
            return
        self._run_with_consent((probe_id,))

    def action_rerun_all(self) -> None:
        """`R`: re-run every probe (asking first where other processes hold the GPUs)."""
        self._run_with_consent(tuple(self.probe_views))

    def _run_with_consent(self, probe_ids: tuple[str, ...]) -> None:
        """Queue `probe_ids` at once where nothing else holds the GPUs (or the user consented already); otherwise
        look at the GPUs in a worker, and where they are held ask first (`ConfirmProbesScreen`)."""
        if not probe_ids:
            return
        guard = self.sources.gpu_guard
        if self.held is not None:
            self._ask_consent(probe_ids, self.held)
        elif guard is None or guard.forced:
            self._enqueue_all(probe_ids)
        else:
            self._look_at_gpus(probe_ids)

    def _enqueue_all(self, probe_ids: tuple[str, ...]) -> None:
        for probe_id in probe_ids:
            if probe_id in self.probe_views:
                self._enqueue(probe_id)
        self._set_status()

    def _held_now(self) -> HeldGpus | None:
        """(worker thread) The GPUs other processes hold now, unless the user consented; None when free."""
        guard = self.sources.gpu_guard
        if guard is None or guard.forced:
            return None
        try:
            return guard.held()
        except Exception:  # NVML trouble must not stop the plan: each run's own preflight still looks
            return None

    @work(thread=True, exit_on_error=False, group="gpus")
    def _look_at_gpus(self, probe_ids: tuple[str, ...]) -> None:
        self.post_message(GpusLooked(probe_ids, self._held_now()))

    @on(GpusLooked)
    def _gpus_looked(self, message: GpusLooked) -> None:
        if self.closing:
            return
        if message.held is None:
            self._enqueue_all(message.probe_ids)
            return
        self.held = message.held
        self._show_held()
        self._set_status()
        self._ask_consent(message.probe_ids, message.held)

    def _ask_consent(self, probe_ids: tuple[str, ...], held: HeldGpus) -> None:
        """The warning modal; on yes the guard takes the consent (for the session, as --force) and the probes run."""

        def answered(run: bool | None) -> None:
            if not run:
                self.notify("nothing run: the GPUs stay with the engine", timeout=3)
                return
            if self.sources.gpu_guard is not None:
                self.sources.gpu_guard.allow()
            self.held = None
            self._status_notes.append("probing beside other processes on the GPUs (confirmed)")
            self._show_held()
            self._enqueue_all(probe_ids)

        self.push_screen(ConfirmProbesScreen(held, len(probe_ids)), answered)

    # -- the serving-time view -------------------------------------------------------------------------------------

    def _accepting(self) -> dict[object, bool] | None:
        """Whether each distinct fingerprint in the history feeds the budget now (asked once per fingerprint); None
        when the budget cannot say (a model it cannot handle: the composition says why)."""
        verdicts: dict[object, bool] = {}
        try:
            for entry in self._history_probes:
                if entry.fingerprint not in verdicts:
                    verdicts[entry.fingerprint] = self.sources.budget.accepts(entry.fingerprint, self.settings)
        except Exception:  # the composition's worker reports the same failure in the status line
            return None
        return verdicts

    def _split_history(self) -> None:
        """The stored records of other scenarios (listed by `b`, counted in the status line), never composed."""
        verdicts = self._accepting()
        self.other_scenarios = (
            () if verdicts is None else other_scenarios(self._history_probes, lambda fp: verdicts.get(fp, False))
        )

    def _stored_line(self) -> str:
        verdicts = self._accepting() or {}
        feeding = [e for e in self._history_probes if e.key in self.probe_views and verdicts.get(e.fingerprint)]
        newest = max((e.recorded_at_s for e in feeding), default=None)
        return stored_line(len({e.key for e in feeding}), newest, self.now())

    def _show_held(self) -> None:
        """The serving-time view's header: why probes did not start, and what the budget shows instead."""
        note = self.query_one("#held-note", Static)
        held = self.held
        text = ""
        if held is not None:
            verdicts = self._accepting() or {}
            feeding = [e for e in self._history_probes if e.key in self.probe_views and verdicts.get(e.fingerprint)]
            newest = max(feeding, key=lambda e: e.recorded_at_s, default=None)
            shows = (
                "the budget shows this scenario's stored results, measured "
                f"{format_ago(max(0.0, self.now() - newest.recorded_at_s))} {origin_text(newest.fingerprint)}"
                " · b: details"
                if newest is not None
                else "no stored result of this scenario: the budget shows estimates only"
            )
            text = f"{held.line()}\n{shows}"
            if self.query_one(BudgetBar).compact:  # every row counts: one line, cut to the width
                width = max(10, self.size.width - 2)
                fits = [t for t in (f"{held.short_line()} · b: details", held.short_line()) if len(t) <= width]
                text = fits[0] if fits else held.short_line()[: width - 1] + "…"
        if text != self._held_text:
            self._held_text = text
            note.update(text)
            note.display = bool(text)

    def action_budget_details(self) -> None:
        """`b`: where each figure came from, and the other scenarios stored (never mixed in)."""
        self._split_history()
        details = BudgetDetails(
            view=self._budget_view,
            held_line=self.held.line() if self.held is not None else "",
            stored_line=self._stored_line(),
            others=self.other_scenarios,
        )
        self.push_screen(BudgetDetailsScreen(details, self.now()))

    def action_cancel_probe(self) -> None:
        """`x`: cancel the running probe and everything queued."""
        for probe_id in self.queue.clear():
            view = self.probe_views.get(probe_id)
            if view is not None:
                self._update_probe(dataclasses.replace(view, state=ProbeState.CANCELLED, progress=None))
        if self.running_probe is not None:
            self._cancel_running()
        self._set_status()

    @work(thread=True, exit_on_error=False, group="cancel")
    def _cancel_running(self) -> None:
        self.sources.probes.cancel()

    @on(DataTable.RowSelected)
    def _row_selected(self, event: DataTable.RowSelected) -> None:
        """`enter` in a table: details of the probe or check under the cursor."""
        if isinstance(event.data_table, ProbeTable):
            key = event.row_key.value
            if key is not None and key in self.probe_views:
                self.push_screen(ProbeDetailScreen(self.probe_views[key], self.now()))
        elif isinstance(event.data_table, GpuTable):
            gpu = event.data_table.selected_gpu
            if gpu is not None:
                self.push_screen(GpuDetailScreen(gpu, list(event.data_table.history.get(gpu.index, ()))))
        elif event.data_table.id == "health-table" and isinstance(event.data_table.parent, HealthPanel):
            check = event.data_table.parent.selected
            if check is not None:
                changed = check.check_id in changed_since(self.checks, self.baseline)
                self.push_screen(CheckDetailScreen(check, changed))

    def action_pick_tp(self) -> None:
        """`p`: choose the tensor-parallel degree; the probe plan and the budget follow."""
        gpus = len(self.last_frame.gpus) if self.last_frame is not None else 0
        self.push_screen(TpPickerScreen(tp_options(gpus, self.settings.tp), self.settings.tp), self._tp_picked)

    def _tp_picked(self, choice: TpChoice | None) -> None:
        if choice is None or choice.tp == self.settings.tp:
            return
        self.settings = dataclasses.replace(self.settings, tp=choice.tp)
        self.results = {}
        self._recompose_budget()
        self._plan_probes(run_now=self.sources.run_probes_at_start)
        self._save_settings({"tp": choice.tp})
        self._set_status()

    def action_cycle_sort(self) -> None:
        """`o`: the next sort order of the GPU tables."""
        order = ""
        for table in self.query(GpuTable):
            order = table.cycle_sort()
        self.notify(f"GPUs sorted by {order}", timeout=2)

    def action_filter(self) -> None:
        """`/`: type a filter for the probe, GPU, process and health tables."""
        box = self.query_one("#filter", Input)
        box.add_class("-shown")
        box.focus()

    @on(Input.Changed, "#filter")
    def _filter_changed(self, event: Input.Changed) -> None:
        self._apply_filter(event.value)

    @on(Input.Submitted, "#filter")
    def _filter_kept(self, event: Input.Submitted) -> None:
        if not event.value:
            event.input.remove_class("-shown")
        self.action_show_tab(self.query_one(TabbedContent).active)

    def _apply_filter(self, text: str) -> None:
        for table in self.query(GpuTable):
            table.set_filter(text)
        self.query_one(ProcessTable).set_filter(text)
        self.query_one(ProbeTable).set_filter(text)
        for panel in self.query(HealthPanel):
            panel.set_filter(text)

    def on_key(self, event: events.Key) -> None:
        """escape in the filter box clears the filter and hides the box."""
        box = self.query_one("#filter", Input)
        if event.key == "escape" and box.has_focus:
            event.stop()
            box.value = ""
            self._apply_filter("")
            box.remove_class("-shown")
            self.action_show_tab(self.query_one(TabbedContent).active)

    def action_pick_model(self) -> None:
        """`m`: choose a model preset; the probe plan and the budget follow."""
        try:
            models = list(self.sources.budget.models())
        except Exception as exc:  # the budget package may be missing presets
            self.notify(f"no model list: {exc}", severity="error")
            return
        self.push_screen(ModelPickerScreen(models, self.settings.model), self._model_picked)

    def _model_picked(self, model: str | None) -> None:
        if model is None or model == self.settings.model:
            return
        self.settings = dataclasses.replace(self.settings, model=model)
        self.results = {}
        self._recompose_budget()
        self._plan_probes(run_now=self.sources.run_probes_at_start)
        self._save_settings({"model": model})
        self._set_status()

    def action_capture_trace(self) -> None:
        """`c`: capture a few decode steps from --server in the background; the traced bar shows them."""
        self.query_one(TracedBar).capture({"model": self.settings.model, "tp": self.settings.tp})

    @on(TraceStatus)
    def _trace_status(self, message: TraceStatus) -> None:
        self.trace_note = message.text
        self._set_status()

    @on(OpenTraceKernels)
    def _open_trace_kernels(self, message: OpenTraceKernels) -> None:
        self.push_screen(TraceKernelsScreen(message.segment, message.trace_path))

    def action_cycle_theme(self) -> None:
        """`t`: next theme, remembered in the settings file."""
        self.theme = next_theme(self.theme)
        self.settings = dataclasses.replace(self.settings, theme=self.theme)
        self.query_one(BudgetBar).refresh()
        self.notify(f"theme {self.theme}", timeout=2)
        self._save_settings({"theme": self.theme})

    @work(thread=True, exit_on_error=False, group="files")
    def _save_settings(self, changed: dict[str, object]) -> None:
        """Store what the user changed in the UI, and only that: one-off flags never reach the file."""
        if not self.save_theme:
            return
        try:
            save_changes(self.settings_path, changed)
        except (OSError, UserInputError) as exc:
            self.call_from_thread(self.notify, f"settings not saved: {exc}", severity="warning")

    def on_unmount(self) -> None:
        """However the app ends, stop taking probes and cancel the running one (non-blocking), so the probe worker
        returns and the process can exit; the caller of `run` then calls `shutdown_sources`."""
        self.closing = True
        self.queue.close()
        if self.running_probe is not None:
            self.sources.probes.cancel()

    async def action_quit(self) -> None:
        """`q`: stop the probe group and the collector, then exit (nothing is left running)."""
        if self.closing:
            return
        self.closing = True
        self.queue.close()
        self.query_one("#status", StatusLine).text = "stopping probe ranks and telemetry…"
        self._shutdown_worker()

    @work(thread=True, exit_on_error=False, group="shutdown")
    def _shutdown_worker(self) -> None:
        self.shutdown_sources()
        self.call_from_thread(self.exit, 0)

    def shutdown_sources(self) -> None:
        """Cancel and close the probe group and the collector (blocking, bounded; safe to call twice)."""
        self.queue.close()
        if self._sources_closed:
            return
        self._sources_closed = True
        try:
            if self.running_probe is not None:
                self.sources.probes.cancel()
        finally:
            try:
                self.sources.probes.close()
            finally:
                try:
                    self.sources.telemetry.close()
                finally:
                    if self.sources.server is not None:
                        self.sources.server.close()
                    if self.sources.taps is not None:
                        self.sources.taps.close()
