"""The traced bar (should cost / does cost), graph-replayed steps on the GPU timeline, every rank of a TP run,
hostile times, and the headless command showing the same figures as the live UI."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest

from decodetop.budget.components import Component
from decodetop.cli import main
from decodetop.traces.analysis import analyze_trace
from decodetop.traces.ranks import analyze_path
from decodetop.traces.trace_report import LAUNCH_KEY
from decodetop.traces.traced import COPIES_KEY, traced_view
from tests.helpers.synth import SynthSpec, write_synthetic_trace

from .conftest import fixture, write_trace

CAST = "direct_copy_kernel_cuda"
PROBED = {"attention": 0.06, "attention_proj": 0.1, "dense_mlp": 0.1, "norms": 0.05, "lm_head": 0.04, "launch": 0.3}
"""A probed budget of the fixture model's size (ms per step), small next to the planted cast."""


def serving_graph_trace(tmp_path: Path, name: str = "h200_graph_planted") -> Path:
    """The graph fixture as a server records it: no device synchronize inside the step, so each ProfilerStep host
    range ends when cudaGraphLaunch returns, long before the replay's kernels finish."""
    data = json.loads(gzip.decompress(fixture(name).read_bytes()))
    events = [e for e in data["traceEvents"] if e.get("name") != "cudaDeviceSynchronize"]
    launches = sorted((e["ts"], e["dur"]) for e in events if e.get("name") == "cudaGraphLaunch")
    for e in events:
        if e.get("cat") == "user_annotation" and str(e.get("name", "")).startswith("ProfilerStep"):
            launch = next((ts, dur) for ts, dur in launches if ts >= e["ts"])
            e["dur"] = launch[0] + launch[1] - e["ts"] + 5.0
    data["traceEvents"] = events
    return write_trace(tmp_path / f"{name}_serving.json", events, deviceProperties=data.get("deviceProperties"))


def test_graph_step_is_timed_on_the_gpu_timeline(tmp_path: Path) -> None:
    """The host marker of a graph step ends when the launch returns: the step's wall is its kernels' window, never
    less than the GPU's busy time inside it."""
    path = serving_graph_trace(tmp_path)
    markers = [e["dur"] for e in json.loads(path.read_text())["traceEvents"] if e.get("cat") == "user_annotation"]
    report = analyze_trace(path)
    assert max(markers) < report.gpu_busy_us_mean  # the host ranges alone would give a step shorter than its work
    assert "graph replays timed on the GPU timeline" in report.segmentation
    assert report.graph_kernels_per_step == 233  # 229 kernels of the step + the 4 planted casts
    for step in report.steps:
        assert step.wall_us == step.gpu_window_us >= step.gpu_busy_us
    assert report.step_wall_us_mean >= report.gpu_busy_us_mean


def test_graph_kernels_attributed_share_and_by_which_rule() -> None:
    """Graph-replayed kernels have no host operators: they are attributed by name rules and by their place in the
    replay, and the report says how many by which; 99 % of the kernel time lands in a budget component."""
    report = analyze_trace(fixture("h200_graph_planted"))
    rules = {a.rule: a for a in report.attribution}
    assert set(rules) == {
        "order in the step (the block between norms)",
        "kernel name",
        "unattributed (family known, component not)",
    }
    assert rules["kernel name"].kernels_per_step == 149
    assert rules["order in the step (the block between norms)"].kernels_per_step == 79
    assert report.attributed_share == pytest.approx(0.99, abs=0.005)
    view = traced_view(report, PROBED, layers=4)
    assert "kernel time attributed to a component: 99%" in view.attribution_text


def test_planted_cast_is_the_largest_gap_named_with_its_place() -> None:
    """The planted whole-cache cast lands in attention (its place in the replay) and is the named largest gap."""
    sources = dict.fromkeys(PROBED, "probed")
    view = traced_view(
        analyze_trace(fixture("h200_graph_planted")), PROBED, observed_ms=12.0, layers=4, sources=sources
    )
    assert view.gap_key == "attention"
    assert view.gap_text.startswith("attention: traced 0.954 ms vs probed 0.06 ms per step — top kernel ")
    assert "unrolled_elementwise_kernel<direct_copy_kernel_cuda>" in view.gap_text
    assert view.gap_text.endswith("via graph replay, attention block (a cast), 1 per layer")
    att = view.segment("attention")
    assert att is not None and CAST in att.kernels[0].name


