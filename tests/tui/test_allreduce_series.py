"""The all-reduce chart draws one series per (mode, implementation): NCCL (gloo on CPU ranks) by mode alone, the
engines' P2P kernel class (one-shot, two-shot) beside it, never mixed into one line."""

from __future__ import annotations

from decodetop.probes.results import Measurement, ProbeResult, ProbeStatus, Stats
from decodetop.tui.sources.probe_curves import allreduce_curves

NCCL_US = {8: 11.1, 16384: 12.2, 1048576: 19.1}
ONE_SHOT_US = {8: 6.2, 16384: 6.6, 1048576: 13.1}
TWO_SHOT_US = {16384: 9.0, 1048576: 11.0}


def _point(us: float, size: int, mode: str, impl: str | None) -> Measurement:
    params: dict[str, object] = {"size_bytes": size, "mode": mode, "world_size": 2}
    if impl is not None:
        params["impl"] = impl
    stats = Stats.from_samples([us], "us")
    return Measurement(f"allreduce {size} {mode} {impl}", params, "us", stats=stats, metrics={"time_us": us})


def _result(*points: Measurement) -> ProbeResult:
    return ProbeResult("allreduce", ProbeStatus.OK, {}, points, world_size=2)


def test_nccl_and_the_p2p_kernels_are_separate_series() -> None:
    points = [_point(us, size, "graph", "nccl") for size, us in NCCL_US.items()]
    points += [_point(us, size, "pipelined", "nccl") for size, us in NCCL_US.items()]
    points += [_point(us, size, "graph", "one_shot") for size, us in ONE_SHOT_US.items()]
    points += [_point(us, size, "graph", "two_shot") for size, us in TWO_SHOT_US.items()]
    series = {s.label: s for s in allreduce_curves(_result(*points))}
    assert list(series) == ["graph", "graph one-shot", "graph two-shot", "pipelined"]
    assert series["graph"].y == tuple(NCCL_US.values())  # NCCL only: no one-shot point mixed in
    assert series["graph one-shot"].y == tuple(ONE_SHOT_US.values())
    assert series["graph two-shot"].x == tuple(float(s) for s in TWO_SHOT_US)


def test_results_without_impl_and_gloo_ranks_read_by_mode() -> None:
    old = _result(*(_point(us, size, "graph", None) for size, us in NCCL_US.items()))
    assert [s.label for s in allreduce_curves(old)] == ["graph"]
    gloo = _result(*(_point(us, size, "synced", "gloo") for size, us in NCCL_US.items()))
    assert [s.label for s in allreduce_curves(gloo)] == ["synced"]
