"""FP4 expert weights (`decodetop.probes.worker.fp4`): dequantisation against hand-computed values of both formats,
the packed layout's checks, the bytes it stores against the budget's bits per weight, random weights in range."""

from __future__ import annotations

import pytest
import torch

from decodetop.budget.quant import WeightFormat, bits_per_weight
from decodetop.probes.worker.fp4 import (
    E2M1_VALUES,
    MXFP4,
    NVFP4,
    Fp4Weights,
    dequant_fp4,
    fp4_nbytes,
    random_fp4,
)

CPU = torch.device("cpu")


def _bytes(*first: int, total: int) -> torch.Tensor:
    return torch.tensor([*first, *([0] * (total - len(first)))], dtype=torch.uint8)


def test_mxfp4_low_nibble_is_the_even_element_and_e8m0_is_a_power_of_two() -> None:
    # 0x21: low nibble 1 (0.5), high 2 (1.0); 0xF9: 9 (-0.5), 15 (-6); 0x7C: 12 (-2), 7 (6); 0x35: 5 (3), 3 (1.5)
    row = _bytes(0x21, 0xF9, 0x7C, 0x35, total=16)  # 32 values: one E8M0 block
    values = torch.stack([row, row])
    scales = torch.tensor([[127], [125]], dtype=torch.uint8)  # 2^0, 2^-2
    got = dequant_fp4(values, scales, None, MXFP4)
    first = [0.5, 1.0, -0.5, -6.0, -2.0, 6.0, 3.0, 1.5]
    assert got.shape == (2, 32) and got.dtype == torch.float32
    assert got[0, :8].tolist() == first and not got[0, 8:].any()
    assert got[1, :8].tolist() == [v / 4 for v in first]


def test_every_e2m1_code_reads_as_the_spec_lists_it() -> None:
    codes = torch.arange(16, dtype=torch.uint8)
    values = (codes[0::2] | (codes[1::2] << 4)).reshape(1, 8)  # codes 0..15 in order along k
    got = dequant_fp4(values, torch.tensor([[127]], dtype=torch.uint8), None, MXFP4)
    assert got[0].tolist() == [*E2M1_VALUES, *(-v for v in E2M1_VALUES)]


def test_nvfp4_multiplies_each_16_by_its_e4m3_scale_and_the_global_scale() -> None:
    values = _bytes(0x21, *([0] * 7), 0x7C, total=16).reshape(1, 16)  # 32 values: two NVFP4 blocks
    scales = torch.tensor([[2.0, 0.5]]).to(torch.float8_e4m3fn)
    got = dequant_fp4(values, scales, torch.tensor(0.5), NVFP4)
    assert got[0, :2].tolist() == [0.5, 1.0]  # 2.0 · 0.5 = 1
    assert got[0, 16:18].tolist() == [-0.5, 1.5]  # -2 and 6, times 0.5 · 0.5
    per_expert = torch.stack([values, values])
    both = dequant_fp4(per_expert, torch.stack([scales, scales]), torch.tensor([0.5, 2.0]), NVFP4)
    assert torch.equal(both[0], got) and torch.equal(both[1], got * 4)


def test_a_width_of_no_whole_blocks_has_a_last_partial_block() -> None:
    values = torch.full((1, 20), 0x22, dtype=torch.uint8)  # 40 values, all 1.0: blocks of 32 and 8
    got = dequant_fp4(values, torch.tensor([[127, 128]], dtype=torch.uint8), None, MXFP4)
    assert got.shape == (1, 40) and got[0, :32].eq(1.0).all() and got[0, 32:].eq(2.0).all()


def test_packed_weights_say_what_is_wrong_with_them() -> None:
    values = torch.zeros(2, 4, 16, dtype=torch.uint8)
    good = torch.zeros(2, 4, 1, dtype=torch.uint8)
    assert Fp4Weights(MXFP4, values, good).shape == (2, 4, 32)
    e4m3 = torch.zeros(2, 4, 2).to(torch.float8_e4m3fn)
    cases = [
        (("int4", values, good, None), "none of"),
        ((MXFP4, values.float(), good, None), "uint8"),
        ((MXFP4, values, torch.zeros(2, 4, 2, dtype=torch.uint8), None), r"\(2, 4, 1\)"),
        ((NVFP4, values, torch.zeros(2, 4, 2, dtype=torch.uint8), torch.ones(2)), "float8_e4m3fn"),
        ((NVFP4, values, e4m3, None), "global scale is needed"),
        ((MXFP4, values, good, torch.ones(2)), "is not needed"),
        ((NVFP4, values, e4m3, torch.ones(3)), r"float32 \[2\]"),
    ]
    for args, words in cases:
        with pytest.raises(ValueError, match=words):
            Fp4Weights(*args)
    with pytest.raises(ValueError, match="odd"):
        random_fp4((1, 2, 33), MXFP4, CPU)


@pytest.mark.parametrize(("fmt", "form"), [(MXFP4, WeightFormat.MXFP4), (NVFP4, WeightFormat.NVFP4)])
def test_stored_bytes_match_the_budgets_bits_per_weight(fmt: str, form: WeightFormat) -> None:
    shape = (4, 64, 2880)  # gpt-oss's hidden width: whole blocks of 32 and of 16
    w = random_fp4(shape, fmt, CPU)
    assert w.nbytes == fp4_nbytes(shape, fmt) and w.is_contiguous()
    per_expert = 4 if fmt == NVFP4 else 0  # NVFP4's fp32 scale
    assert (w.nbytes - shape[0] * per_expert) * 8 / (4 * 64 * 2880) == bits_per_weight(form)


@pytest.mark.parametrize("fmt", [MXFP4, NVFP4])
def test_random_weights_are_finite_and_in_a_sane_range(fmt: str) -> None:
    torch.manual_seed(3)
    w = random_fp4((2, 32, 256), fmt, CPU)
    dense = torch.stack([w.expert(e) for e in range(2)])
    assert torch.isfinite(dense).all() and dense.abs().max() > 0
    assert dense.abs().max() <= 6 * 2.0**-3  # E2M1's largest under the largest scale drawn (both formats)
    assert len(torch.unique(w.values)) > 200  # random bytes: nearly every code pair
