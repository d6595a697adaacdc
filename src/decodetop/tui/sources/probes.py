"""Provides the probe sources: `ControllerProbes` over the probe group (spawned on the first run), `NoProbes`
(``--no-probes``) and `ReplayProbes` (``--replay``). Nothing here imports torch: the UI process never touches CUDA."""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from decodetop.budget.plan import build_plan
from decodetop.budget.scenario import Scenario
from decodetop.errors import DecodetopError
from decodetop.pipeline.gpu_guard import GpuGuard, GpusHeldError
from decodetop.pipeline.plan_runner import PlanRunner, ResultHook
from decodetop.pipeline.result_history import compact_payload
from decodetop.pipeline.scenario_flags import ScenarioFlags
from decodetop.probes.hooks import ProbeRequest
from decodetop.probes.protocol import Progress
from decodetop.probes.registry import ProbeRegistry
from decodetop.probes.results import ProbeResult
from decodetop.settings import Settings
from decodetop.tui.model import ProbeState, ProbeView
from decodetop.tui.probe_group import group_of, scenario_for
from decodetop.tui.sources import ProbeOutcome, ProgressCallback
from decodetop.tui.sources.probe_views import probe_view, utc_to_unix

if TYPE_CHECKING:
    # types only: the controller module pulls in multiprocessing (a --replay or --no-probes session never loads it)
    from decodetop.probes.controller import GroupLayout, ProbeController


@contextlib.contextmanager
def real_stderr() -> Iterator[None]:
    """Point sys.stderr at the process's real stderr for a moment.

    Textual replaces sys.stderr with a capture object whose `fileno()` is not a real descriptor, and
    multiprocessing's resource tracker passes `sys.stderr.fileno()` to the process it spawns ("bad value(s) in
    fds_to_keep"). Spawning the probe group (and the tracker) under this context gives them the terminal's stderr.
    """
    saved = sys.stderr
    if sys.__stderr__ is not None:
        sys.stderr = sys.__stderr__
    try:
        yield
    finally:
        sys.stderr = saved


def start_resource_tracker() -> None:
    """Start multiprocessing's resource tracker before the UI takes over stderr (see `real_stderr`)."""
    from multiprocessing import resource_tracker

    with real_stderr():
        resource_tracker.ensure_running()


class ControllerProbes:
    """`ProbeSource` over `decodetop.probes.controller.ProbeController` (spawned on the first run), each run through
    the one plan runner (`decodetop.pipeline.plan_runner.PlanRunner`): `guard` (other processes on the GPUs refuse a
    run until the user consents), `pause` (telemetry's costly calls paused while a latency-sensitive probe runs) and
    the `on_result` callbacks (the history, the taps)."""

    def __init__(
        self,
        make_controller: Callable[[], ProbeController],
        telemetry_line: Callable[[], str] | None = None,
        *,
        cpu_rank_nice: int | None = None,
        layout: Callable[[], GroupLayout] | None = None,
        guard: GpuGuard | None = None,
        pause: Callable[[], AbstractContextManager[object]] | None = None,
        on_result: Sequence[ResultHook] = (),
        flags: ScenarioFlags | None = None,
    ):
        self._make = make_controller
        self.runner = PlanRunner(self._group, guard=guard, pause=pause, on_result=on_result)
        self.layout = layout
        """Returns the group's `GroupLayout` without spawning it (the plan depends on its size and device kind)."""
        self.flags = flags or ScenarioFlags()
        """The session's scenario flags (batch, context, KV dtype, …): the plan measures that deployment."""
        self._requests: dict[str, ProbeRequest] = {}
        self.plan_notes: tuple[str, ...] = ()
        """What the plan cannot measure on this group (collectives on fewer ranks than the TP degree)."""
        self.cpu_rank_nice = cpu_rank_nice
        """Niceness for CPU (gloo) ranks, so spinning ranks on a small box leave the UI its share; None leaves them."""
        self._reniced: set[int] = set()
        self._controller: ProbeController | None = None
        self._lock = threading.Lock()
        self._closed = False
        self.telemetry_line = telemetry_line
        """Returns a one-line summary of the current telemetry (clocks, clock events), recorded with each run."""
        self.scenario: Scenario | None = None
        """The scenario of the latest plan: what this session's runs measure (their results' fingerprint)."""

    def _group(self) -> ProbeController:
        """The plan runner's group: spawned on the first run, its CPU ranks reniced."""
        controller = self._get()
        self._renice(controller)
        return controller

    def _get(self) -> ProbeController:
        with self._lock:
            if self._closed:
                raise DecodetopError("probe group is closed")
            if self._controller is None:
                with real_stderr():
                    self._controller = self._make()
            return self._controller

    def plan(self, settings: Settings) -> list[ProbeView]:
        """The model's probe plan on this group: one row per probe run, with the keys it measures."""
        from decodetop.probes.plan_hooks import plan_requests

        layout = self.layout() if self.layout is not None else None
        group = group_of(layout) if layout is not None else None
        scenario = scenario_for(settings, group, self.flags)
        self.scenario = scenario
        inventory = scenario.inventory()
        world = group.size if group is not None else scenario.tp
        kind = group.kind if group is not None else "cuda"
        requests, notes = plan_requests(build_plan(inventory), inventory, world_size=world, device_kind=kind)
        self._requests = {r.probe: r for r in requests}
        self.plan_notes = tuple(notes)
        return [
            ProbeView(
                probe_id=r.probe,
                title=r.probe,
                details=(("keys measured", str(len(r.keys))), *((("first key", r.keys[0]),) if r.keys else ())),
            )
            for r in requests
        ]

    def run(self, probe_id: str, on_progress: ProgressCallback) -> ProbeOutcome:
        """Run one probe on the group (blocking), with the plan's parameters for it, through the plan runner."""
        before = self.telemetry_line() if self.telemetry_line else ""

        def progress(p: Progress) -> None:
            fraction = p.done / p.total if p.total else None
            on_progress(fraction, p.line())

        request = self._requests.get(probe_id)
        params = dict(request.params) if request is not None else None
        try:
            result = self.runner.run(probe_id, params, on_progress=progress)
        except GpusHeldError as refused:  # other processes hold the GPUs and the user has not consented
            view = ProbeView(probe_id=probe_id, title=probe_id, state=ProbeState.UNSUPPORTED, error=refused.screen_text)
            return ProbeOutcome(view=view)
        problems = [f"result not kept: {line}" for line in self.runner.take_problems()]
        after = self.telemetry_line() if self.telemetry_line else ""
        view = probe_view(result, title=probe_id)
        lines = tuple(
            line for line in (f"at start: {before}" if before else "", f"at end: {after}" if after else "") if line
        )
        if lines:
            view = replace(view, telemetry_text=lines + view.telemetry_text)
        payload = compact_payload(result.to_dict()) if result.ok else {}
        result_ok = result if result.ok else None
        return ProbeOutcome(view=view, payload=payload, result=result_ok, problem="; ".join(problems))

    def _renice(self, controller: ProbeController) -> None:
        """Lower the priority of CPU ranks (our own children; nothing about the host changes)."""
        if self.cpu_rank_nice is None or controller.backend != "gloo":
            return
        import psutil  # third-party, needed only for CPU ranks

        for pid in controller.rank_pids():
            if pid in self._reniced:
                continue
            with contextlib.suppress(psutil.Error):
                process = psutil.Process(pid)
                process.nice(max(process.nice(), self.cpu_rank_nice))
                self._reniced.add(pid)

    def restore(self, probe_id: str, payload: Mapping[str, Any], measured_at_s: float) -> ProbeOutcome | None:
        """A stored `ProbeResult.to_dict()` back as an outcome."""
        try:
            result = ProbeResult.from_dict(payload)
        except (KeyError, TypeError, ValueError):
            return None
        return ProbeOutcome(view=probe_view(result, title=probe_id), payload=payload, result=result)

    def cancel(self) -> None:
        """Cancel the running probe (any thread)."""
        controller = self._controller
        if controller is not None:
            controller.cancel()

    def close(self) -> None:
        """End every rank."""
        with self._lock:
            self._closed = True
            controller = self._controller
        if controller is not None:
            controller.close()

    def rank_pids(self) -> list[int]:
        """PIDs of live ranks (tests)."""
        controller = self._controller
        return controller.rank_pids() if controller is not None else []


