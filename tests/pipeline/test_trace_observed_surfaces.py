"""A loaded trace is the observation where nothing above it in the rule gives one (no --observed-ms, no settings
value, no --server): on `decodetop trace` (text and JSON), the exporter's /metrics and the live UI, the observed step
is the trace's mean decode step with its provenance (the file, how many steps and their spread), and the unexplained
remainder is traced − composed, each surface over its own composition of the model (`decodetop.pipeline.observed`).

The trace is the recorded 4-layer Llama on an H200 with a planted cast (tests/fixtures/traces), compared with the
same 4-layer Llama as a config."""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from decodetop.cli import main
from decodetop.pipeline.observed import traced_step
from decodetop.settings import Settings
from decodetop.traces.ranks import analyze_path
from decodetop.tui.sources import Sources
from decodetop.tui.sources.budget import PresetBudget
from decodetop.tui.sources.probes import NoProbes
from decodetop.tui.trace_source import TraceOptions
from decodetop.tui.widgets.budget_bar import BudgetBar
from decodetop.tui.widgets.traced_bar import TracedBar
from tests.commands.test_exporter import _EXPORTER, _env, _free_port, _scrape_when
from tests.traces.conftest import fixture
from tests.traces.test_mismatch import LLAMA_4L
from tests.tui.conftest import make_app, wait_until
from tests.tui.fakes import FakeChecks, FakeTelemetry, eight_gpu_frame, fixed_clock

PLANTED = fixture("h200_graph_planted")


@pytest.fixture(scope="module")
def step_ms() -> float:
    """The trace's mean decode step, as the rule reads it."""
    traced = traced_step(analyze_path(PLANTED))
    assert traced is not None and traced.steps == 4
    return traced.step_ms


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "llama-4l" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(LLAMA_4L))
    return path


def test_trace_command_text_and_json(config: Path, step_ms: float, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["trace", str(PLANTED), "--config", str(config), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    observed = data["observed"]
    assert observed["source"] == "trace" and not observed["assumed"]
    assert observed["ms"] == pytest.approx(step_ms)
    assert observed["detail"].startswith(f"{PLANTED}, 4 decode steps (1.60–1.60 ms), written ")
    traced = data["traced"]
    assert traced["observed_is_trace"] and traced["observed_ms"] == pytest.approx(step_ms)
    composed = sum(r["probed_ms"] for r in data["comparison"]["rows"] if r["probed_ms"] is not None)
    assert traced["explained_ms"] == pytest.approx(composed)
    assert traced["unexplained_ms"] == pytest.approx(step_ms - composed)
    rest = step_ms - composed
    assert (
        traced["header"]
        == f"traced step 1.6 ms, the observed step · unexplained {rest:.3g} ms of 1.6 ms ({rest / step_ms:.0%})"
    )

    assert main(["trace", str(PLANTED), "--config", str(config)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert f"observed {observed['text']}" in lines  # under the trace's own step line
    assert lines[3].startswith(f"observed 1.60 ms observed in the trace {PLANTED}, 4 decode steps (1.60–1.60 ms)")
    assert f"traced bar: {traced['header']}" in lines
    assert not any("assumed" in line or "95 ms" in line for line in lines)


def test_exporter_metrics(tmp_path: Path, config: Path, step_ms: float) -> None:
    """`decodetop exporter --config … --trace FILE` (the demo's H200, no probes): the observed line's source is the
    trace, its value the traced step, and the unexplained series traced − the sum of the components."""
    port = _free_port()
    argv = [*_EXPORTER, "--no-probes", "--no-checks", "--demo", "--listen", f"127.0.0.1:{port}"]
    proc = subprocess.Popen(
        [*argv, "--config", str(config), "--trace", str(PLANTED)],
        env=_env(tmp_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        page = _scrape_when(
            proc,
            f"http://127.0.0.1:{port}/metrics",
            lambda page: "decodetop_budget_step_seconds" in page,
            "the budget over the trace's step",
        )
        series = [s for f in text_string_to_metric_families(page) for s in f.samples]
        lines = {s.labels["line"]: s for s in series if s.name == "decodetop_budget_step_seconds"}
        assert lines["observed"].labels["source"] == "trace"
        assert lines["observed"].value == pytest.approx(step_ms / 1000)
        (rest,) = [
            s for s in series if s.name == "decodetop_budget_segment_seconds" and s.labels["component"] == "unexplained"
        ]
        assert rest.labels["provenance"] == "observed"
        assert rest.value == pytest.approx((step_ms - lines["sum"].value * 1000) / 1000)
        assert 0 < rest.value < step_ms / 1000
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=20)
        assert proc.returncode == 0, err
        assert f"trace: {PLANTED}, 4 decode steps (1.60–1.60 ms), written " in err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


async def test_live_ui_header_and_traced_bar(config: Path, step_ms: float) -> None:
    """The live UI over the real budget source (`PresetBudget`, the one composition) with --trace and the default
    observed step: the budget's observed step becomes the trace's, said so on the bar and in the details; the
    traced bar's header calls it the observed step with the remainder traced − composed."""
    budget = PresetBudget(lambda: "NVIDIA H200", gpu_how="fake NVML")
    sources = Sources(
        telemetry=FakeTelemetry([eight_gpu_frame()]),
        probes=NoProbes("no probes in this test"),
        budget=budget,
        checks=FakeChecks(),
        history=None,
        clock=fixed_clock,
        run_probes_at_start=False,
        trace=TraceOptions(path=PLANTED),
    )
    app = make_app(sources, Settings(config=str(config), tp=1))
    async with app.run_test(size=(160, 48)) as pilot:

        def settled() -> bool:
            view = app.query_one(BudgetBar).budget
            return view is not None and view.observed_source == "trace" and app.query_one(TracedBar).view is not None

        await wait_until(pilot, settled, "the budget over the trace's step")
        view = app.query_one(BudgetBar).budget
        assert view is not None and not view.observed_assumed
        assert view.observed_ms == pytest.approx(step_ms)
        assert view.observed_text.startswith(f"1.60 ms observed in the trace {PLANTED}, 4 decode steps (1.60–1.60 ms)")
        assert 0 < view.unexplained_ms == pytest.approx(step_ms - view.explained_ms)
        bar = "\n".join(line.plain for line in app.query_one(BudgetBar)._lines(156))
        assert "observed 1.60 ms in the trace · target" in bar and "assumed" not in bar
        traced = app.query_one(TracedBar).view
        assert traced is not None and traced.observed_is_trace
        assert traced.observed_ms == pytest.approx(step_ms)
        assert traced.explained_ms == pytest.approx(view.explained_ms) and traced.mismatch == ""
        assert traced.unexplained_ms == pytest.approx(view.unexplained_ms)
        assert (
            app.query_one(TracedBar)
            .render()
            .plain.splitlines()[0]
            .startswith("traced step 1.6 ms, the observed step · ")
        )
