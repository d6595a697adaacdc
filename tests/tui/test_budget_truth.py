"""The live UI's budget tells the truth about where its figures come from, over the real budget source
(`PresetBudget`, the one composition) with fixed telemetry and a fixed clock:

- history from elsewhere never mixes in: a CPU run, or another model's GPU-like run, in the same state dir leaves
  the `--demo` screen exactly as a clean state dir shows it (while the same run does feed its own scenario);
- CPU ranks say so and name no GPU; an unreachable `--server` says the observed step is assumed;
- after `s` then `R`, estimates stay marked as estimates (≈, hatched), never as moves (Δ).

The probe results are a real plan run of Llama-3.1-70B at TP 2 on 2 × H200 (tests/fixtures/budgets).
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from textual.app import App, ComposeResult

from decodetop.collectors.serving import ServerState, ServerStatus
from decodetop.history import KIND_PROBE, History, local_host_id
from decodetop.pipeline.result_history import compact_payload
from decodetop.probes.results import ProbeResult, load_results
from decodetop.settings import Settings
from decodetop.themes import register_themes, theme_variable_defaults
from decodetop.themes.palette import SEGMENT_KEYS, segment_pattern
from decodetop.tui.app import DecodetopApp
from decodetop.tui.model import BudgetView, ProbeView, TelemetryFrame
from decodetop.tui.probe_group import GroupInfo
from decodetop.tui.sources import ProbeOutcome, ProgressCallback, Sources
from decodetop.tui.sources.budget import PresetBudget
from decodetop.tui.sources.probe_views import probe_view
from decodetop.tui.sources.probes import NoProbes
from decodetop.tui.sources.server import ServerPoller
from decodetop.tui.widgets.budget_bar import SHORT_LABELS, UNEXPLAINED_GLYPH, BudgetBar, format_ms

from .conftest import make_app, wait_until
from .fakes import NO_GPU_FRAME, NOW_S, FakeChecks, FakeTelemetry, eight_gpu_frame, fixed_clock, record_results

_GLYPHS = {segment_pattern(key) for key in SEGMENT_KEYS} | {UNEXPLAINED_GLYPH}
"""The legend's glyphs: where one legend entry ends and the next begins."""

PLAN = Path(__file__).resolve().parents[1] / "fixtures" / "budgets" / "plan_llama-3.1-70b-tp2-h200x2.json"
SIZE = (100, 32)
DEMO = GroupInfo(8, "cuda", "fake GPUs", "of the demo")
CPU = GroupInfo(2, "cpu", "CPU ranks")


def _results(device_kind: str = "cuda", gpus: int = 2) -> list[ProbeResult]:
    """The recorded plan run, moved to this host (and to CPU ranks, or to `gpus` H200s)."""
    out = []
    for r in load_results(PLAN):
        assert r.environment is not None
        env = dataclasses.replace(r.environment, host=local_host_id(), world_size=gpus)
        if device_kind == "cpu":
            env = dataclasses.replace(env, device_kind="cpu", backend="gloo", gpu_names=(), driver=None)
        else:
            env = dataclasses.replace(env, gpu_names=("NVIDIA H200",) * gpus)
        out.append(dataclasses.replace(r, environment=env))
    return out


def _sources(
    budget: PresetBudget,
    *,
    history: History | None,
    telemetry: TelemetryFrame,
    probes: Any = None,
    server: Any = None,
) -> Sources:
    return Sources(
        telemetry=FakeTelemetry([telemetry]),
        probes=probes or NoProbes("demo: no probes unless --cpu-ranks is given"),
        budget=budget,
        checks=FakeChecks(),
        history=history,
        clock=fixed_clock,
        run_probes_at_start=False,
        server=server,
    )


def _demo_budget() -> PresetBudget:
    return PresetBudget(lambda: "NVIDIA H200", group=lambda: DEMO, gpu_how="fake NVML of the demo")


def _budget_text(app: DecodetopApp) -> str:
    bar = app.query_one(BudgetBar)
    return "\n".join(line.plain for line in bar._lines(SIZE[0] - 4))


def _settled(app: DecodetopApp, extra: Callable[[], bool] = lambda: True) -> Callable[[], bool]:
    return lambda: app.query_one(BudgetBar).budget is not None and app.budget_settled and extra()


