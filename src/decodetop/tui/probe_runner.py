"""Provides ProbeRunner: the probe plan of the current scenario and its runs, off the event loop.

The plan is made in a short worker thread (it may build the model's inventory); one long-lived worker thread takes
probe ids from a `ProbeQueue` and hands them one at a time to the probe source, which runs each through the one
plan runner (`decodetop.pipeline.plan_runner`: the GPU guard, telemetry's costly calls paused while a
latency-sensitive probe runs, the history and the taps as its callbacks). The event loop only applies the messages
those threads post (`ProbePlanned`, `ProbeStarted`, `ProbeProgress`, `ProbeFinished`) to the rows it keeps, and
shows each changed row through `show`.
"""

from __future__ import annotations

import dataclasses
import traceback
from collections.abc import Callable, Iterable
from functools import partial

from textual.app import App
from textual.worker import get_current_worker

from decodetop.history import HistoryEntry
from decodetop.pipeline.gpu_guard import HeldGpus
from decodetop.settings import Settings
from decodetop.tui.messages import ProbeFinished, ProbePlanned, ProbeProgress, ProbeStarted
from decodetop.tui.model import ProbeState, ProbeView
from decodetop.tui.probe_queue import ProbeQueue
from decodetop.tui.sources import ProbeOutcome, Sources
from decodetop.tui.sources.probes import ControllerProbes

POP_TIMEOUT_S = 0.2
"""How often the idle probe worker looks at its cancel flag."""


