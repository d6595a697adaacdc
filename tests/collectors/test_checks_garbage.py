"""Garbage in any file a check reads makes that check `unknown` with the reason, never a crash."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from decodetop.collectors.checks.host import run_host_checks
from decodetop.collectors.checks.result import CheckResult, Status
from decodetop.collectors.hostroot import HostRoot

GPU = "sys/devices/pci0000:00/0000:00:01.1/0000:01:00.0/0000:02:00.0/0000:03:00.0"


@pytest.fixture()
def tree(copy_host: Callable[[str], Path]) -> Path:
    return copy_host("epyc-motivating")


def _find(results: list[CheckResult], check_id: str) -> CheckResult:
    return next(r for r in results if r.check_id == check_id)


CASES = [
    ("proc/sys/kernel/numa_balancing", "", "C10", "expected an integer"),
    ("proc/sys/kernel/perf_event_paranoid", "four\n", "C13", "perf_event_paranoid: expected an integer"),
    ("proc/sys/vm/swappiness", "\x00\x01", "C12", "expected an integer"),
    ("sys/kernel/mm/transparent_hugepage/enabled", "always madvise never\n", "C11", "bracketed"),
    ("sys/devices/system/cpu/cpufreq/policy3/scaling_driver", "", "C1", "expected one word"),
    ("sys/devices/system/cpu/cpufreq/policy0/scaling_max_freq", "lots\n", "C4", "scaling_max_freq"),
    ("sys/devices/system/cpu/cpu5/cpuidle/state2/usage", "-\n", "C8", "usage: expected an integer"),
    ("proc/devices", "garbage\n", "N12", "Character devices"),
    ("proc/sys/kernel/osrelease", "", "C14", "osrelease is empty"),
    (f"{GPU}/current_link_width", "x16\n", "P1:0000:03:00.0", "current_link_width"),
    (f"{GPU}/current_link_speed", "fast\n", "P1:0000:03:00.0", "unrecognised link speed"),
    (f"{GPU}/numa_node", "\n", "P6:0000:03:00.0", "numa_node"),
]


@pytest.mark.parametrize(("path", "content", "check_id", "reason"), CASES)
def test_garbage_makes_unknown(tree: Path, path: str, content: str, check_id: str, reason: str) -> None:
    (tree / path).write_text(content)
    results = run_host_checks(HostRoot(tree), sample_interval_s=0.0)
    result = _find(results, check_id)
    assert result.status == Status.UNKNOWN, result
    assert reason in result.observed


def test_truncated_config_space(tree: Path) -> None:
    hex_path = tree / GPU / "config.hex"
    hex_path.write_text("de 10 35 23 06 04 10 00\n")  # 8 bytes
    result = _find(run_host_checks(HostRoot(tree), sample_interval_s=0.0), "P3:0000:03:00.0")
    assert result.status == Status.UNKNOWN and "truncated: 8 bytes" in result.observed


def test_header_only_config_space(tree: Path) -> None:
    hex_path = tree / GPU / "config.hex"
    hex_path.write_text("\n".join(hex_path.read_text().splitlines()[:4]) + "\n")  # 64 bytes
    result = _find(run_host_checks(HostRoot(tree), sample_interval_s=0.0), "P3:0000:03:00.0")
    assert result.status == Status.UNKNOWN and "needs host root" not in result.observed
    assert "only 64 bytes readable" in result.observed and "host root" in result.observed


def test_missing_cpuidle_second_sample_is_unknown(tree: Path) -> None:
    shutil.rmtree(tree / ".later")
    result = _find(run_host_checks(HostRoot(tree), sample_interval_s=0.0), "C8")
    assert result.status == Status.UNKNOWN and "sampled once" in result.observed


def test_empty_tree_gives_no_crash(tmp_path: Path) -> None:
    results = run_host_checks(HostRoot(tmp_path), sample_interval_s=0.0)
    assert {r.check_id for r in results} >= {"C1", "C8", "C14", "N12", "P1"}
    unknown = [r for r in results if r.status == Status.UNKNOWN]
    assert all(r.observed.startswith("cannot evaluate:") for r in unknown)
    assert all("does not exist" in r.observed for r in unknown)


def test_fuzz_any_file_the_checks_read(hosts: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    """Replace any one file the checks read with random bytes: no exception escapes, every finding is well formed."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    from decodetop.collectors.archive import RecordingRoot

    tree = tmp_path_factory.mktemp("fuzz") / "root"
    shutil.copytree(hosts / "epyc-motivating" / "root", tree, symlinks=True)
    recorder = RecordingRoot(tree)
    run_host_checks(recorder, sample_interval_s=0.0)
    read = sorted(
        p for p in (*recorder.recording.files, *(f"{p}.hex" for p in recorder.recording.files)) if (tree / p).is_file()
    )
    assert len(read) > 100

    @settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(st.sampled_from(read), st.binary(max_size=300))
    def fuzz(path: str, garbage: bytes) -> None:
        target = tree / path
        original = target.read_bytes()
        target.write_bytes(garbage)
        try:
            results = run_host_checks(HostRoot(tree), sample_interval_s=0.0)
        finally:
            target.write_bytes(original)
        assert results and all(isinstance(r.status, Status) and r.observed for r in results)

    fuzz()
