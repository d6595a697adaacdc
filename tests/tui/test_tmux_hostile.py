"""decodetop in a real terminal keeps a hostile replay's escape sequences off it: a recording whose source, GPU names
and check names hold OSC 0/2 (set the window title), OSC 52 (write the clipboard), CSI 2J (clear) and Rich markup
replays in a tmux pane; the pane's title is what it was before, the marks show on screen, `q` quits with exit 0.

A control run in the same tmux first proves this terminal honours a title escape (printf of OSC 2 does change the
pane title), so the test cannot pass merely because tmux ignored it."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import require_tool
from tests.helpers.hostile_text import ESCAPES
from tests.helpers.waiting import wait_for

from .test_hostile_ui import _hostile_recording

START_TIMEOUT_S = 60.0
"""First frame on 2 busy CI cores."""
TITLE_ESCAPES = "\x1b]0;PWNED\x07\x1b]2;PWNED2\x1b\\"
"""OSC 0 ended by BEL and OSC 2 ended by ST: the two ways a program sets the title."""


def _tmux(tmux: str, sock: Path, *args: str) -> str:
    out = subprocess.run([tmux, "-S", str(sock), *args], capture_output=True, text=True, check=False, timeout=30)
    return out.stdout


def _title(tmux: str, sock: Path, target: str) -> str:
    return _tmux(tmux, sock, "display-message", "-p", "-t", target, "#{pane_title}").strip()


def _screen(tmux: str, sock: Path, needle: str, timeout_s: float) -> str:
    last = [""]

    def shown() -> str:
        last[0] = _tmux(tmux, sock, "capture-pane", "-p", "-t", "dt")
        return last[0] if needle in last[0] else ""

    try:
        return wait_for(shown, f"{needle!r} on the screen", timeout_s=timeout_s, interval_s=0.2)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; the screen was:\n{last[0]}") from None


@pytest.mark.slow
def test_a_hostile_replay_leaves_the_pane_title_alone(tmp_path: Path) -> None:
    tmux = require_tool("tmux")
    sock = tmp_path / "tmux.sock"
    hostile = "[bold red]R[/oops]" + TITLE_ESCAPES + ESCAPES[1] + ESCAPES[2]
    recording = _hostile_recording(tmp_path / "hostile.jsonl", hostile)
    env = {
        "HOME": str(tmp_path / "home"),
        "DECODETOP_STATE_DIR": str(tmp_path / "state"),
        "DECODETOP_CONFIG_DIR": str(tmp_path / "config"),
        "TERM": "xterm-256color",
        "PATH": os.environ.get("PATH", ""),
        "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "src"),
    }
    command = shlex.join(
        [
            "env",
            "-i",
            *[f"{k}={v}" for k, v in env.items()],
            sys.executable,
            "-m",
            "decodetop",
            "--replay",
            str(recording),
        ]
    )
    try:
        # the control: this tmux does take a title from an escape a program prints
        _tmux(tmux, sock, "new-session", "-d", "-s", "control", "-x", "200", "-y", "50", "sleep 300")
        _tmux(tmux, sock, "set-option", "-g", "allow-rename", "on")
        _tmux(tmux, sock, "new-window", "-d", "-t", "control", "printf '\\033]2;CONTROL\\033\\\\'; sleep 300")
        wait_for(
            lambda: "CONTROL" in _tmux(tmux, sock, "list-panes", "-a", "-F", "#{pane_title}"),
            "the control pane's title set by its escape",
            timeout_s=10.0,
            interval_s=0.1,
        )
        _tmux(
            tmux, sock, "new-session", "-d", "-s", "dt", "-x", "200", "-y", "50", f"{command}; echo EXIT $?; sleep 300"
        )
        before = _title(tmux, sock, "dt")
        assert "PWNED" not in before
        screen = _screen(tmux, sock, "␛]0;PWNED␇", START_TIMEOUT_S)  # the replay's names, drawn with their marks
        assert "[bold red]R[/oops]" in screen  # markup as typed
        assert _title(tmux, sock, "dt") == before
        _tmux(tmux, sock, "send-keys", "-t", "dt", "q")
        screen = _screen(tmux, sock, "EXIT", START_TIMEOUT_S)
        assert "EXIT 0" in screen
        assert _title(tmux, sock, "dt") == before
        assert "PWNED" not in _tmux(tmux, sock, "list-panes", "-a", "-F", "#{pane_title}")
    finally:
        _tmux(tmux, sock, "kill-server")
