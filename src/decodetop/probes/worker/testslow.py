"""Provides `slowed_for_test`: a test-only delay on one CPU rank, so tests can plant a straggler in a real gloo group.

Honoured only when `DECODETOP_TEST_SLOW_RANK` is set (by a test), only on CPU ranks (a GPU run is never slowed):

    DECODETOP_TEST_SLOW_RANK=1:0.5     # rank 1 sleeps 0.5 ms inside every host-timed op of the ops-based probes

Unset (every real run), `slowed_for_test` returns the op unchanged.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

ENV = "DECODETOP_TEST_SLOW_RANK"


def planted_delay_s(rank: int, value: str | None = None) -> float:
    """Seconds rank `rank` sleeps per op under `ENV` ("RANK:MS"); 0 when unset, for another rank, or malformed."""
    raw = os.environ.get(ENV) if value is None else value
    if not raw:
        return 0.0
    who, _, ms = raw.partition(":")
    try:
        return float(ms) / 1e3 if int(who) == rank and float(ms) > 0 else 0.0
    except ValueError:
        return 0.0


def slowed_for_test(fn: Callable[[], Any], rank: int, *, cuda: bool) -> Callable[[], Any]:
    """`fn`, or `fn` followed by the test delay on the CPU rank `ENV` names."""
    delay = 0.0 if cuda else planted_delay_s(rank)
    if delay <= 0:
        return fn

    def slowed() -> Any:
        out = fn()
        time.sleep(delay)
        return out

    return slowed
