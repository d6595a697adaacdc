"""The CLI's plain-text rendering of results."""

from __future__ import annotations

import dataclasses

from decodetop.probes.report import format_result, header_for, summary_line
from decodetop.probes.results import (
    MeasurementStatus,
    ProbeResult,
    ProbeStatus,
    RankMeasurement,
    RankOutput,
    merge_rank_outputs,
)


def test_headers_carry_units() -> None:
    assert header_for("busbw_gbps") == "busbw GB/s"
    assert header_for("size_bytes") == "size"
    assert header_for("graph_per_node_us") == "graph per node µs"
    assert header_for("mode") == "mode"


def _result() -> ProbeResult:
    outputs = {
        0: RankOutput(
            measurements=(
                RankMeasurement(
                    "allreduce 4 KiB pipelined",
                    {"size_bytes": 4096, "mode": "pipelined"},
                    "us",
                    samples=(10.0, 12.0, 14.0),
                    metrics={"time_us": 12.0, "busbw_gbps": 0.34},
                ),
                RankMeasurement(
                    "allreduce 4 KiB graph",
                    {"size_bytes": 4096, "mode": "graph"},
                    "us",
                    status=MeasurementStatus.UNSUPPORTED,
                    note="CUDA graphs need a GPU",
                ),
            )
        )
    }
    return ProbeResult(
        probe="allreduce",
        status=ProbeStatus.OK,
        params={},
        measurements=merge_rank_outputs(outputs),
        world_size=1,
        duration_s=0.5,
    )


def test_table_with_param_columns() -> None:
    text = format_result(_result(), columns=("size_bytes", "mode"))
    lines = text.splitlines()
    assert lines[0] == "== allreduce: ok, 1 ranks, 0.5 s"
    assert lines[1].split() == ["size", "mode", "median", "µs", "p10", "p90", "busbw", "GB/s", "note"]
    assert lines[3].split() == ["4", "KiB", "pipelined", "12.0", "10.4", "13.6", "0.340", "-"]
    assert lines[4].split()[:3] == ["4", "KiB", "graph"] and lines[4].endswith("unsupported: CUDA graphs need a GPU")


def test_failed_summary_names_rank() -> None:
    failed = ProbeResult(
        probe="launch", status=ProbeStatus.FAILED, params={}, world_size=2, error_rank=1, error="ValueError: x"
    )
    assert summary_line(failed) == "launch: failed, 2 ranks, 0.0 s: failed on rank 1: ValueError: x"


def test_rank_warnings_and_the_log_are_named_after_the_table() -> None:
    warned = dataclasses.replace(_result(), rank_warnings=2, rank_log="/state/logs/ranks-1.log")
    assert format_result(warned).splitlines()[-1] == "ranks showed 2 warnings: see /state/logs/ranks-1.log"
    quiet = dataclasses.replace(_result(), rank_log="/state/logs/ranks-1.log")
    assert "ranks-1.log" not in format_result(quiet)
    failed = dataclasses.replace(quiet, status=ProbeStatus.FAILED, error="boom", error_rank=1)
    assert format_result(failed).splitlines()[-1] == "rank output: /state/logs/ranks-1.log"


def test_the_ui_details_name_the_rank_log_and_a_dead_rank_once() -> None:
    from decodetop.tui.sources.probe_views import probe_view

    warned = dataclasses.replace(_result(), rank_warnings=1, rank_log="/state/logs/ranks-1.log")
    assert ("rank output", "1 warning in /state/logs/ranks-1.log") in probe_view(warned).details
    died = dataclasses.replace(
        _result(),
        status=ProbeStatus.FAILED,
        error="rank 1 died: killed by SIGKILL",
        error_rank=1,
        rank_log="/state/logs/ranks-1.log",
    )
    view = probe_view(died)
    assert view.error == "rank 1 died: killed by SIGKILL"
    assert ("rank output", "/state/logs/ranks-1.log") in view.details
