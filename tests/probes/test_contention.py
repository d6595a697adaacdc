"""Other processes on a probed GPU, from the NVML snapshots the results carry (fake NVML process lists, as recorded on
an H200 with a GEMM loop from another process: docs/benchmarks.md "A neighbour named")."""

from __future__ import annotations

from typing import Any

import pytest

from decodetop.budget.contention import Contention, contention_error, contention_in
from decodetop.probes.contention import contention_of
from decodetop.probes.results import Environment, ProbeResult, ProbeStatus

RANK = 613
NEIGHBOUR = 1306


def _env(
    before: list[dict[str, Any]], after: list[dict[str, Any]], pids: list[int] | None, kind: str = "cuda"
) -> Environment:
    extra: dict[str, Any] = {"nvml_before": before, "nvml_after": after}
    if pids is not None:
        extra["probe_pids"] = pids
    return Environment(
        host="h200",
        time_utc="2026-12-01T12:00:00+00:00",
        python="3.12",
        backend="nccl",
        device_kind=kind,
        world_size=1,
        extra=extra,
    )


def _row(util: int, *procs: tuple[int, str, int | None]) -> dict[str, Any]:
    return {
        "cuda_index": 0,
        "gpu_util_pct": util,
        "processes": [
            {"pid": p, "name": n, "used_memory_bytes": 1 << 30, **({"sm_util_pct": s} if s is not None else {})}
            for p, n, s in procs
        ],
    }


def _result(probe: str, env: Environment) -> ProbeResult:
    return ProbeResult(probe=probe, status=ProbeStatus.OK, params={}, environment=env)


def test_a_neighbour_is_named_with_its_pid_name_gpu_and_sm_share() -> None:
    env = _env(
        [_row(100, (NEIGHBOUR, "python3", None), (RANK, "python3", None))],
        [_row(100, (NEIGHBOUR, "python3", 97), (RANK, "python3", 31))],
        [RANK],
    )
    found = contention_of([_result("gemm", env), _result("layer", env)])
    assert [(n.gpu, n.pid, n.name, n.sm_util_pct, n.probes) for n in found.neighbours] == [
        (0, NEIGHBOUR, "python3", 97, ("gemm", "layer"))
    ]
    assert found.foreign == ()  # the busy GPU is explained by the process named
    assert found.line() == (
        "likely cause: another process on the probed GPU — GPU 0: pid 1306 (python3, 97 % SM during the run): its "
        "context time-slices with the probes', so tails, eager all-reduces and whole-layer timings include its work"
    )
    assert found.to_dict()["neighbours"][0] == {
        "gpu": 0,
        "pid": NEIGHBOUR,
        "name": "python3",
        "sm_util_pct": 97,
        "probes": ["gemm", "layer"],
    }
    assert contention_in({"contention": found.to_dict()}) == found.line()


def test_the_probe_groups_own_ranks_and_a_clean_gpu_name_nobody() -> None:
    clean = _env([_row(0, (RANK, "python3", None))], [_row(95, (RANK, "python3", 99))], [RANK])
    assert not contention_of([_result("gemm", clean)]) and contention_of([_result("gemm", clean)]).line() == ""
    cpu = _env([_row(100, (NEIGHBOUR, "x", 90))], [_row(100, (NEIGHBOUR, "x", 90))], [], kind="cpu")
    assert not contention_of([_result("gemm", cpu)])


def test_a_busy_gpu_without_a_visible_process_is_foreign_load_and_older_files_count_only_that() -> None:
    """Another container's process is not in NVML's list here; an older result has no probe pids to tell a rank from
    a neighbour, so only its utilisation before the probe says anything."""
    old = _env(
        [_row(100, (578, "python3", None), (RANK, "python3", None))],
        [_row(100, (578, "python3", None), (RANK, "python3", None))],
        None,
    )
    found = contention_of([_result("launch", old), _result("gemm", old)])
    assert found.neighbours == () and [(f.gpu, f.util_pct) for f in found.foreign] == [(0, 100)]
    assert found.line().startswith(
        "likely cause: foreign work on the probed GPU — GPU 0 100 % busy before the probes while their ranks were "
        "idle (no process visible from here)"
    )


@pytest.mark.parametrize(
    ("error", "said"),
    [(-59.1, "contention (pid 1306 (python3) on GPU 0), not a composition figure"), (-12.0, "-12.0%")],
)
def test_a_layer_error_beyond_15_percent_on_a_shared_gpu_is_contention(error: float, said: str) -> None:
    env = _env([_row(100, (NEIGHBOUR, "python3", None))], [_row(100, (NEIGHBOUR, "python3", 97))], [RANK])
    assert contention_error(error, contention_of([_result("layer", env)])) == said
    assert contention_error(error, Contention()) == f"{error:+.1f}%"
