"""Provides the headless exporter: telemetry, host checks, the probe plan and a live server's step on schedules,
all feeding one `StateBox` that the /metrics server renders at each scrape.

Threads (all daemons, all stopped by `Exporter.stop()` within a few seconds):

- telemetry: `collectors.telemetry.TelemetryCollector` at `tick_s`;
- checks: `collectors.checks.host.run_all_checks` every `check_every_s`;
- probes: the probe plan through one `probes.controller.ProbeController` every `probe_every_s` (first run at
  start); latency probes pause costly NVML calls while they run (docs/architecture.md, "Processes");
- server: `collectors.serving.ServerStepSource.poll()` every `server_every_s`.

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
from dataclasses import dataclass, field
from typing import Any, TextIO

from decodetop.errors import UserInputError
from decodetop.export.prometheus import ExportState, MetricsServer, StateBox, start_metrics_server

LATENCY_PROBES = frozenset({"allreduce", "launch"})
"""Probes whose timings costly NVML calls (process lists) would disturb (peers.md §3.8)."""
DEFAULT_PROBE_EVERY_S = 600.0
"""The issue's example schedule: the plan every 10 minutes."""
DEFAULT_CHECK_EVERY_S = 300.0
"""Host settings change rarely; every 5 minutes catches a governor reset without measurable cost."""
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


@dataclass(frozen=True)
class PlannedRun:
    """One probe run of the plan: the registered probe and the parameters that differ from its defaults."""

    probe: str
    params: Mapping[str, Any] = field(default_factory=dict)


def probe_plan_runs(
    model: str | None, tp: int | None, registry: Any, *, world_size: int, device_kind: str
) -> tuple[tuple[PlannedRun, ...], tuple[str, ...]]:
    """What the exporter runs each period, and notes on what cannot be measured on this group.

    Without a model: every registered probe (`registry.names()`) at its defaults, what the TUI lists. With a
    model (a preset name or a config.json path): the probe engine's plan for it (`probes.planrun.plan_requests`,
    the same runs as `decodetop probe --model`), on a group of `world_size` ranks of `device_kind` ("cuda" or
    "cpu"), keeping the probes this build registers. A model that cannot be resolved is one UserInputError line.
    """
    names = list(registry.names())
    if model is None:
        return tuple(PlannedRun(name) for name in names), ()
    from decodetop.budget.plan import build_plan
    from decodetop.probes.planrun import plan_requests

    inventory = _inventory(model, tp)
    requests, notes = plan_requests(build_plan(inventory), inventory, world_size=world_size, device_kind=device_kind)
    runs = tuple(PlannedRun(r.probe, dict(r.params)) for r in requests if r.probe in names)
    missing = sorted({r.probe for r in requests} - set(names))
    if missing:
        notes = (*notes, f"not in this build's probe registry: {', '.join(missing)}")
    return runs, tuple(notes)


def _inventory(model: str, tp: int | None) -> Any:
    """The step inventory of `model` (preset or config.json) at `tp` (the budget's default TP when None)."""
    from decodetop.budget.deployment import Deployment
    from decodetop.budget.inventory import build_inventory

    spec = _resolve_spec(model)
    deployment = Deployment(tp=tp) if tp is not None else Deployment()
    deployment.validate(spec)
    return build_inventory(spec, deployment)


def _resolve_spec(model: str) -> Any:
    """A ModelSpec from a preset name (`glm-5-nvfp4`) or a path to an HF config.json (or its folder)."""
    from pathlib import Path

    from decodetop.budget.spec import load_config, load_preset

    if model.endswith(".json") or "/" in model or Path(model).exists():
        return load_config(model)
    return load_preset(model)


