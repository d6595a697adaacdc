"""Budget baseline diff: real budgets composed from an H200 plan run's measured times with planted slowdowns, the
two real H200 plan files, the significance rule on hand-built edges, and malformed files (one line, the file named)."""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from decodetop.budget.compose import Budget, Curve, MeasuredTime, compose_budget
from decodetop.budget.deployment import Deployment
from decodetop.budget.diff import (
    NOISE_FLOOR_MS,
    RELATIVE_FLOOR,
    diff_budget_files,
    diff_budgets,
    find_budget,
    format_budget_diff,
    load_budget_document,
    moved_most_line,
)
from decodetop.budget.inventory import build_inventory
from decodetop.budget.spec import load_preset
from decodetop.errors import UserInputError

RESULTS = (
    Path(__file__).resolve().parents[1] / "fixtures" / "budgets"
)  # copies of benchmarks/results/plan_* (15:47 UTC)
PLAN_X1 = RESULTS / "plan_llama-3.1-70b-tp2-h200x1.json"
"""Llama-3.1-70B TP 2 plan on 1 × H200: the all-reduce needs 2 ranks, so communication is missing."""
PLAN_X2 = RESULTS / "plan_llama-3.1-70b-tp2-h200x2.json"
"""The same plan on 2 × H200 over NVLink: every component measured."""


def _plan_doc() -> dict[str, Any]:
    return json.loads(PLAN_X2.read_text())  # type: ignore[no-any-return]


def compose_h200x2(
    mode: str = "graph", scale: Callable[[str], float] = lambda key: 1.0, shift: Callable[[str], float] = lambda k: 0.0
) -> Budget:
    """Llama-3.1-70B TP 2 composed from the 2 × H200 run's measured times; `scale` multiplies a key's times (a
    planted slowdown), `shift` moves its median by a fraction of its own p10–p90 spread (noise)."""
    doc = _plan_doc()
    measured = {}
    for key, t in doc["measured"].items():
        k = scale(key)
        median = t["median_ms"] + shift(key) * (t["p90_ms"] - t["p10_ms"])
        measured[key] = MeasuredTime(median * k, t["p10_ms"] * k, t["p90_ms"] * k, t["source"])
    ar_scale = scale("allreduce:curve")
    curves = {c: Curve(tuple((x, y * ar_scale) for x, y in pts)) for c, pts in doc["allreduce_curves"].items()}
    gemm = {c: Curve(tuple((x, y) for x, y in pts)) for c, pts in doc["gemm_curves"].items()}
    inventory = build_inventory(load_preset("llama-3.1-70b"), Deployment(tp=2, launch_mode=mode))
    return compose_budget(inventory, measured, allreduce_curves=curves, gemm_curves=gemm, launch_mode=mode)


def test_composed_budget_matches_the_plan_file() -> None:
    """The fixture really is the H200 run: composing its measured times gives the file's budget, less what the
    inventory counts differently since the file was written: rotary is one op with the KV-cache write now (the
    kvcast key's time), so each layer's rotary norm op and its launch are gone."""
    doc = _plan_doc()
    file_segments = {s["component"]: s["ms"] for s in doc["budget"]["segments"]}
    layers = 80
    rotary = next(t["median_ms"] for k, t in doc["measured"].items() if k.startswith("norms:op=rotary"))
    per_launch = doc["measured"][f"launch:mode=graph,kernels={doc['budget']['kernels']}"]["median_ms"]
    file_segments["norms"] -= layers * rotary
    file_segments["launch"] -= layers * per_launch
    budget = compose_h200x2()
    assert budget.kernels == doc["budget"]["kernels"] - layers
    assert {s.component: s.ms for s in budget.segments} == pytest.approx(file_segments)


# --------------------------------------------------------------------------------------------- planted slowdowns


def test_whole_cache_cast_in_attention_moves_attention() -> None:
    clean = compose_h200x2()
    planted = compose_h200x2(scale=lambda key: 1.6 if key.startswith("attention:") else 1.0)
    diff = diff_budgets(clean.to_dict(), planted.to_dict())
    assert diff.moved_most is not None and diff.moved_most.component == "attention"
    assert [d.component for d in diff.moved] == ["attention"]
    att = diff.moved_most
    before, after = clean.segment("attention"), planted.segment("attention")
    assert before is not None and after is not None and before.ms is not None and after.ms is not None
    assert att.delta_ms == pytest.approx(after.ms - before.ms)
    assert att.ratio is not None and att.ratio > 1.3
    assert diff.components[0] is att  # sorted by Δ, largest first
    assert diff.notes == ()


