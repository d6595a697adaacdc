"""The engine's all-reduce in the budget: `--allreduce {auto,nccl,custom}` on every command that composes a budget,
carried by the scenario (and its fingerprint), and the all-reduce row saying which path it assumed and why on every
surface (the CLI table, the JSON, the live UI's budget, the exporter) — custom under auto where the engines run it,
NCCL under --allreduce nccl, and NCCL with the reason where the custom kernels cannot run (CPU ranks, P2P off)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from decodetop.budget.compose import Budget, default_observed
from decodetop.budget.scenario import Scenario, build_scenario, choose_tp, model_source
from decodetop.budget.segment import Segment
from decodetop.budget.text import format_budget_table
from decodetop.cli import build_parser, main
from decodetop.commands._scenario_args import scenario_from_args
from decodetop.pipeline.composition import compose
from decodetop.pipeline.context import BudgetContext
from decodetop.pipeline.scenario_flags import ScenarioFlags
from decodetop.probes.results import (
    RESULTS_FORMAT_VERSION,
    Environment,
    Measurement,
    MeasurementStatus,
    ProbeResult,
    ProbeStatus,
)

MODEL = "llama-3.1-70b"
"""At TP 2 its decode step all-reduces 16 KiB messages (8192 BF16 activations), 161 of them."""
STEP_BYTES = 16384
# Synthetic graph-mode medians (µs), shaped like a 2 × H200 sweep: the P2P one-shot kernel is faster than NCCL at
# decode sizes and slower at 16 MiB.
NCCL_US = {8: 11.1, 16384: 12.2, 131072: 12.9, 1048576: 19.1, 16777216: 77.6}
ONE_SHOT_US = {8: 6.2, 16384: 6.6, 131072: 7.4, 1048576: 13.1, 16777216: 97.1}
NVLINK_PAIR = "\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \tNV18\t0-31\nGPU1\tNV18\t X \t0-31\n"
AUTO_TEXT = "NCCL ≤ 8 B, custom one-shot ≤ 1 MiB, NCCL above (vLLM at TP 2 over NVLink: custom all-reduce below 8 MiB)"
CPU_WHY = "torch symmetric memory needs CUDA GPUs; these are gloo CPU ranks"
P2P_WHY = "NCCL_P2P_DISABLE=1 is set: this host declares GPU P2P off"


def _point(us: float, size: int, impl: str, mode: str = "graph") -> Measurement:
    params: dict[str, object] = {"size_bytes": size, "mode": mode, "world_size": 2, "impl": impl}
    if impl not in ("nccl", "gloo"):
        params["compute_capability"] = "9.0"
    return Measurement(f"allreduce {impl} {size} {mode}", params, "us", metrics={"time_us": us})


def _unsupported(impl: str, why: str) -> Measurement:
    params = {"impl": impl, "mode": "graph", "world_size": 2}
    return Measurement(f"allreduce {impl} (custom)", params, "us", status=MeasurementStatus.UNSUPPORTED, note=why)


def _allreduce(*measurements: Measurement, kind: str = "cuda") -> ProbeResult:
    cuda = kind == "cuda"
    env = Environment(
        host="vm",
        time_utc="2026-12-01T10:00:00Z",
        python="3.12",
        backend="nccl" if cuda else "gloo",
        device_kind=kind,
        world_size=2,
        gpu_names=("NVIDIA H200",) * 2 if cuda else (),
        topology=NVLINK_PAIR if cuda else None,
    )
    return ProbeResult(
        "allreduce", ProbeStatus.OK, {}, tuple(measurements), environment=env, world_size=2, started_utc=env.time_utc
    )


def with_custom() -> ProbeResult:
    """NCCL and the one-shot kernel, both measured on two NVLink-connected H200s."""
    nccl = [_point(us, size, "nccl") for size, us in NCCL_US.items()]
    return _allreduce(*nccl, *(_point(us, size, "one_shot") for size, us in ONE_SHOT_US.items()))


def _scenario(allreduce: str = "auto") -> Scenario:
    return build_scenario(model_source(MODEL, None), choose_tp(2), allreduce=allreduce)


def _budget(results: list[ProbeResult], allreduce: str = "auto") -> Budget:
    return compose(BudgetContext(_scenario(allreduce), tuple(results), observed=default_observed(), now_s=0.0)).budget


def _row(budget: Budget) -> Segment:
    seg = budget.segment("communication")
    assert seg is not None
    return seg


# --- the flag -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        ["--allreduce", "nccl"],
        ["budget", "--allreduce", "nccl"],
        ["probe", "--allreduce", "nccl"],
        ["exporter", "--allreduce", "nccl"],
    ],
)
def test_every_command_that_composes_a_budget_takes_the_flag(argv: list[str]) -> None:
    assert build_parser().parse_args(argv).allreduce == "nccl"


@pytest.mark.parametrize("command", [[], ["budget"], ["probe"], ["exporter"]])
def test_a_choice_outside_the_three_is_refused(command: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args([*command, "--allreduce", "fast"])
    assert exc.value.code == 2
    assert "--allreduce: invalid choice: 'fast'" in capsys.readouterr().err


def test_budget_keeps_allreduce_us_apart_from_allreduce() -> None:
    args = build_parser().parse_args(["budget", "--allreduce", "custom", "--allreduce-us", "9"])
    assert (args.allreduce, args.allreduce_us) == ("custom", 9.0)
    assert build_parser().parse_args(["budget"]).allreduce is None  # unset: the scenario's default, auto


def test_the_scenario_carries_the_choice_and_its_id_changes_with_it() -> None:
    args = build_parser().parse_args(["budget", "--model", MODEL, "--tp", "2", "--allreduce", "nccl"])
    scenario = scenario_from_args(args, None)
    assert scenario.allreduce == "nccl"
    ids = {choice: _scenario(choice).fingerprint_id for choice in ("auto", "nccl", "custom")}
    assert len(set(ids.values())) == 3
    assert ids["nccl"] == scenario.fingerprint_id and ids["nccl"].endswith(";allreduce=nccl")
    assert "allreduce" not in ids["auto"]  # records stored before the choice existed (all auto) keep matching
    assert "all-reduce nccl" in scenario.describe()
    assert "all-reduce" not in _scenario().describe()


def test_a_bad_choice_from_code_is_one_line_naming_the_flag() -> None:
    from decodetop.errors import UserInputError

    with pytest.raises(UserInputError, match="--allreduce: 'fast' is not one of auto, nccl, custom"):
        _scenario("fast")
    assert scenario_from_args(argparse.Namespace(model=MODEL, tp=2), None).allreduce == "auto"


# --- the row ------------------------------------------------------------------------------------------------------


def test_auto_takes_the_custom_kernel_and_says_why() -> None:
    row = _row(_budget([with_custom()]))
    assert row.path == "custom one-shot"  # the step's 16 KiB all-reduces
    assert row.path_text == AUTO_TEXT
    assert row.path_rule.startswith("https://github.com/vllm-project/vllm/")
    assert row.provenance.endswith(f"; all-reduce: {AUTO_TEXT}")  # after what the figure is (measured, estimated)


def test_nccl_takes_nccl_and_costs_more_at_decode_sizes() -> None:
    auto, nccl = _row(_budget([with_custom()])), _row(_budget([with_custom()], "nccl"))
    assert nccl.path == "NCCL"
    assert nccl.path_text == "NCCL assumed: --allreduce nccl"
    assert nccl.path_rule == "--allreduce nccl"
    assert auto.ms is not None and nccl.ms is not None
    per_op = (NCCL_US[STEP_BYTES] - ONE_SHOT_US[STEP_BYTES]) / 1e3
    assert nccl.ms - auto.ms == pytest.approx(161 * per_op, rel=1e-9)  # every all-reduce of the step moved


def test_custom_takes_the_kernel_at_every_size_it_was_measured() -> None:
    row = _row(_budget([with_custom()], "custom"))
    assert row.path == "custom one-shot"
    assert row.path_text == "custom one-shot (--allreduce custom)"


def test_cpu_ranks_say_the_custom_kernel_cannot_run_and_why() -> None:
    gloo = [_point(us, size, "gloo") for size, us in NCCL_US.items()]
    result = _allreduce(*gloo, _unsupported("one_shot", CPU_WHY), _unsupported("two_shot", CPU_WHY), kind="cpu")
    row = _row(_budget([result]))
    assert row.path == "gloo"
    assert row.path_text == f"gloo assumed: custom all-reduce cannot run here ({CPU_WHY})"


def test_p2p_off_says_nccl_was_assumed_because_of_it() -> None:
    nccl = [_point(us, size, "nccl") for size, us in NCCL_US.items()]
    row = _row(_budget([_allreduce(*nccl, _unsupported("one_shot", P2P_WHY))]))
    assert row.path == "NCCL"
    assert row.path_text == f"NCCL assumed: custom all-reduce cannot run here ({P2P_WHY})"
    assert _row(_budget([_allreduce(*nccl, _unsupported("one_shot", P2P_WHY))], "custom")).path == "NCCL"


def test_results_with_nccl_points_only_say_so() -> None:
    row = _row(_budget([_allreduce(*(_point(us, size, "nccl") for size, us in NCCL_US.items()))], "custom"))
    assert row.path_text == "NCCL as measured (these results hold no custom all-reduce points)"
    assert row.path_rule == "--allreduce custom"


def test_without_a_measurement_the_roofline_row_names_nccl() -> None:
    row = _row(_budget([], "custom"))
    assert row.status == "estimated" and row.path == "NCCL"
    assert "no all-reduce measured here" in row.path_text and "--allreduce custom needs" in row.path_text


# --- every surface ------------------------------------------------------------------------------------------------


def test_the_table_and_the_json_say_the_path(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    table = format_budget_table(_budget([with_custom()]), bars=False)[0].splitlines()
    row = next(line for line in table if line.startswith("all-reduce / all-to-all"))
    assert row.endswith(AUTO_TEXT)
    path = tmp_path / "results.json"
    doc = {"decodetop_probe_results": RESULTS_FORMAT_VERSION, "results": [with_custom().to_dict()]}
    path.write_text(json.dumps(doc))
    for choice, want in (("auto", AUTO_TEXT), ("nccl", "NCCL assumed: --allreduce nccl")):
        argv = ["budget", "--model", MODEL, "--results", str(path), "--allreduce", choice, "--json"]
        assert main(argv) == 0
        out = json.loads(capsys.readouterr().out)
        seg = next(s for s in out["budget"]["segments"] if s["component"] == "communication")
        assert seg["path_text"] == want
        assert seg["provenance"].endswith(f"all-reduce: {want}")
        assert any(src.startswith("allreduce probe: ") for src in seg["sources"])
    argv = ["budget", "--model", MODEL, "--results", str(path), "--allreduce", "nccl"]
    assert main(argv) == 0
    assert "NCCL assumed: --allreduce nccl" in capsys.readouterr().out


def test_the_live_ui_budget_says_the_path_under_the_bar() -> None:
    from decodetop.settings import Settings
    from decodetop.tui.probe_group import GroupInfo
    from decodetop.tui.sources.budget import PresetBudget

    results = {"allreduce": with_custom()}
    group = GroupInfo(2, "cuda", "GPUs")
    for choice, want in (("auto", AUTO_TEXT), ("nccl", "NCCL assumed: --allreduce nccl")):
        budget = PresetBudget(
            lambda: "NVIDIA H200", group=lambda: group, flags=ScenarioFlags(allreduce=choice), session_start_s=0.0
        )
        view = budget.compose(Settings(model=MODEL), results, 0.0)
        assert f"all-reduce: {want}" in view.note.splitlines()
        seg = next(s for s in view.segments if s.key == "communication")
        assert seg.provenance.endswith(want)
    # results holding NCCL points only under auto: nothing was chosen, the bar stays as it was
    nccl_only = {"allreduce": _allreduce(*(_point(us, size, "nccl") for size, us in NCCL_US.items()))}
    view = PresetBudget(lambda: "NVIDIA H200", group=lambda: group, session_start_s=0.0).compose(
        Settings(model=MODEL), nccl_only, 0.0
    )
    assert not any(line.startswith("all-reduce:") for line in view.note.splitlines())


def test_the_exporter_labels_the_path_not_the_reason() -> None:
    from decodetop.export.prometheus import ExportState, render_exposition

    for choice, path in (("auto", "custom one-shot"), ("nccl", "NCCL")):
        text = render_exposition(ExportState(budget=_budget([with_custom()], choice)), parts=("budget",))
        series = [line for line in text.splitlines() if line.startswith("decodetop_budget_segment_path{")]
        assert len(series) == 1  # one series: the component holding the all-reduces
        assert f'path="{path}"' in series[0] and 'component="communication"' in series[0]
        assert "vLLM" not in series[0]  # the reason stays out of the label


def test_flags_are_spelt_out_so_allreduce_us_is_never_a_prefix_match(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(["budget", "--allreduce-u", "9"])
    assert exc.value.code == 2
    assert "unrecognized arguments: --allreduce-u" in capsys.readouterr().err


def test_the_live_ui_flag_reaches_its_budget(tmp_path: Path) -> None:
    from decodetop.settings import Settings
    from decodetop.tui.launch import LaunchOptions, build_sources
    from decodetop.tui.sources.budget import PresetBudget

    options = LaunchOptions(demo=True, flags=ScenarioFlags(allreduce="nccl"), history_path=tmp_path / "history.jsonl")
    budget = build_sources(Settings(model=MODEL), options).budget
    assert isinstance(budget, PresetBudget) and budget.flags.allreduce == "nccl"


def test_one_gpu_says_nccl_was_assumed_because_one_gpu_measures_no_all_reduce() -> None:
    env = Environment(
        host="vm",
        time_utc="2026-12-01T10:00:00Z",
        python="3.12",
        backend="nccl",
        device_kind="cuda",
        world_size=1,
        gpu_names=("NVIDIA H200",),
    )
    launch = ProbeResult("launch", ProbeStatus.OK, {}, (), environment=env, world_size=1)
    row = _row(_budget([launch]))
    assert row.status == "estimated" and row.path == "NCCL"
    assert row.path_text.startswith("NCCL assumed: one GPU in the probe group measures no all-reduce")