class Exporter:
    """The headless exporter's threads around one `StateBox`. `start()` binds the server first (a port in use fails
    before anything else starts); `stop()` ends everything."""

    def __init__(
        self,
        *,
        listen: str,
        nvml: Any | None,
        tick_s: float = 1.0,
        check_every_s: float | None = DEFAULT_CHECK_EVERY_S,
        probe_every_s: float | None = DEFAULT_PROBE_EVERY_S,
        plan: Sequence[PlannedRun] = (),
        make_controller: Callable[[], Any] | None = None,
        server_source: Any | None = None,
        server_every_s: float = DEFAULT_SERVER_EVERY_S,
        budget_for: Callable[[tuple[Any, ...], Any], Any] | None = None,
        preflight: Callable[[Sequence[int]], str | None] | None = None,
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
        self.preflight = preflight
        """(our own rank pids) → None to probe, or why not (another process holds the GPUs: a serving engine)."""
        """(probe results, observed step or None) → Budget or None; called after each probe cycle and server poll."""
        self.box = StateBox(ExportState(probe_interval_s=self.probe_every_s))
        self._log = log if log is not None else sys.stderr
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._server: MetricsServer | None = None
        self._collector: Any | None = None
        self._controller: Any | None = None
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
            from decodetop.collectors.telemetry import TelemetryCollector

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

    def _on_snapshot(self, snapshot: Any) -> None:
        first = self.box().telemetry is None
        self.box.update(telemetry=snapshot)
        if first:
            self._recompose()  # the GPU is known now: unmeasured parts can be estimated from its table row
        available = getattr(snapshot, "nvml_available", True)
        self._note("telemetry", None if available else f"NVML unavailable: {getattr(snapshot, 'nvml_reason', '')}")

    def _checks_loop(self) -> None:
        from decodetop.collectors.checks.host import run_all_checks

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
        while not self._stop.is_set():
            started = time.monotonic()
            failures: list[str] = []
            refusal = self._preflight()
            if refusal is not None:
                self._note("probes", f"skipped this cycle: {refusal}")
                self._stop.wait(self.probe_every_s)
                continue
            for planned in self.plan:
                if self._stop.is_set():
                    break
                result = self._run_probe(planned, failures)
                if result is not None:
                    self.box.add_probe_result(result)
                    self._recompose()  # the budget fills in probe by probe
            self._note("probes", "; ".join(failures) if failures else None)
            self._stop.wait(max(0.0, self.probe_every_s - (time.monotonic() - started)))

    def _preflight(self) -> str | None:
        if self.preflight is None:
            return None
        controller = self._controller
        own = list(controller.rank_pids()) if controller is not None and hasattr(controller, "rank_pids") else []
        try:
            return self.preflight(own)
        except Exception as exc:  # a failed look at the GPUs is a reason not to probe them
            return f"could not check the GPUs for other processes ({type(exc).__name__}: {exc})"

    def _run_probe(self, planned: PlannedRun, failures: list[str]) -> Any | None:
        try:
            with self._controller_lock:
                if self._stop.is_set():
                    return None
                if self._controller is None:
                    assert self.make_controller is not None
                    self._controller = self.make_controller()
                controller = self._controller
            pause = (
                self._collector.latency_probe()
                if self._collector is not None and planned.probe in LATENCY_PROBES
                else contextlib.nullcontext()
            )
            with pause:
                result = controller.run(planned.probe, dict(planned.params) or None)
        except Exception as exc:  # the group could not start, or was closed by stop()
            if not self._stop.is_set():
                failures.append(f"{planned.probe}: {type(exc).__name__}: {exc}")
            return None
        status = str(getattr(getattr(result, "status", None), "value", "ok"))
        message = str(getattr(result, "message", "") or getattr(result, "error", "") or "")
        if status != "ok" and not self._stop.is_set():
            detail = f" ({message})" if message and message != status else ""
            failures.append(f"{planned.probe}: {status}{detail}")
        return result

    def _recompose(self) -> None:
        if self.budget_for is None:
            return
        state = self.box()
        observed = state.observed if hasattr(state.observed, "step_ms") else None
        try:
            budget = self.budget_for(state.probe_results, observed)
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
                self.box.update(observed=observed)
                self._note("observed", None)
                if hasattr(observed, "step_ms"):
                    self._recompose()
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
        """End every thread, the probe group, the collector and the server."""
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


def budget_composer(model: str, tp: int | None) -> Callable[[tuple[Any, ...], Any], Any]:
    """A `budget_for` hook for `--model`: the probe engine's `compose_from_results` (what `decodetop probe --model
    --budget` prints) over the results so far, against the live server's step where there is one, else the
    budget's default observed step."""
    from decodetop.probes.planrun import PlanRunOptions, compose_from_results

    inventory = _inventory(model, tp)

    def compose_for(results: tuple[Any, ...], observed: Any) -> Any:
        step_ms = getattr(observed, "step_ms", None)
        options = PlanRunOptions() if step_ms is None else PlanRunOptions(observed_ms=float(step_ms))
        budget, _ = compose_from_results(inventory, list(results), options)
        return budget

    return compose_for