async def _demo_screen(history: History | None, model: str) -> tuple[str, list[str]]:
    """The budget panel's text and the sources of its segments, for the demo on `model`."""
    app = make_app(
        _sources(_demo_budget(), history=history, telemetry=eight_gpu_frame()), Settings(model=model, tp=None)
    )
    async with app.run_test(size=SIZE) as pilot:
        # the history's records taken (its handler asks for the recomposition in the same step), then that one shown
        read = lambda: history is None or bool(app.stored.probes)  # noqa: E731
        await wait_until(pilot, _settled(app, lambda: bool(app.probe_views) and read()), "demo budget after history")
        view = app.query_one(BudgetBar).budget
        assert view is not None
        return _budget_text(app), [s.provenance for s in view.components]


async def test_a_cpu_run_in_the_same_state_dir_leaves_the_demo_as_a_clean_one(tmp_path: Path) -> None:
    history = History(tmp_path / "history.jsonl", clock=fixed_clock)
    record_results(history, _results("cpu"), CPU, "llama-3.1-70b", tp=2)
    # and a record from before fingerprints: origin unknown, never feeds a GPU budget
    history.record(KIND_PROBE, "gemm", compact_payload(_results()[1].to_dict()), recorded_at_s=NOW_S - 60)
    clean, clean_sources = await _demo_screen(None, "llama-3.1-70b")
    dirty, dirty_sources = await _demo_screen(History(tmp_path / "history.jsonl", clock=fixed_clock), "llama-3.1-70b")
    assert dirty == clean and dirty_sources == clean_sources
    assert f"roofline {format_ms(_budget_roofline_ms('llama-3.1-70b', 8))} ms" in clean  # as `decodetop budget`
    assert all("estimate for NVIDIA H200 141GB (fake NVML of the demo)" in p for p in clean_sources)


async def test_another_models_gpu_run_leaves_the_demo_as_a_clean_one(tmp_path: Path) -> None:
    path = tmp_path / "history.jsonl"
    record_results(History(path, clock=fixed_clock), _results("cuda", gpus=8), DEMO, "llama-3.1-70b")
    clean, _ = await _demo_screen(None, "glm-5-nvfp4")
    other, _ = await _demo_screen(History(path, clock=fixed_clock), "glm-5-nvfp4")
    assert other == clean
    # the same run does feed its own scenario (so the comparison above can fail)
    _, own = await _demo_screen(History(path, clock=fixed_clock), "llama-3.1-70b")
    assert any(p.startswith("measured earlier: ") and "(8 × NVIDIA H200)" in p for p in own)


class _BarApp(App[None]):
    """The budget bar alone, showing a view the real app composed (its snapshot does not move with the layout)."""

    def __init__(self, view: BudgetView, theme: str = "decodetop-dark") -> None:
        super().__init__()
        self.view = view
        register_themes(self)
        self.theme = theme

    def get_theme_variable_defaults(self) -> dict[str, str]:
        return theme_variable_defaults()

    def compose(self) -> ComposeResult:
        yield BudgetBar()

    def on_mount(self) -> None:
        bar = self.query_one(BudgetBar)
        bar.now_s = NOW_S
        bar.budget = self.view


async def _view_of(
    app: DecodetopApp,
    until: Callable[[], bool],
    what: str,
    keys: Sequence[tuple[str, Callable[[], bool]]] = (),
) -> BudgetView:
    """Run the real app until its budget settles, then press each key and wait for its condition; its view."""
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, _settled(app, until), what)
        for key, then in keys:
            await pilot.press(key)
            await wait_until(pilot, _settled(app, then), f"{what}: after {key}")
        view = app.query_one(BudgetBar).budget
        assert view is not None
        return view


def _snapshot(snap_compare: Callable[..., bool], view: BudgetView, theme: str = "decodetop-dark") -> None:
    assert snap_compare(_BarApp(view, theme), terminal_size=(SIZE[0], 22))


def _text(view: BudgetView) -> str:
    async def render() -> str:
        app = _BarApp(view)
        async with app.run_test(size=(SIZE[0], 22)) as pilot:
            await pilot.pause()
            return "\n".join(line.plain for line in app.query_one(BudgetBar)._lines(SIZE[0] - 2))

    return asyncio.run(render())