class NoProbes:
    """`ProbeSource` for ``--no-probes`` without history: an empty plan, nothing to run."""

    def __init__(self, reason: str = "probes are off (--no-probes)") -> None:
        self.reason = reason

    def plan(self, settings: Settings) -> list[ProbeView]:
        """The registry's probes, shown idle."""
        return [ProbeView(probe_id=spec.name, title=spec.name) for spec in ProbeRegistry().specs()]

    def run(self, probe_id: str, on_progress: ProgressCallback) -> ProbeOutcome:
        """Refuse, saying why."""
        return ProbeOutcome(view=ProbeView(probe_id, probe_id, ProbeState.UNSUPPORTED, error=self.reason))

    def restore(self, probe_id: str, payload: Mapping[str, Any], measured_at_s: float) -> ProbeOutcome | None:
        """History still shows."""
        return ControllerProbes.restore(self, probe_id, payload, measured_at_s)  # type: ignore[arg-type]

    def cancel(self) -> None:
        """Nothing runs."""

    def close(self) -> None:
        """Nothing to end."""


class ReplayProbes:
    """`ProbeSource` for ``--replay``: "running" a probe shows the recorded result (the newest of each probe), handed
    to `on_result` as a live run's is (the taps: --prometheus)."""

    def __init__(self, results: Sequence[ProbeResult], on_result: Sequence[ResultHook] = ()) -> None:
        self.results = {r.probe: r for r in results}
        self.on_result = tuple(on_result)

    def plan(self, settings: Settings) -> list[ProbeView]:
        """The recorded probes, in recorded order."""
        return [ProbeView(probe_id=name, title=name) for name in self.results]

    def run(self, probe_id: str, on_progress: ProgressCallback) -> ProbeOutcome:
        """The recorded result."""
        result = self.results.get(probe_id)
        if result is None:
            return ProbeOutcome(
                view=ProbeView(probe_id, probe_id, ProbeState.UNSUPPORTED, error="not in the recording")
            )
        for hook in self.on_result:
            hook(result)
        view = probe_view(result, title=probe_id)
        at = utc_to_unix(result.started_utc) if result.started_utc else None
        return ProbeOutcome(view=replace(view, measured_at_s=at), result=result if result.ok else None)

    def restore(self, probe_id: str, payload: Mapping[str, Any], measured_at_s: float) -> ProbeOutcome | None:
        """No history in a replay."""
        return None

    def cancel(self) -> None:
        """Nothing runs."""

    def close(self) -> None:
        """Nothing to end."""
