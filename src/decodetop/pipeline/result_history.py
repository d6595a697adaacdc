"""Provides `ResultHistory`: a plan runner callback that keeps every fresh probe result in the results history with
the fingerprint of where and for which scenario it was measured, and `compact_payload`, what the history keeps of a
result (stdlib only).

    fingerprints = SessionFingerprints()                       # shared with the budget: which records feed it
    hook = ResultHistory(history, scenario=lambda: probes.scenario, fingerprints=fingerprints)
    PlanRunner(group, on_result=[hook, taps.on_probe_result])

A result without an environment (a group that could not start) is not stored; a failed one is not either (nothing
to compose from), but its environment still tells the session which versions its ranks run.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from decodetop.budget.scenario import Scenario
from decodetop.history import KIND_PROBE, History
from decodetop.pipeline.fingerprints import SessionFingerprints
from decodetop.probes.results import ProbeResult


def compact_payload(data: dict[str, Any]) -> dict[str, Any]:
    """A result's dict without the raw samples (stats and metrics stay): what the history keeps of a probe."""
    out = dict(data)
    measurements = []
    for raw in data.get("measurements", ()):
        m = dict(raw)
        m["per_rank"] = [{k: v for k, v in r.items() if k != "samples"} for r in m.get("per_rank", ())]
        measurements.append(m)
    out["measurements"] = measurements
    return out


class ResultHistory:
    """Stores each fresh result with its fingerprint (an `on_result` callback of `PlanRunner`). `scenario`: what
    the session measures now (it changes when the UI picks another model or TP). Raises what the history raises
    (the runner says it as the result's problem; the run itself stands)."""

    def __init__(
        self,
        history: History,
        *,
        scenario: Callable[[], Scenario],
        fingerprints: SessionFingerprints,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.history = history
        self.scenario = scenario
        self.fingerprints = fingerprints
        self.clock = clock

    def __call__(self, result: ProbeResult) -> None:
        """Keep `result` (any thread)."""
        env = result.environment
        fingerprint = self.fingerprints.learn(env, self.scenario()) if env is not None else None
        if not result.ok or env is None:
            return
        payload = compact_payload(result.to_dict())
        self.history.record(KIND_PROBE, result.probe, payload, recorded_at_s=self.clock(), fingerprint=fingerprint)
