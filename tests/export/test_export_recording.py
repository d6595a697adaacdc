"""Record/replay: events round-trip into the same dataclasses; truncated and corrupt lines are skipped and counted,
never fatal; a file that is not a recording is one clear line."""

from __future__ import annotations

import enum
import gzip
import json
import math
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from decodetop import jsonio
from decodetop.collectors.checks.result import CheckResult, Status
from decodetop.collectors.serving import ServerStep
from decodetop.errors import UserInputError
from decodetop.export.recording import (
    KIND_TYPES,
    Recorder,
    decode_event,
    decode_replay,
    from_jsonable,
    read_recording,
    to_jsonable,
    write_events,
)
from decodetop.probes.results import ProbeResult
from tests.export.expo_fixtures import budget, checks, observed, probe_results, telemetry_snapshot


def _record_session(path: Path) -> None:
    t0 = 1795959000.0
    with Recorder(path, meta={"argv": ["decodetop", "--record", str(path)]}, clock=lambda: t0) as rec:
        rec.record("telemetry", telemetry_snapshot(), t=t0 + 1)
        for i, result in enumerate(probe_results()):
            rec.record("probe_result", result, t=t0 + 2 + i)
        rec.record("checks", list(checks()), t=t0 + 10)
        rec.record("observed_step", observed(), t=t0 + 11)
        rec.record("telemetry", telemetry_snapshot(), t=t0 + 12)
        rec.record("budget", budget(), t=t0 + 12.5)


def _plain_lines(path: Path) -> list[str]:
    """A recording's lines as text (recordings are gzip; plain lines still read, as earlier versions wrote them)."""
    return gzip.decompress(path.read_bytes()).decode("utf-8").splitlines()


def test_session_round_trips(tmp_path: Path) -> None:
    path = tmp_path / "session.jsonl"
    _record_session(path)
    replay = read_recording(path)
    assert replay.corrupt_lines == 0 and replay.warnings == ()
    assert [e.kind for e in replay.events] == [
        "meta",
        "telemetry",
        "probe_result",
        "probe_result",
        "probe_result",
        "checks",
        "observed_step",
        "telemetry",
        "budget",
    ]
    assert replay.meta["format"] == "decodetop-recording"
    assert replay.meta["argv"][0] == "decodetop"
    assert replay.duration_s == pytest.approx(12.5)
    assert replay.counts()["probe_result"] == 3
    # each event rebuilds into the same object it recorded
    assert decode_event(replay.of_kind("telemetry")[0]) == telemetry_snapshot()
    assert tuple(decode_event(e) for e in replay.of_kind("probe_result")) == probe_results()
    assert decode_event(replay.of_kind("checks")[0]) == checks()
    assert decode_event(replay.of_kind("observed_step")[0]) == observed()
    assert decode_event(replay.of_kind("budget")[0]) == budget()
    assert "3 probe_result" in replay.summary and "corrupt" not in replay.summary


