"""The engine all-reduce axis: why the P2P kernels cannot run (CPU ranks, one GPU, NCCL_P2P_DISABLE, multimem
without the opt-in), a real 2-rank gloo group saying so, and the budget's all-reduce curve under --allreduce."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from decodetop.probes.controller import ProbeController
from decodetop.probes.plan_hooks import measured_from_results
from decodetop.probes.results import Environment, Measurement, MeasurementStatus, ProbeResult, ProbeStatus
from decodetop.probes.worker.context import ProbeContext
from decodetop.probes.worker.symm_allreduce import agreed_reason, local_reason

# 2 × H200 graph-mode medians in µs (h200 all-reduce paths: NCCL vs torch symm-mem one-shot).
NCCL_US = {8: 11.1, 16384: 12.2, 131072: 12.9, 1048576: 19.1, 16777216: 77.6}
ONE_SHOT_US = {8: 6.2, 16384: 6.6, 131072: 7.4, 1048576: 13.1, 16777216: 97.1}
H200_TOPOLOGY = "\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \tNV18\t0-31\nGPU1\tNV18\t X \t0-31\n"


def _gpu_ctx(world_size: int) -> ProbeContext:
    return ProbeContext(rank=0, world_size=world_size, device=torch.device("cuda", 0), backend="nccl")


def test_cpu_ranks_are_named() -> None:
    ctx = ProbeContext(rank=0, world_size=2, device=torch.device("cpu"), backend="gloo")
    assert "CPU ranks" in local_reason(ctx, ["one_shot"], multimem=False, env={})


def test_one_gpu_has_nothing_to_reduce() -> None:
    assert "two or more GPUs" in local_reason(_gpu_ctx(1), ["one_shot"], multimem=False, env={})


@pytest.mark.parametrize("value", ["1", "true", "YES"])
def test_nccl_p2p_disable_declares_p2p_off(value: str) -> None:
    reason = local_reason(_gpu_ctx(2), ["one_shot", "two_shot"], multimem=False, env={"NCCL_P2P_DISABLE": value})
    assert f"NCCL_P2P_DISABLE={value}" in reason


def test_nccl_p2p_disable_zero_leaves_p2p_on() -> None:
    assert local_reason(_gpu_ctx(2), ["one_shot"], multimem=False, env={"NCCL_P2P_DISABLE": "0"}) == ""


def test_multimem_needs_the_opt_in() -> None:
    assert "opt-in" in local_reason(_gpu_ctx(2), ["multimem"], multimem=False, env={})
    assert local_reason(_gpu_ctx(2), ["multimem"], multimem=True, env={}) == ""


def test_one_rank_keeps_its_own_reason() -> None:
    assert agreed_reason(_gpu_ctx(1), "why") == "why"


@pytest.mark.slow
def test_gloo_group_reports_the_custom_kernels_unsupported_with_the_reason(tmp_path: Path) -> None:
    with ProbeController(device="cpu", cpu_ranks=2, rank_log=tmp_path / "ranks.log") as pc:
        result = pc.run(
            "allreduce", {"sizes": [8, 4096], "impls": ["one_shot", "two_shot"], "modes": ["graph", "pipelined"]}
        )
    assert result.status is ProbeStatus.OK, result.message
    assert [m.params["impl"] for m in result.measurements] == ["one_shot", "two_shot"]
    for m in result.measurements:
        assert m.status is MeasurementStatus.UNSUPPORTED
        assert "torch symmetric memory needs CUDA GPUs" in m.note


def _point(us: float, size: int, impl: str | None, mode: str = "graph") -> Measurement:
    params: dict[str, object] = {"size_bytes": size, "mode": mode, "world_size": 2, "dtype": "bfloat16"}
    if impl is not None:
        params["impl"] = impl
        if impl != "nccl":
            params["compute_capability"] = "9.0"
    return Measurement(f"allreduce {size} {mode}", params, "us", metrics={"time_us": us})


def _result(*measurements: Measurement, topology: str = H200_TOPOLOGY) -> ProbeResult:
    env = Environment(
        host="h", time_utc="", python="3.12", backend="nccl", device_kind="cuda", world_size=2, topology=topology
    )
    return ProbeResult("allreduce", ProbeStatus.OK, {}, tuple(measurements), environment=env, world_size=2)


def _both() -> ProbeResult:
    nccl = [_point(us, size, "nccl") for size, us in NCCL_US.items()]
    custom = [_point(us, size, "one_shot") for size, us in ONE_SHOT_US.items()]
    return _result(*nccl, *custom)


def test_auto_takes_the_p2p_kernel_below_the_engines_limit() -> None:
    measured = measured_from_results([_both()], allreduce="auto")
    curve = measured.allreduce_curves["all_reduce"]
    got = dict(curve.points)
    assert got[16384.0] == pytest.approx(ONE_SHOT_US[16384] / 1e3)
    assert got[1048576.0] == pytest.approx(ONE_SHOT_US[1048576] / 1e3)
    assert got[16777216.0] == pytest.approx(NCCL_US[16777216] / 1e3)  # 16 MiB ≥ 8 MiB: NCCL, as vLLM
    assert got[8.0] == pytest.approx(NCCL_US[8] / 1e3)  # 8 B is not a multiple of 16 B
    assert "custom one-shot" in curve.source and "vLLM at TP 2 over NVLink" in curve.source
    assert dict(measured.allreduce_curves["all_reduce:one_shot"].points)[16777216.0] == pytest.approx(0.0971)


def test_nccl_and_custom_choices() -> None:
    nccl = measured_from_results([_both()], allreduce="nccl").allreduce_curves["all_reduce"]
    assert dict(nccl.points)[16384.0] == pytest.approx(NCCL_US[16384] / 1e3)
    assert "--allreduce nccl" in nccl.source
    custom = measured_from_results([_both()], allreduce="custom").allreduce_curves["all_reduce"]
    assert dict(custom.points)[16777216.0] == pytest.approx(ONE_SHOT_US[16777216] / 1e3)


def test_results_without_custom_points_read_as_before() -> None:
    old = _result(*[_point(us, size, None) for size, us in NCCL_US.items()])
    curve = measured_from_results([old], allreduce="auto").allreduce_curves["all_reduce"]
    assert curve.source == "allreduce probe"
    assert dict(curve.points)[16384.0] == pytest.approx(NCCL_US[16384] / 1e3)


def test_unsupported_custom_keeps_nccl_and_says_why() -> None:
    why = "NCCL_P2P_DISABLE=1 is set: this host declares GPU P2P off"
    unsupported = Measurement(
        "allreduce one_shot (custom)",
        {"impl": "one_shot", "mode": "graph", "world_size": 2},
        "us",
        status=MeasurementStatus.UNSUPPORTED,
        note=why,
    )
    result = _result(*[_point(us, size, "nccl") for size, us in NCCL_US.items()], unsupported)
    curve = measured_from_results([result], allreduce="auto").allreduce_curves["all_reduce"]
    assert dict(curve.points)[16384.0] == pytest.approx(NCCL_US[16384] / 1e3)
    assert why in curve.source


def test_four_pcie_gpus_stay_on_nccl_even_with_custom_points() -> None:
    pcie = "\tGPU0\tGPU1\tGPU2\tGPU3\nGPU0\t X \tPIX\tPIX\tPIX\nGPU1\tPIX\t X \tPIX\tPIX\n"
    pcie += "GPU2\tPIX\tPIX\t X \tPIX\nGPU3\tPIX\tPIX\tPIX\t X \n"
    pts = []
    for impl, table in (("nccl", NCCL_US), ("one_shot", ONE_SHOT_US)):
        for size, us in table.items():
            m = _point(us, size, impl)
            pts.append(Measurement(m.name, {**m.params, "world_size": 4}, "us", metrics=dict(m.metrics)))
    env = Environment(
        host="h", time_utc="", python="3.12", backend="nccl", device_kind="cuda", world_size=4, topology=pcie
    )
    result = ProbeResult("allreduce", ProbeStatus.OK, {}, tuple(pts), environment=env, world_size=4)
    curve = measured_from_results([result], allreduce="auto").allreduce_curves["all_reduce"]
    assert dict(curve.points)[16384.0] == pytest.approx(NCCL_US[16384] / 1e3)
    assert "more than two GPUs not all NVLink-connected" in curve.source


def test_a_failing_size_stops_that_implementation_and_names_why(monkeypatch: pytest.MonkeyPatch) -> None:
    from decodetop.probes.worker import symm_allreduce as sa

    calls: list[int] = []

    def one_size(sweep: object, impl: str, size: int) -> list[object]:
        calls.append(size)
        if size == 1024:
            raise RuntimeError("two_shot_all_reduce: input must be contiguous.")
        return []

    monkeypatch.setattr(sa, "_one_size", one_size)
    ctx = ProbeContext(rank=0, world_size=1, device=torch.device("cpu"), backend="gloo")
    sweep = sa._Sweep(ctx, {}, None, 2, ("graph", "pipelined"), {"world_size": 1}, lambda *a: {})  # type: ignore[arg-type]
    out = sa._sweep_impl(sweep, "two_shot", [8, 1024, 4096])
    assert calls == [8, 1024]  # 4096 is never tried: the kernel's barriers may be left mid-way
    assert [(m.params["size_bytes"], m.params["mode"]) for m in out] == [
        (1024, "graph"),
        (1024, "pipelined"),
        (4096, "graph"),
        (4096, "pipelined"),
    ]
    assert all(m.status is MeasurementStatus.FAILED for m in out)
    assert "must be contiguous" in out[0].note and out[2].note.startswith("not run: an earlier size failed")


def test_a_group_across_hosts_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    from decodetop.probes.worker import symm_allreduce as sa

    monkeypatch.setattr(sa, "_gather", lambda ctx, value: [("node-a", 0), ("node-b", 0)])
    assert "spans 2 hosts" in sa._p2p_reason(_gpu_ctx(2))
