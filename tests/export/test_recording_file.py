"""A recording is small and survives what happens to files: gzip with telemetry deltas (a few hundred bytes a tick
at 8 GPUs, replayed identical), cut anywhere it replays up to its last whole tick, damage costs the ticks up to the
next keyframe, a bomb or a crafted file is one line naming it, and two processes never write into one file."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest

from decodetop.collectors.telemetry import TelemetrySnapshot
from decodetop.errors import UserInputError
from decodetop.export import recording, recording_file
from decodetop.export.recording import Recorder, decode_replay, read_recording
from decodetop.export.recording_delta import DeltaError, apply, diff
from decodetop.settings import Settings
from decodetop.tui.launch import LaunchOptions, build_sources
from tests.export.expo_fixtures import checks
from tests.helpers.demo_ticks import demo_ticks
from tests.helpers.env import subprocess_env

T0 = 1_795_959_000.0


def _record(path: Path, snaps: list[TelemetrySnapshot], *, keyframe_every: int = 10) -> list[int]:
    """Record the ticks; the file's size after each line (meta first)."""
    sizes = []
    with Recorder(path, clock=lambda: T0, keyframe_every=keyframe_every) as rec:
        sizes.append(rec.bytes_written)
        for i, snap in enumerate(snaps):
            rec.record("telemetry", snap, t=T0 + i)
            sizes.append(rec.bytes_written)
    return sizes


@pytest.fixture(scope="module")
def ticks() -> list[TelemetrySnapshot]:
    return demo_ticks(25)


def test_a_tick_at_eight_gpus_takes_a_few_hundred_bytes_and_replays_identical(
    tmp_path: Path, ticks: list[TelemetrySnapshot]
) -> None:
    path = tmp_path / "demo.jsonl.gz"
    _record(path, ticks, keyframe_every=60)
    whole = sum(len(json.dumps(recording.to_jsonable(s))) for s in ticks) / len(ticks)
    assert whole > 30_000  # ~40 KB of JSON a tick when every snapshot is written whole
    per_tick = path.stat().st_size / len(ticks)
    assert per_tick < 2_500, per_tick  # a keyframe and 24 deltas; docs/benchmarks.md has the hour-long figure
    decoded = decode_replay(read_recording(path))
    assert decoded.skipped == 0 and decoded.warnings == ()
    assert decoded.values(TelemetrySnapshot) == ticks
    lines = [json.loads(line) for line in gzip.decompress(path.read_bytes()).splitlines()]
    assert ["data" in line for line in lines[1:4]] == [True, False, False]  # a keyframe, then what changed


def test_cut_anywhere_it_replays_up_to_its_last_whole_tick(tmp_path: Path, ticks: list[TelemetrySnapshot]) -> None:
    full = tmp_path / "full.jsonl.gz"
    sizes = _record(full, ticks[:12])
    data = full.read_bytes()
    for cut in (sizes[0] + 3, sizes[4], sizes[4] + 11, sizes[11] + 40, len(data) - 4):
        path = tmp_path / f"cut-{cut}.jsonl.gz"
        path.write_bytes(data[:cut])  # a session killed mid-write: no gzip end
        replay = decode_replay(read_recording(path))
        whole = sum(1 for size in sizes[1:] if size <= cut)
        assert replay.values(TelemetrySnapshot) == ticks[:whole], cut
        assert replay.replay.corrupt_lines <= 1  # at most the line being written


def test_a_damaged_tick_costs_the_ticks_up_to_the_next_keyframe(tmp_path: Path, ticks: list[TelemetrySnapshot]) -> None:
    path = tmp_path / "damaged.jsonl"
    _record(path, ticks[:25], keyframe_every=10)
    lines = gzip.decompress(path.read_bytes()).split(b"\n")
    lines[4] = lines[4][:-30]  # tick 4 (a delta) damaged: ticks 5-10 have no tick before them; 11 is whole
    path.write_bytes(b"\n".join(lines))
    replay = read_recording(path)
    decoded = decode_replay(replay)
    assert decoded.values(TelemetrySnapshot) == ticks[:3] + ticks[10:]
    assert replay.corrupt_lines == 7
    assert "without the tick before them" in replay.warnings[0] and "\n" not in replay.warnings[0]


