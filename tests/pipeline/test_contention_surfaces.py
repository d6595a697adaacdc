"""A neighbour on the probed GPU named on every surface, on a CPU, as the H200 run named it: the plan run recorded on
one H200 beside a GEMM loop from another process (benchmarks/engine/neighbour_named.sh; its files in
benchmarks/results/engine/neighbour_named_h200x1/) with every NVML snapshot taken again through the fake NVML — the
H200 recording's clocks and links, and each snapshot's compute processes, per-process SM samples and utilisation as
NVML gave them on the H200 — and the neighbour's pid moved to a real process named as it was (python3), so psutil
names it as it did there. Composed by the pipeline into the `budget --results` text and JSON, the `probe --budget`
text with its layer check, and `budget --diff` against the run without the neighbour: each says what the H200 run
said, with this pid for the H200's."""

from __future__ import annotations

import importlib
import json
import os
import re
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
from decodetop.probes.results import load_results

ROOT = Path(__file__).resolve().parents[2]
RUN = ROOT / "benchmarks/results/engine/neighbour_named_h200x1"
H200_PID = 677
"""The GEMM loop's pid on the H200 (summary.txt)."""
STARTED_US = 1_764_590_000_000_000
"""When each probe started, µs since the epoch (NVML's clock): the after snapshot reads the samples since then."""


@pytest.fixture(scope="module")
def neighbour(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, str]]:
    """A real process standing in for the GEMM loop, started as `python3` (its name, as on the H200): its pid and
    its name as psutil reads it."""
    exe = tmp_path_factory.mktemp("bin") / "python3"
    exe.symlink_to(sys.executable)
    proc = subprocess.Popen([str(exe), "-c", "import time; time.sleep(300)"])
    try:
        yield proc.pid, psutil.Process(proc.pid).name()
    finally:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="module")
def config(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The run's model: Llama-3.1-70B with 4 layers (benchmarks/fidelity's reduced config, as the script wrote it)."""
    sys.path.insert(0, str(ROOT / "benchmarks" / "fidelity"))
    try:
        fidelity: Any = importlib.import_module("fidelity")
    finally:
        sys.path.remove(str(ROOT / "benchmarks" / "fidelity"))
    path = tmp_path_factory.mktemp("cfg") / "llama-3.1-70b-4l" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(fidelity.reduced_config("llama-3.1-70b", 4)))
    return path


def _retaken(row: dict[str, Any], pid: int, since_us: int) -> list[dict[str, Any]]:
    """One recorded GPU row taken again through the fake NVML: the H200 recording, with the row's processes, their
    SM samples and the GPU's utilisation as NVML gave them there (the neighbour at `pid`)."""
    procs = [{**p, "pid": pid if p["pid"] == H200_PID else p["pid"]} for p in row["processes"]]
    samples = [
        {"pid": p["pid"], "timeStamp": since_us + 1, "smUtil": p["sm_util_pct"]} for p in procs if "sm_util_pct" in p
    ]
    recording = load_recording("h200x1-load").with_calls(
        {
            "nvmlDeviceGetComputeRunningProcesses(gpu0)": ok(
                [{"pid": p["pid"], "usedGpuMemory": p["used_memory_bytes"]} for p in procs]
            ),
            f"nvmlDeviceGetProcessUtilization(gpu0,{since_us})": ok(samples),
            "nvmlDeviceGetUtilizationRates(gpu0)": ok({"gpu": row["gpu_util_pct"], "memory": 0}),
        }
    )
    gpu = gpuinfo.GpuInfo(0, 0, "NVIDIA H200", "GPU-aaaa", 141 << 30, 2 << 30)
    return gpuinfo.clock_snapshot([gpu], nvml=fake_nvml(recording), since_us=since_us)


def _results(tmp_path: Path, name: str, pid: int) -> Path:
    """The H200 run `name` with its NVML snapshots taken again through the fake NVML, as a results file."""
    doc = json.loads((RUN / f"{name}.json").read_text())
    for res in doc["results"]:
        extra = res["environment"]["extra"]
        (before,) = extra["nvml_before"]
        (after,) = extra["nvml_after"]
        extra["nvml_before"] = _retaken(before, pid, 0)
        extra["nvml_after"] = _retaken(after, pid, STARTED_US)
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(doc))
    return path


