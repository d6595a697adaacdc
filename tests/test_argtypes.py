"""Flag types: bad values fail at parse time with one line, before any work; nothing is opened to check them."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import pytest

from decodetop.argtypes import (
    check_cpu_ranks,
    file_or_directory,
    non_empty,
    output_file,
    output_path,
    positive_finite_float,
    positive_int,
    regular_file,
)
from decodetop.errors import UserInputError


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("nan", "must be a positive finite number, got 'nan'"),
        ("inf", "must be a positive finite number, got 'inf'"),
        ("-inf", "must be a positive finite number, got '-inf'"),
        ("0", "must be a positive finite number, got '0'"),
        ("-1.5", "must be a positive finite number, got '-1.5'"),
        ("fast", "not a number: 'fast'"),
        ("", "not a number: ''"),
    ],
)
def test_positive_finite_float_refuses(text: str, message: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError) as info:
        positive_finite_float(text)
    assert str(info.value) == message


def test_positive_values_pass() -> None:
    assert positive_finite_float("12.5") == 12.5
    assert positive_finite_float("1e-3") == 0.001
    assert positive_int(" 4 ") == 4
    for bad in ("0", "-2", "2.5", "x"):
        with pytest.raises(argparse.ArgumentTypeError):
            positive_int(bad)


@pytest.mark.parametrize("text", ["", "   ", "\t"])
def test_non_empty_refuses_blank(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="must not be empty"):
        non_empty(text)
    assert non_empty("llama-3.1-70b") == "llama-3.1-70b"


def test_regular_file_refuses_fifo_device_directory_without_opening(tmp_path: Path) -> None:
    fifo = tmp_path / "config.json"
    os.mkfifo(fifo)  # opening it for reading without a writer would block: the check must not open it
    with pytest.raises(argparse.ArgumentTypeError, match=r"config\.json: a FIFO, not a regular file"):
        regular_file(str(fifo))
    with pytest.raises(argparse.ArgumentTypeError, match="/dev/zero: a character device, not a regular file"):
        regular_file("/dev/zero")
    with pytest.raises(argparse.ArgumentTypeError, match="a directory, not a regular file"):
        regular_file(str(tmp_path))
    with pytest.raises(argparse.ArgumentTypeError, match="no such file"):
        regular_file(str(tmp_path / "gone.json"))
    good = tmp_path / "c.json"
    good.write_text("{}")
    assert regular_file(str(good)) == good
    assert file_or_directory(str(tmp_path)) == tmp_path
    with pytest.raises(argparse.ArgumentTypeError, match="a FIFO, not a file or directory"):
        file_or_directory(str(fifo))


def test_output_path_is_checked_up_front(tmp_path: Path) -> None:
    assert output_path("-") == "-"
    assert output_path(str(tmp_path / "new.json")) == str(tmp_path / "new.json")
    assert output_path(str(tmp_path / "sub" / "dir" / "new.json"))  # the writer creates the directories
    assert list(tmp_path.iterdir()) == []  # the write check leaves nothing behind
    with pytest.raises(argparse.ArgumentTypeError, match="a directory, not a file to write"):
        output_path(str(tmp_path))
    with pytest.raises(argparse.ArgumentTypeError, match="a character device, not a file to write"):
        output_path("/dev/null")
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(argparse.ArgumentTypeError, match="Not a directory"):
        output_path(str(blocker / "out.json"))
    with pytest.raises(argparse.ArgumentTypeError, match="must not be empty"):
        output_path("")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(argparse.ArgumentTypeError, match="a FIFO, not a file to write"):
        output_path(str(tmp_path / "missing" / ".." / "fifo"))
    with pytest.raises(argparse.ArgumentTypeError, match="needs a file"):
        output_file("-")  # no standard output for a file written while the screen is in use


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes whatever the mode")
def test_output_path_in_a_read_only_directory(tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        with pytest.raises(argparse.ArgumentTypeError, match="Permission denied"):
            output_path(str(locked / "out.json"))
    finally:
        locked.chmod(0o700)


def test_output_path_on_a_read_only_filesystem() -> None:
    """/proc is read-only for every user, root included."""
    with pytest.raises(argparse.ArgumentTypeError, match="cannot write"):
        output_path("/proc/decodetop-out.json")


def test_cpu_ranks_are_capped_unless_forced() -> None:
    check_cpu_ranks(None, force=False)
    check_cpu_ranks(4, force=False, cpu_count=4)
    with pytest.raises(UserInputError, match=r"--cpu-ranks 5: more than the 4 CPUs of this machine \(add --force"):
        check_cpu_ranks(5, force=False, cpu_count=4)
    check_cpu_ranks(64, force=True, cpu_count=4)
