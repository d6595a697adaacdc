"""Unit tests for results: stats, merge across ranks, JSON round trip, load_results errors (no processes)."""

from __future__ import annotations

import json
import statistics

import pytest
from hypothesis import given
from hypothesis import strategies as st

from decodetop.errors import UserInputError
from decodetop.probes.results import (
    Environment,
    MeasurementStatus,
    ProbeResult,
    ProbeStatus,
    RankMeasurement,
    RankOutput,
    Stats,
    load_results,
    merge_rank_outputs,
    percentile,
    results_from_json,
    results_to_json,
)


def test_stats_of_one_to_ten() -> None:
    s = Stats.from_samples([float(v) for v in range(10, 0, -1)], "us")
    assert (s.min, s.max, s.count, s.unit) == (1.0, 10.0, 10, "us")
    assert s.median == 5.5
    assert s.p10 == pytest.approx(1.9)  # numpy 'linear': 1 + 0.9 * (2 - 1)
    assert s.p90 == pytest.approx(9.1)
    assert s.p99 == pytest.approx(9.91)
    assert s.mean == 5.5


def test_stats_single_sample() -> None:
    s = Stats.from_samples([3.0], "gbps")
    assert s.median == s.p10 == s.p90 == s.p99 == s.min == s.max == 3.0


def test_stats_rejects_empty_and_nan() -> None:
    with pytest.raises(ValueError):
        Stats.from_samples([], "us")
    with pytest.raises(ValueError):
        Stats.from_samples([1.0, float("nan")], "us")
    with pytest.raises(ValueError):
        percentile([1.0], 101)


@given(st.lists(st.floats(min_value=-1e6, max_value=1e6), min_size=1, max_size=200))
def test_stats_agree_with_statistics_module(values: list[float]) -> None:
    s = Stats.from_samples(values, "us")
    assert s.median == pytest.approx(statistics.median(values), rel=1e-9, abs=1e-9)
    assert s.min <= s.p10 <= s.median <= s.p90 <= s.p99 <= s.max
    if len(values) >= 2:
        q = statistics.quantiles(values, n=10, method="inclusive")
        assert s.p10 == pytest.approx(q[0], rel=1e-9, abs=1e-6)
        assert s.p90 == pytest.approx(q[-1], rel=1e-9, abs=1e-6)


def _outputs() -> dict[int, RankOutput]:
    return {
        1: RankOutput(
            measurements=(
                RankMeasurement("a", {"size_bytes": 8}, "us", samples=(3.0, 5.0), metrics={"time_us": 4.0}),
                RankMeasurement("g", {"mode": "graph"}, "us", status=MeasurementStatus.UNSUPPORTED, note="no GPU"),
            )
        ),
        0: RankOutput(
            measurements=(
                RankMeasurement("a", {"size_bytes": 8}, "us", samples=(1.0, 2.0), metrics={"time_us": 1.5, "x": 1.0}),
                RankMeasurement("g", {"mode": "graph"}, "us", status=MeasurementStatus.UNSUPPORTED, note="no GPU"),
            )
        ),
    }


def test_merge_pools_samples_and_averages_metrics() -> None:
    merged = merge_rank_outputs(_outputs())
    assert [m.name for m in merged] == ["a", "g"]
    a = merged[0]
    assert [r.rank for r in a.per_rank] == [0, 1]
    assert a.stats is not None and a.stats.count == 4 and a.stats.median == 2.5
    assert a.metrics == {"time_us": pytest.approx(2.75), "x": 1.0}  # x only reported by rank 0
    assert a.per_rank[1].stats is not None and a.per_rank[1].stats.median == 4.0
    g = merged[1]
    assert g.status is MeasurementStatus.UNSUPPORTED and g.note == "no GPU" and g.stats is None


def _result() -> ProbeResult:
    env = Environment(
        host="h",
        time_utc="2026-11-29T00:00:00+00:00",
        python="3.11",
        backend="gloo",
        device_kind="cpu",
        world_size=2,
        torch="2.x",
        gpu_names=("NVIDIA H200",),
        nccl_env={"NCCL_NVLS_ENABLE": "0"},
        extra={"cpu_count": 2},
    )
    return ProbeResult(
        probe="allreduce",
        status=ProbeStatus.FAILED,
        params={"sizes": [8, 16]},
        measurements=merge_rank_outputs(_outputs()),
        environment=env,
        started_utc="2026-11-29T00:00:00+00:00",
        duration_s=1.25,
        world_size=2,
        message="rank 1: boom",
        error_rank=1,
        error="ValueError: boom",
        traceback="Traceback ...",
    )


def test_json_round_trip_is_exact() -> None:
    result = _result()
    back = results_from_json(results_to_json([result]))
    assert back == [result]


def test_load_results_file(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "r.json"
    path.write_text(results_to_json([_result()]))
    assert load_results(path)[0].error_rank == 1


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("{not json", "not JSON"),
        ('{"x": 1}', "not a decodetop probe results file"),
        ('{"decodetop_probe_results": 99, "results": []}', "version 99"),
        ('{"decodetop_probe_results": 1, "results": {}}', "must be a list"),
        ('{"decodetop_probe_results": 1, "results": [{"probe": "a"}]}', "result #0 is malformed"),
        ('{"decodetop_probe_results": 1, "results": [{"probe": "a", "status": "weird"}]}', "result #0 is malformed"),
        ("[3]", "result #0 is not an object"),
    ],
)
def test_malformed_results_give_one_line(tmp_path, text: str, needle: str) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(UserInputError) as info:
        load_results(path)
    message = str(info.value)
    assert needle in message and "\n" not in message and str(path) in message


def test_missing_file(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(UserInputError, match="no such results file"):
        load_results(tmp_path / "nope.json")


def test_json_is_strict() -> None:
    doc = json.loads(results_to_json([_result()]))
    assert doc["decodetop_probe_results"] == 1
    assert doc["results"][0]["measurements"][0]["per_rank"][0]["samples"] == [1.0, 2.0]
