"""One way for a test to wait: poll a condition until it holds or a deadline passes, then fail naming what was
awaited. Never a fixed sleep: on two loaded cores any fixed time is either too short or wasted."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import psutil

T = TypeVar("T")

WAIT_S = 60.0
"""Default upper bound: processes here spawn interpreters that import torch, on cores other tests load too."""


def wait_for(condition: Callable[[], T], what: str, *, timeout_s: float = WAIT_S, interval_s: float = 0.05) -> T:
    """Call `condition` until it returns something true and return that; AssertionError naming `what` after
    `timeout_s` (with the last value seen)."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for: {what} (last: {value!r})")
        time.sleep(interval_s)


def process_ended(process: psutil.Process) -> bool:
    """Exited: gone, or a zombie its new parent has not reaped yet (a container's PID 1 may never reap)."""
    try:
        return process.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True
