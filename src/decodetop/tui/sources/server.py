"""Provides the ``--server`` source: `ServerPoller` polls the serving engine's observed step on a thread, and
`BudgetServerPoller` hands each answer to the budget before the screen, so the next composition says where the
observed step came from (or that the server could not be read).

Each poll runs on the poller's thread, never on the event loop (it waits on the network).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from decodetop.collectors.serving import ServerStatus, ServerStep

if TYPE_CHECKING:
    from decodetop.tui.sources.budget import PresetBudget

log = logging.getLogger(__name__)

SERVER_POLL_S = 2.0
"""How often `--server` is scraped (the engine's histogram window is what smooths the figure)."""
CLOSE_WAIT_S = 0.2
"""How long quitting waits for the poller thread: enough for an idle one to wake and end, a small part of the
one-second quit the UI promises (docs/benchmarks.md, UI)."""


class StepSource(Protocol):
    """What the poller needs of a live server (`decodetop.collectors.serving.ServerStepSource`)."""

    def poll(self) -> ServerStep | ServerStatus: ...


class ServerPoller:
    """Polls `ServerStepSource.poll()` every `period_s` on a daemon thread and hands each answer to a callback.

    Each poll is bounded by the source's one overall deadline (`decodetop.httpget`), but quitting never waits for
    it: `close()` waits at most `CLOSE_WAIT_S` for an idle thread and otherwise leaves the poll in flight to its
    daemon thread, which drops its answer."""

    def __init__(self, source: StepSource, period_s: float = SERVER_POLL_S) -> None:
        self.source = source
        self.period_s = period_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, on_answer: Callable[[ServerStep | ServerStatus], None]) -> None:
        """Start polling."""

        def run() -> None:
            while not self._stop.is_set():
                try:
                    answer = self.source.poll()
                    if self._stop.is_set():
                        return  # closed while the poll was in flight: nobody is listening any more
                    on_answer(answer)
                except Exception:  # one bad scrape must not end the thread
                    log.exception("server poll failed")
                self._stop.wait(self.period_s)

        self._thread = threading.Thread(target=run, name="decodetop-server-poll", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop polling without waiting on the server: an idle thread ends at once, one in a poll is abandoned."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(CLOSE_WAIT_S)


class BudgetServerPoller(ServerPoller):
    """`ServerPoller` that hands each answer to the budget first, so its next composition says where the observed
    step came from (or that the server could not be read)."""

    def __init__(self, source: StepSource, budget: PresetBudget, period_s: float = SERVER_POLL_S) -> None:
        super().__init__(source, period_s)
        self.budget = budget

    def start(self, on_answer: Callable[[ServerStep | ServerStatus], None]) -> None:
        """Start polling; each answer goes to the budget, then to `on_answer`."""

        def both(answer: ServerStep | ServerStatus) -> None:
            self.budget.note_server(answer)
            on_answer(answer)

        super().start(both)
