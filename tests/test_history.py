"""History: appended atomically, read back with ages, a corrupt file set aside and never truncated."""

from __future__ import annotations

import errno
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest

from decodetop.history import (
    KIND_BASELINE,
    KIND_PROBE,
    Fingerprint,
    History,
    HistoryEntry,
    HistoryUnavailableError,
    default_history_path,
    format_age,
)
from tests.helpers.env import subprocess_env


def _clock() -> float:
    return 1_800_000_000.0


def test_default_path_follows_state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DECODETOP_STATE_DIR", str(tmp_path))
    assert default_history_path() == tmp_path / "history.jsonl"


def test_append_and_reload(tmp_path: Path) -> None:
    path = tmp_path / "h.jsonl"
    history = History(path, clock=_clock)
    assert history.load().entries == ()
    history.record(KIND_PROBE, "allreduce", {"median_us": 41.5}, recorded_at_s=100.0)
    history.record(KIND_PROBE, "allreduce", {"median_us": 40.0}, recorded_at_s=200.0)
    history.record(KIND_BASELINE, "default", {"checks": {}})
    again = History(path, clock=_clock)
    loaded = again.load()
    assert loaded.problem is None
    assert [e.key for e in loaded.entries] == ["allreduce", "allreduce", "default"]
    latest = again.latest(KIND_PROBE)
    assert latest["allreduce"].payload == {"median_us": 40.0}
    assert latest["allreduce"].age_s(260.0) == 60.0
    assert again.latest(KIND_BASELINE)["default"].recorded_at_s == _clock()


def test_corrupt_file_is_set_aside_not_truncated(tmp_path: Path) -> None:
    path = tmp_path / "h.jsonl"
    good = HistoryEntry(KIND_PROBE, "gemm", 5.0, {"gbps": 3000.0}).to_json()
    original = f"{good}\n{{not json\n[1,2]\n"
    path.write_text(original)
    history = History(path, clock=_clock)
    loaded = history.load()
    assert loaded.problem is not None
    assert "corrupt history" in loaded.problem
    assert "2 bad lines" in loaded.problem
    assert "line 2" in loaded.problem
    assert loaded.set_aside_path is not None
    assert loaded.set_aside_path.read_text() == original  # every byte kept
    assert [e.key for e in loaded.entries] == ["gemm"]
    assert path.read_text() == good + "\n"  # the good entries carried over
    history.record(KIND_PROBE, "launch", {"us": 3.0})
    assert len(History(path).load().entries) == 2


def test_not_utf8_is_set_aside(tmp_path: Path) -> None:
    path = tmp_path / "h.jsonl"
    path.write_bytes(b"\xff\xff\n")
    loaded = History(path, clock=_clock).load()
    assert loaded.problem is not None and "not UTF-8" in loaded.problem
    assert loaded.set_aside_path is not None and loaded.set_aside_path.read_bytes() == b"\xff\xff\n"


def test_two_corrupt_loads_do_not_overwrite_each_other(tmp_path: Path) -> None:
    path = tmp_path / "h.jsonl"
    path.write_text("garbage 1\n")
    first = History(path, clock=_clock).load().set_aside_path
    path.write_text("garbage 2\n")
    second = History(path, clock=_clock).load().set_aside_path
    assert first is not None and second is not None and first != second
    assert first.read_text() == "garbage 1\n"
    assert second.read_text() == "garbage 2\n"


@pytest.mark.parametrize(
    "line",
    ['{"kind":"probe","key":"x"}', '{"kind":"","key":"x","at":1}', '{"kind":"p","key":"x","at":1,"data":[]}', "3"],
)
def test_entry_validation(line: str) -> None:
    with pytest.raises(ValueError):
        HistoryEntry.from_json(line)


def test_non_json_payload_is_refused_before_writing(tmp_path: Path) -> None:
    path = tmp_path / "h.jsonl"
    history = History(path)
    history.record(KIND_PROBE, "a", {"x": 1})
    with pytest.raises(ValueError):
        history.record(KIND_PROBE, "b", {"x": float("nan")})
    assert len(History(path).load().entries) == 1