def test_launch_blocking_moves_launch_in_eager_mode() -> None:
    clean = compose_h200x2("eager")
    planted = compose_h200x2("eager", scale=lambda key: 1.7 if key.startswith("launch:") else 1.0)
    diff = diff_budgets(clean.to_dict(), planted.to_dict())
    assert diff.moved_most is not None and diff.moved_most.component == "launch"
    seg = planted.segment("launch")
    assert seg is not None and seg.p10_ms is not None and seg.p90_ms is not None
    assert diff.moved_most.noise_ms == pytest.approx(seg.p90_ms - seg.p10_ms)  # the eager op's spread, scaled up
    assert "moved most: kernel launch overhead (+" in moved_most_line(diff)


def test_slower_all_reduce_protocol_moves_communication() -> None:
    clean = compose_h200x2()
    planted = compose_h200x2(scale=lambda key: 1.5 if key.startswith("allreduce:") else 1.0)
    diff = diff_budgets(clean.to_dict(), planted.to_dict())
    assert diff.moved_most is not None and diff.moved_most.component == "communication"
    assert [d.component for d in diff.moved] == ["communication"]
    assert diff.total_delta_ms == pytest.approx(planted.total_ms - clean.total_ms)


def test_noise_inside_the_spread_moves_nothing() -> None:
    clean = compose_h200x2()
    noisy = compose_h200x2(shift=lambda key: 0.9)  # every measured median 90 % of its own spread up
    diff = diff_budgets(clean.to_dict(), noisy.to_dict())
    assert diff.moved == () and diff.moved_most is None
    # the spread is what holds them back: some moves clear both floors
    beyond_floors = [
        d
        for d in diff.components
        if d.delta_ms is not None
        and d.baseline_ms is not None
        and d.delta_ms > max(NOISE_FLOOR_MS, RELATIVE_FLOOR * d.baseline_ms)
    ]
    assert beyond_floors, [(d.component, d.delta_ms) for d in diff.components]
    assert moved_most_line(diff) == "no component moved beyond its noise"


def test_same_budget_twice_moves_nothing_and_documents_are_accepted_whole() -> None:
    doc = _plan_doc()
    diff = diff_budgets(doc, doc["budget"])  # the plan-run document and its bare budget
    assert diff.moved == ()
    assert all(d.delta_ms == 0 and d.change == "changed" for d in diff.components)
    assert diff.total_before_ms == diff.total_after_ms == doc["budget"]["total_ms"]
    assert find_budget(doc, "x") is doc["budget"]
    assert find_budget(doc["budget"], "x") is doc["budget"]


# --------------------------------------------------------------------------------------------- real files


def test_real_h200_plan_files_one_gpu_vs_two() -> None:
    diff = diff_budget_files(PLAN_X1, PLAN_X2)
    comm = diff.component("communication")
    assert comm is not None and comm.change == "unknown" and comm.delta_ms is None and not comm.significant
    assert comm.baseline_status == "missing" and comm.current_ms == pytest.approx(1.9209328)
    assert diff.components[-1] is comm  # unknown Δ sorts last
    dense = diff.component("dense_mlp")
    assert dense is not None and dense.significant and dense.delta_ms == pytest.approx(13.9507197 - 14.9830396)
    assert diff.moved_most is None  # nothing got slower beyond its noise
    lm_head = diff.component("lm_head")
    assert lm_head is not None and not lm_head.significant  # +0.0077 ms: inside the floor
    assert diff.total_before_ms == pytest.approx(23.4349006) and diff.total_after_ms == pytest.approx(24.2659973)
    assert not diff.complete_before and diff.complete_after
    assert any("baseline misses data for all-reduce" in n for n in diff.notes)
    text = format_budget_diff(diff, str(PLAN_X1))
    assert text.startswith(f"vs baseline {PLAN_X1} (Llama-3.1-70B)")
    assert "total (≥, incomplete)" in text and "data missing" in text
    assert text.rstrip().endswith("no component got slower beyond its noise (faster: dense MLP)")
    json.dumps(diff.to_dict(), allow_nan=False)

    back = diff_budget_files(PLAN_X2, PLAN_X1)
    assert back.moved_most is not None and back.moved_most.component == "dense_mlp"
    assert "moved most: dense MLP (+1.03 ms, ×1.1)" in format_budget_diff(back, "b")


