"""Provides the one plan runner: probes run one at a time on a probe group, each behind the same steps on every
surface (`decodetop probe`, the exporter's schedule thread, the live UI's probe worker thread). Stdlib only, no torch.

For each probe run (`PlanRunner.run`):

1. the GPU guard looks at the group's GPUs (`decodetop.pipeline.gpu_guard`): where other processes hold them and
   the user has not consented, the run is refused (`GpusHeldError`) before anything is spawned or timed;
2. the probe group is asked for (the caller's factory: a group spawns on its first run);
3. telemetry makes no costly NVML call while a probe whose spec is `latency_sensitive` runs (the caller's `pause`);
4. the probe runs (its deadline: `timeout_s`, else the probe's own); an exception from the group (it could not
   start, it was closed) comes back as a failed result naming it, never as a crash of the surface;
5. every `on_result` callback gets the result (the history, the recorder, the Prometheus state); a callback that
   fails (a full disk under the history) does not fail the run: its problem is one line the surface takes
   (`PlanRunner.take_problems`).

`PlanRunner.run_all` runs a plan's requests in order with progress ('probe 2/9 gemm: key 3/12 …'), stops between
probes when `should_stop()` turns true or after a cancelled probe, and stops (keeping what it has) when the guard
refuses a run. `run_model_plan` runs a model's plan and composes its budget through the one composition.

    runner = PlanRunner(lambda: controller, guard=guard, pause=collector.latency_probe, on_result=[history.add])
    run = run_model_plan(runner, BudgetContext(scenario, observed=observed), world_size=2, device_kind="cpu")
    run.budget
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import traceback
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol

from decodetop.budget.compose import Budget
from decodetop.budget.plan import ProbePlan, build_plan
from decodetop.pipeline.composition import Composition, compose
from decodetop.pipeline.context import BudgetContext
from decodetop.pipeline.gpu_guard import GpuGuard, GpusHeldError
from decodetop.probes.hooks import MeasuredSet, ProbeRequest
from decodetop.probes.plan_hooks import plan_requests
from decodetop.probes.protocol import Progress
from decodetop.probes.registry import ProbeRegistry
from decodetop.probes.results import ProbeResult, ProbeStatus

ResultHook = Callable[[ProbeResult], None]
"""Called with every result, in the thread that ran it (history, recorder, Prometheus state)."""


class ProbeGroup(Protocol):
    """What the runner needs of a probe group (`decodetop.probes.controller.ProbeController`)."""

    def run(
        self,
        probe: str,
        params: Mapping[str, Any] | None = None,
        *,
        timeout_s: float | None = None,
        on_progress: Callable[[Progress], None] | None = None,
    ) -> ProbeResult: ...

    def rank_pids(self) -> list[int]: ...


class Request(Protocol):
    """One probe run to make: a plan's `ProbeRequest`, or the exporter's `PlannedRun`."""

    @property
    def probe(self) -> str: ...

    @property
    def params(self) -> Mapping[str, Any]: ...


@dataclass(frozen=True)
class PlanProgress:
    """Progress of a plan run: probe i of n, and the probe's own progress (key j of m)."""

    probe_index: int
    probe_count: int
    probe: str
    text: str
    done: int
    total: int

    def line(self) -> str:
        """'probe 2/9 gemm: key 3/12 gemm:m=1,…'."""
        return f"probe {self.probe_index}/{self.probe_count} {self.probe}: {self.text}"


def failure_line(result: ProbeResult) -> str:
    """'allreduce: timed_out (timed out after 60 s)': a result that is not ok, in one line ('' for an ok one)."""
    if result.status is ProbeStatus.OK:
        return ""
    message = result.message or result.error or ""
    detail = f" ({message})" if message and message != result.status.value else ""
    return f"{result.probe}: {result.status.value}{detail}"


def _crashed(probe: str, exc: Exception) -> ProbeResult:
    """A run the group could not make (it did not start, it was closed) as a failed result naming the error."""
    error = f"{type(exc).__name__}: {exc}"
    return ProbeResult(probe, ProbeStatus.FAILED, {}, error=error, message=error, traceback=traceback.format_exc())


@dataclass(frozen=True)
class RunOutcome:
    """What `PlanRunner.run_all` ran: the results in order, notes (stops, failures), and the refusal that stopped
    it, if the guard refused a run."""

    results: tuple[ProbeResult, ...]
    notes: tuple[str, ...]
    """Where the run stopped early, and why."""
    refused: GpusHeldError | None = None

    @property
    def failures(self) -> tuple[str, ...]:
        """One line per result that is not ok (`failure_line`)."""
        return tuple(line for r in self.results if (line := failure_line(r)))


