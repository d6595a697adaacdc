"""`decodetop probe` end to end in subprocesses: bad arguments, JSON output, Ctrl-C, torchrun."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from decodetop.probes.results import ProbeStatus, load_results
from tests.helpers.env import subprocess_env
from tests.helpers.waiting import WAIT_S, process_ended, wait_for
from tests.probes.test_plan_hooks import TINY_LLAMA

HERE = Path(__file__).resolve().parent
SRC = HERE.parents[1] / "src"
FAKE_PROBES = HERE.parent / "probes"
"""Where the fake probe modules live (DECODETOP_PROBE_MODULES=fake_probes imports them by bare name)."""
QUICK = [
    "--sizes",
    "8,1K,64K",
    "--set",
    "allreduce.samples=3",
    "--set",
    "allreduce.synced_ops=10",
    "--set",
    "allreduce.budget_ms=20",
    "--set",
    "membw.copy_bytes=1M",
    "--set",
    "launch.samples=5",
]


PLAN_X2 = HERE.parent / "fixtures" / "budgets" / "plan_llama-3.1-70b-tp2-h200x2.json"
"""A real plan-run document (Llama-3.1-70B TP 2 on 2 × H200): a baseline with a budget."""


def _env(**extra: str) -> dict[str, str]:
    """Never the caller's environment: the session's temp HOME and state dirs, the checkout's src and the fake
    probes' folder on PYTHONPATH, and `extra`."""
    return subprocess_env(pythonpath=(FAKE_PROBES,), **extra)


def _cli(*args: str, timeout: float = 120, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "decodetop", "probe", *args],
        capture_output=True,
        check=False,
        text=True,
        timeout=timeout,
        env=_env(**env),
        stdin=subprocess.DEVNULL,
    )


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["allreduce", "--sizes", "-8"], "--sizes: size must be positive: '-8'"),
        (["allreduce", "--sizes", "12Q"], "--sizes: not a size: '12Q'"),
        (["nosuchprobe"], "unknown probe 'nosuchprobe' (known: allreduce, launch, membw"),
        (["allreduce", "--gpus", "99"], "--gpus: no GPU 99"),
        (["allreduce", "--gpus", "x"], "--gpus: 'x' is not a GPU index"),
        (["allreduce", "--set", "allreduce.nope=1"], "probe 'allreduce' has no parameter 'nope'"),
        (["allreduce", "--timeout", "0"], "--timeout: must be a number from 0.001 to 604,800 s, got '0'"),
        (["allreduce", "--cpu-ranks", "0"], "--cpu-ranks: must be at least 1, got '0'"),
    ],
)
def test_bad_arguments_are_one_line_and_exit_2(args: list[str], needle: str) -> None:
    out = _cli(*args, timeout=60)
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert lines[0].startswith("decodetop: error: ") and needle in lines[0]


@pytest.mark.slow
def test_all_three_probes_print_tables_and_json_reads_back(tmp_path: Path) -> None:
    path = tmp_path / "out.json"
    out = _cli("allreduce", "launch", "membw", *QUICK, "--json", str(path))
    assert out.returncode == 0, out.stderr
    for header in ("busbw GB/s", "median µs", "eager op µs", "bandwidth GB/s", "unsupported: CUDA graphs need a GPU"):
        assert header in out.stdout
    assert "allreduce 3/3 done" in out.stderr  # progress goes to stderr
    results = load_results(path)
    assert [r.probe for r in results] == ["allreduce", "launch", "membw"]
    assert all(r.status is ProbeStatus.OK for r in results)
    assert results[2].measurement(what="device_copy").metrics["bandwidth_gbps"] > 0


@pytest.mark.slow
def test_json_to_stdout_is_only_json() -> None:
    out = _cli("test_echo", "--json", "-", DECODETOP_PROBE_MODULES="fake_probes")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["results"][0]["status"] == "ok"


@pytest.mark.slow
def test_failed_probe_exits_1_with_traceback_on_stderr() -> None:
    out = _cli("test_raise", DECODETOP_PROBE_MODULES="fake_probes")
    assert out.returncode == 1
    assert "failed on rank 1: ValueError: planted failure on rank 1" in out.stdout
    assert "Traceback" in out.stderr


def _ranks_of(pid: int) -> list[psutil.Process]:
    """The probe ranks under `pid` (multiprocessing's resource tracker is no rank; a child gone meanwhile is none)."""
    ranks = []
    for child in psutil.Process(pid).children(recursive=True):
        try:
            if "resource_tracker" not in " ".join(child.cmdline()):
                ranks.append(child)
        except psutil.Error:
            continue
    return ranks


@pytest.mark.slow
def test_ctrl_c_ends_every_rank() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "decodetop", "probe", "test_hang", "--timeout", "100"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(DECODETOP_PROBE_MODULES="fake_probes"),
        stdin=subprocess.DEVNULL,
    )
    assert proc.stderr is not None
    try:
        for line in proc.stderr:
            if "hanging" in line:
                break
        ranks = _ranks_of(proc.pid)
        assert len(ranks) == 2, [r.pid for r in ranks]
        proc.send_signal(signal.SIGINT)
        # No bound on time is tested (two loaded cores make any bound flaky): the exit code and that every rank
        # ended are.
        assert proc.wait(timeout=WAIT_S) == 130
        wait_for(lambda: all(process_ended(r) for r in ranks), "every rank to end")
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=10)