def test_corrupt_and_truncated_lines_are_skipped_and_counted(tmp_path: Path) -> None:
    path = tmp_path / "damaged.jsonl"
    _record_session(path)
    lines = gzip.decompress(path.read_bytes()).split(b"\n")  # damaged plain lines: the reader takes both
    assert lines[-1] == b""
    good = lines[:-1]
    damaged = [
        good[0],
        good[1],
        b"{this is not json",
        good[2],
        b"\xff\xfe\x00 binary",
        b'{"v":1,"t":1795959003,"kind":"checks"}',  # no data
        b'{"v":99,"t":1795959003,"kind":"checks","data":[]}',  # a newer format
        good[3],
        b'{"v":1,"t":1795959004,"kind":"no_such_kind","data":{}}',
        b"[1, 2, 3]",
        *good[4:],
        good[2][: len(good[2]) // 2],  # the last line cut mid-write (a crash)
    ]
    path.write_bytes(b"\n".join(damaged))
    replay = read_recording(path)
    assert replay.corrupt_lines == 7
    assert [e.kind for e in replay.events] == [
        "meta",
        "telemetry",
        "probe_result",
        "probe_result",
        "probe_result",
        "checks",
        "observed_step",
        "telemetry",
        "budget",
    ]
    assert len(replay.warnings) == 1
    warning = replay.warnings[0]
    assert "skipped 7 corrupt lines" in warning and "line 3: not JSON" in warning and "4 more" in warning
    assert "\n" not in warning
    assert "7 corrupt lines skipped" in replay.summary
    # the events keep their line numbers in the damaged file
    assert replay.events[2].line_no == 4


def test_recorder_appends_after_a_crash_mid_line(tmp_path: Path) -> None:
    path = tmp_path / "appended.jsonl.gz"
    rec = Recorder(path, clock=lambda: 1.0)
    rec.record("checks", list(checks()))
    whole = rec.bytes_written
    rec.record("observed_step", observed())
    rec.close()
    with path.open("r+b") as handle:
        handle.truncate(whole + 7)  # the previous run died inside its third line's compressed bytes
    with Recorder(path, clock=lambda: 3.0) as rec:
        rec.record("observed_step", observed())
    replay = read_recording(path)
    assert [e.kind for e in replay.events] == ["meta", "checks", "meta", "observed_step"]
    assert replay.corrupt_lines <= 1  # the cut line, where its first bytes decompressed
    assert any("cut or damaged after byte" in w and "to the next session" in w for w in replay.warnings)
    assert all("\n" not in w for w in replay.warnings)


def test_recorder_threads_write_whole_lines(tmp_path: Path) -> None:
    path = tmp_path / "threads.jsonl"
    rec = Recorder(path)
    result = CheckResult("C1", "governor", Status.PASS, "performance", "performance", facts={"x": "y" * 2000})

    def writer() -> None:
        for _ in range(200):
            rec.record("checks", [result])

    threads = [threading.Thread(target=writer) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    rec.close()
    assert rec.record("checks", [result]) is False  # closed
    replay = read_recording(path)
    assert replay.corrupt_lines == 0
    assert replay.counts() == {"meta": 1, "checks": 800}
    assert rec.lines_written == 801


def test_bad_files_are_one_clear_line(tmp_path: Path) -> None:
    with pytest.raises(UserInputError, match="no such file"):
        read_recording(tmp_path / "missing.jsonl")
    with pytest.raises(UserInputError, match="is a directory"):
        read_recording(tmp_path)
    png = tmp_path / "picture.png"
    png.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(range(256)))
    with pytest.raises(UserInputError, match="not a decodetop recording") as info:
        read_recording(png)
    assert "\n" not in str(info.value)
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    replay = read_recording(empty)
    assert replay.events == () and replay.corrupt_lines == 0
    assert replay.warnings == ("empty.jsonl: the recording is empty",)
    with pytest.raises(UserInputError, match="directory"):
        Recorder(tmp_path)
    with pytest.raises(ValueError, match="unknown recording kind"):
        Recorder(tmp_path / "x.jsonl").record("nonsense", {})


def test_write_events_helper(tmp_path: Path) -> None:
    path = tmp_path / "made.jsonl"
    write_events(path, [(100.0, "checks", list(checks())), (101.5, "observed_step", observed())])
    replay = read_recording(path)
    assert [(e.t_unix_s, e.kind) for e in replay.events] == [
        (100.0, "meta"),
        (100.0, "checks"),
        (101.5, "observed_step"),
    ]
    assert isinstance(decode_event(replay.events[2]), ServerStep)


class Colour(str, enum.Enum):
    RED = "red"
    BLUE = "blue"


@dataclass(frozen=True)
class Inner:
    colour: Colour
    values: tuple[float, ...]


@dataclass(frozen=True)
class Outer:
    name: str
    inner: Inner | None
    by_colour: Mapping[Colour, int] = field(default_factory=dict)
    pairs: tuple[tuple[int, str], ...] = ()
    maybe: float | None = None
    ratio: float = 0.5
    tags: list[str] = field(default_factory=list)


def test_generic_dataclass_round_trip() -> None:
    value = Outer(
        "x",
        Inner(Colour.BLUE, (1.0, 2.5)),
        {Colour.RED: 3},
        ((1, "a"), (2, "b")),
        None,
        math.inf,
        ["t"],
    )
    data = json.loads(json.dumps(to_jsonable(value), allow_nan=False))
    assert data["ratio"] is None  # JSON has no infinity
    back = from_jsonable(Outer, data)
    assert back.inner == value.inner and back.by_colour == {Colour.RED: 3} and back.pairs == value.pairs
    assert math.isnan(back.ratio)
    # unknown keys are ignored, missing ones take defaults, wrong types are a ValueError naming the field
    assert from_jsonable(Outer, {"name": "y", "inner": None, "added_later": 1}) == Outer("y", None)
    with pytest.raises(ValueError, match=r"Inner\.colour"):
        from_jsonable(Outer, {"name": "y", "inner": {"colour": "green", "values": []}})
    with pytest.raises(ValueError, match="name"):
        from_jsonable(Outer, {"name": 3, "inner": None})
    with pytest.raises(TypeError, match="cannot record"):
        to_jsonable(object())


def _line(kind: str, type_name: object, data: object) -> str:
    return json.dumps({"v": 1, "t": 1795959002.5, "kind": kind, "type": type_name, "data": data})


PROBE_RESULT = "decodetop.probes.results.ProbeResult"


def test_hostile_lines_are_corrupt_or_undecodable_never_a_crash(tmp_path: Path) -> None:
    """Lines a hand or another tool wrote: a probe result typed null or as another class, data of the wrong shape,
    payloads whose fields are null or of the wrong type, a line of 5 MiB. Each is counted and skipped."""
    path = tmp_path / "hostile.jsonl"
    _record_session(path)
    lines = _plain_lines(path)
    corrupt = [
        _line("probe_result", None, {"probe": "allreduce", "status": "ok", "params": {}}),
        _line("probe_result", "decodetop.collectors.checks.result.CheckResult", {"probe": "x", "status": "ok"}),
        _line("probe_result", "os.system", {"probe": "x", "status": "ok"}),
        _line("telemetry", "decodetop.collectors.telemetry.TelemetrySnapshot", 42),
        _line("budget", "decodetop.budget.compose.Budget", [{"model": "m"}]),
        _line("meta", None, ["not", "an", "object"]),
        '{"v":1,"t":1795959002.5,"kind":"checks","type":null,"data":"' + "x" * (5 * 1024 * 1024) + '"}',
    ]
    undecodable = [
        _line("probe_result", PROBE_RESULT, {"probe": None, "status": "ok", "params": {}}),
        _line("probe_result", PROBE_RESULT, {"probe": "x", "status": "no-such-status", "params": {}}),
        _line("probe_result", PROBE_RESULT, {"probe": "x", "status": "ok", "params": [], "measurements": [None]}),
        _line(
            "probe_result", PROBE_RESULT, {"probe": "x", "status": "ok", "params": {}, "measurements": [{"name": 1}]}
        ),
        _line("observed_step", "decodetop.collectors.serving.ServerStep", {"step_ms": "fast"}),
        _line("checks", "decodetop.collectors.checks.result.CheckResult", [{"check_id": None}]),
    ]
    path.write_text("\n".join([*lines[:3], *corrupt, *undecodable, *lines[3:]]) + "\n")
    replay = read_recording(path)
    assert replay.corrupt_lines == len(corrupt)
    assert "line 4: type null is not what a probe_result line holds (ProbeResult)" in replay.warnings[0]
    decoded = decode_replay(replay)
    assert decoded.undecodable == len(undecodable)
    for item in decoded.items:  # everything that did decode is of its kind's class
        expected = KIND_TYPES.get(item.event.kind)
        values = item.value if isinstance(item.value, tuple) else (item.value,)
        assert expected is None or all(isinstance(v, expected) for v in values), item
    assert [d.event.kind for d in decoded.items].count("probe_result") == 3
    assert decoded.values(ProbeResult) == list(probe_results())
    assert decoded.values(CheckResult) == list(checks())


def test_an_overlong_line_is_skipped_unread(tmp_path: Path) -> None:
    path = tmp_path / "long.jsonl"
    _record_session(path)
    good = gzip.decompress(path.read_bytes())
    path.write_bytes(b"x" * (jsonio.MAX_LINE_BYTES * 3) + b"\n" + good)
    replay = read_recording(path)
    assert replay.corrupt_lines == 1 and replay.events[0].kind == "meta" and replay.events[0].line_no == 2
    assert "line 1: line longer than 4 MiB" in replay.warnings[0]


def test_decode_replay_skips_payloads_that_no_longer_fit(tmp_path: Path) -> None:
    path = tmp_path / "old.jsonl"
    _record_session(path)
    lines = _plain_lines(path)
    # a recording from another version: a check without its required fields, an unknown class
    lines.insert(
        3,
        json.dumps(
            {
                "v": 1,
                "t": 1795959002.5,
                "kind": "checks",
                "type": "decodetop.collectors.checks.result.CheckResult",
                "data": [{"check_id": "C1"}],
            }
        ),
    )
    lines.insert(
        4, json.dumps({"v": 1, "t": 1795959002.6, "kind": "budget", "type": "decodetop.budget.gone.Budget", "data": {}})
    )
    path.write_text("\n".join(lines) + "\n")
    decoded = decode_replay(read_recording(path))
    assert decoded.undecodable == 2 and decoded.skipped == 2
    assert [d.event.kind for d in decoded.items].count("probe_result") == 3
    assert decoded.items[1].value == telemetry_snapshot()
    assert len(decoded.warnings) == 1 and "skipped 2 events" in decoded.warnings[0]
    assert "line 4 (checks)" in decoded.warnings[0]


def test_a_server_step_recorded_under_its_former_class_name_still_reads(tmp_path: Path) -> None:
    """collectors.serving.ServerStep was ObservedStep: a recording written then replays the same step."""
    path = tmp_path / "before-the-rename.jsonl"
    _record_session(path)
    lines = _plain_lines(path)
    former = _line("observed_step", "decodetop.collectors.serving.ObservedStep", to_jsonable(observed()))
    path.write_text("\n".join([*lines[:1], former]) + "\n")
    replay = read_recording(path)
    assert replay.corrupt_lines == 0
    (step,) = [item.value for item in decode_replay(replay).items if item.event.kind == "observed_step"]
    assert isinstance(step, ServerStep) and step == observed()
