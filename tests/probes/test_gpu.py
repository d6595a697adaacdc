"""The probes on real GPUs (skipped without CUDA): every mode runs, graph mode included, and shutdown is clean."""

from __future__ import annotations

from pathlib import Path

import pytest

from decodetop.probes.controller import ProbeController
from decodetop.probes.gpuinfo import visible_gpus
from decodetop.probes.results import MeasurementStatus, ProbeStatus

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.slow,
    pytest.mark.skipif(not visible_gpus(), reason="needs a CUDA GPU"),
]


def test_all_probes_on_gpus(tmp_path: Path) -> None:
    with ProbeController(device="cuda", rank_log=tmp_path / "ranks.log") as pc:
        ar = pc.run("allreduce", {"sizes": [8, 1 << 20], "samples": 5, "synced_ops": 20, "budget_ms": 50.0})
        assert ar.status is ProbeStatus.OK, ar.message
        graph = ar.measurement(size_bytes=8, mode="graph")
        assert graph.status is MeasurementStatus.OK and graph.metrics["time_us"] > 0
        assert ar.environment is not None and ar.environment.nccl
        launch = pc.run("launch", {"samples": 5})
        assert launch.status is ProbeStatus.OK, launch.message
        fit = launch.measurement(what="graph_fit")
        assert fit.metrics["graph_per_node_us"] > 0
        membw = pc.run("membw", {"copy_bytes": 64 << 20, "samples": 5})
        assert membw.status is ProbeStatus.OK, membw.message
        assert membw.measurement(what="h2d").metrics["bandwidth_gbps"] > 1
        pids = pc.rank_pids()
    assert pc.rank_pids() == []
    assert pids