DIAGNOSIS = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "diagnosis" / "plans_h200x2"
"""The latest recorded diagnosis plans (any run must point at the planted component)."""
"""The diagnosis plants on 2 × H200 (Llama-3.1-70B, 4 layers, TP 2): a clean plan and one plan per plant."""


@pytest.mark.parametrize(
    ("clean", "planted", "expected"),
    [
        ("diagnosis_clean.plan.json", "diagnosis_kv_whole_cast.plan.json", "attention"),
        ("diagnosis_clean.plan.json", "diagnosis_nccl_simple_ring.plan.json", "communication"),
        ("diagnosis_clean.eager.plan.json", "diagnosis_launch_blocking.eager.plan.json", "launch"),
    ],
    ids=["kv_whole_cast", "nccl_simple_ring", "launch_blocking"],
)
def test_recorded_plants_on_two_h200_point_at_the_right_component(clean: str, planted: str, expected: str) -> None:
    diff = diff_budget_files(DIAGNOSIS / clean, DIAGNOSIS / planted)
    assert diff.moved_most is not None and diff.moved_most.component == expected, diff.to_dict()
    assert diff.notes == ()


# --------------------------------------------------------------------------------------------- hand-built edges


def _seg(component: str, ms: float | None, spread: float = 0.0, status: str = "measured") -> dict[str, Any]:
    half = spread / 2
    return {
        "component": component,
        "ms": ms,
        "p10_ms": None if ms is None else ms - half,
        "p90_ms": None if ms is None else ms + half,
        "status": status,
    }


def _budget(*segments: dict[str, Any], model: str = "m", deployment: str = "TP 2") -> dict[str, Any]:
    return {
        "model": model,
        "deployment": deployment,
        "segments": list(segments),
        "total_ms": sum(s["ms"] or 0.0 for s in segments),
    }


def _one(before: dict[str, Any], after: dict[str, Any]) -> Any:
    return diff_budgets(_budget(before), _budget(after)).components[0]


def test_a_move_must_clear_both_spreads() -> None:
    assert _one(_seg("norms", 1.0, 0.2), _seg("norms", 1.25, 0.2)).significant
    assert not _one(_seg("norms", 1.0, 0.2), _seg("norms", 1.15, 0.2)).significant
    wide_now = _one(_seg("norms", 1.0, 0.2), _seg("norms", 1.3, 0.5))
    assert not wide_now.significant and wide_now.noise_ms == pytest.approx(0.5)
    down = _one(_seg("norms", 1.0, 0.2), _seg("norms", 0.7, 0.2))
    assert down.significant and down.delta_ms == pytest.approx(-0.3)


def test_point_figures_need_to_clear_the_floors() -> None:
    assert not _one(_seg("launch", 0.1), _seg("launch", 0.105)).significant  # under the absolute floor
    assert _one(_seg("launch", 0.1), _seg("launch", 0.12)).significant
    assert not _one(_seg("launch", 10.0), _seg("launch", 10.2)).significant  # 2 % < the relative floor
    assert _one(_seg("launch", 10.0), _seg("launch", 10.4)).significant


def test_added_and_removed_components_count() -> None:
    before = _budget(_seg("attention", 1.0, 0.1), _seg("routing", 0.5, 0.05))
    after = _budget(_seg("attention", 1.0, 0.1), _seg("routed_experts", 2.0, 0.1))
    diff = diff_budgets(before, after)
    added, removed = diff.component("routed_experts"), diff.component("routing")
    assert added is not None and added.change == "added" and added.delta_ms == 2.0 and added.significant
    assert added.baseline_status == "absent" and added.ratio is None
    assert removed is not None and removed.change == "removed" and removed.delta_ms == -0.5 and removed.significant
    assert diff.moved_most is added
    assert [d.component for d in diff.components] == ["routed_experts", "attention", "routing"]
    assert "moved most: routed experts (+2 ms, added)" in format_budget_diff(diff, "old.json")


def test_an_estimate_against_a_measurement_never_counts() -> None:
    d = _one(_seg("attention", 1.0, status="estimated"), _seg("attention", 3.0, 0.1))
    assert d.change == "estimate" and d.delta_ms == pytest.approx(2.0) and not d.significant
    d = _one(_seg("attention", 1.0, status="estimated"), _seg("attention", 3.0, status="estimated"))
    assert d.change == "changed" and d.significant  # two estimates compare
    d = _one(_seg("attention", 1.0, 0.1, status="interpolated"), _seg("attention", 3.0, 0.1))
    assert d.change == "changed" and d.significant  # interpolated between measured points is a measurement