class ProbeRunner:
    """The probe rows (`views`), the latest good raw result of each probe (`results`, what the budget composes
    from), the queue of probes waiting and the one that runs."""

    def __init__(
        self,
        app: App[int],
        sources: Sources,
        *,
        settings: Callable[[], Settings],
        now: Callable[[], float],
        show: Callable[[ProbeView], None],
    ) -> None:
        self.app = app
        self.sources = sources
        self.settings = settings
        """The app's current settings (the plan is made for them)."""
        self.now = now
        self.show = show
        """Draws one changed row (the probe table)."""
        self.views: dict[str, ProbeView] = {}
        """Every probe's row, by id."""
        self.results: dict[str, object] = {}
        """The latest good raw result of each probe (what the budget composes from)."""
        self.queue = ProbeQueue()
        self.running: str | None = None
        """The probe the worker runs now (None when idle)."""
        self.generation = 0
        """Counts scenario changes: a run started before the latest change is another scenario's result."""
        self._started_in: dict[str, int] = {}
        """The generation each run started in (probe thread writes, event loop reads)."""

    # -- the plan --------------------------------------------------------------------------------------------------

    def plan(self, run_now: bool, held_now: Callable[[], HeldGpus | None]) -> None:
        """Plan the probes of the current settings in a worker; `ProbePlanned` brings the rows (and whether to run
        them now: not where `held_now` finds other processes on the GPUs)."""
        self.app.run_worker(
            partial(self._plan, run_now, held_now),
            name="plan",
            group="plan",
            exclusive=True,
            thread=True,
            exit_on_error=False,
        )

    def _plan(self, run_now: bool, held_now: Callable[[], HeldGpus | None]) -> None:
        try:
            views = self.sources.probes.plan(self.settings())
        except Exception as exc:  # a bad model config must not close the UI
            self.app.call_from_thread(self.app.notify, f"probe plan: {exc}", severity="error", timeout=15)
            views = []
        probes = self.sources.probes
        notes = probes.plan_notes if isinstance(probes, ControllerProbes) else ()
        held = held_now() if run_now and views else None
        self.app.post_message(ProbePlanned(probes=views, run_now=run_now and held is None, notes=notes, held=held))

    def take_plan(self, planned: Iterable[ProbeView]) -> list[ProbeView]:
        """The planned rows, keeping the state of probes that were planned before; returns them in order."""
        planned = list(planned)
        kept = {v.probe_id: self.views[v.probe_id] for v in planned if v.probe_id in self.views}
        self.views = {v.probe_id: kept.get(v.probe_id, v) for v in planned}
        return list(self.views.values())

    def forget_results(self) -> None:
        """A new scenario (model, TP): no result of the old one feeds its budget or shows in its rows (a run in
        flight is cancelled, and its result, stored under the old scenario, never shows)."""
        self.generation += 1
        self.cancel_all()
        self.results = {}
        for probe_id, view in list(self.views.items()):
            self.update(ProbeView(probe_id=probe_id, title=view.title))

    # -- rows ------------------------------------------------------------------------------------------------------

    def update(self, view: ProbeView) -> None:
        """Keep and draw one row."""
        self.views[view.probe_id] = view
        self.show(view)

    def enqueue(self, probe_ids: Iterable[str]) -> None:
        """Queue each planned probe that is neither running nor waiting (its row says queued)."""
        for probe_id in probe_ids:
            if probe_id not in self.views or probe_id == self.running:
                continue
            if self.queue.push(probe_id):
                view = self.views[probe_id]
                self.update(dataclasses.replace(view, state=ProbeState.QUEUED, progress=None, progress_note=""))

    def restore(self, probe_id: str, entry: HistoryEntry | None) -> None:
        """Show a stored result for a probe not measured in this session (its row keeps a queued or running state)."""
        view = self.views.get(probe_id)
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
        self.update(restored)

    def restore_all(self, stored: Callable[[str], HistoryEntry | None]) -> None:
        """Show the stored result `stored` gives for each planned probe this session has not measured."""
        for probe_id in list(self.views):
            self.restore(probe_id, stored(probe_id))

    def cancel_all(self) -> None:
        """Cancel the running probe (in a worker: it may block) and everything queued."""
        for probe_id in self.queue.clear():
            view = self.views.get(probe_id)
            if view is not None:
                self.update(dataclasses.replace(view, state=ProbeState.CANCELLED, progress=None))
        if self.running is not None:
            self.app.run_worker(
                self.sources.probes.cancel, name="cancel", group="cancel", thread=True, exit_on_error=False
            )

    # -- the probe thread ------------------------------------------------------------------------------------------

    def start(self) -> None:
        """Start the one worker thread that runs queued probes until the queue closes."""
        self.app.run_worker(
            self._loop, name="probe-loop", group="probe-loop", exclusive=True, thread=True, exit_on_error=False
        )

    def _loop(self) -> None:
        worker = get_current_worker()
        while not worker.is_cancelled and not self.queue.closed:
            probe_id = self.queue.pop(POP_TIMEOUT_S)
            if probe_id is None:
                continue
            self.running = probe_id
            self._started_in[probe_id] = self.generation
            self.app.post_message(ProbeStarted(probe_id))
            try:
                outcome = self._run_one(probe_id)
            finally:
                self.running = None
            self.app.post_message(ProbeFinished(probe_id, outcome))

    def _run_one(self, probe_id: str) -> ProbeOutcome:
        """(probe thread) One run; an exception becomes a failed row, a callback's problem a warning."""
        try:

            def progress(fraction: float | None, note: str) -> None:
                self.app.post_message(ProbeProgress(probe_id, fraction, note))

            outcome = self.sources.probes.run(probe_id, progress)
        except Exception as exc:  # an adapter bug must show as a failed probe, not kill the loop
            view = ProbeView(
                probe_id=probe_id,
                title=probe_id,
                state=ProbeState.FAILED,
                error=f"{type(exc).__name__}: {exc}",
                traceback=traceback.format_exc(),
            )
            outcome = ProbeOutcome(view=view)
        if outcome.problem and not self.queue.closed:
            self.app.call_from_thread(self.app.notify, outcome.problem, severity="warning")
        if outcome.view.measured_at_s is None:
            outcome = dataclasses.replace(outcome, view=dataclasses.replace(outcome.view, measured_at_s=self.now()))
        return outcome

    # -- what the thread posted ------------------------------------------------------------------------------------

    def _stale(self, probe_id: str) -> bool:
        """Whether the run of `probe_id` started before the latest scenario change."""
        return self._started_in.get(probe_id, self.generation) != self.generation

    def started(self, message: ProbeStarted) -> None:
        """A probe began: its row says running."""
        view = self.views.get(message.probe_id)
        if view is not None and not self._stale(message.probe_id):
            self.update(dataclasses.replace(view, state=ProbeState.RUNNING, progress=0.0, progress_note=""))

    def progressed(self, message: ProbeProgress) -> None:
        """The running probe's progress bar and note."""
        view = self.views.get(message.probe_id)
        if view is not None and view.state is ProbeState.RUNNING and not self._stale(message.probe_id):
            self.update(dataclasses.replace(view, progress=message.fraction, progress_note=message.note))

    def finished(self, message: ProbeFinished) -> bool:
        """A probe ended: its row shows the outcome (the last good value stays, with its age, under a failure).
        True when a good result came, which the budget composes from."""
        if self._started_in.pop(message.probe_id, self.generation) != self.generation:
            view = self.views.get(message.probe_id)  # started before the scenario changed: another scenario's figure
            if view is not None and view.state is ProbeState.RUNNING:
                self.update(ProbeView(probe_id=view.probe_id, title=view.title))
            return False
        outcome = message.outcome
        old = self.views.get(message.probe_id)
        view = outcome.view
        if old is not None and not view.title:
            view = dataclasses.replace(view, title=old.title)
        if view.state is not ProbeState.DONE and old is not None and old.value_text and not view.value_text:
            # keep showing the last good value (with its age) under the new state
            view = dataclasses.replace(
                view, value_text=old.value_text, measured_at_s=old.measured_at_s, from_history=old.from_history
            )
        if message.probe_id in self.views or old is None:
            self.update(view)
        if view.state is ProbeState.DONE and outcome.result is not None:
            self.results[message.probe_id] = outcome.result
            return True
        return False
