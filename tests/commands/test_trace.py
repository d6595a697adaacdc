"""The probed-vs-traced comparison (with the budget package's own Budget) and the headless command."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from decodetop.cli import main
from decodetop.errors import UserInputError
from decodetop.traces import analyze_trace, compare
from decodetop.traces.compare import budget_ms, load_budget_json, short_name
from tests.traces.conftest import fixture


def _llama_budget() -> object:
    from decodetop.budget.compose import compose_budget
    from decodetop.budget.deployment import Deployment
    from decodetop.budget.gpus import GPUS
    from decodetop.budget.inventory import build_inventory
    from decodetop.budget.roofline import hardware_for
    from decodetop.budget.spec import load_preset

    inv = build_inventory(load_preset("llama-3.1-70b"), Deployment(tp=8, launch_mode="eager"))
    return compose_budget(inv, {}, estimate=hardware_for(GPUS["h200"]))


def test_compare_with_a_budget_names_the_cast() -> None:
    report = analyze_trace(fixture("h200_eager_planted"))
    budget = _llama_budget()
    comparison = compare(report, budget)
    rows = {r.key: r for r in comparison.rows}
    att = rows["attention"]
    assert att.probed_ms is not None and att.probed_ms > 0
    assert att.traced_ms == pytest.approx(report.bucket("attention").time_us_per_step / 1000)  # type: ignore[union-attr]
    assert att.delta_ms == pytest.approx(att.traced_ms - att.probed_ms)
    assert "of which" in att.finding and "direct_copy_kernel_cuda" in att.finding and "in attention" in att.finding
    assert rows["launch"].traced_ms == pytest.approx(report.gpu_idle_us_mean / 1000)
    assert "GPU idle" in rows["launch"].finding
    # the same comparison from the budget's JSON form
    again = compare(report, json.loads(json.dumps({"budget": budget.to_dict()})))  # type: ignore[attr-defined]
    assert [(r.key, r.probed_ms) for r in again.rows] == [(r.key, r.probed_ms) for r in comparison.rows]


def test_compare_with_plain_mapping_and_unattributed_rows() -> None:
    report = analyze_trace(fixture("h200_graph_planted"))
    comparison = compare(report, {"attention": 0.05, "dense_mlp": {"ms": 0.1}, "norms": None})
    rows = {r.key: r for r in comparison.rows}
    assert rows["dense_mlp"].probed_ms == 0.1
    assert rows["norms"].delta_ms is None
    assert "not in the budget" in rows["unattributed:copy"].finding
    assert comparison.notes  # a component without a figure is said


def test_bad_budgets(tmp_path: Path) -> None:
    with pytest.raises(UserInputError):
        budget_ms(42)
    bad = tmp_path / "b.json"
    bad.write_text("[1, 2")
    with pytest.raises(UserInputError, match="not a JSON budget"):
        load_budget_json(bad)
    bad.write_text('"text"')
    with pytest.raises(UserInputError, match="expected a Budget"):
        load_budget_json(bad)


def test_short_name() -> None:
    name = (
        "void at::native::(anonymous namespace)::indexSelectSmallIndex<c10::BFloat16, long>"
        "(at::cuda::detail::TensorInfo)"
    )
    assert short_name(name, 200) == "indexSelectSmallIndex<BFloat16, long>(TensorInfo)"
    assert len(short_name(name, 20)) == 20


def test_cli_text_and_json(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = str(fixture("h200_eager_planted"))
    assert main(["trace", path]) == 0
    out = capsys.readouterr().out
    assert "GPU idle inside the step" in out and "unrolled_elementwise_kernel<direct_copy" in out
    assert main(["trace", path, "--json", "--top", "3"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert len(data["trace"]["top_kernels"]) == 3 and "comparison" not in data
    budget = tmp_path / "budget.json"
    budget.write_text(json.dumps({"attention": 0.2, "launch": 1.0}))
    assert main(["trace", path, "--budget", str(budget)]) == 0
    out = capsys.readouterr().out
    assert "stored vs trace (budget from" in out and "attention: stored 0.2 ms, traced" in out  # a file: stored
    assert "probed" not in out and "probes" not in out and "server" not in out


def test_cli_with_model_builds_the_budget(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["trace", str(fixture("h200_graph")), "--model", "llama-3.1-70b", "--tp", "8", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    keys = {r["key"] for r in data["comparison"]["rows"]}
    assert {"attention", "dense_mlp", "launch"} <= keys
    assert "Llama-3.1-70B" in data["budget_source"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["trace"], "give a trace FILE or --server URL"),
        (["trace", "x.json", "--server", "http://127.0.0.1:1"], "give a trace FILE or --server URL"),
        (["trace", "/nonexistent/trace.json"], "cannot open trace"),
    ],
)
def test_cli_errors_are_one_line(capsys: pytest.CaptureFixture[str], argv: list[str], message: str) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err


def test_a_server_url_that_is_not_http_is_refused_with_the_flags(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["trace", "--server", "ftp://x"])
    assert info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert "--server: 'ftp://x': scheme 'ftp' is not http or https" in err and "\n" not in err


def test_budget_gpu_comes_from_the_trace_or_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    assert analyze_trace(fixture("h200_graph")).gpu_name == "NVIDIA H200"
    cpu = str(fixture("cpu_eager"))
    assert main(["trace", cpu, "--model", "llama-3.1-70b"]) == 2
    assert "does not name a known GPU" in capsys.readouterr().err
    assert main(["trace", cpu, "--model", "llama-3.1-70b", "--gpu", "h200", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert any("CPU-only" in n for n in data["comparison"]["notes"])


def test_cli_budget_takes_the_shared_scenario_flags_and_the_trace_s_ranks(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """TP defaults to the ranks the trace holds (as every command defaults to its group's), the launch mode to the
    trace's; the budget is `decodetop budget`'s for those flags."""
    from tests.helpers.synth import SynthSpec, write_synthetic_trace

    for rank in (0, 1):
        write_synthetic_trace(tmp_path / f"decode-TP-{rank}.trace.json", 0, SynthSpec(allreduce=True))
    assert main(["trace", str(tmp_path), "--model", "llama-3.1-70b", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert "(TP 2, EP 1, batch 1, context 4096" in doc["budget_source"]
    launch = "eager" if doc["trace"]["gpu_idle_us_mean"] > doc["trace"]["gpu_busy_us_mean"] else "graph"
    assert f"launch {launch}" in doc["budget_source"]
    flags = ["--model", "llama-3.1-70b", "--tp", "2", "--gpu", "h200", "--launch-mode", launch, "--batch", "4"]
    assert main(["budget", *flags, "--json"]) == 0
    budget = json.loads(capsys.readouterr().out)["budget"]
    assert main(["trace", str(tmp_path), *flags, "--json"]) == 0
    traced = json.loads(capsys.readouterr().out)["budget"]
    assert [(s["component"], s["ms"], s["status"]) for s in traced["segments"]] == [
        (s["component"], s["ms"], s["status"]) for s in budget["segments"]
    ]
    assert traced["observed"]["source"] == "trace" and budget["observed"]["assumed"]


def test_cli_results_need_a_model(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["trace", str(fixture("h200_graph")), "--results", str(tmp_path / "r.json")]) == 2
    err = capsys.readouterr().err.strip()
    assert "--results: give --model or --config too" in err and "\n" not in err