def test_the_clean_demo_budget(snap_compare: Callable[..., bool]) -> None:
    app = make_app(_sources(_demo_budget(), history=None, telemetry=eight_gpu_frame()), Settings(model="llama-3.1-70b"))
    view = asyncio.run(_view_of(app, lambda: True, "demo budget"))
    assert all(seg.estimated for seg in view.components)
    _snapshot(snap_compare, view)


def test_cpu_ranks_say_cpu_and_name_no_gpu(snap_compare: Callable[..., bool], tmp_path: Path) -> None:
    history = History(tmp_path / "history.jsonl", clock=fixed_clock)
    record_results(history, _results("cpu"), CPU, "llama-3.1-70b")
    budget = PresetBudget(lambda: None, group=lambda: CPU)
    app = make_app(_sources(budget, history=history, telemetry=NO_GPU_FRAME), Settings(model="llama-3.1-70b"))
    measured = lambda: any(s.status == "measured" for s in _components(app))  # noqa: E731
    view = asyncio.run(_view_of(app, measured, "CPU budget from the history"))
    _snapshot(snap_compare, view)
    text = _text(view)
    assert text.startswith("CPU ranks (gloo): timings show the method, not a GPU")
    assert "roofline n/a on CPU" in text and "assumed, not observed" in text
    assert "H200" not in text and "RTX" not in text and "NVIDIA" not in text
    assert "TP 2 (default: the 2 CPU ranks of the probe group)" in text


class _Unreachable:
    """A serving engine /metrics source that is never there."""

    url = "http://127.0.0.1:9/metrics"

    def poll(self) -> ServerStatus:
        return ServerStatus(ServerState.UNREACHABLE, f"{self.url}: connection refused", self.url)


def test_an_unreachable_server_says_the_step_is_assumed(snap_compare: Callable[..., bool]) -> None:
    budget = PresetBudget(lambda: "NVIDIA H200", group=lambda: DEMO, server_url=_Unreachable.url)
    poller = ServerPoller(_Unreachable(), period_s=0.05)  # the app hands each answer to the budget
    app = make_app(
        _sources(budget, history=None, telemetry=eight_gpu_frame(), server=poller), Settings(model="glm-5-nvfp4")
    )
    try:
        view = asyncio.run(_view_of(app, lambda: "server" in _header(app), "server header"))
    finally:
        poller.close()
    _snapshot(snap_compare, view)
    text = _text(view)
    assert text.startswith(f"server {_Unreachable.url}: connection refused") and text.count(_Unreachable.url) == 1
    assert "95.0 ms assumed, not observed" in text


class _RecordedProbes:
    """A probe source whose runs hand back the recorded plan run's results (so `R` gives real measurements)."""

    def __init__(self, results: Sequence[ProbeResult]) -> None:
        self.results = {r.probe: r for r in results}

    def plan(self, settings: Settings) -> list[ProbeView]:
        return [ProbeView(probe_id=p, title=p) for p in self.results]

    def run(self, probe_id: str, on_progress: ProgressCallback) -> ProbeOutcome:
        result = self.results[probe_id]
        return ProbeOutcome(view=probe_view(result, title=probe_id), result=result)

    def restore(self, probe_id: str, payload: Mapping[str, Any], measured_at_s: float) -> ProbeOutcome | None:
        return None

    def cancel(self) -> None:
        pass

    def close(self) -> None:
        pass


