"""CPU parts of the engine-kernel benchmarks (benchmarks/engine/*): the shapes they compare at, their verdicts and
tables, the neighbours' core lists. No timing assertions: the figures only mean something on the GPU machine."""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path
from typing import Any

import pytest

ENGINE = Path(__file__).resolve().parents[2] / "benchmarks" / "engine"
sys.path.insert(0, str(ENGINE))

allreduce_oneshot: Any = importlib.import_module("allreduce_oneshot")
moe_routed: Any = importlib.import_module("moe_routed")
neighbour: Any = importlib.import_module("neighbour")


def test_oneshot_rows_judge_each_size_within_15_percent() -> None:
    probe = {"8": 6.5, "1024": 7.0, "16384": 9.0}
    independent = {"8": 6.2, "1024": 6.3, "16384": 6.6}
    rows = allreduce_oneshot.compare(probe, independent, (8, 1024, 16384, 131072))
    assert [r["within"] for r in rows] == [True, True, False, None]
    assert rows[0]["ratio"] == pytest.approx(6.5 / 6.2)
    text = allreduce_oneshot.table(rows, "why not")
    assert "| 16384 B | 9.00 | 6.60 | 1.364 | NO |" in text
    assert "| 131072 B | — | — | — | — |" in text
    assert text.endswith("why not")


def test_oneshot_sizes_span_the_acceptance_range() -> None:
    assert min(allreduce_oneshot.SIZES) == 8 and max(allreduce_oneshot.SIZES) == 1024 * 1024


@pytest.mark.parametrize(
    ("model", "experts", "top_k", "hidden", "inter", "moe_layers"),
    [
        ("mixtral-8x7b", 8, 2, 4096, 7168, 4),  # 14336 / TP 2
        ("qwen3-235b-a22b", 128, 8, 4096, 768, 4),  # 1536 / TP 2
        ("deepseek-v3", 256, 8, 7168, 1024, 3),  # 2048 / TP 2; layer 0 is dense
    ],
)
def test_moe_shapes_are_the_models_at_tp_2(
    model: str, experts: int, top_k: int, hidden: int, inter: int, moe_layers: int
) -> None:
    shape = moe_routed.moe_shape(model)
    assert (shape["experts"], shape["top_k"], shape["hidden"], shape["intermediate"]) == (experts, top_k, hidden, inter)
    assert shape["moe_layers"] == moe_layers
    assert shape["key"].startswith("moe:tokens=1,")


def test_moe_rows_and_table() -> None:
    shapes = [moe_routed.moe_shape("qwen3-235b-a22b")]
    ours = {"qwen3-235b-a22b": {"segment_ms": 0.33, "variants_us": {"grouped": 185.0, "fused": 80.0, "loop": "n/a"}}}
    ind = {"qwen3-235b-a22b": {"ms": 0.31}}
    rows = moe_routed.rows_for(shapes, ours, ind)
    assert rows[0]["within"] is True and rows[0]["ratio"] == pytest.approx(0.33 / 0.31)
    text = moe_routed.table(rows)
    assert "| qwen3-235b-a22b | 128 experts, top 8, 4096×768 | 0.330 | 0.310 | 1.065 | yes |" in text
    assert "fused 80" in text and "loop n/a" in text


def test_independent_experts_say_why_without_a_gpu() -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is here: the benchmark itself runs it")
    got = moe_routed.independent_experts(moe_routed.moe_shape("mixtral-8x7b", tiny=True))
    assert "CUDA" in got["error"]


def test_cpulist_and_bus_ids() -> None:
    assert neighbour.parse_cpulist("0-3,8,10-11\n") == [0, 1, 2, 3, 8, 10, 11]
    assert neighbour.parse_cpulist("0-31") == list(range(32))
    with pytest.raises(ValueError):
        neighbour.parse_cpulist("5-2")
    assert neighbour.sysfs_bus_id("00000000:00:06.0") == "0000:00:06.0"
    assert neighbour.sysfs_bus_id("00000000:C1:00.0") == "0000:c1:00.0"
    with pytest.raises(ValueError):
        neighbour.sysfs_bus_id("garbage")


def test_numa_cpus_falls_back_to_this_process_affinity(tmp_path: Path) -> None:
    # No nvidia-smi or no sysfs entry: every core this process may run on (a VM exposes no NUMA placement).
    assert neighbour.numa_cpus(99, sys_root=tmp_path) == sorted(os.sched_getaffinity(0))


judge_plants: Any = importlib.import_module("judge_plants")


def _doc(nccl_16k_us: float, source: str) -> dict[str, Any]:
    ar_key = {"id": "allreduce:…", "params": {"collective": "all_reduce", "bytes": 16384, "ranks": 2, "dtype": "bf16"}}
    point = {
        "params": {"impl": "nccl", "mode": "graph", "size_bytes": 16384},
        "status": "ok",
        "metrics": {"time_us": nccl_16k_us},
    }
    return {
        "plan": {"probes": {"allreduce": [ar_key]}},
        "results": [{"probe": "allreduce", "measurements": [point]}],
        "budget": {"segments": [{"component": "communication", "sources": [source]}]},
    }


CUSTOM = "allreduce probe: custom one-shot 16 KiB–4 MiB (vLLM at TP 2 over NVLink: custom all-reduce below 8 MiB)"


def test_verdict_lines_and_expectations() -> None:
    text = "component  before\nall-reduce  0.1 0.3\nmoved most: all-reduce / all-to-all (+0.200 ms, ×3.0)\n"
    assert judge_plants.verdict(text) == "moved most: all-reduce / all-to-all (+0.200 ms, ×3.0)"
    assert judge_plants.expected("gemm_neighbour", 1) == "GPU 1"
    assert judge_plants.expected("nccl_p2p_disable", 1) == "all-reduce"
    assert judge_plants.expected("launch_blocking", 1) == "launch"
    with pytest.raises(ValueError):
        judge_plants.expected("nonsense", 1)


def test_a_custom_path_budget_is_immune_to_nccl_proto_and_the_probe_still_names_it() -> None:
    still = "no component moved beyond its noise"
    row = judge_plants.judge("nccl_proto_simple", 1, still, _doc(12.2, CUSTOM), _doc(19.0, CUSTOM))
    assert row["named"] is True and "immune" in row["why"] and "12.2 → 19.0" in row["why"]
    flat = judge_plants.judge("nccl_proto_simple", 1, still, _doc(12.2, CUSTOM), _doc(12.5, CUSTOM))
    assert flat["named"] is False
    nccl = judge_plants.judge("nccl_proto_simple", 1, still, _doc(12.2, "allreduce probe"), _doc(19.0, "x"))
    assert nccl["named"] is False  # on the NCCL path the budget itself must name it
    assert judge_plants.step_sizes(_doc(1.0, "")) == [16384]


def test_a_straggler_verdict_names_the_neighbours_gpu() -> None:
    said = "straggler: GPU 1 (launch+sync 2421 µs vs 17 µs)\nmoved most: dense MLP (+0.3 ms, ×1.5)"
    row = judge_plants.judge("gemm_neighbour", 1, said, {}, {})
    assert row["named"] is True
    assert judge_plants.judge("gemm_neighbour", 0, said, {}, {})["named"] is False
