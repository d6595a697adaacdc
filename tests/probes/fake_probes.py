"""Test-only probes, registered through `DECODETOP_PROBE_MODULES=fake_probes` or `ProbeRegistry(extra_modules=...)`.

Importing this module must not import torch (the controller imports it); the probe bodies import torch lazily.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

from decodetop.probes.registry import ProbeSpec
from decodetop.probes.results import RankMeasurement, RankOutput

DEADLINE_S = 120.0
"""Each fake probe's deadline: what they test is not time, and on two cores other test runs load, a respawned
group's first probe can take tens of seconds (tests of the deadline itself give their own)."""

PROBES = (
    ProbeSpec(
        "test_raise", "raises on one rank", "fake_probes", DEADLINE_S, {"fail_rank": 1, "kind": "raise"}, hidden=True
    ),
    ProbeSpec("test_hang", "never returns", "fake_probes", DEADLINE_S, {"kind": "hang"}, hidden=True),
    ProbeSpec(
        "test_echo", "reports its rank and pid", "fake_probes", DEADLINE_S, {"kind": "echo", "value": 1.5}, hidden=True
    ),
    ProbeSpec("test_unsupported", "cannot run here", "fake_probes", DEADLINE_S, {"kind": "unsupported"}, hidden=True),
    ProbeSpec("test_exit", "rank 1 dies", "fake_probes", DEADLINE_S, {"kind": "exit"}, hidden=True),
    ProbeSpec(
        "test_sigkill", "rank 1 is killed in a collective", "fake_probes", DEADLINE_S, {"kind": "sigkill"}, hidden=True
    ),
    ProbeSpec(
        "test_noisy", "prints and warns on every rank", "fake_probes", DEADLINE_S, {"kind": "noisy"}, hidden=True
    ),
)

#: What `test_noisy` writes, so a test can look for it on the terminal and in the rank log.
NOISY_STDOUT = "planted stdout line"
NOISY_STDERR = "planted stderr line"
NOISY_C_LEVEL = "planted fd-level line"
NOISY_WARNING = "planted warning"


def run(ctx: Any, params: dict[str, Any]) -> RankOutput:
    """One entry point for all the fake probes, dispatching on params['kind']."""
    kind = params["kind"]
    if kind == "raise":
        if ctx.rank == params["fail_rank"]:
            raise ValueError(f"planted failure on rank {ctx.rank}")
        return RankOutput()
    if kind == "hang":
        ctx.progress("hanging", 0, 1)
        while True:
            time.sleep(0.05)
    if kind == "unsupported":
        return RankOutput(unsupported_reason="fake probe: not on this device")
    if kind == "exit":
        if ctx.rank == 1:
            os._exit(7)
        return RankOutput()
    if kind == "noisy":
        import sys
        import warnings

        print(f"{NOISY_STDOUT} from rank {ctx.rank}", flush=True)
        print(f"{NOISY_STDERR} from rank {ctx.rank}", file=sys.stderr, flush=True)
        os.write(1, f"{NOISY_C_LEVEL} from rank {ctx.rank}\n".encode())
        warnings.warn(f"{NOISY_WARNING} from rank {ctx.rank}", UserWarning, stacklevel=1)
        return RankOutput()
    import torch
    import torch.distributed as dist

    if kind == "sigkill":
        # Rank 0 waits in an all-reduce that rank 1 never joins: rank 1 is killed, rank 0 sees the peer vanish.
        if ctx.rank == 1:
            time.sleep(0.3)
            os.kill(os.getpid(), signal.SIGKILL)
        dist.all_reduce(torch.ones(1))
        return RankOutput()

    t = torch.tensor([float(ctx.rank + 1)])
    dist.all_reduce(t)
    return RankOutput(
        measurements=(
            RankMeasurement(
                "echo",
                {"kind": "echo"},
                "us",
                samples=(params["value"], params["value"] * (ctx.rank + 1)),
                metrics={"pid": float(os.getpid()), "sum": float(t.item())},
            ),
        )
    )
