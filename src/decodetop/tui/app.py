"""Provides DecodetopApp: the live UI (budget bar, probes, GPUs, health, charts) over injected `Sources`.

Its parts: the screen (`tui.layout`), the keys (`tui.bindings`), the message handlers (`tui.handlers`), the state
they share (`tui.app_base`); the work lives in controllers off the event loop (`ProbeRunner`, `StoredResults`,
`BudgetComposer`, `GpuConsent`) and in the sources. Threads: the telemetry collector runs its own thread and posts
`TelemetryReady`; one long-lived worker thread runs probes one at a time; short workers read the history, plan the
probes, compose the budget, run the checks and write files. Results come back as messages, so the event loop only
draws. Quitting cancels the running probe, closes the probe group and the collector (in a worker, so the screen
stays live while ranks exit), then exits.
"""

from __future__ import annotations

from textual import work

from decodetop.budget.scenario import ModelSource
from decodetop.tui import layout
from decodetop.tui.handlers import MessageHandlers
from decodetop.tui.widgets.budget_bar import BudgetBar
from decodetop.tui.widgets.probe_table import ProbeTable
from decodetop.tui.widgets.status_line import StatusLine
from decodetop.tui.widgets.traced_bar import TracedBar


class DecodetopApp(MessageHandlers):
    """The live UI."""

    CSS_PATH = "app.tcss"
    TITLE = "decodetop"
    ENABLE_COMMAND_PALETTE = True
    ALLOW_IN_MAXIMIZED_VIEW = "Footer, StatusLine, #filter"
    """A maximised tab keeps the status line, the filter box and the keys."""

    def on_mount(self) -> None:
        """Draw the empty frame at once, then start everything in the background."""
        self.query_one("#budget-box").border_title = "per-token budget"
        layout.fit_layout(self, self.size)
        self.recompose_budget()
        self.set_status()
        self.sources.telemetry.start(self.post_frame)
        self.run_worker(self._read_history, name="history", group="files", thread=True, exit_on_error=False)
        self.plan_probes()
        self.runner.start()
        self.run_checks()
        if self.sources.server is not None:
            self.sources.server.start(self.post_server_answer)
        if self.age_refresh_s > 0:
            self.set_interval(self.age_refresh_s, self.refresh_ages)
        self.query_one(TracedBar).now_s = self.now()
        self.query_one(TracedBar).start(ModelSource(*self.settings.model_ref), self.settings.tp)
        self.query_one(ProbeTable).focus()

    def _read_history(self) -> None:
        self.post_message(self.stored.read())

    def refresh_ages(self) -> None:
        """Once a second: the ages beside stored figures and probe rows (nothing while the app shuts down: its
        widgets may be gone before the timer stops)."""
        if self.closing:
            return
        now = self.now()
        if self.consent.held is not None:
            self.show_held()
        for bar in self.query(BudgetBar):
            bar.tick(now)
        for traced in self.query(TracedBar):
            traced.now_s = now
        for table in self.query(ProbeTable):
            table.refresh_ages(now)

    # -- the end ---------------------------------------------------------------------------------------------------

    def _handle_exception(self, error: Exception) -> None:
        """An exception nothing handled: its traceback goes to the crash log (tui/crash.py), then Textual exits."""
        self.crash_report.record(error)
        super()._handle_exception(error)

    def _print_error_renderables(self) -> None:
        """After a crash the traceback is in the crash log and `decodetop` says where in one line: nothing here."""
        if self.crash_report.crash is None:
            super()._print_error_renderables()
            return
        self._exit_renderables.clear()

    def on_unmount(self) -> None:
        """However the app ends, stop taking probes and cancel the running one (non-blocking), so the probe worker
        returns and the process can exit; the caller of `run` then calls `shutdown_sources`."""
        self.closing = True
        self.runner.queue.close()
        if self.runner.running is not None:
            self.sources.probes.cancel()

    async def action_quit(self) -> None:
        """`q`: stop the probe group and the collector, then exit (nothing is left running)."""
        if self.closing:
            return
        self.closing = True
        self.runner.queue.close()
        self.query_one("#status", StatusLine).text = "stopping probe ranks and telemetry…"
        self._shutdown_worker()

    @work(thread=True, exit_on_error=False, group="shutdown")
    def _shutdown_worker(self) -> None:
        self.shutdown_sources()
        self.call_from_thread(self.exit, 0)

    def shutdown_sources(self) -> None:
        """Cancel and close the probe group and the collector (blocking, bounded; safe to call twice)."""
        self.runner.queue.close()
        if self._sources_closed:
            return
        self._sources_closed = True
        try:
            if self.runner.running is not None:
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