class PlanRunner:
    """Runs probes on one probe group, one at a time, behind the steps of the module docstring.

    group: returns the probe group (a factory that spawns it on its first call, or the group itself). guard: the
    busy-GPU guard (None: CPU ranks, or nothing to guard). pause: a context manager during which telemetry makes no
    costly NVML call (`TelemetryCollector.latency_probe`). registry: the probe specs (their `latency_sensitive`).
    on_result: callbacks for every result. timeout_s: a deadline for every probe (None: each probe's own)."""

    def __init__(
        self,
        group: Callable[[], ProbeGroup],
        *,
        guard: GpuGuard | None = None,
        pause: Callable[[], AbstractContextManager[object]] | None = None,
        registry: ProbeRegistry | None = None,
        on_result: Sequence[ResultHook] = (),
        timeout_s: float | None = None,
    ) -> None:
        self.group = group
        self.guard = guard
        self.pause = pause
        self.registry = registry or ProbeRegistry()
        self.on_result = tuple(on_result)
        self.timeout_s = timeout_s
        self._last: ProbeGroup | None = None
        self._problems: list[str] = []
        self._problems_lock = threading.Lock()

    def own_pids(self) -> list[int]:
        """The ranks of the group this runner last ran on (they hold the GPUs too, and are ours)."""
        return self._last.rank_pids() if self._last is not None else []

    def latency_sensitive(self, probe: str) -> bool:
        """Whether telemetry pauses its costly calls while `probe` runs (its spec says; unknown probes do)."""
        return self.registry.get(probe).latency_sensitive if probe in self.registry else True

    def check(self) -> None:
        """The guard's look at the GPUs now: `GpusHeldError` where a run must not start."""
        if self.guard is not None:
            self.guard.check(self.own_pids())

    def run(
        self,
        probe: str,
        params: Mapping[str, Any] | None = None,
        *,
        on_progress: Callable[[Progress], None] | None = None,
    ) -> ProbeResult:
        """Run one probe (blocking; module docstring). Raises `GpusHeldError` where the guard refuses it."""
        self.check()
        pause = self.pause() if self.pause is not None and self.latency_sensitive(probe) else contextlib.nullcontext()
        try:
            group = self.group()
            self._last = group
            with pause:
                result = group.run(probe, dict(params or {}) or None, timeout_s=self.timeout_s, on_progress=on_progress)
        except GpusHeldError:
            raise
        except Exception as exc:  # the group could not start, or was closed: a failed run, named
            result = _crashed(probe, exc)
        for hook in self.on_result:
            try:
                hook(result)
            except Exception as exc:  # a callback's failure is said, never a failed run
                with self._problems_lock:
                    self._problems.append(f"{result.probe}: {type(exc).__name__}: {exc}")
        return result

    def take_problems(self) -> list[str]:
        """The callbacks' problems since the last call, one line each (any thread)."""
        with self._problems_lock:
            problems, self._problems = self._problems, []
        return problems

    def run_all(
        self,
        requests: Sequence[Request],
        *,
        on_progress: Callable[[PlanProgress], None] | None = None,
        should_stop: Callable[[], bool] | None = None,
    ) -> RunOutcome:
        """Run every request in order (module docstring); stops are notes, a refusal ends the run."""
        results: list[ProbeResult] = []
        notes: list[str] = []
        n = len(requests)
        for i, req in enumerate(requests, start=1):
            if should_stop is not None and should_stop():
                notes.append(f"stopped before {req.probe} (probe {i}/{n})")
                break
            if on_progress is not None:
                on_progress(PlanProgress(i, n, req.probe, "starting", 0, 0))

            def relay(p: Progress, i: int = i, probe: str = req.probe) -> None:
                if on_progress is not None:
                    on_progress(PlanProgress(i, n, probe, p.text, p.done, p.total))

            try:
                result = self.run(req.probe, req.params, on_progress=relay)
            except GpusHeldError as refused:
                notes.append(f"stopped before {req.probe} (probe {i}/{n}): {refused}")
                return RunOutcome(tuple(results), tuple(notes), refused)
            results.append(result)
            if result.status is ProbeStatus.CANCELLED:
                if i < n:
                    notes.append(f"cancelled during {req.probe} (probe {i}/{n}); later probes not run")
                break
        return RunOutcome(tuple(results), tuple(notes))


@dataclass(frozen=True)
class PlanRun:
    """A finished model plan run: what ran, what came back, and the budget composed from it."""

    plan: ProbePlan
    requests: tuple[ProbeRequest, ...]
    results: tuple[ProbeResult, ...]
    composition: Composition
    notes: tuple[str, ...] = ()

    @property
    def budget(self) -> Budget:
        """The composed budget."""
        return self.composition.budget

    @property
    def measured(self) -> MeasuredSet:
        """The budget inputs read from the results (key times, curves, layer composition checks)."""
        return self.composition.measured


def run_model_plan(
    runner: PlanRunner,
    ctx: BudgetContext,
    *,
    world_size: int,
    device_kind: str,
    sweeps: bool = True,
    only: Sequence[str] = (),
    on_progress: Callable[[PlanProgress], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> PlanRun:
    """Run every probe `ctx.scenario`'s plan needs on a group of `world_size` ranks of `device_kind` (cuda or cpu),
    then compose the budget from the results with `ctx` (its results replaced by this run's). A probe that fails or
    times out leaves its keys missing (its result says why) and the rest still runs. Raises `GpusHeldError` where the
    guard refuses the first run; a later refusal stops the run and composes what it has."""
    inventory = ctx.scenario.inventory()
    plan = ctx.plan or build_plan(inventory)
    requests, notes = plan_requests(
        plan, inventory, world_size=world_size, device_kind=device_kind, sweeps=sweeps, only=only
    )
    outcome = runner.run_all(requests, on_progress=on_progress, should_stop=should_stop)
    if outcome.refused is not None and not outcome.results:
        raise outcome.refused
    composed = compose(dataclasses.replace(ctx, results=outcome.results, plan=plan, group_kind=device_kind))
    all_notes = (*notes, *outcome.notes, *composed.measured.notes, *outcome.failures)
    return PlanRun(plan, requests, outcome.results, composed, all_notes)