@pytest.mark.parametrize("status", ["extrapolated", "transferred"])
def test_a_curve_prediction_diffs_and_counts_only_against_its_own_kind(status: str) -> None:
    """A what-if budget (`budget --results` at another scenario) holds predicted segments: the diff reads them, a
    prediction against a measurement says how far it was off without counting, two predictions compare."""
    d = _one(_seg("attention", 1.0, status=status), _seg("attention", 3.0, 0.1))
    assert d.change == "estimate" and d.delta_ms == pytest.approx(2.0) and not d.significant
    d = _one(_seg("attention", 1.0, status=status), _seg("attention", 3.0, status="transferred"))
    assert d.change == "changed" and d.significant


def test_missing_data_has_no_delta() -> None:
    diff = diff_budgets(
        _budget(_seg("attention", 1.0), _seg("communication", 0.4)),
        _budget(_seg("attention", 1.0), _seg("communication", None, status="missing")),
    )
    comm = diff.component("communication")
    assert comm is not None and comm.change == "unknown" and comm.delta_ms is None and not comm.significant
    assert not diff.complete_after and any("current budget misses data" in n for n in diff.notes)


@pytest.mark.parametrize(
    ("before", "after", "differs"),
    [
        (
            {"model": "Llama-3.1-70B", "deployment": "TP 2, EP 1"},
            {"model": "GLM-5", "deployment": "TP 8, EP 1"},
            ("model Llama-3.1-70B vs GLM-5", "TP 2 vs 8"),
        ),
        ({"deployment": "TP 2, EP 1, batch 1"}, {"deployment": "TP 4, EP 1, batch 1"}, ("TP 2 vs 4",)),
        (
            {"device_kind": "cpu", "hardware": "n/a on CPU"},
            {"device_kind": "cuda", "hardware": "NVIDIA H200 141GB (--gpu)"},
            ("device kind cpu vs cuda", "hardware n/a on CPU vs NVIDIA H200 141GB"),
        ),
        (
            {"device_kind": "cuda", "hardware": "NVIDIA H200 141GB (the probe results' GPU)"},
            {"device_kind": "cuda", "hardware": "NVIDIA H100 SXM5 80GB (--gpu)"},
            ("hardware NVIDIA H200 141GB vs NVIDIA H100 SXM5 80GB",),
        ),
    ],
    ids=["model-and-tp", "tp", "cpu-vs-h200-roofline", "hardware"],
)
def test_budgets_of_other_models_tp_hardware_or_device_kinds_are_not_comparable(
    before: dict[str, str], after: dict[str, str], differs: tuple[str, ...]
) -> None:
    diff = diff_budgets(
        {**_budget(_seg("attention", 1.0), _seg("routing", 0.5)), **before},
        {**_budget(_seg("attention", 2.0), _seg("routed_experts", 3.0)), **after},
    )
    assert not diff.comparable and diff.not_comparable == differs
    assert diff.components == () and diff.moved_most is None and diff.moved == () and not diff.tail_moved
    text = format_budget_diff(diff, "b.json")
    assert (
        text == f"vs baseline b.json: not comparable: {'; '.join(differs)} (baseline vs now): a per-component "
        "diff needs the same model, TP, hardware and device kind\n"
    )
    assert "moved most" not in text and "routed experts" not in text
    data = diff.to_dict()
    assert data["comparable"] is False and data["not_comparable"] == list(differs) and data["moved_most"] is None


def test_the_same_gpu_chosen_two_ways_and_other_deployment_fields_still_compare() -> None:
    """How the GPU was chosen (NVML, --gpu, the results) is not the hardware; batch or context differences compare
    with a note; a field one file does not hold (an older file) is not judged."""
    diff = diff_budgets(
        {
            **_budget(_seg("attention", 1.0), deployment="TP 2, EP 1, batch 1, context 4096"),
            "device_kind": "cuda",
            "hardware": "NVIDIA H200 141GB (the probe results' GPU)",
        },
        {
            **_budget(_seg("attention", 2.0), deployment="TP 2, EP 1, batch 1, context 32768"),
            "hardware": "NVIDIA H200 141GB (--gpu)",
        },
    )
    assert diff.comparable and diff.moved_most is not None and diff.moved_most.component == "attention"
    assert diff.notes == (
        "different deployments: baseline TP 2, EP 1, batch 1, context 4096, now TP 2, EP 1, batch 1, context 32768",
    )


