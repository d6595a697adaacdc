"""Provides the headless exporter's schedule: telemetry, host checks, the probe plan and a live server's step on
their periods, all feeding one `StateBox` that the /metrics server renders at each scrape, and the budget
recomposed through the one composition every surface uses (`decodetop.pipeline.composition.compose`).

Threads (all daemons, all stopped by `Exporter.stop()` within a few seconds):

- telemetry: `collectors.telemetry.TelemetryCollector` at `tick_s`;
- checks: `collectors.checks.host.run_all_checks` every `check_every_s`;
- probes: the probe plan through the one plan runner (`decodetop.pipeline.plan_runner`: the GPU guard before each
  probe, costly NVML calls paused while a latency-sensitive probe runs) on one probe group every `probe_every_s`
  (first run at start);
- server: `collectors.serving.ServerStepSource.poll()` every `server_every_s`, each poll bounded by one overall
  deadline (`decodetop.httpget`), so a server that trickles shows as down (`decodetop_server_up` 0) within it.

A part that fails (no NVML, a probe group that cannot start, a dead server URL) is a one-line note in the state
(`decodetop_exporter_part_failing{part}`) and on stderr once per change; the exporter keeps serving the rest.
"""

from __future__ import annotations

import contextlib
import re
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Protocol, TextIO

from decodetop.budget.compose import Budget
from decodetop.budget.plan import build_plan
from decodetop.budget.scenario import Scenario
from decodetop.collectors.checks.host import run_all_checks
from decodetop.collectors.nvml import Nvml
from decodetop.collectors.serving import ServerStatus, ServerStep
from decodetop.collectors.telemetry import TelemetryCollector, TelemetrySnapshot
from decodetop.defaults import DEFAULT_TARGET_TPS
from decodetop.errors import DecodetopError, UserInputError
from decodetop.export.prometheus import ExportState, MetricsServer, Observation, StateBox, start_metrics_server
from decodetop.pipeline.composition import compose
from decodetop.pipeline.context import BudgetContext, gpu_hint
from decodetop.pipeline.gpu_guard import GpuGuard
from decodetop.pipeline.observed import TracedStep, observed_step
from decodetop.pipeline.plan_runner import PlanRunner, ProbeGroup
from decodetop.probes.plan_hooks import plan_requests
from decodetop.probes.results import ProbeResult

