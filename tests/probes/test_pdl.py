"""Programmatic dependent launch of decodetop's Triton kernels (`kernels.common.pdl_enabled`, `launch(pdl=True)`):
off on CPU ranks and under the interpreter, on for a CUDA GPU of compute capability 9 where Triton has it (the
capability lookup faked), off inside `pdl_disabled`; a launch passes `launch_pdl` and `USE_GDC=True` exactly when
on, and the requests collected for ahead-of-time compiling carry the same; the kernel class says PDL; compiled for
sm_90 on the CPU, every PDL kernel waits before its first global access (tests/probes/pdl_ptx.py; a kernel that
loads the scores of a grid at least two back before it waits, before its first global write)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import torch

from decodetop.budget.keys import AttentionKey, parse_key_id
from decodetop.probes.specs.attention import GQA_SPLIT_K
from decodetop.probes.worker import attention, precompile
from decodetop.probes.worker.context import ProbeContext
from decodetop.probes.worker.kernels import common
from tests.conftest import require_module
from tests.helpers.env import subprocess_env

ROOT = Path(__file__).resolve().parents[2]
PTX = Path(__file__).with_name("pdl_ptx.py")
GQA = (
    "attention:kind=gqa,batch=1,q_len=1,context=256,heads=8,kv_heads=2,head_dim=32,v_head_dim=32,"
    "kv_lora_rank=0,rope_dim=0,index_heads=0,index_head_dim=0,index_topk=0,window=0,kv_dtype=fp8"
)


class _OnCuda(torch.Tensor):
    """A CPU tensor that says it lives on CUDA device 0 (what `launch` reads to decide)."""

    @property
    def device(self) -> torch.device:  # type: ignore[override]
        return torch.device("cuda", 0)


class _Kernel:
    """A stand-in for a Triton kernel: `kernel[grid](*args, **kwargs)` records the launch."""

    def __init__(self) -> None:
        self.calls: list[tuple[tuple[int, ...], tuple[object, ...], dict[str, Any]]] = []

    def __getitem__(self, grid: tuple[int, ...]) -> Any:
        def run(*args: object, **kwargs: Any) -> None:
            self.calls.append((grid, args, kwargs))

        return run


@pytest.fixture
def hopper(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """A CUDA device of compute capability 9.0 and a Triton with the gdc functions, no interpreter."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(common, "HAVE_GDC", True)
    monkeypatch.setattr(common, "device_capability", lambda _device: (9, 0))
    return monkeypatch


def test_pdl_is_off_on_cpu_ranks_and_under_the_interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(common, "HAVE_GDC", True)
    monkeypatch.setattr(common, "device_capability", lambda _device: (9, 0))
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert not common.pdl_enabled(torch.device("cpu"))
    assert not common.pdl_enabled(torch.device("meta"))  # meta tensors outside `collecting`
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert not common.pdl_enabled(torch.device("cuda", 0))


def test_pdl_is_on_for_compute_capability_9_where_triton_has_it(hopper: pytest.MonkeyPatch) -> None:
    cuda = torch.device("cuda", 0)
    assert common.pdl_enabled(cuda)
    hopper.setattr(common, "device_capability", lambda _device: (10, 0))
    assert common.pdl_enabled(cuda)
    hopper.setattr(common, "device_capability", lambda _device: (8, 9))  # Ada: no PDL
    assert not common.pdl_enabled(cuda)
    hopper.setattr(common, "device_capability", lambda _device: (9, 0))
    hopper.setattr(common, "HAVE_GDC", False)  # a Triton without gdc_wait / launch_pdl
    assert not common.pdl_enabled(cuda)


def test_a_benchmark_turns_pdl_off_for_a_block(hopper: pytest.MonkeyPatch) -> None:
    cuda = torch.device("cuda", 0)
    with common.pdl_disabled():
        assert not common.pdl_enabled(cuda)
        with common.pdl_disabled():
            assert not common.pdl_enabled(cuda)
        assert not common.pdl_enabled(cuda)  # the outer block still holds
    assert common.pdl_enabled(cuda)


def test_the_triton_here_has_the_gdc_functions() -> None:
    require_module("triton", "the test extra installs Triton")
    assert common.HAVE_GDC  # Triton 3.9 here: `launch_pdl` and tl.extra.cuda.gdc_wait / gdc_launch_dependents


