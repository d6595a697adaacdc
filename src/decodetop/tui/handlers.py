"""Provides `MessageHandlers`: what the live UI does with each message its threads and widgets post (telemetry
frames, server answers, the history, the probe plan and runs, checks, baselines, compositions, trace progress,
table selections, tab and filter changes). Each hands the message to its controller and redraws what changed;
late messages while the app shuts down are dropped (the widgets may be gone)."""

from __future__ import annotations

from textual import events, on
from textual.widgets import DataTable, Input, Static, TabbedContent

from decodetop.collectors.serving import ServerStatus, ServerStep
from decodetop.pipeline.observed import traced_step
from decodetop.tui import layout
from decodetop.tui.baseline import changed_since
from decodetop.tui.bindings import KeyActions
from decodetop.tui.inert_text import inert_text
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
from decodetop.tui.model import TelemetryFrame
from decodetop.tui.screens.details import CheckDetailScreen, ProbeDetailScreen
from decodetop.tui.screens.gpu_details import GpuDetailScreen
from decodetop.tui.screens.trace_kernels import TraceKernelsScreen
from decodetop.tui.widgets.budget_bar import BudgetBar
from decodetop.tui.widgets.gpu_table import GpuTable
from decodetop.tui.widgets.health_panel import HealthPanel
from decodetop.tui.widgets.probe_table import ProbeTable
from decodetop.tui.widgets.process_table import ProcessTable
from decodetop.tui.widgets.traced_bar import OpenTraceKernels, TraceLoaded, TraceStatus


