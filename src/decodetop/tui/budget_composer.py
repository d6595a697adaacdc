"""Provides BudgetComposer: the budget source's composition run off the event loop, newest request wins.

Each request gets a sequence number; a worker thread composes (the first composition imports and builds the
inventory) and posts `BudgetReady` with it, and only the answer to the latest request is shown, so a slow
composition of an older scenario never overwrites a newer one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import partial

from textual.app import App

from decodetop.settings import Settings
from decodetop.tui.messages import BudgetReady
from decodetop.tui.model import BudgetView, ProbeCurves
from decodetop.tui.sources import BudgetSource


class BudgetComposer:
    """The latest composition asked for and the latest shown."""

    def __init__(self, app: App[int], budget: BudgetSource, now: Callable[[], float]) -> None:
        self.app = app
        self.budget = budget
        self.now = now
        self.seq = 0
        """The latest request."""
        self.shown_seq = -1
        """The request whose answer is on screen."""
        self.view: BudgetView | None = None
        """The latest composition, before the baseline's moves are marked on it."""
        self.curves = ProbeCurves()
        """The chart curves of the latest composition."""

    def request(self, settings: Settings, results: Mapping[str, object]) -> None:
        """Compose the budget for `settings` from `results` in a worker."""
        self.seq += 1
        self.app.run_worker(
            partial(self._compose, self.seq, settings, dict(results)),
            name="compose",
            group="budget",
            thread=True,
            exit_on_error=False,
        )

    def _compose(self, seq: int, settings: Settings, results: dict[str, object]) -> None:
        try:
            view = self.budget.compose(settings, results, self.now())
            curves = self.budget.curves(results)
        except Exception as exc:  # a model the budget cannot handle: say so, keep running
            self.app.post_message(BudgetReady(seq, None, None, f"budget: {type(exc).__name__}: {exc}"))
            return
        self.app.post_message(BudgetReady(seq, view, curves))

    def is_latest(self, message: BudgetReady) -> bool:
        """Whether `message` answers the latest request (an older one is dropped)."""
        return message.seq == self.seq

    def take(self, message: BudgetReady) -> None:
        """Keep the latest answer's view and curves (a failed one keeps the previous ones)."""
        if message.view is None:
            return
        self.shown_seq = message.seq
        self.view = message.view
        if message.curves is not None:
            self.curves = message.curves

    @property
    def settled(self) -> bool:
        """True when the latest composition asked for is the one shown."""
        return self.shown_seq == self.seq