@pytest.mark.parametrize("theme", ["decodetop-dark", "decodetop-contrast"])
def test_after_s_then_r_estimates_stay_marked_as_estimates(
    snap_compare: Callable[..., bool], tmp_path: Path, theme: str
) -> None:
    """The baseline is all roofline estimates at the datasheet bandwidth; after R the GEMMs are measured and the
    measured copy bandwidth moves the remaining estimates: they keep their ≈ and hatching, and get no Δ."""
    results = [r for r in _results() if r.probe in ("gemm", "launch")]
    budget = PresetBudget(lambda: "NVIDIA H200", group=lambda: GroupInfo(2, "cuda", "GPUs"), session_start_s=0.0)
    history = History(tmp_path / "history.jsonl", clock=fixed_clock)
    app = make_app(
        _sources(budget, history=history, telemetry=eight_gpu_frame(), probes=_RecordedProbes(results)),
        Settings(model="llama-3.1-70b"),
    )

    def idle() -> bool:
        return len(app.probe_views) == 2 and not app.queue and app.running_probe is None

    def measured() -> bool:
        return idle() and any(s.status == "measured" for s in _components(app))

    keys = (("s", lambda: app.baseline is not None), ("R", measured))
    view = asyncio.run(_view_of(app, idle, "plan and budget", keys=keys))
    assert app.baseline is not None
    estimated = [seg for seg in view.components if seg.estimated]
    assert estimated and any(seg.status == "measured" for seg in view.components)
    # the diff did flag estimates that moved with the measured bandwidth: the bar must not show them as moves
    assert {m.key for m in view.moved} & {seg.key for seg in estimated}
    _snapshot(snap_compare, view, theme)
    text = _text(view)
    for seg in estimated:
        label = seg.label if seg.label in text else SHORT_LABELS[seg.key]
        entry = next(line for line in text.splitlines() if label in line and "ms" in line)
        rest = entry[entry.index(label) :]
        part = rest[: next((i for i, ch in enumerate(rest) if ch in _GLYPHS), len(rest))]  # up to the next entry
        assert "≈" in part and "Δ" not in part, entry
    zoom = [line for line in text.splitlines() if line.lstrip().startswith("0–")][1]
    assert "·" in zoom  # hatched


def _components(app: DecodetopApp) -> tuple[Any, ...]:
    view = app.query_one(BudgetBar).budget
    return view.components if view is not None else ()


def _header(app: DecodetopApp) -> str:
    view = app.query_one(BudgetBar).budget
    return view.header if view is not None else ""


def _budget_roofline_ms(model: str, tp: int) -> float:
    """`decodetop budget --model M --tp N --gpu h200 --json`'s roofline."""
    import contextlib
    import io
    import json

    from decodetop.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["budget", "--model", model, "--tp", str(tp), "--gpu", "h200", "--json"]) == 0
    return float(json.loads(out.getvalue())["roofline"]["step_ms"])


def test_a_live_server_step_says_where_and_when_it_was_observed() -> None:
    from decodetop.collectors.serving import ServerStep

    budget = PresetBudget(lambda: "NVIDIA H200", group=lambda: DEMO, server_url=_Unreachable.url)
    step = ServerStep(
        step_ms=21.5,
        itl_ms=21.5,
        source="sglang",
        metric="sglang:inter_token_latency_seconds",
        samples=400,
        window_s=30.0,
        accept_length=1.0,
        accept_length_from="none",
        url=_Unreachable.url,
        taken_unix_s=NOW_S - 4,
    )
    budget.note_server(step)
    observed, header = budget.observed(Settings(model="glm-5-nvfp4", observed_ms=21.5), NOW_S)
    assert (observed.source, observed.assumed, header) == ("server", False, "")
    assert observed.text == f"21.5 ms observed by the server {_Unreachable.url}, 30 s window, 4s ago"
    # a window read this very second reads "just now", never "now ago"
    fresh, _ = budget.observed(Settings(model="glm-5-nvfp4", observed_ms=21.5), NOW_S - 4)
    assert fresh.text.endswith("30 s window, just now") and "now ago" not in fresh.text
    # the server goes away: its last figure stays, said as such, and the header says the step is not live
    budget.note_server(ServerStatus(ServerState.UNREACHABLE, "connection refused", _Unreachable.url, last_step=step))
    observed, header = budget.observed(Settings(model="glm-5-nvfp4", observed_ms=21.5), NOW_S + 60)
    assert observed.source == "server" and "now: connection refused" in observed.text
    assert header == f"server {_Unreachable.url}: connection refused — the observed step is not live"
    # nothing observed and no flag: the default, assumed
    fresh = PresetBudget(lambda: None, server_url=_Unreachable.url)
    observed, _ = fresh.observed(Settings(model="glm-5-nvfp4"), NOW_S)
    assert observed.assumed and "waiting for the server's first window" in observed.text
