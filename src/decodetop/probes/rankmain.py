"""Provides the entry point of a spawned probe rank, before torch: environment, stdin, signals, parent watch.

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


def _watch_parent(parent_pid: int) -> None:
    while True:
        if os.getppid() != parent_pid:
            os._exit(3)
        time.sleep(PARENT_POLL_S)


def rank_entry(config: RankConfig, conn: Connection) -> None:
    """Prepare the process, then hand over to the torch-side rank loop."""
    # Ctrl-C reaches the whole foreground process group; the controller decides how the ranks end.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
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
