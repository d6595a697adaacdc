"""Test-only probes, registered through `DECODETOP_PROBE_MODULES=fake_probes` or `ProbeRegistry(extra_modules=...)`.

Importing this module must not import torch (the controller imports it); the probe bodies import torch lazily.
"""

from __future__ import annotations

import os
import time
from typing import Any

from decodetop.probes.registry import ProbeSpec
from decodetop.probes.results import RankMeasurement, RankOutput

PROBES = (
    ProbeSpec("test_raise", "raises on one rank", "fake_probes", 30.0, {"fail_rank": 1, "kind": "raise"}, hidden=True),
    ProbeSpec("test_hang", "never returns", "fake_probes", 30.0, {"kind": "hang"}, hidden=True),
    ProbeSpec(
        "test_echo", "reports its rank and pid", "fake_probes", 30.0, {"kind": "echo", "value": 1.5}, hidden=True
    ),
    ProbeSpec("test_unsupported", "cannot run here", "fake_probes", 30.0, {"kind": "unsupported"}, hidden=True),
    ProbeSpec("test_exit", "rank 1 dies", "fake_probes", 30.0, {"kind": "exit"}, hidden=True),
)


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
    import torch
    import torch.distributed as dist

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
