"""`decodetop check` end to end: table, JSON, exit codes, baselines, --collect and --root on the tarball."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from decodetop.cli import main


@pytest.fixture(autouse=True)
def state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    state = tmp_path / "state"
    monkeypatch.setenv("DECODETOP_STATE_DIR", str(state))
    return state


def _json(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[int, dict[str, object]]:
    code = main(["check", "--json", *argv])
    return code, json.loads(capsys.readouterr().out)


@pytest.mark.parametrize(
    ("name", "code"),
    [
        ("epyc-well-tuned", 0),
        ("epyc-driver-missing", 2),
        ("epyc-motivating", 1),
        ("lxc-stale-uvm-major", 2),
        ("firecracker-h200-vm", 0),
        ("kvm-haltpoll-vm", 0),
    ],
)
def test_exit_codes_on_fixtures(capsys: pytest.CaptureFixture[str], hosts: Path, name: str, code: int) -> None:
    got, document = _json(capsys, ["--root", str(hosts / name / "root")])
    assert got == code == document["exit_code"]


def test_gpus_on_the_bus_without_nvml_or_driver_are_critical_with_the_reason(
    capsys: pytest.CaptureFixture[str], hosts: Path
) -> None:
    """A copied GPU host whose driver did not load after a kernel upgrade (NVML's init, recorded when the tree was
    collected, failed): exit 2, and the table says why on the N1 and C14 rows, failing rows first."""
    assert main(["check", "--root", str(hosts / "epyc-driver-missing" / "root")]) == 2
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines()[3:] if line[:1].strip()]
    assert [r.split()[:2] for r in rows[:2]] == [["C14", "FAIL"], ["N1", "FAIL"]]
    code, document = _json(capsys, ["--root", str(hosts / "epyc-driver-missing" / "root")])
    results = {r["check_id"]: r for r in document["results"]}  # type: ignore[union-attr]
    assert code == 2 and results["N1"]["status"] == "fail"
    assert results["N1"]["observed"] == (
        "2 NVIDIA GPUs on the PCI bus (0000:03:00.0, 0000:04:00.0) but NVML unavailable: NVIDIA driver not loaded "
        "(no nvidia kernel module loaded)"
    )
    assert "built for 6.11.0-29-generic" in results["C14"]["observed"]


def test_a_tree_with_gpus_and_no_driver_fails_even_without_a_recorded_nvml_outcome(
    capsys: pytest.CaptureFixture[str], hosts: Path, tmp_path: Path
) -> None:
    """An older or hand-made tree holds no `.nvml`: NVIDIA GPUs and no NVIDIA driver in it still fail N1; a tree
    whose NVML answered when collected keeps the one info line."""
    import shutil

    tree = tmp_path / "root"
    shutil.copytree(hosts / "epyc-driver-missing" / "root", tree, symlinks=True)
    (tree / ".nvml").unlink()
    code, document = _json(capsys, ["--root", str(tree)])
    n1 = next(r for r in document["results"] if r["check_id"] == "N1")  # type: ignore[union-attr]
    assert code == 2 and n1["status"] == "fail"
    assert n1["observed"].endswith(
        "but no NVIDIA driver in the tree (no /sys/module/nvidia, no "
        "/proc/driver/nvidia/version): NVML and CUDA cannot work"
    )
    good = tmp_path / "good"
    shutil.copytree(hosts / "epyc-well-tuned" / "root", good, symlinks=True)
    (good / ".nvml").write_text("ok\n")
    code, document = _json(capsys, ["--root", str(good)])
    (skipped,) = [r for r in document["results"] if r["check_id"] == "N1-N11"]  # type: ignore[union-attr]
    assert (
        code == 0 and skipped["status"] == "info" and "NVML answered when the tree was collected" in skipped["observed"]
    )


def test_the_outcome_of_nvml_travels_in_a_collected_tree(tmp_path: Path, hosts: Path) -> None:
    """What a recording root is told of NVML's init becomes the `.nvml` side file of the archive, and `--root` on
    the archive reads it back."""
    from decodetop.collectors.archive import RecordingRoot, unpack_collected, write_collect_tarball
    from decodetop.collectors.checks.gpu_driver import NVML_OUTCOME, tree_gpu_checks

    recorder = RecordingRoot(hosts / "epyc-well-tuned" / "root")
    recorder.record_outcome(NVML_OUTCOME, "unavailable 12 NVML library (libnvidia-ml.so.1) not found")
    recorder.try_read_text("/sys/module/nvidia/version")
    for gpu in ("0000:03:00.0", "0000:04:00.0"):
        for name in ("vendor", "device", "class"):
            recorder.try_read_text(f"/sys/bus/pci/devices/{gpu}/{name}")
    recorder.try_listdir("/sys/bus/pci/devices")
    archive = tmp_path / "c.tar.gz"
    write_collect_tarball(recorder, archive, {})
    tree = unpack_collected(archive, tmp_path / "unpacked")
    assert (tree / ".nvml").read_text() == "unavailable 12 NVML library (libnvidia-ml.so.1) not found\n"
    from decodetop.collectors.hostroot import HostRoot

    (n1,) = tree_gpu_checks(HostRoot(tree))
    assert n1.status.value == "fail" and "NVML unavailable: NVML library (libnvidia-ml.so.1) not found" in n1.observed


def test_table_is_failing_first_and_verbose_adds_fix(capsys: pytest.CaptureFixture[str], hosts: Path) -> None:
    assert main(["check", "--root", str(hosts / "lxc-stale-uvm-major" / "root"), "--verbose"]) == 2
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[1].split()[:5] == ["ID", "STATUS", "TITLE", "OBSERVED", "EXPECTED"]
    assert lines[3].startswith("N12") and "FAIL" in lines[3]
    assert "why: NVML works but CUDA init fails" in out and "fix: Recreate stale nodes" in out
    assert "→ exit 2 (critical)" in out


def test_baseline_save_then_diff(capsys: pytest.CaptureFixture[str], state_dir: Path, hosts: Path) -> None:
    good = str(hosts / "epyc-well-tuned" / "root")
    bad = str(hosts / "epyc-motivating" / "root")
    assert main(["check", "--root", good, "--save-baseline", "boot1"]) == 0
    assert (state_dir / "baselines" / "boot1.json").is_file()
    capsys.readouterr()
    code, document = _json(capsys, ["--root", bad, "--baseline", "boot1"])
    assert code == 1
    changes = {(c["check_id"], c["what"]) for c in document["changes"]}  # type: ignore[union-attr,index]
    assert ("C1", "scaling_driver") in changes and ("C10", "numa_balancing") in changes
    assert ("C14", "kernel") in changes


@pytest.mark.parametrize(("name", "code"), [("epyc-well-tuned", 0), ("epyc-motivating", 1)])
def test_unreadable_baseline_keeps_the_findings_exit_code_and_the_file(
    capsys: pytest.CaptureFixture[str], state_dir: Path, hosts: Path, name: str, code: int
) -> None:
    """Monitoring reads the exit code: a corrupt baseline is said on stderr, never turned into a critical (2)."""
    path = state_dir / "baselines" / "default.json"
    path.parent.mkdir(parents=True)
    path.write_text("{garbage")
    root = str(hosts / name / "root")
    assert main(["check", "--root", root, "--save-baseline"]) == code
    err = capsys.readouterr().err
    assert "baseline not saved" in err and "default.json: not valid JSON" in err
    assert main(["check", "--root", root, "--baseline", "default"]) == code
    captured = capsys.readouterr()
    assert "baseline not compared" in captured.err and "Changed since" not in captured.out
    assert path.read_text() == "{garbage"
    (path.parent / "deep.json").write_text("[" * 100_000)
    assert main(["check", "--root", root, "--baseline", "deep"]) == code
    assert "baseline not compared" in capsys.readouterr().err
    assert (path.parent / "deep.json").read_text() == "[" * 100_000
    assert main(["check", "--baseline", "missing"]) == 2
    assert "no such baseline" in capsys.readouterr().err


def _exits_2_with_one_line(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    with pytest.raises(SystemExit) as stopped:
        main(argv)
    err = capsys.readouterr().err.strip()
    assert stopped.value.code == 2 and err.count("\n") == 0, err
    return err


def test_bad_root_and_collect_paths_fail_before_any_work(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """A missing root, a FIFO or a device as --root, and a --collect path that cannot be written: one line, exit 2."""
    assert "no such file or directory" in _exits_2_with_one_line(capsys, ["check", "--root", str(tmp_path / "nope")])
    os.mkfifo(tmp_path / "fifo")
    assert "a FIFO, not a file or directory" in _exits_2_with_one_line(
        capsys, ["check", "--root", str(tmp_path / "fifo")]
    )
    assert "not a file or directory" in _exits_2_with_one_line(capsys, ["check", "--root", "/dev/zero"])
    err = _exits_2_with_one_line(capsys, ["check", "--collect", str(tmp_path)])
    assert "a directory, not a file to write" in err
    (tmp_path / "file").write_text("")
    err = _exits_2_with_one_line(capsys, ["check", "--collect", str(tmp_path / "file" / "host.tar.gz")])
    assert "cannot write" in err


def test_collect_then_root_reproduces_findings(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    archive = tmp_path / "host.tar.gz"
    code, live = _json(capsys, ["--collect", str(archive), "--sample-interval", "0"])
    assert archive.is_file()
    code2, replay = _json(capsys, ["--root", str(archive)])

    def key(doc: dict[str, object]) -> dict[str, tuple[str, str]]:
        return {
            r["check_id"]: (r["status"], r["observed"])  # type: ignore[index]
            for r in doc["results"]  # type: ignore[attr-defined]
            if not str(r["check_id"]).startswith("N1")  # type: ignore[index]
        }

    assert key(live) == key(replay)
    assert code == code2 or {code, code2} <= {0, 3}


def test_check_does_not_import_textual_or_torch() -> None:
    code = (
        "import sys; from decodetop.cli import main; main(['check', '--json', '--sample-interval', '0']); "
        "bad = [m for m in ('textual', 'torch') if m in sys.modules]; sys.exit(9 if bad else 0)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("name", ["epyc-motivating", "lxc-stale-uvm-major"])
def test_recording_a_tree_packs_everything_the_checks_read(tmp_path: Path, hosts: Path, name: str) -> None:
    """Config space (hex), device numbers, open outcomes, kmsg and the second cpuidle sample survive the trip."""
    from decodetop.collectors.archive import RecordingRoot, unpack_collected, write_collect_tarball
    from decodetop.collectors.checks.host import run_host_checks
    from decodetop.collectors.hostroot import HostRoot

    recorder = RecordingRoot(hosts / name / "root")
    before = run_host_checks(recorder, sample_interval_s=0.0)
    archive = tmp_path / "c.tar.gz"
    write_collect_tarball(recorder, archive, {"n": len(before)})
    tree = unpack_collected(archive, tmp_path / "unpacked")
    assert (tree / "dev/.rdev").is_file() and (tree / ".later").is_dir()
    assert list(tree.glob("sys/devices/pci0000:00/**/config.hex"))
    after = run_host_checks(HostRoot(tree), sample_interval_s=0.0)
    assert [(r.check_id, r.status, r.observed) for r in after] == [(r.check_id, r.status, r.observed) for r in before]


def test_unpack_rejects_foreign_archives(tmp_path: Path) -> None:
    import io
    import tarfile

    from decodetop.collectors.archive import unpack_collected
    from decodetop.errors import UserInputError

    archive = tmp_path / "evil.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        info = tarfile.TarInfo("../escape")
        info.size = 1
        tar.addfile(info, io.BytesIO(b"x"))
    with pytest.raises(UserInputError, match="escapes the archive"):
        unpack_collected(archive, tmp_path / "out")
    (tmp_path / "plain.tar.gz").write_bytes(b"not a tarball")
    with pytest.raises(UserInputError, match="not a readable"):
        unpack_collected(tmp_path / "plain.tar.gz", tmp_path / "out2")


def test_default_baseline_is_compared_automatically(capsys: pytest.CaptureFixture[str], state_dir: Path) -> None:
    main(["check", "--sample-interval", "0", "--save-baseline"])
    capsys.readouterr()
    main(["check", "--sample-interval", "0"])
    assert "No change since baseline 'default'." in capsys.readouterr().out
    (state_dir / "baselines" / "default.json").write_text("[1, 2")
    code = main(["check", "--sample-interval", "0"])
    captured = capsys.readouterr()
    assert code in (0, 1, 2, 3) and "baseline not compared" in captured.err and "not valid JSON" in captured.err
    assert (state_dir / "baselines" / "default.json").read_text() == "[1, 2"


def test_root_accepts_the_unpacked_collect_folder(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    from decodetop.collectors.archive import ARCHIVE_TOP, unpack_collected

    archive = tmp_path / "host.tar.gz"
    main(["check", "--collect", str(archive), "--sample-interval", "0"])
    capsys.readouterr()
    unpack_collected(archive, tmp_path / "x")
    code, document = _json(capsys, ["--root", str(tmp_path / "x" / ARCHIVE_TOP)])
    assert document["root"] == str(tmp_path / "x" / ARCHIVE_TOP)
    assert "C16" in {r["check_id"] for r in document["results"]}  # type: ignore[attr-defined,index]
    assert code == document["exit_code"]


def test_a_crash_inside_check_exits_unknown(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Monitoring plugins exit 3 (UNKNOWN) when they cannot tell; a bug must never read as warning or critical."""
    import decodetop.collectors.checks.host as host

    def boom(*_args: object, **_kwargs: object) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(host, "run_all_checks", boom)
    assert main(["check", "--sample-interval", "0"]) == 3
    err = capsys.readouterr().err
    assert err == "decodetop check: UNKNOWN: internal error: RuntimeError: boom\n"


