"""Provides the `membw` probe's spec (no torch): device copy, pinned host copies and peer-to-peer bandwidth.

Not part of a model's plan (the `gemm` probe measures the copy bandwidth the roofline uses beside its GEMMs).
"""

from __future__ import annotations

from decodetop.probes.probe_spec import ProbeSpec

MiB = 1024 * 1024

SPEC = ProbeSpec(
    name="membw",
    description="memory bandwidth: device copy, pinned H2D/D2H, and P2P bandwidth and latency per GPU pair",
    module="decodetop.probes.worker.membw",
    default_timeout_s=180.0,
    collective=True,
    # 256 MiB copies: 0.13 ms each at the 4.1 TB/s of docs/reference/h200-machine.md, past a process-list call
    latency_sensitive=False,
    default_params={
        # docs/reference/h200-machine.md: 256 MiB copies gave 4.1 TB/s D2D and 55 GB/s pinned H2D
        "copy_bytes": 256 * MiB,
        "samples": 20,
        "warmup": 3,
        "latency_ops": 100,
        "budget_ms": 500.0,
    },
)