# --------------------------------------------------------------------------------------------- malformed input


def _good() -> dict[str, Any]:
    return _budget(_seg("attention", 1.0, 0.1), _seg("launch", 0.5))


@pytest.mark.parametrize(
    ("mutate", "needle"),
    [
        (lambda d: d.pop("segments"), "no budget in this file"),
        (lambda d: d.update(segments="x"), "budget 'segments' is str, not a list"),
        (lambda d: d.update(segments=[]), "the budget has no segments"),
        (lambda d: d["segments"].append(3), "budget segment 3 is int, not an object"),
        (lambda d: d["segments"][0].pop("component"), "budget segment 1: 'component' is None"),
        (
            lambda d: d["segments"][0].update(ms="fast"),
            "budget segment 'attention': 'ms' is 'fast', not a number from 0 to",
        ),
        (lambda d: d["segments"][0].update(ms=-1.0), "'ms' is -1.0, not a number from 0 to 3,600,000 ms"),
        (lambda d: d["segments"][0].update(ms=math.nan), "'ms' is nan"),
        (lambda d: d["segments"][0].update(p90_ms=True), "'p90_ms' is True"),
        (lambda d: d["segments"][0].update(status="great"), "'status' is 'great' (known: measured, interp"),
        (lambda d: d["segments"][0].update(ms=None), "'ms' is null but the status is 'measured'"),
        (lambda d: d["segments"].append(_seg("launch", 1.0)), "budget segment 'launch' appears twice"),
        (lambda d: d.update(total_ms="1"), "budget 'total_ms' is '1'"),
        (lambda d: d.update(model=3), "budget 'model' is 3, not a string"),
        (lambda d: d.update(complete="yes"), "budget 'complete' is 'yes', not true or false"),
    ],
)
def test_malformed_budgets_are_one_line_errors(mutate: Callable[[dict[str, Any]], object], needle: str) -> None:
    bad = copy.deepcopy(_good())
    mutate(bad)
    with pytest.raises(UserInputError) as info:
        diff_budgets(_good(), bad, current_name="new.json")
    message = str(info.value)
    assert message.startswith("new.json: ") and needle in message and "\n" not in message


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        ("", "not JSON: Expecting value (line 1, column 1)"),
        ('{"budget": ', "not JSON"),
        ("[1, 2]", "expected a JSON object with a budget, got list"),
        ('{"budget": 3}', "'budget' is int, not an object"),
        ('{"decodetop_probe_results": 1, "results": []}', "probe results without a budget"),
        ('{"hello": 1}', "no budget in this file"),
        (b"\xff\xfe\x00", "cannot read"),
    ],
)
def test_malformed_files_name_the_file(tmp_path: Path, content: str | bytes, needle: str) -> None:
    path = tmp_path / "old.json"
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    with pytest.raises(UserInputError) as info:
        diff_budget_files(path, PLAN_X2)
    message = str(info.value)
    assert message.startswith(f"{path}: ") and needle in message and "\n" not in message


def test_unreadable_paths(tmp_path: Path) -> None:
    with pytest.raises(UserInputError, match=r"nope\.json: cannot read: No such file or directory"):
        load_budget_document(tmp_path / "nope.json")
    with pytest.raises(UserInputError, match="cannot read: Is a directory"):
        load_budget_document(tmp_path)


PLANTS_H200 = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "engine" / "plants_h200x1"
"""Plan runs on one H200 (Llama-3.1-70B, 4 layers, TP 1): two clean runs and a GEMM loop from another process on
the same GPU (benchmarks/engine/plants.sh with PLANT_GPU=0)."""


@pytest.mark.parametrize("run", ["gemm_neighbour_1", "gemm_neighbour_2"])
def test_a_time_sliced_gpu_moves_the_tail_while_the_medians_hold(run: str) -> None:
    diff = diff_budget_files(PLANTS_H200 / "clean1.json", PLANTS_H200 / f"{run}.json")
    assert diff.moved_most is None  # the medians held
    assert diff.tail_moved
    assert diff.mean_after_ms is not None and diff.mean_before_ms is not None
    assert diff.mean_after_ms > 1.5 * diff.mean_before_ms
    assert "the tail moved: mean step" in format_budget_diff(diff, "clean1.json")
    assert diff.to_dict()["tail_moved"] is True


