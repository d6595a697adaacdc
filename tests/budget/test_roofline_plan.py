"""Roofline arithmetic, the GPU table, and probe-plan generation."""

from __future__ import annotations

import pytest

from decodetop.budget.deployment import Deployment
from decodetop.budget.gpus import GPUS, INTERCONNECTS, find_gpu, nvml_bandwidth_gbps
from decodetop.budget.inventory import build_inventory
from decodetop.budget.keys import (
    KEY_TYPES,
    AllreduceKey,
    AttentionKey,
    GemmKey,
    LaunchKey,
    MeasurementKeyError,
    MoeKey,
    parse_key_id,
)
from decodetop.budget.plan import build_plan
from decodetop.budget.roofline import Hardware, collective_time_us, hardware_for, roofline
from decodetop.budget.spec import load_preset, spec_from_config
from decodetop.errors import UserInputError

from .test_spec import TINY_LLAMA


def test_gpu_table_rows_have_sources() -> None:
    assert {"rtx-pro-6000", "h100", "h200", "b200", "a100", "l40s", "rtx-4090", "rtx-5090"} <= set(GPUS)
    for gpu in GPUS.values():
        assert gpu.source and gpu.mem_bandwidth_gbps > 0 and gpu.interconnect in INTERCONNECTS
    assert GPUS["rtx-pro-6000"].mem_bandwidth_gbps == 1792  # docs/reference/models.md §1
    assert find_gpu("NVIDIA RTX PRO 6000 Blackwell Server Edition") is GPUS["rtx-pro-6000"]
    assert find_gpu("NVIDIA H200") is GPUS["h200"]
    assert find_gpu("rtx6000") is GPUS["rtx-pro-6000"]
    assert find_gpu("Voodoo 3") is None


def test_nvml_bandwidth_formula() -> None:
    # docs/reference/h200-machine.md: 4.8 TB/s
    assert nvml_bandwidth_gbps(6016, 3201) == pytest.approx(4814.3, rel=1e-4)


def _hw(bw: float = 1000.0, lat: float = 10.0, busbw: float = 100.0) -> Hardware:
    return Hardware("test", bw, "test", lat, "test", busbw, "pcie5", None)


def test_collective_time_by_hand() -> None:
    hw = _hw(lat=10.0, busbw=100.0)  # 100 GB/s = 1e5 bytes per µs
    assert collective_time_us("all_reduce", 1e6, 8, hw) == pytest.approx(10 + 1e6 * 2 * 7 / 8 / 1e5)
    assert collective_time_us("all_gather", 1e6, 8, hw) == pytest.approx(10 + 1e6 * 7 / 1e5)
    assert collective_time_us("all_reduce", 1e6, 1, hw) == 0


def test_roofline_by_hand() -> None:
    spec = spec_from_config(TINY_LLAMA)
    inv = build_inventory(spec, Deployment(tp=2, context_len=100))
    hw = _hw(bw=1000.0, lat=10.0, busbw=100.0)
    roof = roofline(inv, hw)
    mem_ms = (inv.weight_bytes + inv.kv_bytes) / 1e12 * 1e3
    assert roof.memory_ms == pytest.approx(mem_ms)
    ar = 5 * collective_time_us("all_reduce", 128, 2, hw) / 1e3
    ag = collective_time_us("all_gather", 50 * 2, 2, hw) / 1e3
    assert roof.collective_ms == pytest.approx(ar + ag)
    assert roof.step_ms == pytest.approx(mem_ms + ar + ag)
    assert roof.tokens_per_s == pytest.approx(1000 / roof.step_ms)
    assert roof.compute_ms is None
    names = [t.name for t in roof.terms]
    assert names == ["weights", "kv cache", "all-reduce", "all-gather"]


def test_glm5_nvfp4_roofline_on_rtx_pro_6000() -> None:
    inv = build_inventory(load_preset("glm-5-nvfp4"), Deployment(tp=8))
    roof = roofline(inv, hardware_for(GPUS["rtx-pro-6000"]))
    assert roof.collective_count == 158
    assert roof.memory_ms == pytest.approx((inv.weight_bytes + inv.kv_bytes) / 1.792e12 * 1e3)
    assert 5 < roof.step_ms < 15
    assert roof.hardware.latency_source.startswith("default for PCIe")


def test_hardware_for_prefers_measured() -> None:
    hw = hardware_for(GPUS["h200"], bandwidth_gbps=4100.0, allreduce_latency_us=6.0)
    assert (hw.mem_bandwidth_gbps, hw.bandwidth_source, hw.allreduce_latency_us) == (4100.0, "measured", 6.0)
    with pytest.raises(UserInputError, match="--gpu"):
        hardware_for(None)
    with pytest.raises(UserInputError):
        hardware_for(None, bandwidth_gbps=-1.0)


# --- keys ---------------------------------------------------------------------------------------------------


