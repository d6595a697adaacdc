"""Small compressed traces cannot cost minutes or gigabytes: one huge event, a run of blanks, millions of distinct
names, one enormous name and a gzip bomb past the UI's cap are each refused with one line naming the limit (the
UI's cap counts the bytes once decompressed). Files are crafted here, streamed through gzip."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from decodetop.errors import UserInputError
from decodetop.traces.reader import read_trace
from decodetop.tui.trace_source import TraceOptions, load


def _gz(path: Path, *parts: bytes | tuple[bytes, int]) -> Path:
    """Write `parts` gzipped; a (chunk, n) part is the chunk n times (never held whole)."""
    with gzip.open(path, "wb", compresslevel=1) as out:
        for part in parts:
            if isinstance(part, tuple):
                chunk, times = part
                for _ in range(times):
                    out.write(chunk)
            else:
                out.write(part)
    return path


def _refused(path: Path, needle: str) -> str:
    with pytest.raises(UserInputError) as info:
        read_trace(path)
    message = str(info.value)
    assert str(path) in message and needle in message and "\n" not in message and len(message) < 400
    return message


def test_one_huge_event_is_refused(tmp_path: Path) -> None:
    path = _gz(
        tmp_path / "event.json.gz",
        b'{"traceEvents":[{"ph":"X","cat":"kernel","name":"',
        (b"a" * (1 << 20), 60),  # one 60 Mi-character event in ~60 KB: main read it whole, in 94 s
        b'","ts":1,"dur":1}]}',
    )
    assert path.stat().st_size < 1_000_000
    _refused(path, "event #0 is larger than 4 Mi characters")


def test_a_gigabyte_of_blanks_is_refused(tmp_path: Path) -> None:
    path = _gz(tmp_path / "blanks.json.gz", b'{"traceEvents":[', (b" " * (1 << 20), 100), b"]}")
    _refused(path, "blank characters in a row")


def test_millions_of_distinct_names_are_refused(tmp_path: Path) -> None:
    events = (f'{{"ph":"X","cat":"kernel","name":"k{i}","ts":{i},"dur":1}}' for i in range(150_000))
    path = tmp_path / "names.json"
    path.write_text('{"traceEvents":[' + ",".join(events) + "]}")
    _refused(path, "more than 100,000 distinct names")


def test_an_enormous_name_is_refused(tmp_path: Path) -> None:
    name = "n" * (3 << 20)
    path = tmp_path / "name.json"
    path.write_text(json.dumps({"traceEvents": [{"ph": "X", "cat": "kernel", "name": name, "ts": 1, "dur": 1}]}))
    _refused(path, "a name of 3,145,728 characters")


def test_the_ui_cap_counts_bytes_once_decompressed(tmp_path: Path) -> None:
    event = b'{"ph":"X","cat":"cpu_op","name":"aten::mm","ts":1,"dur":1},'
    path = _gz(tmp_path / "bomb.trace.json.gz", b'{"traceEvents":[', (event * 1000, 400), event[:-1], b"]}")
    assert path.stat().st_size < 1_000_000  # ~24 MB once decompressed
    with pytest.raises(UserInputError) as info:
        load(path, TraceOptions(max_bytes=5_000_000))  # main compared the 1 MB on disk with the cap
    message = str(info.value)
    assert "more than 5,000,000 bytes once decompressed" in message and "\n" not in message