def _said_on_the_h200(name: str, pid: int, marker: str) -> list[str]:
    """The lines of the H200 run's output `name` holding `marker`, with this pid for the H200's."""
    text = (RUN / name).read_text()
    return [line.replace(f"pid {H200_PID} ", f"pid {pid} ") for line in text.splitlines() if marker in line]


def test_budget_text_json_and_diff_name_the_neighbour(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], neighbour: tuple[int, str], config: Path
) -> None:
    pid, name = neighbour
    assert name == "python3"
    (said, *_) = _said_on_the_h200("neighbour.txt", pid, "likely cause:")
    shared = _results(tmp_path, "neighbour", pid)
    clean = _results(tmp_path, "clean", pid)
    argv = ["budget", "--config", str(config), "--tp", "1"]
    assert main([*argv, "--results", str(shared)]) == 0
    assert said in [line.strip() for line in capsys.readouterr().out.splitlines()]  # the budget's lines are indented
    assert main([*argv, "--results", str(shared), "--json"]) == 0
    after = json.loads(capsys.readouterr().out)
    h200 = json.loads((RUN / "neighbour.json").read_text())["budget"]["contention"]
    for found in h200["neighbours"]:
        found["pid"] = pid
    h200["line"] = said
    assert after["budget"]["contention"] == h200
    assert main([*argv, "--results", str(clean), "--json"]) == 0
    before = json.loads(capsys.readouterr().out)
    assert before["budget"]["contention"] is None  # the probe's own rank is nobody's neighbour
    (tmp_path / "before.json").write_text(json.dumps(before))
    (tmp_path / "after.json").write_text(json.dumps(after))
    assert main(["budget", "--diff", str(tmp_path / "before.json"), str(tmp_path / "after.json")]) == 0
    diff = capsys.readouterr().out.splitlines()
    h200_diff = (RUN / "diff.txt").read_text().splitlines()
    # The H200 printed this diff before the inventory counted rotary in the fused rope + KV write op, which moved the
    # norms, launch and attention figures of these results since: the table's components and every line after the
    # table (the verdict, the tail, the cause) are as it printed them; the figures follow today's inventory.
    expected = [line.replace(f"pid {H200_PID} ", f"pid {pid} ") for line in h200_diff[1:]]

    def verdict(lines: list[str]) -> tuple[list[str], list[str]]:
        end = next(i for i, line in enumerate(lines) if line.startswith("no component moved") or "moved beyond" in line)
        return sorted(line.split("  ")[0] for line in lines[2:end]), [re.sub(r"\d[\d.,]*", "#", x) for x in lines[end:]]

    assert verdict(diff[1:]) == verdict(expected)
    assert diff[-1] == said


def test_probe_budget_text_names_it_and_the_layer_check_says_contention(
    tmp_path: Path, neighbour: tuple[int, str], config: Path
) -> None:
    """`probe --budget` prints the plan run's budget and its layer check (the run's own `layer` results): beside a
    neighbour a −58 % layer error is contention, not a figure, as on the H200; the JSON keeps the figure."""
    pid, name = neighbour
    results = list(load_results(_results(tmp_path, "neighbour", pid)))
    scenario = build_scenario(model_source(None, str(config)), choose_tp(1))
    composition = compose(BudgetContext(scenario, results=results))
    run = PlanRun(plan=build_plan(scenario.inventory()), requests=(), results=tuple(results), composition=composition)
    lines = format_budget(run).splitlines()
    (said, *_) = _said_on_the_h200("neighbour.txt", pid, "likely cause:")
    (layer_line,) = _said_on_the_h200("neighbour.txt", pid, "dense layer [graph]: parts")
    assert said in lines and layer_line in lines
    assert layer_line == (
        f"  dense layer [graph]: parts 462 µs vs layer 1113 µs → error contention (pid {pid} ({name}) on GPU 0), not a "
        "composition figure, eager 1133 µs"
    )
    (layer,) = plan_run_to_dict(run)["layers"]
    assert layer["error_pct"] == pytest.approx(-58.4, abs=0.05)
    assert layer["error_text"].startswith(f"contention (pid {pid} ")
    assert os.getpid() != pid  # the neighbour is another process, not this test's
