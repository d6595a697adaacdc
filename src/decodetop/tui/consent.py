"""Provides GpuConsent: asking before probing GPUs that other processes (a serving engine) hold, and the
serving-time view's header that says why probes did not start and what the budget shows instead.

A key's probes are queued at once where nothing else holds the GPUs (or the user consented: the modal's yes, or
`--force`); otherwise a worker looks at the GPUs (NVML) and, where they are held, the confirmation modal asks first.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from textual.app import App

from decodetop.history import HistoryEntry, format_ago
from decodetop.pipeline.gpu_guard import GpuGuard, HeldGpus
from decodetop.tui.messages import GpusLooked
from decodetop.tui.other_scenarios import origin_text
from decodetop.tui.screens.confirm_probes import ConfirmProbesScreen

Enqueue = Callable[[tuple[str, ...]], None]
"""Queues probes by id (called on the event loop)."""


class GpuConsent:
    """Whether other processes hold the probe group's GPUs (`held`) and the user's consent to probe beside them."""

    def __init__(self, app: App[int], guard: GpuGuard | None) -> None:
        self.app = app
        self.guard = guard
        self.held: HeldGpus | None = None
        """Other processes hold the probe group's GPUs and the user has not consented: probes wait for a key."""

    def held_now(self) -> HeldGpus | None:
        """(worker thread) The GPUs other processes hold now, unless the user consented; None when free."""
        guard = self.guard
        if guard is None or guard.forced:
            return None
        try:
            return guard.held()
        except Exception:  # NVML trouble must not stop the plan: each run's own preflight still looks
            return None

    def request(self, probe_ids: tuple[str, ...], enqueue: Enqueue, consented: Callable[[], None]) -> None:
        """Run `probe_ids` now where the GPUs are free or consent was given; otherwise look (worker) or ask first.
        `consented` runs once the user says yes (before the probes are queued)."""
        if not probe_ids:
            return
        if self.held is not None:
            self.ask(probe_ids, self.held, enqueue, consented)
        elif self.guard is None or self.guard.forced:
            enqueue(probe_ids)
        else:
            self.app.run_worker(
                partial(self._look, probe_ids), name="gpus", group="gpus", thread=True, exit_on_error=False
            )

    def _look(self, probe_ids: tuple[str, ...]) -> None:
        self.app.post_message(GpusLooked(probe_ids, self.held_now()))

    def ask(self, probe_ids: tuple[str, ...], held: HeldGpus, enqueue: Enqueue, consented: Callable[[], None]) -> None:
        """The warning modal; on yes the guard takes the consent (for the session, as --force) and the probes run."""

        def answered(run: bool | None) -> None:
            if not run:
                self.app.notify("nothing run: the GPUs stay with the engine", timeout=3)
                return
            if self.guard is not None:
                self.guard.allow()
            self.held = None
            consented()
            enqueue(probe_ids)

        self.app.push_screen(ConfirmProbesScreen(held, len(probe_ids)), answered)


def held_note(held: HeldGpus | None, newest: HistoryEntry | None, now_s: float, *, one_line_width: int | None) -> str:
    """The serving-time view's header: why probes did not start and what the budget shows instead ("" when the
    GPUs are free). `one_line_width`: where every row counts (the compact budget), one line cut to that width."""
    if held is None:
        return ""
    shows = (
        "the budget shows this scenario's stored results, measured "
        f"{format_ago(max(0.0, now_s - newest.recorded_at_s))} {origin_text(newest.fingerprint)}"
        " · b: details"
        if newest is not None
        else "no stored result of this scenario: the budget shows estimates only"
    )
    text = f"{held.line()}\n{shows}"
    if one_line_width is not None:
        width = max(10, one_line_width)
        fits = [t for t in (f"{held.short_line()} · b: details", held.short_line()) if len(t) <= width]
        text = fits[0] if fits else held.short_line()[: width - 1] + "…"
    return text
