"""A test-only probe module that slows one CPU rank, so a test can plant a straggler in a real gloo group.

Loaded in the ranks through the registry's extra modules (`ProbeRegistry(extra_modules=["slow_rank"])`, passed to
every rank): a rank imports it after joining the group, and the rank that `DECODETOP_TEST_SLOW_RANK` names
("RANK:MS") then sleeps MS after every op the ops-based probes time with the host clock (CPU ranks only). The
controller's own process imports it too, outside any group, where it changes nothing. No probe of its own.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

ENV = "DECODETOP_TEST_SLOW_RANK"
PROBES: tuple[object, ...] = ()


def planted_delay_s(rank: int, value: str | None) -> float:
    """Seconds rank `rank` sleeps per op under "RANK:MS"; 0 when unset, for another rank, or malformed."""
    who, _, ms = (value or "").partition(":")
    try:
        return float(ms) / 1e3 if int(who) == rank and float(ms) > 0 else 0.0
    except ValueError:
        return 0.0


def _plant() -> None:
    import torch.distributed as dist

    from decodetop.probes.worker import ops

    if not dist.is_initialized() or dist.get_backend() != "gloo":
        return
    delay_s = planted_delay_s(dist.get_rank(), os.environ.get(ENV))
    if delay_s <= 0:
        return
    time_host = ops.time_host

    def slowed_time_host(fn: Callable[[], Any], *args: Any, **kwargs: Any) -> list[float]:
        def slowed() -> Any:
            out = fn()
            time.sleep(delay_s)
            return out

        return time_host(slowed, *args, **kwargs)

    ops.time_host = slowed_time_host  # type: ignore[assignment]


if os.environ.get(ENV):
    _plant()