def test_rewrite_keeps_the_newest(tmp_path: Path) -> None:
    history = History(tmp_path / "h.jsonl", max_entries=3)
    for i in range(5):
        history.record(KIND_PROBE, f"p{i}", {}, recorded_at_s=float(i))
    assert [e.key for e in History(tmp_path / "h.jsonl").load().entries] == ["p2", "p3", "p4"]


def test_concurrent_appends_lose_nothing(tmp_path: Path) -> None:
    history = History(tmp_path / "h.jsonl")
    history.load()

    def writer(n: int) -> None:
        for i in range(10):
            history.record(KIND_PROBE, f"w{n}-{i}", {})

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(History(tmp_path / "h.jsonl").load().entries) == 40


@pytest.mark.parametrize(("age", "text"), [(0.2, "now"), (42, "42s"), (300, "5m"), (7200, "2h"), (200000, "2d")])
def test_format_age(age: float, text: str) -> None:
    assert format_age(age) == text


def test_rewrite_keeps_the_newest_that_fit_in_the_byte_cap(tmp_path: Path) -> None:
    history = History(tmp_path / "h.jsonl", max_bytes=500)
    for i in range(10):
        history.record(KIND_PROBE, f"p{i}", {"pad": "x" * 100}, recorded_at_s=float(i))
    keys = [e.key for e in History(tmp_path / "h.jsonl").load().entries]
    assert keys == ["p7", "p8", "p9"]
    assert (tmp_path / "h.jsonl").stat().st_size <= 500


@pytest.mark.parametrize(("age", "text"), [(3, "now"), (19, "10s"), (59.9, "50s"), (61, "1m"), (7200, "2h")])
def test_format_age_coarse(age: float, text: str) -> None:
    from decodetop.history import format_age_coarse

    assert format_age_coarse(age) == text


# -- fingerprints ----------------------------------------------------------------------------------------------------


def _fp(scenario: str = "llama-3.1-70b tp2", device_kind: str = "cuda") -> Fingerprint:
    return Fingerprint(
        host_id="node-1",
        device_kind=device_kind,
        gpu_name="NVIDIA H200" if device_kind == "cuda" else None,
        gpu_count=2,
        driver_version="570.86" if device_kind == "cuda" else None,
        cuda_version="12.8" if device_kind == "cuda" else None,
        torch_version="2.11.0",
        nccl_version="2.26.2" if device_kind == "cuda" else None,
        decodetop_version="0.1.0",
        scenario=scenario,
    )


def test_fingerprint_round_trips_through_the_file(tmp_path: Path) -> None:
    path = tmp_path / "h.jsonl"
    history = History(path, clock=_clock)
    history.record(KIND_PROBE, "allreduce", {"us": 40.0}, fingerprint=_fp())
    history.record(KIND_PROBE, "allreduce", {"us": 900.0}, fingerprint=_fp(device_kind="cpu"))
    history.record(KIND_PROBE, "gemm", {"us": 3.0})
    entries = History(path).load().entries
    assert [e.fingerprint for e in entries] == [_fp(), _fp(device_kind="cpu"), None]
    assert Fingerprint.from_dict(_fp().to_dict()) == _fp()


