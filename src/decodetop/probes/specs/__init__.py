"""Provides the built-in probes' specs, one module per probe (no torch): `decodetop.probes.specs.<name>.SPEC`.

Each spec names its worker module (`decodetop.probes.worker.<name>`, torch) and carries its hooks into a model's
plan run. `BUILTIN_PROBES` is the order listings show.
"""

from __future__ import annotations

from decodetop.probes.probe_spec import ProbeSpec
from decodetop.probes.specs import (
    allreduce,
    attention,
    gemm,
    kvcast,
    launch,
    layer,
    membw,
    moe,
    norms,
    routing,
    sampling,
)

BUILTIN_PROBES: tuple[ProbeSpec, ...] = (
    allreduce.SPEC,
    launch.SPEC,
    membw.SPEC,
    gemm.SPEC,
    moe.SPEC,
    routing.SPEC,
    attention.SPEC,
    kvcast.SPEC,
    norms.SPEC,
    sampling.SPEC,
    layer.SPEC,
)
