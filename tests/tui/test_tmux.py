"""decodetop in a real terminal: a tmux pane at 80×24 and 200×50, the bar and both markers on screen, `q` quits and
no decodetop process (nor probe rank) is left behind."""

from __future__ import annotations

import functools
import shlex
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.conftest import require_tool
from tests.helpers.env import isolated_dirs, subprocess_env
from tests.helpers.waiting import wait_for

START_TIMEOUT_S = 60.0
"""First frame on 2 busy CI cores (the benchmark measures the real figure)."""
QUIT_TIMEOUT_S = 60.0
"""q with CPU ranks running: cancel, then end the ranks (controller close timeout 5 s) and the collector."""


def _tmux(tmux: str, sock: Path, *args: str) -> str:
    out = subprocess.run([tmux, "-S", str(sock), *args], capture_output=True, text=True, check=False, timeout=30)
    return out.stdout


def _wait_for(tmux: str, sock: Path, needle: str, timeout_s: float) -> str:
    def shown() -> str:
        screen = _tmux(tmux, sock, "capture-pane", "-p", "-t", "dt")
        return screen if needle in screen else ""

    return wait_for(shown, f"{needle!r} on the screen", timeout_s=timeout_s, interval_s=0.2)


def _descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def _decodetop_command(tmp_path: Path, *flags: str) -> str:
    """`env … python -m decodetop FLAGS` for the pane's shell: HOME, the XDG dirs, the state and config dirs in this
    test's temp dir (`tests.helpers.env.subprocess_env`), a colour terminal."""
    env = subprocess_env(**isolated_dirs(tmp_path / "user"), TERM="xterm-256color")
    return shlex.join(["env", *(f"{k}={v}" for k, v in env.items()), sys.executable, "-m", "decodetop", *flags])


@pytest.mark.slow
@pytest.mark.parametrize(
    ("width", "height", "flags"),
    [(80, 24, ["--no-probes"]), (200, 50, ["--cpu-ranks", "2"])],
    ids=["80x24-no-probes", "200x50-cpu-ranks"],
)
def test_decodetop_in_tmux(tmp_path: Path, width: int, height: int, flags: list[str]) -> None:
    tmux = require_tool("tmux")
    sock = tmp_path / "tmux.sock"
    command = _decodetop_command(tmp_path, *flags)
    shell = f"{command}; echo DECODETOP-EXIT $?; sleep 300"
    _tmux(tmux, sock, "new-session", "-d", "-s", "dt", "-x", str(width), "-y", str(height), shell)
    try:
        pane_pid = int(_tmux(tmux, sock, "display-message", "-p", "-t", "dt", "#{pane_pid}").strip())
        # The observed marker is drawn with the bar and the other markers: wait for it, not for the header's text.
        screen = _wait_for(tmux, sock, "▲", START_TIMEOUT_S)
        assert "target 3.24" in screen
        assert "░" in screen  # the bar (unexplained part at least)
        assert "◆" in screen and "▲" in screen  # target and observed markers
        ranks = "--cpu-ranks" in flags
        if ranks:
            _wait_for(tmux, sock, "▱", START_TIMEOUT_S)  # the progress gauge: ranks are up and probing
        ours = [p for p in _descendants(pane_pid) if "decodetop" in " ".join(p.cmdline())]
        assert ours, "decodetop is not running in the pane"
        tree = [p for q in ours for p in [q, *_descendants(q.pid)]]
        if ranks:
            assert len(tree) >= 3, f"expected decodetop and 2 ranks, found {[p.cmdline()[:3] for p in tree]}"
        _tmux(tmux, sock, "send-keys", "-t", "dt", "q")
        screen = _wait_for(tmux, sock, "DECODETOP-EXIT", QUIT_TIMEOUT_S)
        assert "DECODETOP-EXIT 0" in screen
        gone, alive = psutil.wait_procs(tree, timeout=10)
        assert not alive, f"left running after q: {[p.pid for p in alive]}"
        assert all(p.pid not in {c.pid for c in _descendants(pane_pid)} for p in gone)
    finally:
        _tmux(tmux, sock, "kill-server")


def _gone(tmux: str, sock: Path, needle: str, timeout_s: float) -> str:
    """Wait until `needle` is no longer on screen; the screen then."""

    def away() -> str:
        screen = _tmux(tmux, sock, "capture-pane", "-p", "-t", "dt")
        return screen if needle not in screen else ""

    return wait_for(away, f"{needle!r} off the screen", timeout_s=timeout_s, interval_s=0.2)


@pytest.mark.slow
def test_filter_fold_and_maximise_in_a_quarter_pane(tmp_path: Path) -> None:
    """80×24, a fake 8-GPU host: `/` filters every table through several age refreshes without a crash, `f` folds
    the budget box to its one-line verdict, `z` gives the GPU tab (GPUs and processes) the whole pane, `q` exits 0."""
    tmux = require_tool("tmux")
    sock = tmp_path / "tmux.sock"
    command = _decodetop_command(tmp_path, "--demo")
    _tmux(
        tmux,
        sock,
        "new-session",
        "-d",
        "-s",
        "dt",
        "-x",
        "80",
        "-y",
        "24",
        f"{command}; echo DECODETOP-EXIT $?; sleep 300",
    )
    keys = functools.partial(_tmux, tmux, sock, "send-keys", "-t", "dt")
    try:
        _wait_for(tmux, sock, "▲", START_TIMEOUT_S)
        keys("/")
        _wait_for(tmux, sock, "filter: GPU", 20)  # the filter box has the keys now
        keys("-l", "xid")  # hides every probe row and most checks
        _gone(tmux, sock, "filter: GPU", 20)
        keys("Enter")
        # the age refresh is the app's 1 s wall-clock timer, with nothing on screen to wait for: let three go by
        time.sleep(3.5)
        screen = _tmux(tmux, sock, "capture-pane", "-p", "-t", "dt")
        assert "DECODETOP-EXIT" not in screen and "xid" in screen, screen
        keys("f")  # (an escape just before would reach the app as alt+f)
        screen = _gone(tmux, sock, "╭", 20)  # no border: the box is one line
        first = screen.splitlines()[0]
        assert "explained" in first and "observed" in first and "target" in first, screen
        keys("f")
        _wait_for(tmux, sock, "╭", 20)
        keys("2")
        keys("z")
        screen = _gone(tmux, sock, "explained", 20)
        assert "GPU" in screen and "processes" in screen, screen  # the GPUs and their processes fill the pane
        keys("z")
        _wait_for(tmux, sock, "explained", 20)
        keys("q")
        screen = _wait_for(tmux, sock, "DECODETOP-EXIT", QUIT_TIMEOUT_S)
        assert "DECODETOP-EXIT 0" in screen, screen
    finally:
        _tmux(tmux, sock, "kill-server")