def test_latest_with_a_fingerprint_takes_only_its_records(tmp_path: Path) -> None:
    history = History(tmp_path / "h.jsonl")
    history.record(KIND_PROBE, "copy", {"gbps": 4000.0}, recorded_at_s=10.0, fingerprint=_fp())
    history.record(KIND_PROBE, "copy", {"gbps": 9.0}, recorded_at_s=20.0, fingerprint=_fp(device_kind="cpu"))
    history.record(KIND_PROBE, "copy", {"gbps": 1.0}, recorded_at_s=30.0)  # origin unknown
    history.record(KIND_PROBE, "gemm", {"us": 5.0}, recorded_at_s=40.0, fingerprint=_fp("llama-3.1-8b tp2"))
    assert history.latest(KIND_PROBE)["copy"].payload == {"gbps": 1.0}  # without one: every record, as before
    mine = history.latest(KIND_PROBE, _fp())
    assert set(mine) == {"copy"} and mine["copy"].payload == {"gbps": 4000.0}
    assert history.latest(KIND_PROBE, _fp("other model")) == {}
    others = history.other_fingerprints(_fp())
    assert [s.fingerprint for s in others] == [_fp("llama-3.1-8b tp2"), None, _fp(device_kind="cpu")]
    assert [s.entries for s in history.fingerprints()] == [1, 1, 1, 1]
    assert "CPU rank" in _fp(device_kind="cpu").describe() and "NVIDIA H200" in _fp().describe()


def test_old_lines_without_a_fingerprint_keep_loading(tmp_path: Path) -> None:
    path = tmp_path / "h.jsonl"
    path.write_text('{"at":5.0,"data":{"us":1},"key":"gemm","kind":"probe","v":1}\n')
    loaded = History(path).load()
    assert loaded.problem is None and loaded.entries[0].fingerprint is None


@pytest.mark.parametrize(
    "fp",
    ['"x"', '{"host_id":"a"}', '{"host_id":"a","device_kind":"tpu"}', "[]"],
)
def test_bad_fingerprint_is_a_bad_line(fp: str) -> None:
    with pytest.raises(ValueError):
        HistoryEntry.from_json('{"kind":"probe","key":"x","at":1,"data":{},"fp":' + fp + "}")


# -- two writers, hostile files --------------------------------------------------------------------------------------

_WRITER = """
import sys
import time
from pathlib import Path
from decodetop.history import KIND_BASELINE, KIND_PROBE, History
name, path, start = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
history = History(path)
history.load()
while not start.exists():  # both writers start together, so their appends interleave
    time.sleep(0.001)
for i in range(200):
    history.record(KIND_PROBE, f"{name}-{i}", {"i": i})
history.record(KIND_BASELINE, name, {"checks": {}})
"""


def test_two_processes_lose_nothing(tmp_path: Path) -> None:
    path = tmp_path / "h.jsonl"
    start = tmp_path / "go"
    procs = [
        subprocess.Popen([sys.executable, "-c", _WRITER, name, str(path), str(start)]) for name in ("alpha", "beta")
    ]
    start.touch()
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    loaded = History(path).load()
    assert loaded.problem is None
    assert len(path.read_text().splitlines()) == 402
    assert len([e for e in loaded.entries if e.kind == KIND_PROBE]) == 400
    assert set(History(path).latest(KIND_BASELINE)) == {"alpha", "beta"}


def test_a_write_keeps_what_another_writer_added(tmp_path: Path) -> None:
    path = tmp_path / "h.jsonl"
    first, second = History(path), History(path)
    first.load()
    second.load()
    first.record(KIND_BASELINE, "first", {})
    second.record(KIND_PROBE, "gemm", {})
    assert {e.key for e in History(path).load().entries} == {"first", "gemm"}
    assert {e.key for e in second.entries} == {"first", "gemm"}


def test_deeply_nested_line_is_set_aside_byte_for_byte(tmp_path: Path) -> None:
    path = tmp_path / "h.jsonl"
    good = HistoryEntry(KIND_PROBE, "gemm", 5.0, {"us": 3.0}).to_json()
    original = (good + "\n" + "[" * 100_000 + "]" * 100_000 + "\n").encode()
    path.write_bytes(original)
    history = History(path, clock=_clock)
    loaded = history.load()
    assert loaded.problem is not None and "nested too deeply" in loaded.problem
    assert loaded.set_aside_path is not None and loaded.set_aside_path.read_bytes() == original
    history.record(KIND_PROBE, "launch", {})
    assert [e.key for e in History(path).load().entries] == ["gemm", "launch"]


