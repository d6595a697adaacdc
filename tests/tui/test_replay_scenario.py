"""A recording keeps the scenario it was made under, and a replay restores it: a `--demo` session (TP 8, the demo's
eight fake GPUs) replays as TP 8 with the same budget, not as TP 1 on a host with no probe group. Flags given to the
replay win; a recording whose scenario does not read says so and shows the settings' scenario."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from decodetop.export.recording import Recorder
from decodetop.pipeline.scenario_flags import ScenarioFlags
from decodetop.probes.results import load_results
from decodetop.settings import Settings
from decodetop.tui.launch import LaunchOptions, build_sources

H200_RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "primitives" / "h200x1.json"
NOW_S = 1_796_000_000.0


def _demo_recording(path: Path, settings: Settings, flags: ScenarioFlags) -> str:
    """A --demo --record session: its sources built as `decodetop --demo --record` builds them, one probe result
    recorded; returns the budget's TP line as the live session shows it."""
    sources = build_sources(
        settings, LaunchOptions(demo=True, record=path, flags=flags, history_path=path.with_suffix(".history"))
    )
    try:
        assert sources.taps is not None
        for result in load_results(H200_RESULTS):
            sources.taps.on_probe_result(result)
        return sources.budget.compose(settings, {}, NOW_S).note.splitlines()[0]
    finally:
        sources.telemetry.close()
        sources.taps.close()


def test_a_demo_recording_replays_with_its_scenario(tmp_path: Path) -> None:
    path = tmp_path / "demo.jsonl"
    live = _demo_recording(path, Settings(model="llama-3.1-70b"), ScenarioFlags(batch=4, kv_dtype="fp8"))
    assert live.startswith("TP 8 (default: the 8 fake GPUs of the demo)")
    meta = json.loads(gzip.decompress(path.read_bytes()).splitlines()[0])["data"]
    assert meta["scenario"] == {
        "model": {"kind": "preset", "value": "llama-3.1-70b"},
        "tp": 8,
        "flags": {"batch": 4, "kv_dtype": "fp8"},
    }
    replay = build_sources(Settings(), LaunchOptions(replay=path))  # the settings file says glm-5-nvfp4, TP auto
    assert replay.settings is not None
    assert (replay.settings.model, replay.settings.tp) == ("llama-3.1-70b", 8)
    view = replay.budget.compose(replay.settings, {}, NOW_S)
    assert view.title == "Llama-3.1-70B · TP8"
    assert view.note.splitlines()[0].startswith("TP 8 (the recording)")
    flags = replay.budget.flags  # type: ignore[attr-defined]
    assert (flags.batch, flags.kv_dtype) == (4, "fp8")


def test_flags_given_to_a_replay_win(tmp_path: Path) -> None:
    path = tmp_path / "demo.jsonl"
    _demo_recording(path, Settings(model="llama-3.1-70b"), ScenarioFlags())
    replay = build_sources(Settings(tp=2), LaunchOptions(replay=path, flags=ScenarioFlags(tp=2, batch=2)))
    assert replay.settings is not None and (replay.settings.model, replay.settings.tp) == ("llama-3.1-70b", 2)
    assert replay.budget.compose(replay.settings, {}, NOW_S).note.splitlines()[0].startswith("TP 2 (--tp")


def test_a_recorded_scenario_that_does_not_read_is_said(tmp_path: Path) -> None:
    path = tmp_path / "odd.jsonl"
    with Recorder(path, meta={"scenario": {"model": {"kind": "shell", "value": "rm -rf /"}, "tp": 8}}):
        pass
    replay = build_sources(Settings(model="glm-5"), LaunchOptions(replay=path))
    assert any("the recorded model is not a preset name or a config path" in note for note in replay.notes)
    assert replay.settings is not None and replay.settings.model == "glm-5"