def test_launch_passes_launch_pdl_and_use_gdc_exactly_when_on(hopper: pytest.MonkeyPatch) -> None:
    on_cuda = torch.zeros(4).as_subclass(_OnCuda)
    kernel = _Kernel()
    common.launch(kernel, (2, 1), on_cuda, 7, pdl=True, BLOCK=64, num_warps=4)
    common.launch(kernel, (2, 1), on_cuda, 7, BLOCK=64)  # a kernel that does not opt in gets neither
    with common.pdl_disabled():
        common.launch(kernel, (2, 1), on_cuda, 7, pdl=True, BLOCK=64)
    common.launch(kernel, (1,), torch.zeros(4), 7, pdl=True, BLOCK=64)  # a CPU tensor
    hopper.setattr(common, "device_capability", lambda _device: (8, 0))
    common.launch(kernel, (1,), on_cuda, pdl=True)
    got = [kwargs for _grid, _args, kwargs in kernel.calls]
    assert got == [
        {"BLOCK": 64, "num_warps": 4, "USE_GDC": True, "launch_pdl": True},
        {"BLOCK": 64},
        {"BLOCK": 64, "USE_GDC": False},
        {"BLOCK": 64, "USE_GDC": False},
        {"USE_GDC": False},
    ]
    assert kernel.calls[0][1] == (on_cuda, 7)  # the arguments as given
    with pytest.raises(ValueError, match="tensor argument"):
        common.launch(kernel, (1,), 7, pdl=True)


def test_collected_requests_carry_what_the_gpu_launches(hopper: pytest.MonkeyPatch) -> None:
    """The requests compiled ahead for a cc-9 GPU hold `USE_GDC=True` and `launch_pdl`, as its launches do (the
    compile processes pass a request's keyword arguments to `JITFunction.warmup` as they are)."""
    require_module("triton", "the kernels are collected from their Triton launch sites")
    hopper.setattr(precompile, "sm_count", lambda _device: 132)
    gpu = ProbeContext(rank=0, world_size=1, device=torch.device("cuda", 0), backend="nccl")
    key = parse_key_id(GQA)
    assert isinstance(key, AttentionKey)
    build = [partial(attention.launch_triton_once, key, key.context + 1)]
    on, _ = precompile.collect(gpu, build)
    with common.pdl_disabled():
        off, _ = precompile.collect(gpu, build)
    assert {r.name for r in on} == {"_gqa_split_kernel", "_gqa_combine_kernel"}
    for request in on:
        assert dict(request.kwargs)["USE_GDC"] is True and dict(request.kwargs)["launch_pdl"] is True
    for request in off:
        assert dict(request.kwargs)["USE_GDC"] is False and "launch_pdl" not in dict(request.kwargs)
    assert {r.specialization() for r in on}.isdisjoint(r.specialization() for r in off)  # two binaries


def test_the_kernel_class_says_pdl_and_gqa_points_still_read_their_launch() -> None:
    plain = common.triton_kernel(GQA_SPLIT_K)
    overlapped = common.triton_kernel(GQA_SPLIT_K + " (FP8 cache read as FP8)", pdl=True)
    assert plain.function == GQA_SPLIT_K and plain.text == "decodetop Triton: GQA decode split-K"
    assert overlapped.function == "GQA decode split-K (FP8 cache read as FP8), PDL"
    assert overlapped.function.startswith(GQA_SPLIT_K)  # what the attention spec's launch reader matches


@pytest.mark.slow
def test_every_pdl_kernel_waits_before_its_first_global_access_on_sm_90() -> None:
    require_module("triton", "the test extra installs Triton; its NVIDIA backend compiles for sm_90 on the CPU")
    env = {**subprocess_env(), "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT), *sys.path])}
    env.pop("TRITON_INTERPRET", None)
    done = subprocess.run([sys.executable, str(PTX)], env=env, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-4000:])
    rows = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert len(rows) == 36  # 18 kernels, with and without PDL
    early = {row["kernel"] for row in rows if row["early_loads"]}
    assert early == {"_compact8_carry_kernel", "_mla_select_split_kernel"}
    for row in rows:
        assert row["first_global"] is not None and row["first_write"] is not None, row
        if row["pdl"]:
            assert (row["USE_GDC"], row["launch_pdl"]) == (True, True), row
            first = row["first_write"] if row["early_loads"] else row["first_global"]
            assert row["wait"] is not None and row["wait"] < first, row
            assert row["trigger"] is not None, row
        else:
            assert (row["USE_GDC"], row["launch_pdl"], row["wait"], row["trigger"]) == (False, False, None, None), row
