"""Provides the UI's side outputs and inputs: `Taps` (``--record`` to a recording, ``--prometheus`` metrics) and
`ServerPoller` (``--server``: the serving engine's observed step, polled on a thread).

Every method is called from a worker or collector thread, never from the event loop (each may write a file or
wait on the network).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from decodetop.collectors.checks.model import CheckResult
from decodetop.collectors.serving import ObservedStep, ServerStatus
from decodetop.collectors.telemetry import TelemetrySnapshot

if TYPE_CHECKING:
    # types only: the exporter loads prometheus_client, and a session that neither records nor exports never does
    from decodetop.export.prometheus import MetricsServer, StateBox
    from decodetop.export.recording import Recorder

log = logging.getLogger(__name__)

SERVER_POLL_S = 2.0
"""How often `--server` is scraped (the engine's histogram window is what smooths the figure)."""
CLOSE_WAIT_S = 0.2
"""How long quitting waits for the poller thread: enough for an idle one to wake and end, a small part of the
one-second quit the UI promises (docs/benchmarks.md, UI)."""


class StepSource(Protocol):
    """What the poller needs of a live server (`decodetop.collectors.serving.ServerStepSource`)."""

    def poll(self) -> ObservedStep | ServerStatus: ...


@dataclass
class Taps:
    """Where raw results go besides the screen: a `Recorder` and/or a Prometheus state box (with its server)."""

    recorder: Recorder | None = None
    state_box: StateBox | None = None
    metrics_server: MetricsServer | None = None
    """Closed with the taps."""

    def on_snapshot(self, snapshot: TelemetrySnapshot) -> None:
        """A telemetry snapshot (collector thread)."""
        if self.recorder is not None:
            self.recorder.record("telemetry", snapshot)
        if self.state_box is not None:
            self.state_box.update(telemetry=snapshot)

    def on_probe_result(self, result: Any) -> None:
        """A finished probe's `ProbeResult` (probe worker thread; `ProbeOutcome.result`, which test sources fill
        with stand-ins)."""
        if self.recorder is not None:
            self.recorder.record("probe_result", result)
        if self.state_box is not None:
            self.state_box.add_probe_result(result)

    def on_checks(self, checks: list[CheckResult], at_s: float) -> None:
        """Health check results (checks worker thread)."""
        if self.recorder is not None:
            self.recorder.record("checks", checks)
        if self.state_box is not None:
            self.state_box.update(checks=tuple(checks), checks_unix_s=at_s)

    def on_observed(self, observed: ObservedStep | ServerStatus) -> None:
        """The live server's step or status (poller thread)."""
        if self.recorder is not None and isinstance(observed, ObservedStep):
            self.recorder.record("observed_step", observed)
        if self.state_box is not None:
            self.state_box.update(observed=observed)

    def close(self) -> None:
        """Stop the metrics server and close the recording."""
        if self.metrics_server is not None:
            self.metrics_server.close()
        if self.recorder is not None:
            self.recorder.close()


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

    def start(self, on_answer: Callable[[ObservedStep | ServerStatus], None]) -> None:
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
