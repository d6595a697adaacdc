"""Means and tails of the composed step, the per-rank spread, the straggler rule and its likely causes, and the diff
naming a straggler that appeared: on synthetic per-sample data (the gloo run is tests/probes/test_rank_budget.py)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from decodetop.budget.compose import MeasuredTime, compose_budget
from decodetop.budget.diff import diff_budgets, format_budget_diff
from decodetop.budget.gpus import GPUS
from decodetop.budget.ranks import RankTotal, find_straggler, rank_spread, step_bound_ms, straggler_in
from decodetop.budget.roofline import hardware_for
from decodetop.budget.text import mean_line
from decodetop.probes.hooks import busiest
from decodetop.probes.rankbudget import rank_causes, topology_numa
from decodetop.probes.results import Environment, Measurement, RankSeries, Stats
from tests.probes.test_plan_hooks import tiny_inventory


def heavy_tailed(n: int = 400, seed: int = 7) -> list[float]:
    """µs samples: 90 % near 10 µs, 10 % at 150 µs (an occasional eager all-reduce, a time slice)."""
    rng = random.Random(seed)
    return [150.0 if rng.random() < 0.1 else rng.uniform(9.5, 10.5) for _ in range(n)]


def series_measurement(samples: list[float]) -> Measurement:
    return Measurement("x", {}, "us", per_rank=(RankSeries(0, tuple(samples), Stats.from_samples(samples, "us")),))


def test_heavy_tail_costs_its_mean_not_its_median(tmp_path: Path) -> None:
    inv = tiny_inventory(tmp_path)
    t = busiest(series_measurement(heavy_tailed()))
    assert t is not None and t.mean_ms is not None and t.std_ms is not None
    assert t.median_ms == pytest.approx(0.010, abs=0.001)
    assert t.mean_ms > 1.5 * t.median_ms  # ~ 0.9 × 10 + 0.1 × 150 = 24 µs
    measured = {op.key.key_id: t for op in inv.ops}
    b = compose_budget(inv, measured, launch_mode="eager")
    n = sum(op.count for op in inv.ops)
    ops_known = [s for s in b.segments if s.component != "launch"]
    assert sum(s.ms or 0.0 for s in ops_known) == pytest.approx(n * t.median_ms)
    assert sum(s.mean or 0.0 for s in ops_known) == pytest.approx(n * t.mean_ms)
    assert b.mean_total_ms > b.total_ms
    assert b.mean_tokens_per_s == pytest.approx(inv.tokens_per_step * 1000.0 / b.mean_total_ms)
    spread = b.step_percentiles()
    assert spread is not None
    assert spread["p50"] == pytest.approx(b.mean_total_ms)
    assert spread["p50"] < spread["p90"] < spread["p99"]
    doc = b.to_dict()
    assert doc["mean_total_ms"] == pytest.approx(b.mean_total_ms)
    assert doc["statistics"]["ms"].startswith("median")
    assert doc["step_percentiles_ms"]["p99"] == pytest.approx(spread["p99"])
    # the launch line was not measured: the mean is a lower bound and tok/s an upper one
    assert mean_line(b).startswith(f"mean step ≥ {b.mean_total_ms:.3g} ms = ≤ ")
    estimates = compose_budget(inv, {}, launch_mode="eager", estimate=hardware_for(GPUS["h200"]))
    assert mean_line(estimates) == ""  # no samples: no mean to tell from the median


def test_an_old_result_without_a_mean_composes_its_median(tmp_path: Path) -> None:
    inv = tiny_inventory(tmp_path)
    t = MeasuredTime(0.01, 0.009, 0.011)
    b = compose_budget(inv, {op.key.key_id: t for op in inv.ops}, launch_mode="eager")
    assert b.mean_total_ms == pytest.approx(b.total_ms)
    assert b.step_percentiles() is None  # no samples: no step spread is claimed


def total(rank: int, ms: float, band: float = 0.0, collective: float = 0.0) -> RankTotal:
    parts = {"communication": collective, "dense_mlp": ms - collective}
    return RankTotal(rank, f"GPU {rank}", ms, ms, ms - band / 2, ms + band / 2, collective, parts)


def test_straggler_rule_band_floors_and_the_step_bound() -> None:
    assert find_straggler([total(0, 1.00, band=0.2), total(1, 1.15, band=0.2)]) is None  # inside the band
    assert find_straggler([total(0, 1.000), total(1, 1.005)]) is None  # under the floors
    found = find_straggler([total(0, 1.00, band=0.05), total(1, 1.02, band=0.05), total(2, 2.40, band=0.9)])
    assert found is not None and found.label == "GPU 2"
    assert found.others_median_ms == pytest.approx(1.01)
    assert found.threshold_ms == pytest.approx(0.05)  # the others' band, not the straggler's own
    assert found.slowest_component == "dense MLP"
    assert "most in dense MLP (+1.39 ms)" in found.text
    ranks = [total(0, 1.0, collective=0.3), total(1, 1.4, collective=0.2)]
    assert step_bound_ms(ranks) == pytest.approx(1.2 + 0.3)
    spread = rank_spread(ranks, intervals=8)
    assert spread is not None and spread.spread_ms == pytest.approx(0.4)
    assert "step bound 1.5 ms (slowest rank at each of 8 all-reduces)" in spread.line()
    assert rank_spread([total(0, 1.0)], intervals=8) is None


TOPO = (
    "\tGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\n"
    "GPU0\t X \tNV18\t0-47\t0\t\tN/A\n"
    "GPU1\tNV18\t X \t48-95\t1\t\tN/A\n"
)


def env_with(snapshots: list[dict[str, object]], topology: str | None = None) -> Environment:
    return Environment(
        "h", "t", "3.11", "nccl", "cuda", 2, topology=topology, extra={"nvml_before": snapshots, "nvml_after": []}
    )


def test_likely_causes_from_the_recorded_environment() -> None:
    assert topology_numa(TOPO) == {0: 0, 1: 1}
    snaps: list[dict[str, object]] = [
        {
            "cuda_index": 0,
            "sm_clock_mhz": 1980,
            "clock_event_reasons": 0x1,
            "processes": [{"pid": 10, "name": "p"}],
            "pcie_gen": 5,
            "pcie_gen_max": 5,
            "pcie_width": 16,
            "pcie_width_max": 16,
            "gpu_util_pct": 3,
        },
        {
            "cuda_index": 1,
            "gpu_util_pct": 97,
            "sm_clock_mhz": 1400,
            "clock_event_reasons": 0x4,
            "processes": [{"pid": 11, "name": "p"}, {"pid": 99, "name": "gemm_loop"}],
            "pcie_gen": 3,
            "pcie_gen_max": 5,
            "pcie_width": 16,
            "pcie_width_max": 16,
        },
    ]
    causes = rank_causes([env_with(snaps, TOPO)], [0, 1], "cuda")
    assert not any("process" in c or "clock" in c or "PCIe" in c for c in causes.get(0, []))
    text = "; ".join(causes[1])
    assert (
        "another process on GPU 1: 2 compute processes there, 1 on the other GPUs (pids 11 (p), 99 (gemm_loop))" in text
    )
    assert "GPU 1 97 % busy before the probes while their ranks were idle (the other GPUs 3 %)" in text
    assert "SM clock on GPU 1 down to 1400 MHz" in text
    assert "clock-event reasons on GPU 1: SwPowerCap" in text
    assert "PCIe link of GPU 1 at Gen3 x16, below its maximum Gen5 x16" in text
    assert "GPU 1 is on NUMA node 1, the other GPUs on node 0" in text
    assert rank_causes([env_with(snaps)], [0, 1], "cpu") == {}
    idle = [{"cuda_index": i, "pcie_gen": 1, "pcie_gen_max": 5, "pcie_width": 16, "pcie_width_max": 16} for i in (0, 1)]
    assert rank_causes([env_with(list(idle))], [0, 1], "cuda") == {}  # every idle link downshifts: no cause


def test_diff_names_a_straggler_that_appears_in_the_new_budget(tmp_path: Path) -> None:
    inv = tiny_inventory(tmp_path)
    t = MeasuredTime(0.01, 0.009, 0.011)
    b = compose_budget(inv, {op.key.key_id: t for op in inv.ops}, launch_mode="eager")
    clean = b.to_dict()
    slow = rank_spread(
        [total(0, 1.0, band=0.02), total(1, 3.4, band=0.5)], intervals=5, causes={1: ["another process on GPU 1"]}
    )
    assert slow is not None
    new = {**clean, "ranks": slow.to_dict()}
    assert straggler_in(new) == ("GPU 1", slow.straggler.text if slow.straggler else "")
    diff = diff_budgets(json.loads(json.dumps(clean)), json.loads(json.dumps(new)))
    text = format_budget_diff(diff, "clean.json")
    assert "straggler: GPU 1 (+2.4 ms" in text
    assert "likely: another process on GPU 1" in text
    assert diff.to_dict()["straggler"].startswith("straggler: GPU 1")
    back = format_budget_diff(diff_budgets(new, clean), "neighbour.json")
    assert "no straggler now (the baseline's was GPU 1)" in back