class MessageHandlers(KeyActions):
    """The app's message handlers (its keys are `KeyActions`)."""

    def on_resize(self, event: events.Resize) -> None:
        """Compact legend and footer by size (the rest follows the breakpoint classes in app.tcss)."""
        layout.fit_layout(self, event.size)
        if self.consent.held is not None:
            self.show_held()
        self.fit_box(event.size)

    # -- telemetry and the server --------------------------------------------------------------------------------

    def post_frame(self, frame: TelemetryFrame) -> None:
        """(collector thread) Post the frame to the event loop."""
        self.post_message(TelemetryReady(frame))

    @on(TelemetryReady)
    def _show_frame(self, message: TelemetryReady) -> None:
        if self.closing:
            return
        frame = message.frame
        first_gpus = bool(frame.gpus) and (self.last_frame is None or not self.last_frame.gpus)
        self.last_frame = frame
        if first_gpus:
            self.recompose_budget()  # the roofline can use the GPU's own figures now
        self.telemetry.add(frame)
        self.query_one(ProcessTable).show(frame)
        for table in self.query(GpuTable):
            table.show(frame, self.telemetry)
        if first_gpus:
            self.fit_box()
        note = frame.source_note
        if not frame.gpus:
            note = f"no GPU telemetry: {frame.unavailable_reason or 'no GPU found'}"
        if note != self._gpu_note:
            self._gpu_note = note
            for static in self.query(".gpu-note").results(Static):
                static.update(inert_text(note))  # a replay's or recording's name: never markup
                static.set_class(bool(frame.gpus), "-source")  # only where the data comes from: can give way
        charts = self.charts_shown()
        if charts is not None:
            charts.show_history(self.telemetry, frame.taken_at_s, self.budgets, self.now())
        self.set_status()

    def post_server_answer(self, answer: ServerStep | ServerStatus) -> None:
        """(poller thread) Pass the answer on to the budget source (the observed step follows the one rule), the
        taps and the screen."""
        self.sources.budget.note_server(answer)
        if self.sources.taps is not None:
            self.sources.taps.on_observed(answer)
        step = answer.step_ms if isinstance(answer, ServerStep) else None
        self.post_message(ObservedUpdate(step, answer.summary))

    @on(ObservedUpdate)
    def _observed_update(self, message: ObservedUpdate) -> None:
        if self.closing:
            return
        self.server_note = message.summary
        seen = (message.step_ms, message.step_ms is None and bool(message.summary))
        if seen != self.server_seen:  # a new step, or the server went away or came back: the budget says so
            self.server_seen = seen
            self.recompose_budget()
        self.set_status()

    # -- history, plan and probes ----------------------------------------------------------------------------------

    @on(HistoryLoaded)
    def _apply_history(self, message: HistoryLoaded) -> None:
        if self.closing:
            return
        if message.problem:
            self.status_notes.append(message.problem)
            self.notify(message.problem, title="history", severity="warning", timeout=15)
        self.stored.take(message)
        self.budgets.start_from(self.stored.baseline)
        self.restore_stored()
        self.recompose_budget()
        self.show_health()
        self.show_held()
        self.set_status()

    @on(ProbePlanned)
    def _apply_plan(self, message: ProbePlanned) -> None:
        if self.closing:
            return
        for note in message.notes[:1]:
            self.status_notes.append(f"plan: {note}")
        self.consent.held = message.held
        self.query_one(ProbeTable).replace_all(self.runner.take_plan(message.probes))
        self.restore_stored()
        if message.run_now:
            self.runner.enqueue(tuple(self.runner.views))
        self.recompose_budget()
        self.show_held()
        self.set_status()
        self.fit_box()

    @on(GpusLooked)
    def _gpus_looked(self, message: GpusLooked) -> None:
        if self.closing:
            return
        if message.held is None:
            self.enqueue(message.probe_ids)
            return
        self.consent.held = message.held
        self.show_held()
        self.set_status()
        self.consent.ask(message.probe_ids, message.held, self.enqueue, self.consented)

    @on(ProbeStarted)
    def _probe_started(self, message: ProbeStarted) -> None:
        if self.closing:
            return
        self.runner.started(message)
        self.set_status()

    @on(ProbeProgress)
    def _probe_progress(self, message: ProbeProgress) -> None:
        if not self.closing:
            self.runner.progressed(message)

    @on(ProbeFinished)
    def _probe_finished(self, message: ProbeFinished) -> None:
        if self.closing:
            return
        if self.runner.finished(message):
            self.recompose_budget()
        self.set_status()

    # -- checks, baseline, budget ----------------------------------------------------------------------------------

    @on(ChecksReady)
    def _apply_checks(self, message: ChecksReady) -> None:
        if self.closing:
            return
        self.checks = message.checks
        self.show_health(problem=message.problem)
        self.fit_box()

    @on(BaselineSaved)
    def _baseline_saved(self, message: BaselineSaved) -> None:
        if self.closing:
            return
        if message.entry is None:
            self.notify(message.problem, severity="error")
            return
        self.stored.baseline = message.entry
        self.budgets.start_from(message.entry)
        self.show_health()
        self.mark_budget()
        self.notify(f"baseline saved ({len(self.checks)} checks)", timeout=3)

    @on(BudgetReady)
    def _show_budget(self, message: BudgetReady) -> None:
        if self.closing or not self.composer.is_latest(message):
            return  # shutting down, or a newer composition is on its way
        if message.view is None:
            self.status_notes.append(message.problem)
            self.set_status()
            return
        self.composer.take(message)
        self.budgets.add(message.view, self.now())
        self.query_one(BudgetBar).now_s = self.now()
        self.mark_budget()
        charts = self.charts_shown()
        if charts is not None:
            if message.curves is not None:
                charts.curves = message.curves
            charts.show_history(self.telemetry, self.telemetry_now(), self.budgets, self.now())

    # -- the traced bar --------------------------------------------------------------------------------------------

    @on(TraceStatus)
    def _trace_status(self, message: TraceStatus) -> None:
        self.trace_note = message.text
        self.set_status()
        self.fit_box()

    @on(TraceLoaded)
    def _trace_loaded(self, message: TraceLoaded) -> None:
        """A trace was read: its decode steps are an observation of the engine's step (the one rule decides)."""
        if self.closing or message.load is None:
            return
        load = message.load
        self.sources.budget.note_trace(traced_step(load.traces, written_s=load.modified_s))
        self.recompose_budget()

    @on(OpenTraceKernels)
    def _open_trace_kernels(self, message: OpenTraceKernels) -> None:
        self.push_screen(TraceKernelsScreen(message.segment, message.trace_path))

    # -- tables, tabs, filter --------------------------------------------------------------------------------------

    @on(DataTable.RowSelected)
    def _row_selected(self, event: DataTable.RowSelected) -> None:
        """`enter` in a table: details of the probe, GPU or check under the cursor."""
        table = event.data_table
        if isinstance(table, ProbeTable):
            key = event.row_key.value
            if key is not None and key in self.runner.views:
                self.push_screen(ProbeDetailScreen(self.runner.views[key], self.now()))
        elif isinstance(table, GpuTable):
            gpu = table.selected_gpu
            if gpu is not None:
                now = table.frame.taken_at_s if table.frame is not None else self.now()
                self.push_screen(GpuDetailScreen(gpu, list(table.history.get(gpu.index, ())), table.trend, now))
        elif table.id == "health-table" and isinstance(table.parent, HealthPanel):
            check = table.parent.selected
            if check is not None:
                changed = check.check_id in changed_since(self.checks, self.stored.baseline)
                self.push_screen(CheckDetailScreen(check, changed))

    @on(TabbedContent.TabActivated)
    async def _tab_activated(self, event: TabbedContent.TabActivated) -> None:
        """The budget box fits the tab shown; the charts are built the first time their tab shows, and re-plotted
        each time it does."""
        self.fit_box()
        if event.pane.id != "charts":
            return
        curves = self.composer.curves
        if self.charts is None:
            from decodetop.tui.widgets.charts import Charts

            self.charts = Charts(
                curves, self.telemetry, self.telemetry_now(), self.budgets, self.now(), id="charts-grid"
            )
            await self.query_one("#charts-placeholder").remove()
            await event.pane.mount(self.charts)
            return
        self.charts.curves = curves
        self.charts.show_history(self.telemetry, self.telemetry_now(), self.budgets, self.now())

    @on(Input.Changed, "#filter")
    def _filter_changed(self, event: Input.Changed) -> None:
        self.apply_filter(event.value)
        self.fit_box()

    @on(Input.Submitted, "#filter")
    def _filter_kept(self, event: Input.Submitted) -> None:
        if not event.value:
            event.input.remove_class("-shown")
        self.show_tab(self.query_one(TabbedContent).active)
        self.fit_box()
