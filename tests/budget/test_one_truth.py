"""One truth on every surface: the same probe results give the same component figures and provenance in
`decodetop budget --json`, `decodetop probe --budget --json`, `decodetop trace --json` (its budget, its comparison
and its traced bar), the live UI's budget model and the exporter's `decodetop_budget_*` series; the UI's roofline and
verdict are `decodetop budget`'s for the same scenario and GPU.

The results are a real plan run of Llama-3.1-70B at TP 2 on 2 × H200 (tests/fixtures/budgets). `probe` runs them
through its real command path with the probe group replaced by one that hands back the recorded results; `trace`
reads a synthetic profiler trace (tests/helpers/synth.py) through its real command path.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from decodetop.budget.scenario import build_scenario, choose_tp, model_source
from decodetop.cli import main
from decodetop.probes.controller import GroupLayout
from decodetop.probes.results import ProbeResult, load_results
from tests.helpers.synth import SynthSpec, write_synthetic_trace

PLAN = Path(__file__).resolve().parents[1] / "fixtures" / "budgets" / "plan_llama-3.1-70b-tp2-h200x2.json"
MODEL = "llama-3.1-70b"


@pytest.fixture(scope="module")
def results() -> tuple[ProbeResult, ...]:
    return tuple(load_results(PLAN))


class _RecordedGroup:
    """A probe group of 2 GPUs that answers each probe with the recorded result (the command path is real)."""

    recorded: Mapping[str, ProbeResult] = {}

    def __init__(self, **_: object) -> None:
        self.layout = GroupLayout("cuda", 2)
        self.world_size = 2

    def __enter__(self) -> _RecordedGroup:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def run(
        self,
        probe: str,
        params: Mapping[str, Any] | None = None,
        *,
        timeout_s: float | None = None,
        on_progress: Callable[[Any], None] | None = None,
    ) -> ProbeResult:
        return self.recorded[probe]

    def rank_pids(self) -> list[int]:
        return []


@pytest.fixture
def recorded_group(results: Sequence[ProbeResult], monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    import decodetop.probes.controller as controller
    import decodetop.probes.gpuinfo as gpuinfo

    monkeypatch.setattr(_RecordedGroup, "recorded", {r.probe: r for r in results})
    monkeypatch.setattr(controller, "ProbeController", _RecordedGroup)
    monkeypatch.setattr(controller, "resolve_layout", lambda *a, **k: GroupLayout("cuda", 2))
    monkeypatch.setattr(gpuinfo, "compute_processes", lambda *a, **k: [])
    yield


def _segments(doc: Mapping[str, Any]) -> dict[str, tuple[float, str, str, str]]:
    return {s["component"]: (s["ms"], s["status"], s["provenance_kind"], s["provenance"]) for s in doc["segments"]}


def _budget_json(capsys: pytest.CaptureFixture[str], *extra: str) -> dict[str, Any]:
    assert main(["budget", "--model", MODEL, "--json", *extra]) == 0
    return dict(json.loads(capsys.readouterr().out))


def _tui_segments(results: Sequence[ProbeResult], *, session_start_s: float) -> dict[str, tuple[float, str, str]]:
    from decodetop.settings import Settings
    from decodetop.tui.probe_group import GroupInfo
    from decodetop.tui.sources.budget import PresetBudget

    source = PresetBudget(
        lambda: "NVIDIA H200", group=lambda: GroupInfo(2, "cuda", "GPUs"), session_start_s=session_start_s
    )
    view = source.compose(Settings(model=MODEL), {r.probe: r for r in results}, time.time())
    assert view.title == "Llama-3.1-70B · TP2"
    return {s.key: (s.ms, s.status, s.provenance) for s in view.components}


def _exporter_segments(results: Sequence[ProbeResult]) -> dict[str, tuple[float, str, str]]:
    from decodetop.export.prometheus import ExportState, render_exposition
    from decodetop.export.schedule import BudgetComposer

    scenario = build_scenario(model_source(MODEL, None), choose_tp(None, group_size=2, group_label="GPUs"))
    budget = BudgetComposer(scenario, 309.0, group_kind="cuda")(results, None, None)
    text = render_exposition(ExportState(budget=budget), parts=("budget",))
    out = {}
    for labels, value in re.findall(r"^decodetop_budget_segment_seconds\{([^}]*)\} (\S+)$", text, re.MULTILINE):
        label = dict(re.findall(r'(\w+)="([^"]*)"', labels))
        if label["component"] != "unexplained":
            out[label["component"]] = (float(value) * 1e3, label["status"], label["provenance"])
    return out


def _trace_json(capsys: pytest.CaptureFixture[str], trace: Path, *extra: str) -> dict[str, Any]:
    assert main(["trace", str(trace), "--model", MODEL, "--json", *extra]) == 0
    return dict(json.loads(capsys.readouterr().out))


AGE = re.compile(r"\d+[smhd] ago")
"""The age in a 'measured earlier' provenance: two commands a second apart may say 3s and 4s."""


NCCL_AS_MEASURED = "; all-reduce: NCCL as measured (these results hold no custom all-reduce points)"
"""What the all-reduce row adds to its provenance for results holding NCCL points only (a recording from before the
probe timed the engines' P2P kernels)."""


def test_the_same_results_give_the_same_figures_and_provenance_on_all_five_surfaces(
    results: tuple[ProbeResult, ...],
    recorded_group: None,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    # fresh: probe --budget runs them, the UI and the exporter got them in this session
    assert main(["probe", "--model", MODEL, "--budget", "--json", "-"]) == 0
    probe = _segments(json.loads(capsys.readouterr().out)["budget"])
    tui_now = _tui_segments(results, session_start_s=0.0)
    exporter = _exporter_segments(results)
    # stored: budget --results reads them from a file, the UI from its history
    budget_doc = _budget_json(capsys, "--results", str(PLAN))
    stored = _segments(budget_doc["budget"])
    tui_earlier = _tui_segments(results, session_start_s=time.time())
    write_synthetic_trace(tmp_path / "step.trace.json", 0, SynthSpec(allreduce=True))
    trace_doc = _trace_json(capsys, tmp_path / "step.trace.json", "--results", str(PLAN))
    traced = _segments(trace_doc["budget"])

    components = ["attention", "attention_proj", "dense_mlp", "communication", "norms", "lm_head", "launch"]
    assert list(probe) == components  # a dense Llama: no experts, no routing
    for key in components:
        ms, status, kind, text = probe[key]
        path = NCCL_AS_MEASURED if key == "communication" else ""  # the engine's all-reduce path, said on the row
        assert status == "measured" and kind == "measured_now" and text == "measured in this run" + path
        assert tui_now[key] == (ms, status, text)
        assert exporter[key][0] == pytest.approx(ms, rel=1e-12) and exporter[key][1:] == (status, kind)
        assert stored[key][:2] == (ms, status)
        assert stored[key][2] == "measured_earlier"
        assert re.fullmatch(
            r"measured earlier: \d+[smhd] ago on vm \(2 × NVIDIA H200\)", stored[key][3].removesuffix(path)
        )
        assert stored[key][3].endswith(path)
        assert tui_earlier[key] == (ms, status, stored[key][3])
        assert traced[key][:3] == stored[key][:3] and AGE.sub("N ago", traced[key][3]) == AGE.sub(
            "N ago", stored[key][3]
        )
    assert set(tui_now) == set(exporter) == set(stored) == set(traced) == set(components)
    # the trace compares with and draws those same figures; its decode steps are the observed step
    assert {r["key"]: r["probed_ms"] for r in trace_doc["comparison"]["rows"] if r["key"] in components} == {
        key: probe[key][0] for key in components
    }
    assert {s["key"]: s["probed_ms"] for s in trace_doc["traced"]["segments"] if s["key"] in components} == {
        key: probe[key][0] for key in components
    }
    assert trace_doc["budget"]["observed"]["source"] == "trace" and not trace_doc["budget"]["observed"]["assumed"]
    assert trace_doc["budget_source"].endswith(f"7 of 7 components measured, from {PLAN}")
    assert budget_doc["deployment"]["tp_source"] == "default: the 2 GPUs the results ran on"
    assert budget_doc["budget"]["summary"] == "7 of 7 components measured"
    assert budget_doc["budget"]["observed"]["assumed"] is True


def test_the_ui_roofline_and_verdict_are_the_budget_commands_for_the_same_scenario_and_gpu(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from decodetop.settings import Settings
    from decodetop.tui.sources.budget import PresetBudget

    doc = _budget_json(capsys, "--tp", "2", "--gpu", "h200")
    view = PresetBudget(lambda: "NVIDIA H200").compose(Settings(model=MODEL, tp=2), {}, time.time())
    assert view.roofline_ms == pytest.approx(doc["roofline"]["step_ms"], rel=1e-12)
    assert view.verdict == doc["budget"]["verdict"]
    assert view.verdict.startswith("the target is below this deployment's roofline (")
    assert [(s.key, s.ms, s.status) for s in view.components] == [
        (s["component"], s["ms"], s["status"]) for s in doc["budget"]["segments"]
    ]
    assert main(["budget", "--model", MODEL, "--tp", "2", "--gpu", "h200"]) == 0
    assert view.verdict in capsys.readouterr().out.replace("\n  ", " ")


def test_cpu_results_are_labelled_cpu_with_no_roofline_and_no_gpu_name(
    results: tuple[ProbeResult, ...], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Results of CPU ranks: the header says CPU, the roofline is n/a on CPU, no estimate names a GPU."""
    import dataclasses

    from decodetop.probes.results import results_to_json

    cpu = []
    for r in results:
        assert r.environment is not None
        env = dataclasses.replace(r.environment, device_kind="cpu", backend="gloo", gpu_names=(), driver=None)
        cpu.append(dataclasses.replace(r, environment=env))
    path = tmp_path / "cpu.json"
    path.write_text(results_to_json(cpu))
    doc = _budget_json(capsys, "--results", str(path), "--gpu", "h200")
    budget = doc["budget"]
    assert budget["header"] == "CPU ranks (gloo): timings show the method, not a GPU"
    assert doc["roofline"] is None and budget["roofline_ms"] is None and budget["hardware"] == "n/a on CPU"
    assert "H200" not in json.dumps(budget)
    assert {s["status"] for s in budget["segments"]} <= {"measured", "interpolated", "missing"}
    assert main(["budget", "--model", MODEL, "--results", str(path)]) == 0
    text = capsys.readouterr().out
    assert "CPU ranks (gloo): timings show the method, not a GPU" in text and "Roofline: n/a on CPU" in text


def test_stored_records_feed_only_a_matching_setup(results: tuple[ProbeResult, ...]) -> None:
    """Origin unknown never feeds; before the ranks ran, the known fields must match; after, all of them."""
    import dataclasses

    from decodetop.pipeline.fingerprints import expected_fingerprint, fingerprint_accepts, fingerprint_of

    scenario = build_scenario(model_source(MODEL, None), choose_tp(2))
    env = results[0].environment
    assert env is not None
    stored = fingerprint_of(env, scenario)
    assert (stored.device_kind, stored.gpu_name, stored.gpu_count) == ("cuda", "NVIDIA H200", 2)
    expected = dataclasses.replace(expected_fingerprint(scenario, device_kind="cuda", gpu_count=2), host_id="vm")
    assert fingerprint_accepts(stored, expected, exact=False)  # GPU name and versions not known yet
    assert fingerprint_accepts(stored, dataclasses.replace(expected, gpu_name="NVIDIA H200"), exact=False)
    assert not fingerprint_accepts(None, expected, exact=False)
    for change in ({"gpu_name": "NVIDIA H100"}, {"gpu_count": 8}, {"device_kind": "cpu"}, {"host_id": "other"}):
        assert not fingerprint_accepts(stored, dataclasses.replace(expected, **change), exact=False), change
    other = build_scenario(model_source(MODEL, None), choose_tp(2), batch=2)
    assert not fingerprint_accepts(stored, dataclasses.replace(expected, scenario=other.fingerprint_id), exact=False)
    assert fingerprint_accepts(stored, stored, exact=True)
    assert not fingerprint_accepts(stored, dataclasses.replace(stored, torch_version="2.12.0"), exact=True)