def test_root_that_is_this_host_is_refused(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """A copied tree (or an unpacked decodetop-collect/ folder) whose root is a link to / would show this host."""
    (tmp_path / "slash").symlink_to("/")
    collect = tmp_path / "decodetop-collect"
    collect.mkdir()
    (collect / "findings.json").write_text("{}")
    (collect / "root").symlink_to("/")
    for root in (tmp_path / "slash", collect):
        assert main(["check", "--root", str(root)]) == 2
        assert "resolves to / (this host)" in capsys.readouterr().err


def test_run_as_root_advice_only_when_not_root(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import decodetop.collectors.checks.context as context
    from decodetop.collectors.hostroot import HostRoot

    error = ValueError("state1/name: empty")
    monkeypatch.setattr(context.os, "geteuid", lambda: 1000)
    assert context.unknown_result("C8", "Deep C-states", error, root=HostRoot()).fix.startswith("Run as root")
    assert context.unknown_result("C8", "Deep C-states", error, root=HostRoot(tmp_path)).fix.startswith("Run as root")
    monkeypatch.setattr(context.os, "geteuid", lambda: 0)
    fix = context.unknown_result("C8", "Deep C-states", error, root=HostRoot()).fix
    assert "root" not in fix and "--collect" in fix


@pytest.mark.parametrize(("name", "code"), [("epyc-well-tuned", 0), ("epyc-motivating", 1)])
def test_save_baseline_on_a_full_state_dir_is_a_note_and_keeps_the_exit_code(
    tmp_path: Path, state_dir: Path, hosts: Path, name: str, code: int
) -> None:
    """A full disk (a file-size limit of 0 bytes: every write fails with EFBIG, as ENOSPC would, root or not)."""
    import resource

    def no_room() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))

    env = {**os.environ, "DECODETOP_STATE_DIR": str(state_dir), "HOME": str(tmp_path / "home")}
    argv = [sys.executable, "-m", "decodetop", "check", "--root", str(hosts / name / "root"), "--save-baseline"]
    done = subprocess.run(argv, capture_output=True, text=True, env=env, preexec_fn=no_room, timeout=120, check=False)
    assert done.returncode == code, done.stderr  # main: 3 (UNKNOWN: internal error: OSError)
    notes = [line for line in done.stderr.splitlines() if "baseline not saved" in line]
    assert len(notes) == 1 and "default.json" in notes[0] and "internal error" not in done.stderr
    assert not list((state_dir / "baselines").glob("*.json"))


