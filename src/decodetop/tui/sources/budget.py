"""Provides `PresetBudget`, the budget source: the one composition (`decodetop.pipeline.composition.compose`) for the
UI's settings and results, the observed step with its origin, and the fingerprints stored results are matched by."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

from decodetop.budget.compose import ObservedStep, default_observed
from decodetop.budget.spec import preset_info, preset_names
from decodetop.collectors.serving import ServerStatus, ServerStep
from decodetop.history import Fingerprint
from decodetop.history import format_ago as ago
from decodetop.pipeline.composition import compose
from decodetop.pipeline.context import BudgetContext, gpu_hint
from decodetop.pipeline.fingerprints import expected_fingerprint, fingerprint_accepts, fingerprint_of
from decodetop.pipeline.scenario_flags import ScenarioFlags
from decodetop.probes.results import ProbeResult
from decodetop.settings import Settings
from decodetop.tui.model import BudgetView, ProbeCurves
from decodetop.tui.probe_group import GroupInfo, scenario_for
from decodetop.tui.sources.budget_view import budget_view
from decodetop.tui.sources.probe_curves import allreduce_curves, gemm_curves
from decodetop.tui.sources.probe_views import measured_at

_SERVER_FAILURES = frozenset(
    {"unreachable", "timed_out", "http_error", "not_metrics", "unparseable", "no_latency_metric"}
)
"""`collectors.serving.ServerState` values that mean the server could not be read (said in the bar's header)."""


class PresetBudget:
    """`BudgetSource` over the one composition (`decodetop.pipeline.composition.compose`): the same figures and
    provenance as `decodetop budget` and `decodetop probe --budget` for the same scenario and results.

    gpu_name: the GPU's NVML name once telemetry has it (how it was found: `gpu_how`). group: the probe group (its
    size is the default TP, its device kind says whether figures are a GPU's). observed_from: where the settings'
    observed step came from ("flag", "settings" or "default"). server_url: the --server URL (its answers arrive
    through `note_server`). Results taken before `session_start_s` count as measured earlier (from the history).
    """

    def __init__(
        self,
        gpu_name: Callable[[], str | None] | None = None,
        *,
        group: Callable[[], GroupInfo | None] | None = None,
        gpu_how: str = "detected by NVML",
        observed_from: str = "default",
        server_url: str | None = None,
        session_start_s: float | None = None,
        flags: ScenarioFlags | None = None,
    ) -> None:
        self.gpu_name = gpu_name
        self.group = group
        self.gpu_how = gpu_how
        self.observed_from = observed_from
        self.server_url = server_url
        self.flags = flags or ScenarioFlags()
        """The scenario flags of this session (EP, batch, context, KV dtype, speculation, launch mode, all-reduce)."""
        self.session_start_s = time.time() if session_start_s is None else session_start_s
        self._server_answer: ServerStep | ServerStatus | None = None
        self._fresh_fingerprint: Fingerprint | None = None

    def _current_fingerprint(self, settings: Settings) -> tuple[Fingerprint, bool]:
        """This session's fingerprint for `settings` and whether it is exact (taken from a fresh result's
        environment) or expected (before the probe group has run: the versions it reports are not known yet)."""
        group = self.group() if self.group is not None else None
        scenario = scenario_for(settings, group, self.flags)
        fresh = self._fresh_fingerprint
        if fresh is not None:
            return dataclasses.replace(fresh, scenario=scenario.fingerprint_id), True
        kind = group.kind if group is not None else "cuda"
        name = self.gpu_name() if self.gpu_name else None
        count = group.size if group is not None else scenario.tp
        return expected_fingerprint(scenario, device_kind=kind, gpu_count=count, gpu_name=name), False

    def fingerprint(self, settings: Settings, result: object) -> Fingerprint | None:
        """The fingerprint to store with a fresh result of this session (None without an environment); from then on
        only stored records equal to it feed the budget."""
        if not isinstance(result, ProbeResult) or result.environment is None:
            return None
        group = self.group() if self.group is not None else None
        fp = fingerprint_of(result.environment, scenario_for(settings, group, self.flags))
        self._fresh_fingerprint = fp
        return fp

    def accepts(self, fingerprint: Fingerprint | None, settings: Settings) -> bool:
        """Whether a stored record may feed the budget for `settings`: its fingerprint matches this host, device,
        versions and scenario (records of unknown origin never do)."""
        current, exact = self._current_fingerprint(settings)
        return fingerprint_accepts(fingerprint, current, exact=exact)

    def note_server(self, answer: ServerStep | ServerStatus) -> None:
        """The --server poller's latest answer (any thread)."""
        self._server_answer = answer

    def models(self) -> Sequence[tuple[str, str]]:
        """Preset names with their display names."""
        out = []
        for name in preset_names():
            try:
                info = preset_info(name)
            except (OSError, ValueError, AssertionError):
                info = {}
            out.append((name, str(info.get("display_name", ""))))
        return out

    def observed(self, settings: Settings, now_s: float) -> tuple[ObservedStep, str]:
        """The observed step with its origin, and a header line when the server could not be read."""
        answer = self._server_answer
        header = ""
        last: ServerStep | None = None
        if isinstance(answer, ServerStep):
            last = answer
        elif answer is not None:
            last = answer.last_step
            if answer.state.value in _SERVER_FAILURES:
                header = f"server {answer.url}: {answer.message} — the observed step is not live"
        if last is not None and last.step_ms == settings.observed_ms:
            age = last.age_s(now_s)
            when = f", {ago(age)}" if age is not None else ""  # "just now", never "now ago"
            now = "" if answer is last else f"; now: {answer.summary if answer is not None else ''}"
            detail = f"{last.url}, {last.window_s:.0f} s window{when}{now}"
            return ObservedStep(settings.observed_ms, "server", detail), header
        if self.observed_from in ("flag", "settings"):
            what = "--observed-ms" if self.observed_from == "flag" else ""
            return ObservedStep(settings.observed_ms, self.observed_from, what), header
        if self.server_url is not None:
            why = answer.summary if answer is not None else "waiting for the server's first window"
            return default_observed(f"the default; server {self.server_url}: {why}"), header
        return default_observed(), header

    def compose(self, settings: Settings, results: Mapping[str, object], now_s: float) -> BudgetView:
        """The budget for `settings` from the probe results so far (this session's and the history's)."""
        group = self.group() if self.group is not None else None
        scenario = scenario_for(settings, group, self.flags)
        good = [r for r in results.values() if isinstance(r, ProbeResult) and r.ok]
        taken = measured_at({r.probe: r for r in good})
        stored = {p: t for p, t in taken.items() if t < self.session_start_s}
        fresh = self._fresh_fingerprint
        if fresh is not None:  # once this session's ranks said what they run, stored results must match it exactly
            want = dataclasses.replace(fresh, scenario=scenario.fingerprint_id)
            good = [
                r
                for r in good
                if r.probe not in stored
                or (r.environment is not None and fingerprint_of(r.environment, want.scenario) == want)
            ]
        name = self.gpu_name() if self.gpu_name else None
        observed, header = self.observed(settings, now_s)
        ctx = BudgetContext(
            scenario,
            tuple(good),
            observed=observed,
            target_tps=settings.target_tps,
            gpu=gpu_hint(seen=name, seen_how=self.gpu_how),
            group_kind=group.kind if group is not None else None,
            stored_at_s=stored,
            now_s=now_s,
        )
        budget = compose(ctx).budget
        view = budget_view(budget, scenario.title, taken, scenario.tp_text)
        if header:
            view = replace(view, header="\n".join(h for h in (view.header, header) if h))
        return view

    def curves(self, results: Mapping[str, object]) -> ProbeCurves:
        """Chart series from the all-reduce and GEMM results."""
        allreduce = results.get("allreduce")
        gemm = results.get("gemm")
        return ProbeCurves(
            allreduce_us_by_mode=allreduce_curves(allreduce) if allreduce is not None else (),  # type: ignore[arg-type]
            gemm_gbps_by_shape=gemm_curves(gemm) if gemm is not None else (),  # type: ignore[arg-type]
        )