def test_damaged_compressed_data_keeps_what_came_before_and_the_next_session(
    tmp_path: Path, ticks: list[TelemetrySnapshot]
) -> None:
    path = tmp_path / "rec.jsonl.gz"
    sizes = _record(path, ticks[:6])
    with Recorder(path, clock=lambda: T0 + 100) as rec:
        rec.record("checks", list(checks()))
    data = bytearray(path.read_bytes())
    for i in range(sizes[3] + 5, sizes[3] + 60):
        data[i] ^= 0x5A  # bits flipped inside tick 4's compressed bytes
    path.write_bytes(bytes(data))
    replay = read_recording(path)
    kinds = [e.kind for e in replay.events]
    assert kinds[:4] == ["meta", "telemetry", "telemetry", "telemetry"] and kinds[-2:] == ["meta", "checks"]
    assert any("cut or damaged after byte" in w and "skipped" in w for w in replay.warnings)
    assert all("\n" not in w and path.name in w for w in replay.warnings)


@pytest.mark.parametrize(
    ("ops", "why"),
    [
        ([[["no_such_key", "x"], 1]], "no key 'no_such_key'"),
        ([[["gpus", 99, "power_w"], 1]], "index 99 outside a list of 8"),
        ([[["gpus", "zero"], 1]], "does not fit the tick before"),
        ([[["gpus"] + [0] * 40, 1]], "a path of 41 items"),
        ([[[]]], "removes the whole tick"),
        ("not ops", "not a list of operations"),
        ([["gpus", 1]], "not [path] or [path, value]"),
    ],
)
def test_hostile_deltas_are_corrupt_lines_never_a_crash(
    tmp_path: Path, ticks: list[TelemetrySnapshot], ops: object, why: str
) -> None:
    path = tmp_path / "hostile.jsonl"
    _record(path, ticks[:3])
    lines = gzip.decompress(path.read_bytes()).split(b"\n")
    hostile = json.loads(lines[2])
    hostile["delta"] = ops
    lines[2] = json.dumps(hostile).encode()
    path.write_bytes(b"\n".join(lines))
    replay = read_recording(path)
    assert replay.corrupt_lines == 2  # the hostile tick and the one after it (its tick before is gone)
    assert why in replay.warnings[0]
    assert decode_replay(replay).values(TelemetrySnapshot) == ticks[:1]


def test_apply_never_changes_the_tick_before() -> None:
    before = {"gpus": [{"power_w": 1.0, "name": "H200"}, {"power_w": 2.0}], "tick": 1}
    after = {"gpus": [{"power_w": 1.5, "name": "H200"}, {"power_w": 2.0}], "tick": 2, "new": [1]}
    snapshot = json.dumps(before)
    rebuilt = apply(before, diff(before, after))
    assert rebuilt == after and json.dumps(before) == snapshot
    assert rebuilt["gpus"][1] is before["gpus"][1]  # what did not change is shared
    assert apply(after, diff(after, before)) == before  # removed keys too
    assert diff({"a": 1}, {"a": 1.0}) == [[["a"], 1.0]] and diff({"a": True}, {"a": 1}) == [[["a"], 1]]
    with pytest.raises(DeltaError):
        apply(before, [[["tick", "x"], 1]])


def test_a_gzip_bomb_is_one_line_naming_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(recording_file, "MAX_DECOMPRESSED_BYTES", 1_000_000)
    path = tmp_path / "bomb.jsonl.gz"
    path.write_bytes(gzip.compress(b" " * 5_000_000 + b"\n"))
    with pytest.raises(UserInputError, match=r"bomb\.jsonl\.gz: more than 1,000,000 bytes once decompressed") as e:
        read_recording(path)
    assert "\n" not in str(e.value)
    # the live UI's --replay refuses it the same way before any screen opens (the CLI's exit 2)
    with pytest.raises(UserInputError, match="once decompressed"):
        build_sources(Settings(), LaunchOptions(replay=path))


