"""The probe group for real: a spawned 2-rank gloo group, its failure modes, cancel and shutdown."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from decodetop.probes.controller import ProbeController
from decodetop.probes.protocol import Progress
from decodetop.probes.registry import ProbeRegistry
from decodetop.probes.results import MeasurementStatus, ProbeStatus
from tests.helpers.env import subprocess_env
from tests.helpers.waiting import wait_for

pytestmark = pytest.mark.slow

SMALL_ALLREDUCE = {
    "sizes": [8, 4096, 65536],
    "samples": 5,
    "min_samples": 3,
    "ops_per_sample": 4,
    "synced_ops": 20,
    "budget_ms": 40.0,
}


def _alive(pids: list[int]) -> list[int]:
    out = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
        except psutil.NoSuchProcess:
            pass
    return out


@pytest.fixture(scope="module")
def controller(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProbeController]:
    log = tmp_path_factory.mktemp("ranks") / "ranks.log"
    pc = ProbeController(device="cpu", cpu_ranks=2, registry=ProbeRegistry(extra_modules=["fake_probes"]), rank_log=log)
    with pc:
        yield pc
    assert pc.rank_pids() == []


def test_allreduce_sweep_is_correct(controller: ProbeController) -> None:
    progress: list[Progress] = []
    result = controller.run("allreduce", SMALL_ALLREDUCE, on_progress=progress.append)
    assert result.status is ProbeStatus.OK, result.message
    assert result.world_size == 2 and result.environment is not None
    assert result.environment.backend == "gloo" and result.environment.device_kind == "cpu"
    assert result.environment.nccl_env["NCCL_NVLS_ENABLE"] == "0"
    nccl = [m for m in result.measurements if m.params["impl"] == "gloo"]  # the group's own all-reduce
    assert [(m.params["size_bytes"], m.params["mode"]) for m in nccl] == [
        (size, mode) for size in (8, 4096, 65536) for mode in ("pipelined", "graph", "synced")
    ]
    custom = [m for m in result.measurements if m.params["impl"] != "gloo"]  # P2P kernels: GPUs only, with why
    assert [m.params["impl"] for m in custom] == ["one_shot", "two_shot"]
    assert all(m.status is MeasurementStatus.UNSUPPORTED and "CPU ranks" in m.note for m in custom)
    for m in nccl:
        assert m.params["dtype"] == "float32"
        if m.params["mode"] == "graph":
            assert m.status is MeasurementStatus.UNSUPPORTED and "GPU" in m.note
            continue
        assert m.status is MeasurementStatus.OK
        assert [r.rank for r in m.per_rank] == [0, 1]
        assert m.stats is not None and m.stats.count >= 2 * 3
        for r in m.per_rank:
            assert r.stats is not None
            algbw = m.params["size_bytes"] / r.stats.median / 1e3
            assert r.metrics["algbw_gbps"] == pytest.approx(algbw)
            assert r.metrics["busbw_gbps"] == pytest.approx(algbw * 2 * (2 - 1) / 2)
        if m.params["mode"] == "synced":
            assert m.metrics["p99_us"] >= m.metrics["time_us"]
    assert progress and progress[-1].done == progress[-1].total == 3


def test_raising_probe_fails_with_rank_and_traceback_and_group_stays(controller: ProbeController) -> None:
    pids = controller.rank_pids()
    result = controller.run("test_raise", {"fail_rank": 1})
    assert result.status is ProbeStatus.FAILED
    assert result.error_rank == 1
    assert result.error == "ValueError: planted failure on rank 1"
    assert result.traceback is not None and "fake_probes.py" in result.traceback
    echo = controller.run("test_echo")
    assert echo.ok and echo.measurements[0].metrics["sum"] == 3.0
    assert controller.rank_pids() == pids  # same processes: no respawn was needed


def test_hanging_probe_times_out_and_next_probe_works(controller: ProbeController) -> None:
    old = controller.rank_pids()
    seen: list[str] = []
    result = controller.run("test_hang", timeout_s=3, on_progress=lambda p: seen.append(p.text))
    assert result.status is ProbeStatus.TIMED_OUT
    assert result.message == "timed out after 3 s"
    assert seen == ["hanging"]
    assert _alive(old) == []
    echo = controller.run("test_echo", {"value": 2.0})  # on a respawned group (fake_probes.DEADLINE_S: no race)
    assert echo.ok, echo.message
    new_pids = {int(r.metrics["pid"]) for r in echo.measurements[0].per_rank}
    assert new_pids == set(controller.rank_pids()) and not new_pids & set(old)


def test_cancel_from_another_thread(controller: ProbeController) -> None:
    controller.start()
    timer = threading.Timer(1.0, controller.cancel)
    timer.start()
    result = controller.run("test_hang", timeout_s=60)
    timer.join()
    assert result.status is ProbeStatus.CANCELLED and result.message == "cancelled"  # not the 60 s deadline
    assert controller.run("test_echo").ok


def test_rank_that_dies_gives_failed_result(controller: ProbeController) -> None:
    result = controller.run("test_exit")
    assert result.status is ProbeStatus.FAILED and result.error_rank == 1
    assert result.message == "rank 1 died: exit code 7"
    assert controller.run("test_echo").ok


def test_a_killed_rank_is_named_with_its_signal_not_the_survivors_error(controller: ProbeController) -> None:
    """Rank 1 is SIGKILLed while rank 0 waits for it in a gloo all-reduce: rank 0's transport error is not the
    story; the result names rank 1 and the signal."""
    result = controller.run("test_sigkill")
    assert result.status is ProbeStatus.FAILED and result.error_rank == 1
    assert result.message == "rank 1 died: killed by SIGKILL" == result.error
    if result.traceback:  # rank 0's own failure, when it came in before the grace ended
        assert result.traceback.startswith("rank 0 then failed: ")
    assert controller.run("test_echo").ok


def test_rank_output_goes_to_the_rank_log_not_the_terminal(tmp_path, capfd) -> None:  # type: ignore[no-untyped-def]
    """Prints, C-level writes and warnings of the ranks land in the log file; the parent's fds 1 and 2 stay clean
    and the result counts the warnings and names the file."""
    from tests.probes.fake_probes import NOISY_C_LEVEL, NOISY_STDERR, NOISY_STDOUT, NOISY_WARNING

    log = tmp_path / "logs" / "ranks.log"
    registry = ProbeRegistry(extra_modules=["fake_probes"])
    with ProbeController(device="cpu", cpu_ranks=2, registry=registry, rank_log=log) as pc:
        result = pc.run("test_noisy")
    out, err = capfd.readouterr()
    assert result.status is ProbeStatus.OK, result.message
    for planted in (NOISY_STDOUT, NOISY_STDERR, NOISY_C_LEVEL, NOISY_WARNING):
        assert planted not in out and planted not in err
    text = log.read_text()
    for rank in (0, 1):
        for planted in (NOISY_STDOUT, NOISY_STDERR, NOISY_C_LEVEL, NOISY_WARNING):
            assert f"{planted} from rank {rank}" in text
    assert result.rank_log == str(log)
    assert result.rank_warnings >= 2  # one per rank, plus any the ranks showed while starting
    assert text.count(NOISY_WARNING) == 2


def test_unsupported_probe(controller: ProbeController) -> None:
    result = controller.run("test_unsupported")
    assert result.status is ProbeStatus.UNSUPPORTED and result.message == "fake probe: not on this device"


def test_close_ends_every_rank_and_leaves_no_child(tmp_path: Path) -> None:
    before = {c.pid for c in psutil.Process().children(recursive=True)}  # e.g. the module fixture's ranks
    pc = ProbeController(
        device="cpu", cpu_ranks=2, registry=ProbeRegistry(extra_modules=["fake_probes"]), rank_log=tmp_path / "r.log"
    )
    pc.start()
    pids = pc.rank_pids()
    assert len(pids) == 2
    descendants = [c.pid for p in pids for c in psutil.Process(p).children(recursive=True)]
    pc.close()
    assert _alive(pids + descendants) == []
    # What may remain is multiprocessing's resource tracker (one per controller process, exits with it).
    left = [
        c
        for c in psutil.Process().children(recursive=True)
        if c.pid not in before and c.status() != psutil.STATUS_ZOMBIE
    ]
    assert all("resource_tracker" in " ".join(c.cmdline()) for c in left), [c.cmdline() for c in left]


def test_close_during_a_hanging_probe_ends_it(tmp_path: Path) -> None:
    pc = ProbeController(
        device="cpu", cpu_ranks=2, registry=ProbeRegistry(extra_modules=["fake_probes"]), rank_log=tmp_path / "r.log"
    )
    pc.start()
    pids = pc.rank_pids()
    results = []
    hanging = threading.Event()
    runner = threading.Thread(
        target=lambda: results.append(pc.run("test_hang", timeout_s=60, on_progress=lambda p: hanging.set()))
    )
    runner.start()
    wait_for(hanging.is_set, "the ranks to report they hang")
    pc.close()
    runner.join(10)
    assert results and results[0].status is ProbeStatus.CANCELLED
    assert _alive(pids) == []


def test_ranks_exit_when_the_controller_is_killed(tmp_path: Path) -> None:
    """A controller killed with SIGKILL cannot tell its ranks; they notice their parent is gone and exit."""
    import signal
    import subprocess
    import sys

    script = (
        "import pathlib, sys, time\n"
        "from decodetop.probes.controller import ProbeController\n"
        "pc = ProbeController(device='cpu', cpu_ranks=2, rank_log=pathlib.Path(sys.argv[1]))\n"
        "pc.start()\n"
        "print(*pc.rank_pids(), flush=True)\n"
        "time.sleep(600)\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", script, str(tmp_path / "ranks.log")],
        stdout=subprocess.PIPE,
        text=True,
        env=subprocess_env(),
    )
    assert proc.stdout is not None
    pids = [int(p) for p in proc.stdout.readline().split()]
    assert len(pids) == 2
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)
    ranks = [psutil.Process(p) for p in _alive(pids)]
    _gone, alive = psutil.wait_procs(ranks, timeout=5)
    assert alive == []


def test_close_while_the_group_is_starting_cancels_the_start(tmp_path: Path) -> None:
    """`q` right after launch: close() from another thread ends a group that is still joining, at once."""
    before = {c.pid for c in psutil.Process().children(recursive=True)}
    pc = ProbeController(device="cpu", cpu_ranks=2, rank_log=tmp_path / "ranks.log")
    errors: list[BaseException] = []

    def start() -> None:
        try:
            pc.start()
        except BaseException as exc:  # the cancelled start raises ProbeGroupError
            errors.append(exc)

    starter = threading.Thread(target=start)
    starter.start()
    # Close once a rank is spawned: well inside the start (2 interpreters that import torch take seconds to join).
    wait_for(lambda: [c for c in psutil.Process().children() if c.pid not in before], "a rank to be spawned")
    pc.close()
    starter.join(10)
    assert not starter.is_alive()
    assert errors and "cancelled" in str(errors[0])
    new = [
        c
        for c in psutil.Process().children(recursive=True)
        if c.pid not in before
        and c.status() != psutil.STATUS_ZOMBIE
        and "resource_tracker" not in " ".join(c.cmdline())
    ]
    assert new == []