@pytest.mark.parametrize(
    ("sources", "said"),
    [
        ({}, "vs budget 0.06 ms"),
        ({"attention": "roofline"}, "vs roofline 0.06 ms"),
        ({"attention": "stored"}, "vs stored"),
    ],
)
def test_the_budget_figure_is_named_by_its_source_never_probed_for_an_estimate(
    sources: dict[str, str], said: str
) -> None:
    """A roofline estimate is 'roofline', a figure read back is 'stored'; a figure of unknown source is 'budget'."""
    view = traced_view(analyze_trace(fixture("h200_graph_planted")), PROBED, layers=4, sources=sources)
    assert said in view.gap_text and "probed" not in view.gap_text
    assert view.budget_source == (sources.get("attention") if len(set(sources.values())) == 1 else "budget")


def test_eager_cast_named_with_its_host_op_chain() -> None:
    """In an eager trace the cast keeps its host op chain; with the host-bound idle time budgeted it is the gap."""
    report = analyze_trace(fixture("h200_eager_planted"))
    probed = {**PROBED, "launch": report.gpu_idle_us_mean / 1000}
    view = traced_view(report, probed, layers=4)
    assert view.gap_key == "attention"
    assert "via aten::to>aten::_to_copy>aten::copy_ in attention (a cast), 1 per layer" in view.gap_text


def test_segments_sum_to_the_traced_step_in_budget_order() -> None:
    for name in ("h200_graph_planted", "h200_eager_planted", "h200_qwen3moe_eager"):
        view = traced_view(analyze_trace(fixture(name)), PROBED, observed_ms=95.0)
        assert sum(s.traced_ms for s in view.segments) == pytest.approx(view.step_ms, rel=1e-6), name
        order = [c.value for c in Component]
        keys = [s.key for s in view.segments if s.key in order]
        assert keys == sorted(keys, key=order.index), name
        assert view.segment(LAUNCH_KEY) is not None


def test_header_says_how_much_of_the_unexplained_the_trace_accounts_for() -> None:
    view = traced_view(analyze_trace(fixture("h200_eager_planted")), PROBED, observed_ms=12.0)
    explained = sum(PROBED.values())
    assert view.unexplained_ms == pytest.approx(12.0 - explained)
    assert view.accounted_ms == pytest.approx(view.step_ms - explained)
    share = view.accounted_ms / view.unexplained_ms  # type: ignore[operator]
    assert view.header() == (
        f"traced step {view.step_ms:.3g} ms · accounts for {view.accounted_ms:.3g} ms of the "
        f"{view.unexplained_ms:.3g} ms unexplained ({share:.0%})"
    )


def test_copies_no_context_claims_form_their_own_segment() -> None:
    """Unattributed copies (outside any replay block) form the 'copies & casts' segment probes cannot have."""
    view = traced_view(analyze_trace(fixture("h200_graph_planted")))
    seg = view.segment(COPIES_KEY)
    assert seg is not None and seg.label == "copies & casts" and seg.probed_ms is None and seg.traced_ms > 0


def two_ranks(directory: Path) -> Path:
    """Two TP ranks of one synthetic decode; rank 1's kernels are 40 % slower, so rank 0 waits in all-reduce."""
    directory.mkdir(parents=True, exist_ok=True)
    write_synthetic_trace(
        directory / "1764-TP-0.trace.json.gz", 150_000, SynthSpec(allreduce=True, kernel_us=10, allreduce_us=24)
    )
    write_synthetic_trace(
        directory / "1764-TP-1.trace.json.gz", 150_000, SynthSpec(allreduce=True, kernel_us=14, allreduce_us=4)
    )
    return directory


def test_slow_rank_is_named(tmp_path: Path) -> None:
    traces = analyze_path(two_ranks(tmp_path / "ranks"))
    assert [r.rank for r in traces.ranks] == [0, 1]
    assert traces.standing_out[0].startswith("rank 1 is slow: it computes ")
    assert any(line.startswith("rank 0 waits ") for line in traces.standing_out)
    assert traces.spread_line().startswith("2 ranks: step ")
    assert traces.report.path.endswith("TP-0.trace.json.gz")


def test_ranks_that_agree_name_nobody(tmp_path: Path) -> None:
    for rank in (0, 1):
        write_synthetic_trace(tmp_path / f"rank{rank}.json", 100_000, SynthSpec(allreduce=True))
    traces = analyze_path(tmp_path)
    assert len(traces.ranks) == 2 and traces.standing_out == ()