def test_deltas_that_rebuild_too_much_stop_at_the_replay_limit(
    tmp_path: Path, ticks: list[TelemetrySnapshot], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "many.jsonl.gz"
    _record(path, ticks[:20], keyframe_every=100)
    monkeypatch.setattr(recording, "MAX_REPLAY_BYTES", 200_000)  # ~5 ticks of 40 KB, though the file is ~20 KB
    with pytest.raises(UserInputError, match=r"many\.jsonl\.gz: more than 200,000 bytes of events once its ticks"):
        read_recording(path)


def test_crafted_or_truncated_gzip_is_one_line(tmp_path: Path) -> None:
    crafted = tmp_path / "crafted.jsonl.gz"
    crafted.write_bytes(b"\x1f\x8b\x08\x00" + bytes(range(256)) * 4)
    with pytest.raises(UserInputError, match=r"crafted\.jsonl\.gz: not a decodetop recording \(") as e:
        read_recording(crafted)
    assert "\n" not in str(e.value)
    header = tmp_path / "header.jsonl.gz"
    header.write_bytes(gzip.compress(b"{}\n")[:6])
    with pytest.raises(UserInputError, match=r"truncated gzip data \(it ends before its first line\)"):
        read_recording(header)
    text = tmp_path / "text.jsonl.gz"
    text.write_bytes(gzip.compress(b"hello\nworld\n"))
    with pytest.raises(UserInputError, match="not a decodetop recording"):
        read_recording(text)


def test_two_processes_never_record_into_one_file(tmp_path: Path) -> None:
    path = tmp_path / "shared.jsonl.gz"
    code = (
        "import sys\nfrom decodetop.export.recording import Recorder\nfrom decodetop.errors import UserInputError\n"
        "try:\n    Recorder(sys.argv[1]).close()\nexcept UserInputError as e:\n    print(e)\n    sys.exit(2)\n"
    )
    with Recorder(path) as rec:
        rec.record("checks", list(checks()))
        other = subprocess.run(
            [sys.executable, "-c", code, str(path)],
            env=subprocess_env(),
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert other.returncode == 2, other.stderr
        assert other.stdout.strip() == f"--record {path}: another process is recording to it; record to another file"
        with pytest.raises(UserInputError, match="another process is recording to it"):
            Recorder(path)  # a second recorder in this process too (the lock is the open file's)
        rec.record("checks", list(checks()))
    assert [e.kind for e in read_recording(path).events] == ["meta", "checks", "checks"]
    with Recorder(path) as rec:  # once the first one closed, another session appends its own member
        rec.record("checks", list(checks()))
    replay = read_recording(path)
    assert [e.kind for e in replay.events] == ["meta", "checks", "checks", "meta", "checks"]
    assert replay.warnings == ()


def test_a_file_that_is_not_a_compressed_recording_is_never_appended_to(tmp_path: Path) -> None:
    old = tmp_path / "old.jsonl"
    old.write_text('{"v":1,"t":1.0,"kind":"meta","type":null,"data":{}}\n')
    with pytest.raises(UserInputError, match="holds an uncompressed recording of an earlier decodetop"):
        Recorder(old)
    assert old.read_text() == '{"v":1,"t":1.0,"kind":"meta","type":null,"data":{}}\n'
    assert read_recording(old).meta == {}  # and it still replays
    notes = tmp_path / "notes.txt"
    notes.write_text("my notes\n")
    with pytest.raises(UserInputError, match="exists and is not a decodetop recording; not appended to"):
        Recorder(notes)
    assert notes.read_text() == "my notes\n"