def test_key_ids_are_stable_and_round_trip() -> None:
    key = GemmKey(1, 2048, 6144, 1, "nvfp4")
    assert key.key_id == "gemm:m=1,n=2048,k=6144,batch=1,dtype=nvfp4"
    assert GemmKey.from_params(key.to_params()) == key
    assert GemmKey.from_params({"m": 1.0, "n": 2048, "k": 6144, "batch": 1, "dtype": "nvfp4"}) == key
    assert parse_key_id(key.key_id) == key
    assert hash(key) == hash(GemmKey(1, 2048, 6144, 1, "nvfp4"))


@pytest.mark.parametrize("probe", sorted(KEY_TYPES))
def test_every_inventory_key_round_trips(probe: str) -> None:
    inv = build_inventory(load_preset("glm-5-nvfp4"), Deployment(tp=8, accept_length=2.0))
    plan = build_plan(inv)
    keys = plan.by_probe(probe)
    if probe == "moe":
        assert keys
    for key in keys:
        assert parse_key_id(key.key_id) == key
        assert type(key).from_params(key.to_params()) == key
        assert all(isinstance(v, (int, str, float)) for v in key.to_params().values())


def test_bad_keys() -> None:
    with pytest.raises(MeasurementKeyError):
        GemmKey(0, 1, 1, 1, "bf16")
    with pytest.raises(MeasurementKeyError):
        GemmKey.from_params({"m": 1, "n": 1, "k": 1, "batch": 1})
    with pytest.raises(MeasurementKeyError):
        parse_key_id("nope:m=1")
    with pytest.raises(MeasurementKeyError):
        AllreduceKey("all_reduce", -8, 8, "bf16")


# --- plan -----------------------------------------------------------------------------------------------------


def test_glm5_plan_groups_distinct_keys() -> None:
    inv = build_inventory(load_preset("glm-5-nvfp4"), Deployment(tp=8))
    plan = build_plan(inv)
    ids = plan.key_ids()
    assert len(ids) == len(set(ids))
    assert {p for p, _ in plan.groups} == {
        "gemm",
        "moe",
        "routing",
        "attention",
        "kvcast",
        "norms",
        "sampling",
        "allreduce",
        "launch",
    }
    assert plan.by_probe("allreduce") == (
        AllreduceKey("all_reduce", 12288, 8, "bf16"),
        AllreduceKey("all_gather", 38720, 8, "bf16"),
    )
    assert set(plan.by_probe("launch")) == {LaunchKey("graph", inv.kernels), LaunchKey("eager", inv.kernels)}
    (moe,) = plan.by_probe("moe")
    assert isinstance(moe, MoeKey) and moe.top_k == 8
    (attn,) = plan.by_probe("attention")
    assert isinstance(attn, AttentionKey) and (attn.kind, attn.context) == ("mla+dsa", 4096)
    assert "q_b_proj" in plan.ops_using("gemm:m=1,n=2048,k=2048,batch=1,dtype=bf16")
    # every GEMM shape has a sweep over M 1…256 containing its own M
    gemms = plan.by_probe("gemm")
    sweeps = {s.curve_id: s for s in plan.gemm_sweeps}
    for g in gemms:
        assert isinstance(g, GemmKey)
        assert g.m in sweeps[g.curve_id].ms
        assert sweeps[g.curve_id].ms[-1] == 256
    assert 12288 in plan.allreduce_sweep_bytes and 8 in plan.allreduce_sweep_bytes
    assert plan.allreduce_sweep_bytes[-1] == 128 * 1024 * 1024
    as_dict = plan.to_dict()
    assert as_dict["probes"]["moe"][0]["params"]["experts_local"] == 256


@pytest.mark.parametrize("name", ["llama-3.1-70b", "mixtral-8x7b", "gpt-oss-120b", "deepseek-v3", "qwen3-235b-a22b"])
def test_plans_for_other_models(name: str) -> None:
    spec = load_preset(name)
    plan = build_plan(build_inventory(spec, Deployment(tp=8, batch=4)))
    assert plan.by_probe("gemm")
    assert plan.by_probe("attention")
    assert bool(plan.by_probe("moe")) == spec.is_moe
    assert bool(plan.by_probe("routing")) == spec.is_moe
    kinds = {k.kind for k in plan.by_probe("attention") if isinstance(k, AttentionKey)}
    assert kinds == ({"mla"} if spec.attention_kind == "mla" else {"gqa"})
    assert all(k.m == 4 for k in plan.by_probe("gemm") if isinstance(k, GemmKey))


def test_tp1_plan_has_no_collectives() -> None:
    plan = build_plan(build_inventory(spec_from_config(TINY_LLAMA), Deployment(tp=1)))
    assert plan.by_probe("allreduce") == ()
    assert plan.allreduce_sweep_bytes == ()
