"""Every file decodetop reads goes through the one JSON loader: hostile documents are one line naming the file,
never a crash, a hang or a traceback (the readers themselves, not mocks)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from decodetop.budget.diff import load_budget_document
from decodetop.budget.spec import load_config
from decodetop.collectors.baseline import load_baseline
from decodetop.collectors.fake_nvml import load_recording
from decodetop.errors import UserInputError
from decodetop.export.recording import read_recording
from decodetop.probes.results import load_results
from decodetop.traces.classify import load_rules
from decodetop.traces.compare import load_budget_json
from decodetop.traces.reader import read_trace

HOSTILE: dict[str, tuple[bytes, str]] = {
    "nested 100,000 deep": (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
    "5,000-digit integer": (b'{"n": ' + b"9" * 5000 + b"}", "a number with 5000 digits"),
    "400-digit integer (no float holds it)": (
        b'{"n": ' + b"9" * 400 + b"}",
        "a number with 400 digits is out of range",
    ),
    "NaN": (b'{"ms": NaN}', "NaN is not a finite number"),
    "Infinity": (b'{"ms": Infinity}', "Infinity is not a finite number"),
    "1e999": (b'{"ms": 1e999}', "out of range for a number"),
}

READERS: dict[str, Callable[[Path], Any]] = {
    "model config": load_config,
    "budget --diff input": load_budget_document,
    "probe results": load_results,
    "kernel rules": lambda p: load_rules(str(p)),
    "trace budget": load_budget_json,
    "NVML recording": load_recording,
    "check baseline": lambda p: load_baseline(p.stem, directory=p.parent),
}


@pytest.mark.parametrize("reader", list(READERS))
@pytest.mark.parametrize("content", list(HOSTILE))
def test_hostile_json_is_one_line_naming_the_file(tmp_path: Path, reader: str, content: str) -> None:
    data, problem = HOSTILE[content]
    path = tmp_path / "input.json"
    path.write_bytes(data)
    with pytest.raises(UserInputError) as info:
        READERS[reader](path)
    message = str(info.value)
    assert str(path) in message and problem in message and "\n" not in message
    assert path.read_bytes() == data  # a reader never rewrites what it was given


@pytest.mark.parametrize("reader", [*READERS, "trace"])
def test_fifo_and_device_are_refused_without_blocking(tmp_path: Path, reader: str) -> None:
    fifo = tmp_path / "input.json"
    os.mkfifo(fifo)  # no writer: a blocking open would hang the test
    read = read_trace if reader == "trace" else READERS[reader]
    with pytest.raises(UserInputError, match="not a regular file"):
        read(fifo)


def test_hostile_trace_events_name_the_file(tmp_path: Path) -> None:
    deep = tmp_path / "deep.json"
    deep.write_text('{"traceEvents": [' + "[" * 100_000)
    with pytest.raises(UserInputError, match=r"deep\.json: .*nested too deeply"):
        read_trace(deep)
    huge = tmp_path / "huge.json"
    huge.write_text('{"traceEvents": [{"ph": "X", "ts": ' + "9" * 5000 + "}]}")
    with pytest.raises(UserInputError, match=r"huge\.json: .*a number with (5000|more than 4300) digits"):
        read_trace(huge)


def test_hostile_recording_lines_are_counted_and_skipped(tmp_path: Path) -> None:
    path = tmp_path / "session.jsonl"
    good = '{"v": 1, "t": 1.0, "kind": "meta", "data": {}}'
    path.write_text("\n".join([good, "[" * 100_000, '{"v": 1, "t": NaN}', '{"v": 1, "t": ' + "9" * 5000 + "}"]))
    replay = read_recording(path)
    assert replay.corrupt_lines == 3 and len(replay.events) == 1
    assert "nested too deeply" in replay.warnings[0] and "NaN is not a finite number" in replay.warnings[0]
