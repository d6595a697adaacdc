"""Provides `Taps`: the UI's side outputs (``--record`` to a recording, ``--prometheus`` metrics).

Every method is called from a worker or collector thread, never from the event loop (each may write a file).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from decodetop.collectors.checks.result import CheckResult
from decodetop.collectors.serving import ServerStatus, ServerStep
from decodetop.collectors.telemetry import TelemetrySnapshot

if TYPE_CHECKING:
    # types only: the exporter loads prometheus_client, and a session that neither records nor exports never does
    from decodetop.export.prometheus import MetricsServer, StateBox
    from decodetop.export.recording import Recorder


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

    def on_observed(self, observed: ServerStep | ServerStatus) -> None:
        """The live server's step or status (poller thread)."""
        if self.recorder is not None and isinstance(observed, ServerStep):
            self.recorder.record("observed_step", observed)
        if self.state_box is not None:
            self.state_box.update(observed=observed)

    def close(self) -> None:
        """Stop the metrics server and close the recording."""
        if self.metrics_server is not None:
            self.metrics_server.close()
        if self.recorder is not None:
            self.recorder.close()