@pytest.mark.parametrize(
    "bad",
    [b"9" * 5000, b'{"kind":"probe","key":"x","at":NaN,"data":{}}', b'{"kind":"probe","key":"x","at":1e999}'],
)
def test_hostile_numbers_are_bad_lines(tmp_path: Path, bad: bytes) -> None:
    path = tmp_path / "h.jsonl"
    path.write_bytes(bad + b"\n")
    loaded = History(path, clock=_clock).load()
    assert loaded.problem is not None and loaded.set_aside_path is not None
    assert loaded.set_aside_path.read_bytes() == bad + b"\n"


def test_very_long_line_is_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import decodetop.history as history_module

    monkeypatch.setattr(history_module, "MAX_LINE_BYTES", 100)
    path = tmp_path / "h.jsonl"
    long_line = HistoryEntry(KIND_PROBE, "long", 1.0, {"pad": "x" * 200}).to_json()
    path.write_text(long_line + "\n")
    loaded = History(path, clock=_clock).load()
    assert loaded.problem is not None and "longer than" in loaded.problem


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their mode")
def test_unreadable_file_is_left_alone_and_writes_refused(tmp_path: Path) -> None:
    path = tmp_path / "h.jsonl"
    original = (HistoryEntry(KIND_PROBE, "gemm", 5.0, {}).to_json() + "\n").encode()
    path.write_bytes(original)
    path.chmod(0o200)
    try:
        history = History(path)
        loaded = history.load()
        assert loaded.problem is not None and "cannot read history" in loaded.problem and not loaded.writable
        with pytest.raises(HistoryUnavailableError, match="nothing is saved"):
            history.record(KIND_PROBE, "launch", {})
    finally:
        path.chmod(0o644)
    assert path.read_bytes() == original
    assert sorted(p.name for p in tmp_path.iterdir()) == ["h.jsonl", "h.jsonl.lock"]


_UNPRIVILEGED = """
import sys
from pathlib import Path
from decodetop.history import KIND_PROBE, History
history = History(Path(sys.argv[1]))
print(history.load().problem)
try:
    history.record(KIND_PROBE, "launch", {})
except OSError as exc:
    print("refused:", exc)
"""