@pytest.mark.parametrize("obstacle", ["baselines-is-a-file", "baseline-is-a-link"])
def test_save_baseline_that_cannot_be_written_is_a_note(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, state_dir: Path, hosts: Path, obstacle: str
) -> None:
    root = str(hosts / "epyc-well-tuned" / "root")
    assert main(["check", "--root", str(hosts / "epyc-motivating" / "root"), "--save-baseline", "other"]) == 1
    capsys.readouterr()
    victim = tmp_path / "victim.json"  # another of the user's files, shaped like a baseline
    victim.write_text((state_dir / "baselines" / "other.json").read_text())
    before = victim.read_text()
    if obstacle == "baselines-is-a-file":
        (state_dir / "baselines" / "other.json").unlink()
        (state_dir / "baselines").rmdir()
        (state_dir / "baselines").write_text("not a directory")
    else:
        (state_dir / "baselines" / "good.json").symlink_to(victim)
    assert main(["check", "--root", root, "--save-baseline", "good"]) == 0
    err = capsys.readouterr().err
    assert "baseline not saved" in err and "internal error" not in err  # main: wrote through the link
    assert victim.read_text() == before


def test_a_kernel_log_unreadable_at_collect_time_is_unreadable_on_replay(
    tmp_path: Path, hosts: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """/dev/kmsg refused (no CAP_SYSLOG, a private user namespace): the archive carries the refusal, so `--root` says
    the log was unreadable, as the live run did, never 'no Xid in 0 kernel-log records'."""
    import errno

    from decodetop.collectors import hostroot
    from decodetop.collectors.archive import RecordingRoot, unpack_collected, write_collect_tarball
    from decodetop.collectors.checks.host import run_host_checks

    def refused(self: hostroot.HostRoot) -> list[str]:
        raise hostroot.KmsgUnreadableError(errno.EPERM, "cannot read /dev/kmsg: Operation not permitted")

    recorder = RecordingRoot(hosts / "epyc-motivating" / "root")
    with monkeypatch.context() as patch:
        patch.setattr(hostroot.HostRoot, "read_kmsg", refused)
        before = {r.check_id: (r.status, r.observed) for r in run_host_checks(recorder, sample_interval_s=0.0)}
    archive = tmp_path / "c.tar.gz"
    write_collect_tarball(recorder, archive, {"n": len(before)})
    tree = unpack_collected(archive, tmp_path / "unpacked")
    assert (
        tree / hostroot.KMSG_UNREADABLE_FILE
    ).read_text() == "EPERM cannot read /dev/kmsg: Operation not permitted\n"
    after = {
        r.check_id: (r.status, r.observed) for r in run_host_checks(hostroot.HostRoot(tree), sample_interval_s=0.0)
    }
    assert before["N8"][1] == "kernel log unreadable: cannot read /dev/kmsg: Operation not permitted"
    assert after["N8"] == before["N8"]
    assert after == before
