"""The live UI over the real budget source (`PresetBudget`, the one composition) with recorded plan results in the
history, for the what-if screen's Pilot and snapshot tests and its knob-change benchmark: a real plan run of
Llama-3.1-70B at TP 2 (on 2 × H200, tests/fixtures/budgets, or on 2 CPU ranks, benchmarks/results/plans) moved
to this host, stored with the fingerprint its session would give it, so the app reads it back as a user's would."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from decodetop.history import History, local_host_id
from decodetop.pipeline.scenario_flags import ScenarioFlags
from decodetop.probes.results import ProbeResult, load_results
from decodetop.settings import Settings
from decodetop.tui.app import DecodetopApp
from decodetop.tui.probe_group import GroupInfo
from decodetop.tui.sources import ProbeOutcome, ProgressCallback, Sources
from decodetop.tui.sources.budget import PresetBudget
from decodetop.tui.sources.probes import NoProbes

from .conftest import make_app
from .fakes import NOW_S, FakeChecks, FakeTelemetry, eight_gpu_frame, fixed_clock, record_results

ROOT = Path(__file__).resolve().parents[2]
GPU_PLAN = ROOT / "tests" / "fixtures" / "budgets" / "plan_llama-3.1-70b-tp2-h200x2.json"
CPU_PLAN = ROOT / "benchmarks" / "results" / "plans" / "plan_llama-3.1-70b-tp2-cpu2.json"
MODEL = "llama-3.1-70b"
GPUS = GroupInfo(2, "cuda", "GPUs", "of the probe group")
CPUS = GroupInfo(2, "cpu", "CPU ranks", "of the probe group")


class CountingProbes(NoProbes):
    """The registry's plan, shown idle, with stored results restored as the real source does; every run asked of
    it is counted (the what-if screen must ask none)."""

    def __init__(self) -> None:
        super().__init__("tests: no probe runs")
        self.runs: list[str] = []

    def run(self, probe_id: str, on_progress: ProgressCallback) -> ProbeOutcome:
        self.runs.append(probe_id)
        return super().run(probe_id, on_progress)


def plan_results(path: Path, group: GroupInfo) -> list[ProbeResult]:
    """The recorded plan run, moved to this host (its device kind and size as `group`'s)."""
    out = []
    for r in load_results(path):
        assert r.environment is not None
        env = dataclasses.replace(r.environment, host=local_host_id(), world_size=group.size)
        if group.kind == "cpu":
            env = dataclasses.replace(env, device_kind="cpu", backend="gloo", gpu_names=(), driver=None)
        else:
            env = dataclasses.replace(env, device_kind="cuda", gpu_names=("NVIDIA H200",) * group.size)
        out.append(dataclasses.replace(r, environment=env))
    return out


def whatif_app(
    state_dir: Path,
    *,
    group: GroupInfo = GPUS,
    plan: Path | None = GPU_PLAN,
    flags: ScenarioFlags | None = None,
    probes: CountingProbes | None = None,
    model: str = MODEL,
    observed_ms: float | None = None,
) -> DecodetopApp:
    """The app over `PresetBudget` on `group` for `model` at TP 2, with `plan`'s results stored (None: no results
    at all); `observed_ms`: the step observed by the engine, as `--observed-ms` gives it."""
    flags = flags or ScenarioFlags()
    history = History(state_dir / "history.jsonl", clock=fixed_clock)
    if plan is not None:
        record_results(history, plan_results(plan, group), group, model, tp=2, flags=flags)
    gpu = "NVIDIA H200" if group.kind == "cuda" else None
    observed_from = "flag" if observed_ms is not None else "default"
    budget = PresetBudget(
        lambda: gpu, group=lambda: group, flags=flags, session_start_s=NOW_S, observed_from=observed_from
    )
    sources = Sources(
        telemetry=FakeTelemetry([eight_gpu_frame()] if gpu else []),
        probes=probes or CountingProbes(),
        budget=budget,
        checks=FakeChecks(),
        history=history,
        clock=fixed_clock,
        run_probes_at_start=False,
    )
    settings = Settings(model=model, tp=2)
    if observed_ms is not None:
        settings = dataclasses.replace(settings, observed_ms=observed_ms)
    return make_app(sources, settings)
