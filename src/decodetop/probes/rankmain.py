"""Provides the entry point of a spawned probe rank, before torch: output to the rank log, environment, stdin,
signals, parent watch, and the count of Python warnings the rank shows.

A rank never writes to the terminal: its fd 1 and 2 (Python's prints, warnings and tracebacks, and C-level writes
of NCCL, CUDA or gloo) are appended to the controller's rank log file, so nothing lands on the UI's screen.

This module imports no torch, so that the controller can name `rank_entry` as the spawn target without loading
torch itself; torch is imported in the child only, by `decodetop.probes.worker.serve`.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
import traceback
import warnings
from multiprocessing.connection import Connection

from decodetop.probes.protocol import Fatal, RankConfig
from decodetop.probes.warning_count import WarningCount

#: How often a rank checks that its controller is still alive (a controller killed with SIGKILL cannot tell its
#: ranks; they notice within this many seconds and exit).
PARENT_POLL_S = 0.5


def _detach_stdin() -> None:
    """Point fd 0 at /dev/null: spawn children inherit the terminal's fd 0, and a rank must never read the TTY."""
    with contextlib.suppress(OSError):
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.close(devnull)
    with contextlib.suppress(OSError, ValueError):
        sys.stdin = open(os.devnull, encoding="utf-8")  # noqa: SIM115 - replaces the process's stdin for good


def _redirect_output(log_path: str) -> None:
    """Point fd 1 and 2 at the rank log (appended): C-level writes follow the fds, Python's streams too."""
    with contextlib.suppress(OSError, ValueError):
        sys.stdout.flush()
        sys.stderr.flush()
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        os.dup2(fd, 1)
        os.dup2(fd, 2)
    finally:
        os.close(fd)


def _watch_parent(parent_pid: int) -> None:
    while True:
        if os.getppid() != parent_pid:
            os._exit(3)
        time.sleep(PARENT_POLL_S)


def rank_entry(config: RankConfig, conn: Connection) -> None:
    """Prepare the process, then hand over to the torch-side rank loop."""
    # Ctrl-C reaches the whole foreground process group; the controller decides how the ranks end.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if config.log_path:
        with contextlib.suppress(OSError):  # an unwritable log leaves the output where it was
            _redirect_output(config.log_path)
    WarningCount.install()
    _detach_stdin()
    for key, value in config.env.items():
        os.environ[key] = value
    # CPU-only torch wheels warn once per process when numpy is absent; ranks do not use numpy.
    warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
    if config.parent_pid:
        threading.Thread(target=_watch_parent, args=(config.parent_pid,), daemon=True, name="parent-watch").start()
    try:
        from decodetop.probes.worker import serve
    except BaseException as exc:
        with contextlib.suppress(Exception):
            conn.send(Fatal(config.rank, f"cannot load the probe worker: {exc}", traceback.format_exc()))
        return
    serve(config, conn)
