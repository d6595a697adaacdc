"""Kernels compiled ahead (`decodetop.probes.worker.precompile`): a probe's Triton launches collected on meta
tensors are the launches it makes on real ones, one request per specialization; the compile processes report each
request, and a failure is only a request left to compile at its launch."""

from __future__ import annotations

from functools import partial

import pytest
import torch

from decodetop.budget.keys import AttentionKey, MoeKey, parse_key_id
from decodetop.probes.worker import attention, fused_moe, precompile
from decodetop.probes.worker.context import ProbeContext
from decodetop.probes.worker.kernels import common
from decodetop.probes.worker.kernels import tiles as tile_store
from tests.conftest import require_module

pytestmark = pytest.mark.usefixtures("_triton")

GQA = (
    "attention:kind=gqa,batch={b},q_len={q},context={c},heads=8,kv_heads=2,head_dim=32,v_head_dim=32,"
    "kv_lora_rank=0,rope_dim=0,index_heads=0,index_head_dim=0,index_topk=0,window=0,kv_dtype={kv}"
)
DSA = (
    "attention:kind=mla+dsa,batch={b},q_len={q},context={c},heads=4,kv_heads=1,head_dim=80,v_head_dim=64,"
    "kv_lora_rank=64,rope_dim=16,index_heads=4,index_head_dim=32,index_topk=64,window=0,kv_dtype={kv}"
)
MOE = "moe:tokens={t},top_k=2,experts_local=8,experts_active={a},hidden=4096,intermediate=2048,dtype=bf16,bias=0"


@pytest.fixture
def _triton() -> None:
    require_module("triton", "the kernels are collected from their Triton launch sites")


def _cpu() -> ProbeContext:
    return ProbeContext(rank=0, world_size=1, device=torch.device("cpu"), backend="gloo")


def _attention_keys() -> list[AttentionKey]:
    keys = []
    for form in (GQA, DSA):
        for b, q, c, kv in ((1, 1, 256, "bf16"), (2, 1, 256, "fp8"), (1, 2, 128, "bf16"), (4, 1, 512, "bf16")):
            key = parse_key_id(form.format(b=b, q=q, c=c, kv=kv))
            assert isinstance(key, AttentionKey)
            keys.append(key)
    return keys


def _on_real_tensors(ctx: ProbeContext, builders: list[partial[None]]) -> list[common.CompileRequest]:
    with common.collecting(common.sm_count(ctx.device)) as found:
        for build in builders:
            build(ctx)
    return sorted(found.requests.values(), key=lambda r: repr(r.specialization()))


def test_meta_tensors_collect_the_launches_real_tensors_make() -> None:
    ctx = _cpu()
    builders = [partial(attention.launch_triton_once, k, k.context + k.q_len) for k in _attention_keys()]
    got, unbuilt = precompile.collect(ctx, builders)
    assert unbuilt == 0
    assert got == _on_real_tensors(ctx, builders)
    names = {r.name for r in got}
    assert {"_gqa_split_kernel", "_gqa_combine_kernel", "_score_kernel", "_mla_split_kernel"} <= names
    assert all(isinstance(a, common.TensorArg) for r in got for a in r.args if not isinstance(a, (int, float)))


def test_one_request_per_specialization() -> None:
    request = partial(common.CompileRequest, "m", "k", kwargs=(("BLOCK", 64),))
    same = {
        request((common.TensorArg("bfloat16"), 32)).specialization(),
        request((common.TensorArg("bfloat16"), 48)).specialization(),
    }
    assert len(same) == 1  # both divisible by 16: one binary
    assert (
        request((common.TensorArg("bfloat16"), 1)).specialization()
        != request((common.TensorArg("bfloat16"), 2)).specialization()
    )
    assert (
        request((common.TensorArg("bfloat16"), 2)).specialization()
        != request((common.TensorArg("float16"), 2)).specialization()
    )
    other = common.CompileRequest("m", "k", (common.TensorArg("bfloat16"), 32), (("BLOCK", 128),))
    assert other.specialization() not in same


