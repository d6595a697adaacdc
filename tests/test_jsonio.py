"""The one JSON loader: hostile documents become one line naming the file (and line), never a crash or a hang."""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

import pytest

from decodetop.errors import UserInputError
from decodetop.jsonio import (
    JsonInputError,
    bounded_lines,
    iter_json_lines,
    load_json,
    load_json_object,
    loads,
    open_regular,
    parse_json,
    read_bounded,
    read_maybe_gzip,
)

HOSTILE = [
    ("[" * 100_000 + "]" * 100_000, "nested too deeply to read"),
    ('{"n": ' + "9" * 5000 + "}", "a number with 5000 digits (more than 4300)"),
    ('{"n": -' + "9" * 5000 + "}", "a number with 5000 digits (more than 4300)"),
    ('{"ms": NaN}', "NaN is not a finite number"),
    ('{"ms": Infinity}', "Infinity is not a finite number"),
    ('{"ms": -Infinity}', "-Infinity is not a finite number"),
    ('{"ms": 1e999}', "1e999 is out of range for a number"),
    ("{not json", "not valid JSON (Expecting property name enclosed in double quotes at line 1 column 2)"),
    ("", "not valid JSON (Expecting value at line 1 column 1)"),
]


@pytest.mark.parametrize(("text", "problem"), HOSTILE, ids=[problem.split(" (")[0] for _, problem in HOSTILE])
def test_file_problems_are_one_line_naming_the_file(tmp_path: Path, text: str, problem: str) -> None:
    path = tmp_path / "plan.json"
    path.write_text(text)
    with pytest.raises(UserInputError) as info:
        load_json(path)
    assert str(info.value) == f"{path}: {problem}"


def test_invalid_utf8_and_wrong_top_level(tmp_path: Path) -> None:
    path = tmp_path / "b.json"
    path.write_bytes(b'{"a": "\xff"}')
    with pytest.raises(UserInputError, match=r"b\.json: not UTF-8 text \(bad byte at offset 7\)"):
        load_json(path)
    path.write_text("[1, 2]")
    with pytest.raises(UserInputError, match=r"b\.json: expected an object at the top, found a list"):
        load_json_object(path)
    assert load_json(path, expect=list) == [1, 2]
    path.write_bytes(b'\xef\xbb\xbf{"a": 1.5}')  # a byte-order mark is tolerated
    assert load_json_object(path) == {"a": 1.5}


def test_lines_name_their_number() -> None:
    text = '{"a": 1}\n\n[1]\n{"b": NaN}\n' + "[" * 5000 + "\n"
    out = list(iter_json_lines(text, source="rec.jsonl"))
    assert out[0] == (1, {"a": 1})
    assert [n for n, _ in out] == [1, 3, 4, 5]
    errors = [v for _, v in out[1:]]
    assert all(isinstance(e, JsonInputError) for e in errors)
    assert [str(e) for e in errors] == [
        "rec.jsonl line 3: expected an object at the top, found a list",
        "rec.jsonl line 4: NaN is not a finite number",
        "rec.jsonl line 5: nested too deeply to read",
    ]
    long = list(iter_json_lines('{"a": "' + "x" * 200 + '"}', source="r", max_line_bytes=100))
    assert isinstance(long[0][1], JsonInputError) and "longer than" in str(long[0][1])


def test_loads_keeps_syntax_errors_for_the_caller() -> None:
    with pytest.raises(json.JSONDecodeError):
        loads("{oops", source="x.json")
    with pytest.raises(JsonInputError, match=r"x\.json: nested too deeply"):
        loads("[" * 100_000, source="x.json")
    assert loads(b'{"a": [1, 2.5]}', source="x.json") == {"a": [1, 2.5]}
    assert parse_json('"s"', source="x", expect=str) == "s"
    with pytest.raises(JsonInputError, match="expected a number at the top, found true/false"):
        parse_json("true", source="x", expect=int)


def test_special_files_are_refused_without_reading(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)  # no writer: a blocking open would hang here
    with pytest.raises(UserInputError, match=r"fifo\.json: cannot read: a FIFO, not a regular file"):
        load_json(fifo)
    with pytest.raises(UserInputError, match="/dev/zero: cannot read: a character device, not a regular file"):
        read_bounded("/dev/zero")
    with pytest.raises(UserInputError, match="cannot read: Is a directory"):
        read_bounded(tmp_path)
    with pytest.raises(UserInputError, match="cannot read: No such file or directory"):
        read_bounded(tmp_path / "gone.json")


def test_size_is_bounded(tmp_path: Path) -> None:
    path = tmp_path / "big.json"
    path.write_text("[" + "0," * 100 + "0]")
    with pytest.raises(UserInputError, match=r"big\.json: cannot read: larger than 100 bytes"):
        load_json(path, expect=list, max_bytes=100)
    assert len(load_json(path, expect=list, max_bytes=1000)) == 101


def test_gzip_members_are_read_within_the_bound(tmp_path: Path) -> None:
    plain = b'{"results": [' + b"0," * 200 + b"0]}"
    packed = tmp_path / "results.json.gz"
    packed.write_bytes(gzip.compress(plain))
    assert read_maybe_gzip(packed) == plain
    (tmp_path / "plain.json").write_bytes(plain)
    assert read_maybe_gzip(tmp_path / "plain.json") == plain  # not compressed: read as it is
    bomb = tmp_path / "bomb.gz"
    bomb.write_bytes(gzip.compress(b" " * 1_000_000))  # a few KiB that inflate to a MB
    with pytest.raises(UserInputError, match=r"bomb\.gz: cannot read: decompresses to more than 10000 bytes"):
        read_maybe_gzip(bomb, max_bytes=10_000)
    whole = gzip.compress(plain)
    cases = {
        "truncated.gz": (whole[: len(whole) // 2], "truncated gzip data"),
        "trailing.gz": (whole + b"junk", "bytes after the gzip data"),
        "corrupt.gz": (whole[:10] + b"\xff" * 20 + whole[30:], "corrupt gzip data"),
    }
    for name, (data, problem) in cases.items():
        (tmp_path / name).write_bytes(data)
        with pytest.raises(UserInputError, match=f"{name}: cannot read: {problem}") as info:
            read_maybe_gzip(tmp_path / name)
        assert "\n" not in str(info.value)


def test_open_regular_and_bounded_lines(tmp_path: Path) -> None:
    fifo = tmp_path / "f"
    os.mkfifo(fifo)
    with pytest.raises(UserInputError, match="cannot read: a FIFO, not a regular file"):
        open_regular(fifo)
    path = tmp_path / "lines.jsonl"
    path.write_bytes(b"short\n" + b"x" * 50 + b"\nlast")
    with open_regular(path) as handle:
        assert list(bounded_lines(handle, max_line_bytes=20)) == [b"short\n", None, b"last"]