def test_two_clean_runs_move_no_tail() -> None:
    diff = diff_budget_files(PLANTS_H200 / "clean1.json", PLANTS_H200 / "clean2.json")
    assert not diff.tail_moved
    assert "tail" not in format_budget_diff(diff, "clean1.json")


def test_budgets_without_means_never_claim_a_tail() -> None:
    doc = json.loads((PLANTS_H200 / "gemm_neighbour_1.json").read_text(encoding="utf-8"))
    doc["budget"].pop("mean_total_ms")
    diff = diff_budgets(json.loads((PLANTS_H200 / "clean1.json").read_text(encoding="utf-8")), doc)
    assert not diff.tail_moved and diff.mean_after_ms is None


# --------------------------------------------------------------------------------------------- all-reduce path


def _with_path(ms: float, path: str, path_text: str) -> dict[str, Any]:
    return _budget(_seg("attention", 1.0), {**_seg("communication", ms), "path": path, "path_text": path_text})


NCCL_TEXT = "NCCL assumed: custom all-reduce cannot run here (NCCL_P2P_DISABLE=1 is set)"
CUSTOM_TEXT = "custom one-shot ≤ 1 MiB, NCCL above (vLLM at TP 2 over NVLink: custom all-reduce below 8 MiB)"


def test_a_changed_all_reduce_path_is_said_under_the_moved_most_line() -> None:
    diff = diff_budgets(_with_path(0.5, "NCCL", NCCL_TEXT), _with_path(0.2, "custom one-shot", CUSTOM_TEXT))
    lines = format_budget_diff(diff, "old.json").splitlines()
    most = next(i for i, line in enumerate(lines) if line == moved_most_line(diff))
    assert lines[most + 1] == "all-reduce path: NCCL assumed → custom one-shot ≤ 1 MiB, NCCL above"
    data = diff.to_dict()
    assert data["allreduce_path_before"] == "NCCL assumed"
    assert data["allreduce_path_after"] == "custom one-shot ≤ 1 MiB, NCCL above"
    assert data["allreduce_path_changed"] is True


def test_the_same_path_or_an_older_file_says_nothing_of_the_path() -> None:
    same = diff_budgets(_with_path(0.5, "NCCL", NCCL_TEXT), _with_path(0.6, "NCCL", NCCL_TEXT))
    assert "all-reduce path" not in format_budget_diff(same, "old.json")
    assert same.to_dict()["allreduce_path_before"] == "NCCL assumed"
    assert same.to_dict()["allreduce_path_changed"] is False
    older = _budget(_seg("attention", 1.0), _seg("communication", 0.5))  # written before segments named a path
    diff = diff_budgets(older, _with_path(0.2, "custom one-shot", CUSTOM_TEXT))
    assert "all-reduce path" not in format_budget_diff(diff, "old.json")
    assert diff.to_dict()["allreduce_path_before"] is None and diff.to_dict()["allreduce_path_changed"] is False


def test_a_path_that_is_not_a_string_is_a_one_line_error() -> None:
    bad = _budget({**_seg("communication", 0.5), "path": 3})
    with pytest.raises(UserInputError, match="'communication': 'path' is 3, not a string"):
        diff_budgets(bad, _with_path(0.2, "custom one-shot", CUSTOM_TEXT))


def test_the_current_runs_neighbour_is_named_under_the_diff() -> None:
    """A budget measured beside another process carries it (`Budget.contention`); the diff names it after the moves,
    in the text and the JSON; a clean file says nothing."""
    from decodetop.budget.contention import Contention, GpuNeighbour

    neighbour = Contention((GpuNeighbour(0, 1306, "python3", 97, ("gemm",)),))
    before = {**_budget(_seg("dense_mlp", 1.45, 0.02)), "mean_total_ms": 2.45}
    after = {**_budget(_seg("dense_mlp", 1.46, 0.02)), "mean_total_ms": 5.09, "contention": neighbour.to_dict()}
    diff = diff_budgets(before, after)
    text = format_budget_diff(diff, "clean.json")
    assert diff.likely_cause == neighbour.line() and text.rstrip().endswith(neighbour.line())
    assert "pid 1306 (python3, 97 % SM during the run)" in text
    assert diff.to_dict()["likely_cause"] == neighbour.line()
    assert (
        diff_budgets(before, before).likely_cause == ""
        and diff_budgets(before, before).to_dict()["likely_cause"] is None
    )