def test_moe_collects_every_candidate_tile_until_a_choice_is_stored() -> None:
    key = parse_key_id(MOE.format(t=2, a=4))
    assert isinstance(key, MoeKey)
    build = [partial(fused_moe.launch_triton_once, key, "Test GPU")]
    first, _ = precompile.collect(_cpu(), build)
    names = ("_gate_up_kernel", "_gate_up_mma_kernel", "_down_kernel")
    by_kernel = {name: sum(1 for r in first if r.name == name) for name in names}
    mma = len(tile_store.MMA_CANDIDATES)  # at these widths each candidate is its own specialization
    plain = len(tile_store.TILE_CANDIDATES) - mma  # the down kernel has no tl.dot form
    # Each form its own down kernel (EARLY, FOLD); gate_up's trigger is late or early (the fold form's is early).
    forms, triggers = len(tile_store.FORMS), 2
    want = {"_gate_up_kernel": plain * triggers, "_gate_up_mma_kernel": mma * triggers, "_down_kernel": plain * forms}
    assert mma and by_kernel == want
    chosen = tile_store.TileChoice(
        tile_store.TILE_CANDIDATES[0], tile_store.TILE_CANDIDATES[1], 1.0, 1.0, 2, False, tile_store.FORM_EARLY
    )
    tile_store.remember("Test GPU", tile_store.shape_id(2, 2, 4096, 2048, "bf16"), chosen)
    stored, _ = precompile.collect(_cpu(), build)
    assert sorted(r.name for r in stored) == ["_combine_kernel", "_down_kernel", "_gate_up_kernel"]
    assert all(dict(r.kwargs)["EARLY"] for r in stored)  # the stored form's specialization only
    folded = tile_store.TileChoice(
        tile_store.TILE_CANDIDATES[0], tile_store.TILE_CANDIDATES[1], 1.0, 1.0, 2, False, tile_store.FORM_FOLD
    )
    tile_store.remember("Test GPU", tile_store.shape_id(2, 2, 4096, 2048, "bf16"), folded)
    stored, _ = precompile.collect(_cpu(), build)
    assert sorted(r.name for r in stored) == ["_down_kernel", "_gate_up_kernel"]  # no combine launch


def test_nothing_is_compiled_ahead_off_a_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    ahead = precompile.compile_ahead(_cpu(), [partial(attention.launch_triton_once, _attention_keys()[0], 257)])
    assert (ahead.requested, ahead.text) == (0, "no kernels compiled ahead: not on a CUDA GPU")
    monkeypatch.setenv(precompile.ENV_SWITCH, "0")
    assert precompile.compile_ahead(_cpu(), []).skipped == "DECODETOP_PRECOMPILE=0"


def test_compile_processes_report_each_request_and_a_failure_is_counted() -> None:
    ctx = _cpu()
    key = _attention_keys()[0]
    requests, _ = precompile.collect(ctx, [partial(attention.launch_triton_once, key, key.context + 1)])
    missing = common.CompileRequest("decodetop.no_such_module", "_kernel", (), ())
    # No GPU here: Triton has no driver to compile for, so every request fails in its process and is counted,
    # and the call returns (the rank would compile them at launch).
    pool = precompile.start_pool(ctx, 2)
    try:
        assert pool.compile([*requests, missing], deadline_s=120.0) == (0, len(requests) + 1)
        assert pool.alive()  # a failed request leaves its process serving the next
        assert pool.compile(requests[:1], deadline_s=120.0) == (0, 1)
    finally:
        pool.stop()
    assert not pool.children


def test_a_pool_past_its_deadline_is_stopped_and_its_requests_count_as_failed() -> None:
    ctx = _cpu()
    key = _attention_keys()[0]
    requests, _ = precompile.collect(ctx, [partial(attention.launch_triton_once, key, key.context + 1)])
    pool = precompile.start_pool(ctx, 1)
    try:
        # The process is still importing torch when the deadline passes.
        assert pool.compile(requests, deadline_s=0.01) == (0, len(requests))
        assert not pool.children
    finally:
        pool.stop()


@pytest.mark.parametrize("fmt", ["mxfp4", "nvfp4"])
def test_fp4_moe_collects_the_fp4_kernels_over_the_fp4_tiles(fmt: str) -> None:
    key = parse_key_id(MOE.format(t=2, a=4).replace("intermediate=2048,dtype=bf16", f"intermediate=4096,dtype={fmt}"))
    assert isinstance(key, MoeKey) and key.dtype == fmt
    got, unbuilt = precompile.collect(_cpu(), [partial(fused_moe.launch_triton_once, key, "Test GPU")])
    assert unbuilt == 0
    by_kernel: dict[str, int] = {}
    for r in got:
        by_kernel[r.name] = by_kernel.get(r.name, 0) + 1
    plain = len(tile_store.FP4_CANDIDATES)  # no tl.dot form: each its own specialization at these widths
    forms, triggers = len(tile_store.FORMS), 2
    assert by_kernel == {"_gate_up_fp4_kernel": plain * triggers, "_down_fp4_kernel": plain * forms,
                         "_combine_kernel": triggers}  # fmt: skip
    fp4 = [r for r in got if "fp4" in r.name]
    assert all(dict(r.kwargs)["NVFP4"] == (fmt == "nvfp4") for r in fp4)
    assert all(common.TensorArg("uint8") in r.args for r in fp4)  # the packed values (and scales, as bytes)
