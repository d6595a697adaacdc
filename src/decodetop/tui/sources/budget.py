"""Provides `PresetBudget`, the budget source: the one composition (`decodetop.pipeline.composition.compose`) for the
UI's settings and results, the observed step by the one rule (`decodetop.pipeline.observed`) from what the UI
observes (the server's answers, a loaded trace), and which stored results may feed it (`SessionFingerprints`)."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

from decodetop.budget.compose import ObservedStep
from decodetop.budget.spec import preset_info, preset_names
from decodetop.collectors.serving import ServerStatus, ServerStep
from decodetop.history import Fingerprint
from decodetop.pipeline.composition import compose, stored_times
from decodetop.pipeline.context import BudgetContext, gpu_hint
from decodetop.pipeline.fingerprints import SessionFingerprints
from decodetop.pipeline.observed import TracedStep, observed_step, server_header
from decodetop.pipeline.scenario_flags import ScenarioFlags
from decodetop.probes.results import ProbeResult
from decodetop.settings import Settings
from decodetop.tui.model import BudgetView, ProbeCurves
from decodetop.tui.probe_group import GroupInfo, scenario_for
from decodetop.tui.sources.budget_view import budget_view
from decodetop.tui.sources.probe_curves import allreduce_curves, gemm_curves
from decodetop.tui.sources.probe_views import measured_at


class PresetBudget:
    """`BudgetSource` over the one composition (`decodetop.pipeline.composition.compose`): the same figures and
    provenance as `decodetop budget` and `decodetop probe --budget` for the same scenario and results.

    gpu_name: the GPU's NVML name once telemetry has it (how it was found: `gpu_how`). group: the probe group (its
    size is the default TP, its device kind says whether figures are a GPU's). observed_from: where the settings'
    observed step came from ("flag", "settings" or "default"). server_url: the --server URL (its answers arrive
    through `note_server`, a loaded trace through `note_trace`). Results taken before `session_start_s` count as
    measured earlier (from the history). flags: the session's scenario flags. fingerprints: shared with the history
    callback of the probe runs (`decodetop.pipeline.result_history`).
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
        fingerprints: SessionFingerprints | None = None,
        tp_from: str = "--tp or the settings file",
    ) -> None:
        self.gpu_name = gpu_name
        self.group = group
        self.gpu_how = gpu_how
        self.observed_from = observed_from
        self.server_url = server_url
        self.flags = flags or ScenarioFlags()
        """The scenario flags of this session (EP, batch, context, KV dtype, speculation, launch mode, all-reduce)."""
        self.fingerprints = fingerprints or SessionFingerprints()
        self.tp_from = tp_from
        """Where the settings' TP came from, in words (the budget's TP line says it)."""
        self.session_start_s = time.time() if session_start_s is None else session_start_s
        self._server_answer: ServerStep | ServerStatus | None = None
        self._traced: TracedStep | None = None

    def accepts(self, fingerprint: Fingerprint | None, settings: Settings) -> bool:
        """Whether a stored record may feed the budget for `settings`: its fingerprint matches this host, device,
        versions and scenario (records of unknown origin never do)."""
        group = self.group() if self.group is not None else None
        scenario = scenario_for(settings, group, self.flags, self.tp_from)
        return self.fingerprints.accepts(
            fingerprint,
            scenario,
            device_kind=group.kind if group is not None else "cuda",
            gpu_count=group.size if group is not None else scenario.tp,
            gpu_name=self.gpu_name() if self.gpu_name else None,
        )

    def note_server(self, answer: ServerStep | ServerStatus) -> None:
        """The --server poller's latest answer (any thread)."""
        self._server_answer = answer

    def note_trace(self, traced: TracedStep | None) -> None:
        """A loaded trace's decode steps (any thread): the observed step where no flag, setting or server gives one."""
        self._traced = traced

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
        """The observed step by the one rule (flag > settings > server > trace > default), and a header line when the
        server could not be read."""
        answer = self._server_answer
        observed = observed_step(
            flag_ms=settings.observed_ms if self.observed_from == "flag" else None,
            settings_ms=settings.observed_ms if self.observed_from == "settings" else None,
            server=answer,
            server_url=self.server_url,
            trace=self._traced,
            now_s=now_s,
        )
        return observed, server_header(answer)

    def context(self, settings: Settings, results: Mapping[str, object], now_s: float) -> BudgetContext:
        """What the one composition of the budget for `settings` reads (the what-if screen predicts from it)."""
        return self._context(settings, results, now_s)[0]

    def _context(
        self, settings: Settings, results: Mapping[str, object], now_s: float
    ) -> tuple[BudgetContext, str, dict[str, float]]:
        """The composition's context, the server's header line and when each probe's result was taken."""
        group = self.group() if self.group is not None else None
        scenario = scenario_for(settings, group, self.flags, self.tp_from)
        good = [r for r in results.values() if isinstance(r, ProbeResult) and r.ok]
        stored = stored_times(good, before_s=self.session_start_s)
        # once this session's ranks said what they run, stored results must match it exactly
        good = self.fingerprints.keep(good, scenario, stored)
        observed, header = self.observed(settings, now_s)
        ctx = BudgetContext(
            scenario,
            tuple(good),
            observed=observed,
            target_tps=settings.target_tps,
            gpu=gpu_hint(seen=self.gpu_name() if self.gpu_name else None, seen_how=self.gpu_how),
            group_kind=group.kind if group is not None else None,
            stored_at_s=stored,
            now_s=now_s,
        )
        return ctx, header, measured_at({r.probe: r for r in good})

    def compose(self, settings: Settings, results: Mapping[str, object], now_s: float) -> BudgetView:
        """The budget for `settings` from the probe results so far (this session's and the history's)."""
        ctx, header, taken = self._context(settings, results, now_s)
        budget = compose(ctx).budget
        view = budget_view(budget, ctx.scenario.title, taken, ctx.scenario.tp_text)
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
