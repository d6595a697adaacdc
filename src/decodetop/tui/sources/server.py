"""Provides the ``--server`` source: `ServerPoller` polls the serving engine's observed step on a thread; the app hands
each answer to the budget source (`BudgetSource.note_server`), so the next composition says where the observed step
came from (or that the server could not be read), and to the taps.

Each poll runs on the poller's thread, never on the event loop (it waits on the network).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Protocol

from decodetop.collectors.serving import ServerStatus, ServerStep

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