def _python_for_nobody(env: dict[str, str]) -> str | None:
    """An interpreter that uid 65534 can run with this source tree (the venv's may live under /root)."""
    for python in (sys.executable, "/usr/bin/python3"):
        try:
            subprocess.run(
                [python, "-c", "import decodetop.history"], user=65534, group=65534, env=env, check=True, timeout=60
            )
        except (OSError, subprocess.CalledProcessError):
            continue
        return python
    return None


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run the reader as another user")
def test_unreadable_file_as_an_unprivileged_user() -> None:
    """The permission case for real, when the suite runs as root: the reader runs as nobody (uid 65534)."""
    env = subprocess_env()
    python = _python_for_nobody(env)
    if python is None:
        pytest.skip("no interpreter that an unprivileged user can run with this source tree")
    state = Path(tempfile.mkdtemp(prefix="decodetop-history-"))  # /tmp itself: pytest's tmp_path is root-only
    try:
        state.chmod(0o777)
        path = state / "h.jsonl"
        original = (HistoryEntry(KIND_PROBE, "gemm", 5.0, {}).to_json() + "\n").encode()
        path.write_bytes(original)
        path.chmod(0o600)  # root's, unreadable for nobody
        run = subprocess.run(
            [python, "-c", _UNPRIVILEGED, str(path)],
            user=65534,
            group=65534,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        assert "cannot read history (Permission denied); left as it is, nothing is saved" in run.stdout
        assert "refused:" in run.stdout
        assert path.read_bytes() == original
        assert sorted(p.name for p in state.iterdir()) == ["h.jsonl", "h.jsonl.lock"]
    finally:
        shutil.rmtree(state)


@pytest.mark.parametrize("kind", ["directory", "fifo"])
def test_not_a_file_is_left_alone(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "h.jsonl"
    if kind == "directory":
        path.mkdir()
        (path / "keep").write_text("x")
    else:
        os.mkfifo(path)
    history = History(path)
    loaded = history.load()
    assert loaded.problem is not None and not loaded.writable
    with pytest.raises(OSError, match="left as it is"):
        history.record(KIND_PROBE, "x", {})
    assert path.is_dir() if kind == "directory" else stat.S_ISFIFO(path.stat().st_mode)


@pytest.mark.parametrize(("code", "words"), [(errno.EIO, "Input/output error"), (errno.EACCES, "Permission denied")])
def test_read_error_leaves_the_file_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int, words: str
) -> None:
    """An I/O error, or a permission error as a non-root user meets it (root reads whatever the mode)."""
    import decodetop.jsonio as jsonio

    path = tmp_path / "h.jsonl"
    original = (HistoryEntry(KIND_PROBE, "gemm", 5.0, {}).to_json() + "\n").encode()
    path.write_bytes(original)
    real_read = os.read

    def failing_read(fd: int, n: int) -> bytes:
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(jsonio.os, "read", failing_read)
    history = History(path)
    loaded = history.load()
    assert loaded.problem is not None and words in loaded.problem
    with pytest.raises(HistoryUnavailableError):
        history.record(KIND_PROBE, "x", {})
    monkeypatch.setattr(jsonio.os, "read", real_read)
    assert path.read_bytes() == original


def test_a_line_that_is_not_utf8_costs_only_that_line(tmp_path: Path) -> None:
    path = tmp_path / "h.jsonl"
    good = HistoryEntry(KIND_PROBE, "gemm", 5.0, {"note": "a\u2028b"}).to_json()  # U+2028 is one line in JSON
    original = (good + "\n").encode() + b"\xff\xfe\n" + (good + "\n").encode()
    path.write_bytes(original)
    loaded = History(path, clock=_clock).load()
    assert loaded.problem is not None and "1 bad line, first at line 2: not UTF-8 text" in loaded.problem
    assert len(loaded.entries) == 2 and loaded.entries[0].payload == {"note": "a\u2028b"}
    assert loaded.set_aside_path is not None and loaded.set_aside_path.read_bytes() == original


def test_a_file_beyond_the_read_cap_is_set_aside_unread(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import decodetop.history as history_module

    monkeypatch.setattr(history_module, "MAX_READ_BYTES", 1000)
    path = tmp_path / "h.jsonl"
    original = ((HistoryEntry(KIND_PROBE, "gemm", 5.0, {}).to_json() + "\n") * 40).encode()
    path.write_bytes(original)
    loaded = History(path, clock=_clock).load()
    assert loaded.problem is not None
    assert "corrupt history (the file is larger than 1000 bytes, not read); moved to" in loaded.problem
    assert loaded.set_aside_path is not None and loaded.set_aside_path.read_bytes() == original
    assert path.read_bytes() == b""


# ------------------------------------------------------------------------------------ a shared, hostile state dir


@pytest.mark.parametrize("target_kind", ["empty", "history-shaped"])
def test_a_history_file_that_is_a_link_is_never_written_through(tmp_path: Path, target_kind: str) -> None:
    """Whoever can write a shared state dir links history.jsonl to another of the user's files: it stays as it is."""
    victim = tmp_path / "elsewhere" / "victim.jsonl"
    victim.parent.mkdir()
    content = b"" if target_kind == "empty" else (HistoryEntry(KIND_PROBE, "gemm", 5.0, {}).to_json() + "\n").encode()
    victim.write_bytes(content)
    state = tmp_path / "state"
    state.mkdir()
    (state / "history.jsonl").symlink_to(victim)
    history = History(state / "history.jsonl")
    loaded = history.load()
    assert loaded.problem is not None and "a symbolic link" in loaded.problem and not loaded.writable
    with pytest.raises(HistoryUnavailableError, match="symbolic link"):
        history.record(KIND_PROBE, "x", {})
    assert victim.read_bytes() == content and (state / "history.jsonl").is_symlink()


def test_a_dangling_lock_link_is_not_followed(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    target = tmp_path / "elsewhere" / "created-through-the-link"
    target.parent.mkdir()
    (state / "history.jsonl.lock").symlink_to(target)
    history = History(state / "history.jsonl")
    loaded = history.load()
    assert loaded.problem is not None and "history.jsonl.lock: a symbolic link" in loaded.problem
    with pytest.raises(HistoryUnavailableError, match="symbolic link"):
        history.record(KIND_PROBE, "x", {})
    assert not target.exists() and not (state / "history.jsonl").exists()


def test_a_baseline_is_kept_until_replaced_whatever_the_probes_after_it(tmp_path: Path) -> None:
    path = tmp_path / "h.jsonl"
    history = History(path, max_entries=50)
    history.record(KIND_BASELINE, "default", {"first": True}, recorded_at_s=1.0)
    for i in range(300):  # a UI re-running probes for hours
        history.record(KIND_PROBE, f"p{i % 7}", {"i": i}, recorded_at_s=2.0 + i)
    kept = History(path).load().entries
    baselines = [e for e in kept if e.kind == KIND_BASELINE]
    assert [b.payload for b in baselines] == [{"first": True}]
    assert sum(e.kind == KIND_PROBE for e in kept) == 50 and kept[-1].payload == {"i": 299}
    history.record(KIND_BASELINE, "default", {"second": True}, recorded_at_s=400.0)  # replaced: the old one may go
    for i in range(60):
        history.record(KIND_PROBE, "p", {"i": i}, recorded_at_s=401.0 + i)
    baselines = [e.payload for e in History(path).load().entries if e.kind == KIND_BASELINE]
    assert baselines == [{"second": True}]


def test_temp_files_of_a_killed_writer_are_removed_by_the_next(tmp_path: Path) -> None:
    path = tmp_path / "h.jsonl"
    history = History(path)
    history.record(KIND_PROBE, "gemm", {})
    stale = [tmp_path / f".h.jsonl.{tag}.tmp" for tag in ("a1b2c3", "zz9_k")]
    for leftover in stale:  # what a writer SIGKILLed between its temp file and the rename leaves
        leftover.write_bytes(b"x" * 1000)
    keep = tmp_path / ".h.jsonl.notes"  # not a temp file of ours
    keep.write_text("mine")
    History(path).record(KIND_PROBE, "membw", {})
    assert not any(p.exists() for p in stale) and keep.read_text() == "mine"
    assert [e.key for e in History(path).load().entries] == ["gemm", "membw"]


def test_sigkill_during_rewrites_leaves_no_temp_file_after_the_next_write(tmp_path: Path) -> None:
    """A writer killed mid-rewrite, many times over: the next writer leaves none of their temp files behind."""
    path = tmp_path / "h.jsonl"
    History(path).record(KIND_PROBE, "seed", {"pad": "x" * 100_000})
    script = (
        "import sys, os, signal\n"
        "from pathlib import Path\n"
        "import decodetop.atomic as atomic\n"
        "real = os.replace\n"
        "def die(*a, **k): os.kill(os.getpid(), signal.SIGKILL)\n"
        "atomic.os.replace = die\n"
        "from decodetop.history import History\n"
        "History(Path(sys.argv[1])).record('probe', 'x', {})\n"
    )
    for _ in range(5):
        done = subprocess.run([sys.executable, "-c", script, str(path)], check=False, timeout=60)
        assert done.returncode == -9
    assert len(list(tmp_path.glob(".h.jsonl.*.tmp"))) == 1  # each writer removed the one before it (main: 5)
    History(path).record(KIND_PROBE, "after", {})
    assert list(tmp_path.glob(".h.jsonl.*.tmp")) == []
    assert [e.key for e in History(path).load().entries] == ["seed", "after"]
