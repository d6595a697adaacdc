"""A neighbour on the probed GPU named on every surface, on a CPU: the H200 plan run recorded beside a GEMM loop from
another process (benchmarks/results/engine/plants_h200x1/gemm_neighbour_1.json) with its NVML snapshots taken again
through a fake NVML whose process list holds one of the probe's ranks and a real neighbour process (its pid and name
as psutil gives them), plus a whole-layer check; composed by the pipeline into the `budget --results` text and JSON,
the `probe --budget` text with its layer check, and `budget --diff` against the same run without the neighbour."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from decodetop.budget.plan import build_plan
from decodetop.budget.scenario import build_scenario, choose_tp, model_source
from decodetop.cli import main
from decodetop.collectors.fake_nvml import fake_nvml, load_recording, ok
from decodetop.pipeline.composition import compose
from decodetop.pipeline.context import BudgetContext
from decodetop.pipeline.plan_report import format_budget, plan_run_to_dict
from decodetop.pipeline.plan_runner import PlanRun
from decodetop.probes import gpuinfo
from decodetop.probes.results import Measurement, MeasurementStatus, ProbeResult, ProbeStatus, load_results

RUN = Path(__file__).resolve().parents[2] / "benchmarks/results/engine/plants_h200x1/gemm_neighbour_1.json"
RANK = 613
"""The probe rank's pid in that run (NVML listed it beside the neighbour)."""
STARTED_US = 1_764_590_000_000_000
"""When each probe started, µs since the epoch (NVML's clock): the after snapshot reads the samples since then."""


@pytest.fixture(scope="module")
def neighbour() -> Iterator[tuple[int, str]]:
    """A real process standing in for the GEMM loop: its pid and its name as psutil reads it."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    try:
        yield proc.pid, psutil.Process(proc.pid).name()
    finally:
        proc.kill()
        proc.wait()


def _snapshots(pids: list[int], since_us: int) -> list[dict[str, Any]]:
    """GPU 0 as the fake NVML shows it: those compute processes, the neighbour near 97 % SM, the rank at 30 %; the
    GPU fully busy with a neighbour, idle without one (before a probe the ranks wait)."""
    procs = [{"pid": pid, "usedGpuMemory": 1 << 30} for pid in pids]
    samples = [{"pid": pid, "timeStamp": since_us + 1, "smUtil": 30 if pid == RANK else 97} for pid in pids]
    busy = 100 if len(pids) > 1 else 0
    recording = load_recording("h200x1-load").with_calls(
        {
            "nvmlDeviceGetComputeRunningProcesses(gpu0)": ok(procs),
            f"nvmlDeviceGetProcessUtilization(gpu0,{since_us})": ok(samples),
            "nvmlDeviceGetUtilizationRates(gpu0)": ok({"gpu": busy, "memory": busy}),
        }
    )
    gpu = gpuinfo.GpuInfo(0, 0, "NVIDIA H200", "GPU-aaaa", 141 << 30, 2 << 30)
    return gpuinfo.clock_snapshot([gpu], nvml=fake_nvml(recording), since_us=since_us)


def _layer_check(env: Any) -> ProbeResult:
    """The `layer` probe's verdict as the H200 gave it beside the neighbour (docs: 'parts 447 µs vs layer 1093 µs')."""
    check = Measurement(
        name="dense layer composition error (graph)",
        params={"what": "composition", "layer": "dense", "mode": "graph", "role": "composition", "device": "cuda"},
        unit="us",
        status=MeasurementStatus.OK,
        metrics={"sum_parts_us": 447.0, "layer_us": 1093.0, "error_pct": -59.1},
    )
    return ProbeResult(probe="layer", status=ProbeStatus.OK, params={}, environment=env, measurements=(check,))


def _results(tmp_path: Path, name: str, pids: list[int]) -> Path:
    """The recorded run with its snapshots re-taken through the fake NVML (GPU 0 holding `pids`) and the probe's own
    rank recorded, written as a results file."""
    doc = json.loads(RUN.read_text())
    for res in doc["results"]:
        extra = res["environment"]["extra"]
        extra["nvml_before"] = _snapshots(pids, 0)
        extra["nvml_after"] = _snapshots(pids, STARTED_US)
        extra["probe_pids"] = [RANK]
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(doc))
    return path


def test_budget_text_json_and_diff_name_the_neighbour(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], neighbour: tuple[int, str]
) -> None:
    pid, name = neighbour
    said = (
        f"likely cause: another process on the probed GPU — GPU 0: pid {pid} ({name}, 97 % SM during the run): its "
        "context time-slices with the probes', so tails, eager all-reduces and whole-layer timings include its work"
    )
    shared = _results(tmp_path, "shared", [RANK, pid])
    clean = _results(tmp_path, "clean", [RANK])
    argv = ["budget", "--model", "llama-3.1-70b", "--tp", "1"]
    assert main([*argv, "--results", str(shared)]) == 0
    assert said in [line.strip() for line in capsys.readouterr().out.splitlines()]
    assert main([*argv, "--results", str(shared), "--json"]) == 0
    after = json.loads(capsys.readouterr().out)
    assert after["budget"]["contention"]["neighbours"] == [
        {"gpu": 0, "pid": pid, "name": name, "sm_util_pct": 97, "probes": ["launch", "gemm", "norms"]}
    ]
    assert after["budget"]["contention"]["line"] == said
    assert main([*argv, "--results", str(clean), "--json"]) == 0
    before = json.loads(capsys.readouterr().out)
    assert before["budget"]["contention"] is None  # the probe's own rank is nobody's neighbour
    (tmp_path / "before.json").write_text(json.dumps(before))
    (tmp_path / "after.json").write_text(json.dumps(after))
    assert main(["budget", "--diff", str(tmp_path / "before.json"), str(tmp_path / "after.json")]) == 0
    assert capsys.readouterr().out.rstrip().splitlines()[-1] == said


def test_probe_budget_text_names_it_and_the_layer_check_says_contention(
    tmp_path: Path, neighbour: tuple[int, str]
) -> None:
    """`probe --budget` prints the plan run's budget and its layer check: beside a neighbour a −59 % layer error
    is contention, not a figure; the JSON keeps the figure and says the same."""
    pid, name = neighbour
    results = list(load_results(_results(tmp_path, "shared", [RANK, pid])))
    results.append(_layer_check(results[0].environment))
    scenario = build_scenario(model_source("llama-3.1-70b", None), choose_tp(1))
    composition = compose(BudgetContext(scenario, results=results))
    run = PlanRun(plan=build_plan(scenario.inventory()), requests=(), results=tuple(results), composition=composition)
    text = format_budget(run)
    assert f"likely cause: another process on the probed GPU — GPU 0: pid {pid} ({name}, 97 % SM" in text
    assert (
        f"dense layer [graph]: parts 447 µs vs layer 1093 µs → error contention (pid {pid} ({name}) on GPU 0), not a "
        "composition figure" in text
    )
    (layer,) = plan_run_to_dict(run)["layers"]
    assert layer["error_pct"] == -59.1 and layer["error_text"].startswith(f"contention (pid {pid} ")
