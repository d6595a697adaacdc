"""Where the live UI cannot run it says so and exits 2 before anything starts: stdout or stdin not a terminal,
`TERM=dumb`, a terminal below the minimum size. Unit tests over fake streams, and real terminals in tmux."""

from __future__ import annotations

import io
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from decodetop.cli import main
from decodetop.tui.launch import MIN_COLUMNS, MIN_ROWS, terminal_problem
from tests.conftest import require_tool
from tests.helpers.waiting import wait_for

SRC = Path(__file__).resolve().parents[2] / "src"
EXIT_TIMEOUT_S = 60.0
"""The refusal comes before textual is imported; 60 s covers Python start-up on 2 busy CI cores."""


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_not_a_terminal_names_the_stream_and_the_headless_commands() -> None:
    problem = terminal_problem(_Tty(), io.StringIO(), {"TERM": "xterm-256color"})
    assert problem is not None
    assert "stdout is not one" in problem and "decodetop check" in problem and "decodetop budget" in problem
    problem = terminal_problem(io.StringIO(), _Tty(), {"TERM": "xterm-256color"})
    assert problem is not None and "stdin is not one" in problem


def test_dumb_terminal_is_refused() -> None:
    problem = terminal_problem(_Tty(), _Tty(), {"TERM": "dumb"})
    assert problem is not None and "TERM=dumb" in problem


def test_a_terminal_whose_size_is_unknown_is_let_through() -> None:
    """A StringIO has no file descriptor: the running UI checks the size itself."""
    assert terminal_problem(_Tty(), _Tty(), {"TERM": "xterm-256color"}) is None


def test_cli_exits_2_with_one_line_when_stdout_is_a_file(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--no-probes"]) == 2  # pytest captures stdout: not a terminal
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "stdout is not one" in err[0]


def _tmux(tmux: str, sock: Path, *args: str) -> str:
    out = subprocess.run([tmux, "-S", str(sock), *args], capture_output=True, text=True, check=False, timeout=30)
    return out.stdout


def _run_in_tmux(tmp_path: Path, size: tuple[int, int], term: str, redirect: str = "") -> str:
    tmux = require_tool("tmux")
    sock = tmp_path / "tmux.sock"
    env = {
        "HOME": str(tmp_path / "home"),
        "DECODETOP_STATE_DIR": str(tmp_path / "state"),
        "DECODETOP_CONFIG_DIR": str(tmp_path / "config"),
        "TERM": term,
        "PATH": os.environ.get("PATH", ""),
        "PYTHONPATH": str(SRC),
    }
    command = shlex.join(
        ["env", *(f"{k}={v}" for k, v in env.items()), sys.executable, "-m", "decodetop", "--no-probes"]
    )
    shell = f"{command} {redirect}; echo DECODETOP-EXIT $?; sleep 300"
    _tmux(tmux, sock, "new-session", "-d", "-s", "dt", "-x", str(size[0]), "-y", str(size[1]), shell)
    try:

        def exited() -> str:
            screen = _tmux(tmux, sock, "capture-pane", "-p", "-J", "-t", "dt")
            return screen if "DECODETOP-EXIT" in screen else ""

        return wait_for(exited, "decodetop to exit", timeout_s=EXIT_TIMEOUT_S, interval_s=0.2)
    finally:
        _tmux(tmux, sock, "kill-server")


@pytest.mark.slow
def test_tmux_stdout_to_a_file_exits_2(tmp_path: Path) -> None:
    out = tmp_path / "out.txt"
    screen = _run_in_tmux(tmp_path, (120, 40), "xterm-256color", f"> {shlex.quote(str(out))} < /dev/null")
    assert "DECODETOP-EXIT 2" in screen
    assert "stdout is not one" in screen.replace("\n", "")
    assert out.read_bytes() == b""  # no escape codes written into the file


@pytest.mark.slow
def test_tmux_term_dumb_exits_2(tmp_path: Path) -> None:
    screen = _run_in_tmux(tmp_path, (120, 40), "dumb")
    assert "DECODETOP-EXIT 2" in screen
    assert "TERM=dumb" in screen and "decodetop check" in screen


@pytest.mark.slow
def test_tmux_below_the_minimum_exits_2(tmp_path: Path) -> None:
    screen = _run_in_tmux(tmp_path, (40, 12), "xterm-256color")
    assert "DECODETOP-EXIT 2" in screen
    assert f"at least {MIN_COLUMNS}×{MIN_ROWS}" in screen.replace("\n", "")
