"""Unit tests for the timing harness's pure parts: rotation, count planning, line fit, host timer."""

from __future__ import annotations

import pytest

from decodetop.probes.worker.timing import Rotation, fit_line, plan_counts, rotation_count, time_host


def test_rotation_count_exceeds_twice_the_cache() -> None:
    mib = 1024 * 1024
    # 60 MiB L2 (H200: docs/reference/h200-machine.md/KINDS.md), 16 MiB weights: need > 120 MiB -> 8 copies (128 MiB)
    assert rotation_count(16 * mib, 60 * mib) == 8
    assert 8 * 16 * mib > 2 * 60 * mib >= 7 * 16 * mib
    # a buffer bigger than twice the cache needs no rotation
    assert rotation_count(256 * mib, 60 * mib) == 1
    # the cap holds
    assert rotation_count(1024, 60 * mib, max_copies=16) == 16
    assert rotation_count(1024, 0) == 1


def test_rotation_count_rejects_bad_input() -> None:
    with pytest.raises(ValueError):
        rotation_count(0, 1024)
    with pytest.raises(ValueError):
        rotation_count(10, -1)


def test_rotation_cycles_through_every_item_in_order() -> None:
    made = iter(range(100))
    rot = Rotation.build(lambda: next(made), buffer_bytes=40, cache_bytes=50)  # 2*50/40 -> 3 copies
    assert len(rot) == 3
    assert [rot.next() for _ in range(7)] == [0, 1, 2, 0, 1, 2, 0]
    with pytest.raises(ValueError):
        Rotation([])


def test_plan_counts_fast_point_gets_the_maxima() -> None:
    c = plan_counts(1.0, budget_ms=100.0, max_ops=20, max_samples=25)
    assert (c.ops, c.samples) == (20, 25)


def test_plan_counts_slow_point_fits_budget_keeping_min_samples() -> None:
    c = plan_counts(100_000.0, budget_ms=250.0, max_ops=20, max_samples=25, min_samples=5)
    assert (c.ops, c.samples) == (1, 5)  # 0.1 s per op: budget allows 2.5 ops, the minimum is 5 samples
    mid = plan_counts(1000.0, budget_ms=100.0, max_ops=20, max_samples=25, min_samples=3)
    assert mid.ops * mid.samples <= 100 and mid.samples >= 3
    assert mid.ops >= 1


def test_plan_counts_unknown_estimate() -> None:
    assert plan_counts(0.0, 10.0, max_ops=4, max_samples=5) == plan_counts(float("nan"), 10.0, max_ops=4, max_samples=5)


def test_fit_line_recovers_a_and_b() -> None:
    xs = [1.0, 8.0, 32.0, 128.0]
    a, b = fit_line(xs, [15.0 + 0.58 * x for x in xs])  # docs/reference/probes.md §3: ~15 µs + 0.58 µs/node
    assert a == pytest.approx(15.0) and b == pytest.approx(0.58)
    with pytest.raises(ValueError):
        fit_line([1.0, 1.0], [2.0, 3.0])


def test_time_host_counts_calls_and_syncs() -> None:
    calls = {"fn": 0, "sync": 0}

    def fn() -> None:
        calls["fn"] += 1

    def sync() -> None:
        calls["sync"] += 1

    samples = time_host(fn, ops=4, samples=3, warmup=2, sync=sync)
    assert len(samples) == 3 and all(s >= 0 for s in samples)
    assert calls == {"fn": 2 + 4 * 3, "sync": 1 + 3}
    with pytest.raises(ValueError):
        time_host(fn, ops=0, samples=1)


def test_hold_gpu_for_host_sleeps_per_sample_up_to_a_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    """The sleep kernel in front of a timed replay loop covers the host's enqueue time, capped (no GPU needed:
    the sleep is recorded instead of launched)."""
    import torch

    from decodetop.probes.worker import timing

    cycles: list[int] = []
    monkeypatch.setattr(torch.cuda, "_sleep", cycles.append, raising=False)
    for samples in (10, 20, 10_000, 100_000):
        timing.hold_gpu_for_host(samples)
    # The documented figures, worked out by hand: 150 µs of host lead per sample at the 2 GHz the sleep kernel's
    # cycles are counted in is 300,000 cycles per sample; the lead stops at 20 ms = 40,000,000 cycles.
    assert cycles[:2] == [3_000_000, 6_000_000]  # 10 and 20 samples: 1.5 ms and 3 ms
    assert cycles[2:] == [40_000_000, 40_000_000]  # capped: 10,000 samples would be 1.5 s
    monkeypatch.delattr(torch.cuda, "_sleep")
    timing.hold_gpu_for_host(10)  # a torch without the private sleep kernel: nothing happens
    assert len(cycles) == 4