def test_bad_times_are_skipped_and_counted_and_json_stays_valid(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """NaN, infinite and negative timestamps or durations never reach a sum: skipped, counted, said; the --json
    output parses with a strict parser (no NaN or Infinity tokens)."""
    good = json.loads(gzip.decompress(fixture("h200_graph").read_bytes()))
    events: list[Any] = list(good["traceEvents"])
    bad = [
        {"ph": "X", "cat": "kernel", "name": "k", "ts": float("nan"), "dur": 1.0, "args": {"device": 0}},
        {"ph": "X", "cat": "kernel", "name": "k", "ts": 5.0, "dur": -3.0, "args": {"device": 0}},
        {"ph": "X", "cat": "kernel", "name": "k", "ts": -1.0, "dur": 2.0, "args": {"device": 0}},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 1.0, "dur": float("inf"), "pid": 1, "tid": 1},
    ]
    path = tmp_path / "hostile.json"
    path.write_text(json.dumps({"traceEvents": events + bad, "deviceProperties": good["deviceProperties"]}))
    report = analyze_trace(path)
    assert report.events_skipped == 4
    assert any("4 events with a NaN, infinite or negative" in n for n in report.notes)
    assert report.steps == analyze_trace(fixture("h200_graph")).steps
    assert main(["trace", str(path), "--json"]) == 0

    def refuse(token: str) -> None:
        raise AssertionError(f"not strict JSON: {token}")

    data = json.loads(capsys.readouterr().out, parse_constant=refuse)
    assert data["trace"]["events_skipped"] == 4


def test_cli_and_view_show_the_same_figures(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`decodetop trace DIR --json` prints the traced bar `traced_view` gives the live UI for the same files."""
    directory = two_ranks(tmp_path / "ranks")
    assert main(["trace", str(directory), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    view = traced_view(analyze_path(directory))
    assert [(s["key"], s["traced_ms"]) for s in data["traced"]["segments"]] == [
        (s.key, pytest.approx(s.traced_ms)) for s in view.segments
    ]
    assert data["traced"]["header"] == view.header()
    assert [r["rank"] for r in data["ranks"]["ranks"]] == [0, 1]
    assert main(["trace", str(directory)]) == 0
    text = capsys.readouterr().out
    assert "traced bar: traced step" in text and "rank 1 is slow" in text


def test_empty_directory_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["trace", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert "no trace files" in err and "\n" not in err


def test_a_huge_integer_is_one_line_with_or_without_pythons_digit_cap(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A 5,000-digit number in an event: one line naming the file, whether the interpreter caps integer digits (the
    fast decoder) or not (the strict one)."""
    import sys

    path = tmp_path / "huge.json"
    path.write_text('{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "ts": ' + "9" * 5000 + ', "dur": 1}]}')
    before = sys.get_int_max_str_digits()
    try:
        for cap in (before or 4300, 0):
            sys.set_int_max_str_digits(cap)
            assert main(["trace", str(path)]) == 2
            err = capsys.readouterr().err.strip()
            assert str(path) in err and "digits" in err and "\n" not in err, err
    finally:
        sys.set_int_max_str_digits(before)


def test_a_directory_of_several_captures_reads_the_newest(tmp_path: Path) -> None:
    """A vLLM trace directory keeps every capture: the newest file per rank is read, older ones are left alone."""
    import os
    import shutil

    directory = two_ranks(tmp_path / "ranks")
    for rank in (0, 1):
        old = directory / f"1700-TP-{rank}.trace.json.gz"
        shutil.copy(fixture("h200_graph"), old)
        os.utime(old, (1_700_000_000, 1_700_000_000))
    traces = analyze_path(directory)
    assert [Path(r.path).name for r in traces.ranks] == ["1764-TP-0.trace.json.gz", "1764-TP-1.trace.json.gz"]
    unranked = tmp_path / "vllm"
    unranked.mkdir()
    for name, when in (("a.1700.pt.trace.json.gz", 1_700_000_000), ("b.1764.pt.trace.json.gz", None)):
        shutil.copy(fixture("h200_graph"), unranked / name)
        if when:
            os.utime(unranked / name, (when, when))
    assert [Path(r.path).name for r in analyze_path(unranked).ranks] == ["b.1764.pt.trace.json.gz"]