@pytest.mark.slow
def test_torchrun_launcher(tmp_path: Path) -> None:
    path = tmp_path / "tr.json"
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        "-m",
        "decodetop",
        "probe",
        "allreduce",
        "--launcher",
        "torchrun",
        *QUICK[:8],
        "--json",
        str(path),
    ]
    out = subprocess.run(
        cmd, check=False, capture_output=True, text=True, timeout=180, env=_env(), stdin=subprocess.DEVNULL
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.count("== allreduce: ok, 2 ranks (gloo, cpu)") == 1  # rank 0 prints, once
    (result,) = load_results(path)
    assert result.status is ProbeStatus.OK and result.environment is not None
    assert result.environment.launcher == "torchrun"
    synced = result.measurement(size_bytes=1024, mode="synced")
    assert [r.rank for r in synced.per_rank] == [0, 1]


def test_bad_baseline_is_one_line_before_any_rank_starts(tmp_path: Path) -> None:
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(TINY_LLAMA))
    bad = tmp_path / "base.json"
    bad.write_text(json.dumps({"decodetop_probe_results": 1, "results": []}))
    out = _cli("--config", str(cfg), "--tp", "2", "--cpu-ranks", "2", "--baseline", str(bad), "norms", timeout=60)
    assert out.returncode == 2, out.stderr
    assert out.stderr.count("\n") == 1 and "starting" not in out.stderr and "measurements on" not in out.stderr
    assert out.stderr.startswith(f"decodetop: error: {bad}: probe results without a budget")
    out = _cli("launch", "--baseline", str(PLAN_X2), timeout=60)
    assert out.returncode == 2
    assert out.stderr.startswith("decodetop: error: --baseline needs --model or --config")
    assert out.stderr.count("\n") == 1
    # a baseline of another model (Llama-3.1-70B on 2 × H200): refused before any rank starts
    out = _cli("--config", str(cfg), "--tp", "2", "--cpu-ranks", "2", "--baseline", str(PLAN_X2), "norms", timeout=60)
    assert out.returncode == 2, out.stderr
    assert out.stderr.count("\n") == 1 and "measurements on" not in out.stderr
    assert out.stderr.startswith(
        f"decodetop: error: --baseline {PLAN_X2}: not comparable: model Llama-3.1-70B vs {tmp_path.name} (baseline "
        "vs now)"
    )


@pytest.mark.slow
def test_plan_run_with_a_baseline_prints_and_writes_the_diff(tmp_path: Path) -> None:
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(TINY_LLAMA))
    base, path = tmp_path / "base.json", tmp_path / "plan.json"
    args = ["--config", str(cfg), "--tp", "2", "--cpu-ranks", "2", "--context", "64", "--budget", "norms"]
    out = _cli(*args, "--json", str(base), timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    out = _cli(*args, "--baseline", str(base), "--json", str(path), timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    budget_at, diff_at = out.stdout.index("Budget: "), out.stdout.index(f"vs baseline {base} (")
    assert budget_at < diff_at  # the diff comes after the budget
    diff_text = out.stdout[diff_at:]
    assert diff_text.splitlines()[1].split()[:5] == ["component", "before", "ms", "after", "ms"]
    assert "note: different" not in diff_text and "not comparable" not in diff_text
    lines = diff_text.rstrip().splitlines()
    summary = [i for i, line in enumerate(lines) if line.startswith(("moved most: ", "no component "))]
    assert len(summary) == 1, diff_text  # one verdict, after the table and its notes
    # Then only the lines a diff may add: the all-reduce path, the tail, and a straggler (CPU ranks' scheduler
    # noise can name one on a loaded machine, far above the straggler floors).
    after = ("all-reduce path: ", "the tail moved: ", "straggler: ", "no straggler now")
    assert all(line.startswith(after) for line in lines[summary[0] + 1 :]), diff_text
    doc = json.loads(path.read_text())
    diff = doc["baseline_diff"]
    assert diff["baseline_path"] == str(base) and diff["comparable"] is True and diff["not_comparable"] == []
    rows = {c["component"]: c for c in diff["components"]}
    assert set(rows) == {s["component"] for s in doc["budget"]["segments"]}
    assert rows["norms"]["change"] == "changed" and rows["norms"]["delta_ms"] is not None  # measured both times
    assert rows["attention"]["change"] == "unknown" and rows["attention"]["delta_ms"] is None  # not run here
    # the document written with --baseline is a baseline itself
    again = subprocess.run(
        [sys.executable, "-m", "decodetop", "budget", "--diff", str(path), str(path)],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=60,
        check=False,
    )
    assert again.returncode == 0
    assert "no component moved beyond its noise" in again.stdout.splitlines()  # a straggler line may follow
    # the hardware is known once the ranks ran: a baseline for another one is said after the budget; exit 2
    other = json.loads(base.read_text())
    other["budget"]["hardware"] = "NVIDIA H100 SXM5 80GB (the probe results' GPU)"
    base.write_text(json.dumps(other))
    out = _cli(*args, "--baseline", str(base), "--json", str(path), timeout=300)
    assert out.returncode == 2, out.stderr[-2000:]
    assert out.stdout.rstrip().endswith(
        f"vs baseline {base}: not comparable: hardware NVIDIA H100 SXM5 80GB vs n/a on CPU (baseline vs now): a "
        "per-component diff needs the same model, TP, hardware and device kind"
    )
    assert json.loads(path.read_text())["baseline_diff"]["not_comparable"] == [
        "hardware NVIDIA H100 SXM5 80GB vs n/a on CPU"
    ]
