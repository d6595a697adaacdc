"""The GQA decode kernel at head dims that are not powers of two (Phi-3's 96, 80, 192 over a V dim of 128) under
Triton's CPU interpreter, against its torch form: BF16 and FP8 caches, groups of 1, 7 and 8, contexts ending inside a
tile, the loop forms (TMA's padded descriptor block included) and the FP8 × FP8 q · kᵀ. The cache rows past the
context are NaN (FP8's 0x7F too), so a lane past the head dim read without its mask poisons the output; the partials
and the output lie in larger buffers whose tails must stay untouched, so a store past the V dim shows. Dims outside
[16, 256] are refused with one line."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import require_module
from tests.helpers.interpreter import interpreted_call

torch = pytest.importorskip("torch")

from decodetop.probes.worker.kernels import gqa  # noqa: E402 - after the torch check
from decodetop.probes.worker.kernels.common import CHECK_REL_ERR  # noqa: E402

WHY = "the test extra installs Triton; its interpreter runs the kernels on the CPU"
META = torch.device("meta")
#: (K dim, V dim): Phi-3's 96, 80, and 192 over 128 (K and V dims apart).
DIMS = ((96, 96), (80, 80), (192, 128))
GROUPS = (1, 7, 8)
#: Cached tokens: 200 ends inside a 128-token tile; 256 is whole tiles (the unmasked form's last row reads the NaNs).
LENGTHS = (200, 256)
#: Rows of NaN past each pair's context, and values of NaN past the partials and the output.
GUARD = 4


def _cache(kv_heads: int, length: int, dim: int, fp8: bool, scale: float) -> Any:
    """[1, kv_heads, length, dim] random rows, a view of a buffer whose `GUARD` rows past `length` are NaN."""
    buf = torch.full((1, kv_heads, length + GUARD, dim), float("nan"))
    buf[:, :, :length] = torch.randn(1, kv_heads, length, dim) / scale
    buf = buf.to(torch.float8_e4m3fn) if fp8 else buf.to(torch.bfloat16)
    return buf[:, :, :length]


def _guarded(t: Any) -> tuple[Any, Any]:
    """(a view of `t`'s shape, the NaN tail beyond it) in one buffer."""
    buf = torch.full((t.numel() + GUARD * 64,), float("nan"), dtype=t.dtype)
    return buf[: t.numel()].view(t.shape), buf[t.numel() :]


def _one(
    dims: tuple[int, int], group: int, length: int, fp8: bool, config: Any = None, *, q8: bool = False, sms: int = 4
) -> float:
    """‖kernel − torch form‖ / ‖torch form‖ of one case on `sms` SMs (inf where a guard was written or the output is
    not finite)."""
    dim, v_dim = dims
    kv_heads = 2
    q = torch.randn(1, kv_heads * group, 1, dim).to(torch.bfloat16)
    k, v = _cache(kv_heads, length, dim, fp8, 0.5), _cache(kv_heads, length, v_dim, fp8, 0.25)
    scales = torch.tensor([0.5, 0.25]) if fp8 else None
    work = gqa.gqa_workspace(1, kv_heads * group, kv_heads, 1, length, v_dim, META, sms=sms, config=config, fp8=fp8)
    work.ml = torch.empty_like(work.ml, device="cpu")
    work.acc, acc_tail = _guarded(torch.empty_like(work.acc, device="cpu"))
    work.out, out_tail = _guarded(torch.empty_like(work.out, device="cpu"))
    got = gqa.gqa_decode(q, k, v, sm_scale=dim**-0.5, scales=scales, work=work, q8=q8).float()
    if q8:  # the torch form over q rounded to E4M3 per row, as the kernel multiplies it
        step = q.float().abs().amax(-1, keepdim=True).clamp_min(1e-12) / 448.0
        q = ((q.float() / step).to(torch.float8_e4m3fn).float() * step).to(torch.bfloat16)
    want = gqa.reference_gqa(q, k, v, sm_scale=dim**-0.5, scales=scales).float()
    if not (acc_tail.isnan().all() and out_tail.isnan().all() and got.isfinite().all()):
        return float("inf")
    return float((got - want).norm() / want.norm())


def padded_errors() -> dict[str, float]:
    """Every case's relative error, by name (run under the interpreter)."""
    torch.manual_seed(0)
    got: dict[str, float] = {}
    for dims in DIMS:
        for group in GROUPS:
            for length in LENGTHS:
                for fp8 in (False, True):
                    got[f"{dims} group {group} length {length} fp8 {fp8}"] = _one(dims, group, length, fp8)
    for name, form in gqa.LOOP_FORMS.items():
        config = dataclasses.replace(gqa.LONG, **form)
        for dims, fp8 in (((96, 96), True), ((80, 80), False), ((192, 128), True)):
            for length in LENGTHS:
                got[f"{name} {dims} length {length} fp8 {fp8}"] = _one(dims, 7, length, fp8, config)
    for dims in DIMS:  # 16 rows fill the padded group: the last partial row's lanes past the V dim end the buffer
        got[f"{dims} group 16 length 200 fp8 True"] = _one(dims, 16, 200, True)
    # 66 splits of one 64-token tile: the combine's 96 lanes in two blocks of 64, the last one's upper half padded
    got["combine lanes in blocks (96, 96)"] = _one((96, 96), 7, 4200, True, gqa.FIRST, sms=132)
    got["q8 (96, 96)"] = _one((96, 96), 7, 200, True, q8=True)
    return got


def test_the_kernel_takes_head_dims_that_are_not_powers_of_two() -> None:
    require_module("triton", WHY)
    got = interpreted_call(Path(__file__), "padded_errors()")
    assert len(got) == 3 * 3 * 2 * 2 + len(gqa.LOOP_FORMS) * 3 * 2 + 3 + 2, sorted(got)
    bad = {name: err for name, err in got.items() if not err < CHECK_REL_ERR}
    assert not bad, bad


def test_the_combine_lanes_stay_a_power_of_two_and_cover_the_v_dim() -> None:
    for v_dim in (80, 96, 128, 192, 256):
        for combine_block in (0, 16, 64, 1024):
            config = dataclasses.replace(gqa.SHORT, combine_block=combine_block)
            launch = gqa.gqa_workspace(1, 8, 1, 1, 5000, v_dim, META, sms=132, config=config).launch
            lanes, blocks = launch.combine_lanes, launch.combine_grid[1]
            assert lanes & (lanes - 1) == 0 and (blocks - 1) * lanes < v_dim <= blocks * lanes, (v_dim, launch)


@pytest.mark.parametrize(("dim", "v_dim"), [(8, 8), (320, 320), (128, 8), (128, 320), (15, 15), (257, 128)])
def test_head_dims_outside_what_the_kernel_takes_are_refused(dim: int, v_dim: int) -> None:
    q = torch.empty(1, 8, 1, dim, device=META, dtype=torch.bfloat16)
    k = torch.empty(1, 2, 100, dim, device=META, dtype=torch.bfloat16)
    v = torch.empty(1, 2, 100, v_dim, device=META, dtype=torch.bfloat16)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(gqa, "HAVE_TRITON", True)
        with pytest.raises(ValueError) as err:
            gqa.gqa_decode(q, k, v, sm_scale=0.125)
    assert str(err.value) == f"GQA head dims must be in [16, 256] (got {dim}, {v_dim})"