DEFAULT_PROBE_EVERY_S = 600.0
"""The plan every 10 minutes: a full model plan takes 15-20 s on 2 × H200 (docs/benchmarks.md, cost)."""
DEFAULT_CHECK_EVERY_S = 300.0
"""Host settings change rarely; every 5 minutes catches a governor reset without measurable cost."""
SCHEDULED_SWEEPS = False
"""The plan on a schedule measures the budget's own points only: the GEMM-vs-M and context sweeps draw charts in
`decodetop probe`, are not exported, and would take the GPUs from the serving engine every period for nothing."""
DEFAULT_SERVER_EVERY_S = 5.0
DEFAULT_SERVER_WINDOW_S = 30.0
"""Δ window for the observed step: a few thousand tokens at typical decode rates, steady for a dashboard."""
_DURATION = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*(ms|s|m|h|d)?\s*$", re.IGNORECASE)
_UNIT_S = {"ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}


def parse_duration(text: str, flag: str) -> float:
    """'10m', '30s', '1.5h', '600' (seconds) → seconds; a positive number, else one UserInputError line."""
    m = _DURATION.match(text)
    if m is None:
        raise UserInputError(f"{flag} {text!r}: give a duration like 30s, 10m or 1h")
    unit = m.group(2).lower() if m.group(2) else None
    seconds = float(m.group(1)) * _UNIT_S[unit]
    if seconds <= 0:
        raise UserInputError(f"{flag} {text!r}: must be longer than zero")
    return seconds


class ProbeRunner(ProbeGroup, Protocol):
    """What the schedule needs of a probe group (`decodetop.probes.controller.ProbeController`): the plan runner's
    `ProbeGroup`, and a cancel and close of its own."""

    def cancel(self) -> None: ...

    def close(self) -> None: ...


class StepSource(Protocol):
    """What the schedule needs of a live server (`decodetop.collectors.serving.ServerStepSource`)."""

    def poll(self) -> ServerStep | ServerStatus: ...


class ProbeNames(Protocol):
    """The registered probes' names (`decodetop.probes.registry.ProbeRegistry`)."""

    def names(self) -> list[str]: ...


@dataclass(frozen=True)
class PlannedRun:
    """One probe run of the plan: the registered probe and the parameters that differ from its defaults."""

    probe: str
    params: Mapping[str, object] = field(default_factory=dict)


def probe_plan_runs(
    scenario: Scenario | None, registry: ProbeNames, *, world_size: int, device_kind: str
) -> tuple[tuple[PlannedRun, ...], tuple[str, ...]]:
    """What the exporter runs each period, and notes on what cannot be measured on this group.

    Without a scenario: every registered probe at its defaults, what the TUI lists. With one: the probe engine's
    plan for it (`probes.plan_hooks.plan_requests`, the runs of `decodetop probe --model` less the charts' sweeps,
    `SCHEDULED_SWEEPS`), on a group of `world_size` ranks of `device_kind` ("cuda" or "cpu"), keeping the probes this
    build registers.
    """
    names = list(registry.names())
    if scenario is None:
        return tuple(PlannedRun(name) for name in names), ()
    inventory = scenario.inventory()
    requests, notes = plan_requests(
        build_plan(inventory), inventory, world_size=world_size, device_kind=device_kind, sweeps=SCHEDULED_SWEEPS
    )
    runs = tuple(PlannedRun(r.probe, dict(r.params)) for r in requests if r.probe in names)
    missing = sorted({r.probe for r in requests} - set(names))
    if missing:
        notes = (*notes, f"not in this build's probe registry: {', '.join(missing)}")
    return runs, tuple(notes)


@dataclass(frozen=True)
class BudgetComposer:
    """Composes the exporter's budget through the one composition (`decodetop.pipeline.composition.compose`), as
    `decodetop budget`, `probe --budget` and the UI do: the scenario of `--model/--config`, the probe group's device
    kind, the GPU NVML sees, and the observed step by the one rule (`decodetop.pipeline.observed`): --observed-ms,
    else the server's step while it gives one, else --trace's, else the default (assumed)."""

    scenario: Scenario
    target_tps: float = DEFAULT_TARGET_TPS
    group_kind: str | None = None
    """cuda or cpu: the probe group's ranks (None without probes)."""
    observed_ms: float | None = None
    """--observed-ms (None: not given)."""
    server_url: str | None = None
    """--server (its answers arrive with each call)."""
    trace: TracedStep | None = None
    """--trace: the engine's steps in a profiler trace, an observation."""

    def __call__(
        self, results: Sequence[ProbeResult], observation: Observation | None, telemetry: TelemetrySnapshot | None
    ) -> Budget:
        """The budget of the results so far against the current observed step."""
        now = time.time()
        seen = telemetry.gpus[0].name if telemetry is not None and telemetry.gpus else None
        observed = observed_step(
            flag_ms=self.observed_ms, server=observation, server_url=self.server_url, trace=self.trace, now_s=now
        )
        ctx = BudgetContext(
            self.scenario,
            tuple(results),
            observed=observed,
            target_tps=self.target_tps,
            gpu=gpu_hint(seen=seen),
            group_kind=self.group_kind,
            now_s=now,
        )
        return compose(ctx).budget


class Exporter:
    """The headless exporter's threads around one `StateBox`. `start()` binds the server first (a port in use fails
    before anything else starts); `stop()` ends everything."""

    def __init__(
        self,
        *,
        listen: str,
        nvml: Nvml | None,
        tick_s: float = 1.0,
        check_every_s: float | None = DEFAULT_CHECK_EVERY_S,
        probe_every_s: float | None = DEFAULT_PROBE_EVERY_S,
        plan: Sequence[PlannedRun] = (),
        make_controller: Callable[[], ProbeRunner] | None = None,
        server_source: StepSource | None = None,
        server_every_s: float = DEFAULT_SERVER_EVERY_S,
        budget_for: BudgetComposer | None = None,
        guard: GpuGuard | None = None,
        log: TextIO | None = None,
    ) -> None:
        self.listen = listen
        self.nvml = nvml
        self.tick_s = tick_s
        self.check_every_s = check_every_s
        self.probe_every_s = probe_every_s if make_controller is not None and plan else None
        self.plan = tuple(plan)
        self.make_controller = make_controller
        self.server_source = server_source
        self.server_every_s = server_every_s
        self.budget_for = budget_for
        """Recomposes the budget after each probe result, server poll and the first telemetry snapshot."""
        self.guard = guard
        """Other processes holding the GPUs (a serving engine) skip the cycle unless --force (None: CPU ranks)."""
        self.box = StateBox(ExportState(probe_interval_s=self.probe_every_s))
        self._log = log if log is not None else sys.stderr
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._server: MetricsServer | None = None
        self._collector: TelemetryCollector | None = None
        self._controller: ProbeRunner | None = None
        self._controller_lock = threading.Lock()
        self._notes_lock = threading.Lock()

    @property
    def server(self) -> MetricsServer | None:
        """The running /metrics server."""
        return self._server

    def say(self, line: str) -> None:
        """One line on the log stream (stderr)."""
        print(f"decodetop exporter: {line}", file=self._log, flush=True)

    def _note(self, part: str, message: str | None) -> None:
        with self._notes_lock:
            notes = dict(self.box().notes)
            before = notes.get(part)
            if message:
                notes[part] = message
            else:
                notes.pop(part, None)
            self.box.update(notes=notes)
        if message and message != before:
            self.say(f"{part}: {message}")
        elif not message and before:
            self.say(f"{part}: working again")

    def start(self) -> None:
        """Bind the server, then start the threads."""
        self._server = start_metrics_server(self.listen, self.box)
        self.say(f"serving {self._server.url}")
        self._recompose()  # before anything is measured: observed and target, every component still missing
        if self.nvml is not None:
            self._collector = TelemetryCollector(
                self.nvml, interval_s=self.tick_s, on_snapshot=self._on_snapshot, thread_name="decodetop-exporter-nvml"
            )
            self._collector.start()
        if self.check_every_s is not None:
            self._spawn("checks", self._checks_loop)
        if self.probe_every_s is not None:
            self.say(f"probes: {', '.join(r.probe for r in self.plan)} every {self.probe_every_s:g} s")
            self._spawn("probes", self._probes_loop)
        if self.server_source is not None:
            self._spawn("server", self._server_loop)

    def _spawn(self, name: str, target: Callable[[], None]) -> None:
        thread = threading.Thread(target=target, name=f"decodetop-exporter-{name}", daemon=True)
        self._threads.append(thread)
        thread.start()

    def _on_snapshot(self, snapshot: TelemetrySnapshot) -> None:
        first = self.box().telemetry is None
        self.box.update(telemetry=snapshot)
        if first:
            self._recompose()  # the GPU is known now: unmeasured parts can be estimated from its table row
        self._note("telemetry", None if snapshot.nvml_available else f"NVML unavailable: {snapshot.nvml_reason}")

    def _checks_loop(self) -> None:
        assert self.check_every_s is not None
        while not self._stop.is_set():
            try:
                results = run_all_checks(nvml=self.nvml, sleep=self._sleep)
            except Exception as exc:  # a check crash must not end the exporter; the note says what happened
                self._note("checks", f"checks failed: {type(exc).__name__}: {exc}")
            else:
                self.box.update(checks=tuple(results), checks_unix_s=time.time())
                self._note("checks", None)
            self._stop.wait(self.check_every_s)

    def _sleep(self, seconds: float) -> None:
        self._stop.wait(seconds)

    def _probes_loop(self) -> None:
        assert self.probe_every_s is not None and self.make_controller is not None
        runner = PlanRunner(self._group, guard=self.guard, pause=self._pause, on_result=[self._on_result])
        while not self._stop.is_set():
            started = time.monotonic()
            outcome = runner.run_all(self.plan, should_stop=self._stop.is_set)
            if outcome.refused is not None:
                done = "skipped this cycle" if not outcome.results else "stopped this cycle"
                self._note("probes", f"{done}: {outcome.refused}")
            elif not self._stop.is_set():
                self._note("probes", "; ".join(outcome.failures) or None)
            self._stop.wait(max(0.0, self.probe_every_s - (time.monotonic() - started)))

    def _group(self) -> ProbeRunner:
        """The probe group, spawned on the first probe (never while stopping)."""
        with self._controller_lock:
            if self._stop.is_set():
                raise DecodetopError("the exporter is stopping")
            if self._controller is None:
                assert self.make_controller is not None
                self._controller = self.make_controller()
            return self._controller

    def _pause(self) -> AbstractContextManager[object]:
        """No costly NVML call while a latency-sensitive probe runs (the plan runner asks)."""
        return self._collector.latency_probe() if self._collector is not None else contextlib.nullcontext()

    def _on_result(self, result: ProbeResult) -> None:
        if self._stop.is_set():
            return  # a run the stop cancelled or closed: nothing to export any more
        self.box.add_probe_result(result)
        self._recompose()  # the budget fills in probe by probe

    def _recompose(self) -> None:
        if self.budget_for is None:
            return
        state = self.box()
        try:
            budget = self.budget_for(state.probe_results, state.observed, state.telemetry)
        except Exception as exc:  # composing must not end the exporter; the note says what happened
            self._note("budget", f"composing the budget failed: {type(exc).__name__}: {exc}")
            return
        self.box.update(budget=budget)
        self._note("budget", None)

    def _server_loop(self) -> None:
        assert self.server_source is not None
        while not self._stop.is_set():
            try:
                observed = self.server_source.poll()
            except Exception as exc:  # poll() returns statuses; anything else is a bug worth a note, not a crash
                self._note("observed", f"server poll failed: {type(exc).__name__}: {exc}")
            else:
                before = self.box().observed
                self.box.update(observed=observed)
                self._note("observed", None)
                if isinstance(observed, ServerStep) or isinstance(before, ServerStep):
                    self._recompose()  # a new step, or the step just went away (the budget says so)
            self._stop.wait(self.server_every_s)

    def wait(self, timeout_s: float | None = None) -> bool:
        """Block until `stop()` (or the timeout); True when stopped."""
        return self._stop.wait(timeout_s)

    def request_stop(self) -> None:
        """Ask the main loop to end (signal-safe: sets an event and cancels a running probe)."""
        self._stop.set()
        controller = self._controller
        if controller is not None:
            with contextlib.suppress(Exception):  # cancel from a signal handler must never raise
                controller.cancel()

    def stop(self, timeout_s: float = 5.0) -> None:
        """End every thread, the probe group, the collector and the server (a server poll in flight ends at its
        deadline, `collectors.serving.DEFAULT_TIMEOUT_S`)."""
        self.request_stop()
        deadline = time.monotonic() + timeout_s
        with self._controller_lock:
            controller, self._controller = self._controller, None
        if controller is not None:
            controller.close()
        if self._collector is not None:
            self._collector.stop(max(0.1, deadline - time.monotonic()))
        for thread in self._threads:
            thread.join(max(0.1, deadline - time.monotonic()))
        if self._server is not None:
            self._server.close()
