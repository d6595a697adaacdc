"""Provides FP4 expert weights as the fused-MoE kernel reads them (torch side): the packed MXFP4 and NVFP4 layouts,
their dequantisation in torch (the reference's form, CPU-testable) and random packed weights for the probe.

Both formats store FP4 E2M1 values (sign, 2 exponent bits, 1 mantissa bit; magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6),
two per byte with the even element in the low nibble (as gpt-oss's checkpoint and OpenAI's triton_kernels pack
them), and one block scale per `GROUP` consecutive values along the reduction (k, the last) dimension:

- MXFP4 (OCP Microscaling Formats spec v1.0,
  https://www.opencompute.org/documents/ocp-microscaling-formats-mx-v1-0-spec-final-pdf): an E8M0 scale per 32
  values, a uint8 exponent e meaning 2^(e − 127);
- NVFP4 (https://docs.nvidia.com/cuda/cublas/#d-block-scaling-factors-layout and
  https://developer.nvidia.com/blog/introducing-nvfp4-for-efficient-and-accurate-low-precision-inference/): an
  FP8 E4M3 scale per 16 values, and one fp32 scale per tensor (per expert here).

Weights keep the bf16 layouts (w13 `[E, 2·I, H]`, w2 `[E, H, I]`), packed along k: values uint8 `[E, N, K/2]`,
scales `[E, N, ⌈K/GROUP⌉]` (uint8 for MXFP4, float8_e4m3fn for NVFP4), NVFP4's global scale float32 `[E]`. The
scales are plain row-major, not the swizzled tiles cuBLAS and the Blackwell tensor cores read: a weight-only GEMV
reads each scale once either way, so its time does not depend on the layout. A width that is not a whole number of
scale blocks has a last, partial block (its scale covers the values there are).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from decodetop.probes.worker.tensors import FP8_E4M3_MAX

MXFP4 = "mxfp4"
NVFP4 = "nvfp4"
#: Values per block scale along k: MXFP4 32 (OCP MX spec v1.0), NVFP4 16 (the NVFP4 blog, URL above).
GROUP = {MXFP4: 32, NVFP4: 16}
#: FP4 E2M1's code → value, codes 0–7 positive, 8–15 their negatives (OCP MX spec v1.0, the FP4 element type).
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
#: E2M1's largest magnitude.
E2M1_MAX = 6.0
#: E8M0's exponent bias: e means 2^(e − 127) (OCP MX spec v1.0).
E8M0_BIAS = 127
#: Random MXFP4 scale exponents, 2^-7 … 2^-3 (`random_fp4`): random codes times these are ~0.05 in magnitude,
#: weights of a trained layer's order (`tensors.INIT_STD` 0.02), never zero or inf.
E8M0_RANDOM = (120, 125)
#: NVFP4's per-tensor scale for a tensor whose largest |weight| is 1: amax / (448 · 6), so that the largest block
#: scale is E4M3's largest finite value (the NVFP4 blog's two-level scaling, URL above).
NVFP4_GLOBAL_SCALE = 1.0 / (FP8_E4M3_MAX * E2M1_MAX)
#: Random NVFP4 block scales are drawn in [0.5, 1.5): inside E4M3's normal range.
NVFP4_SCALE_LOW = 0.5


@dataclass(frozen=True)
class Fp4Weights:
    """One projection's FP4 experts, logically [E, N, K]: `values` uint8 [E, N, K/2] (two E2M1 codes a byte, the
    even element low), `scales` [E, N, ⌈K/GROUP⌉] (MXFP4: uint8 E8M0; NVFP4: float8_e4m3fn), `global_scale`
    float32 [E] for NVFP4 (None for MXFP4)."""

    fmt: str
    values: torch.Tensor
    scales: torch.Tensor
    global_scale: torch.Tensor | None = None

    def __post_init__(self) -> None:
        if self.fmt not in GROUP:
            raise ValueError(f"FP4 weights: format {self.fmt!r} is none of {', '.join(GROUP)}")
        if self.values.dtype != torch.uint8 or self.values.dim() != 3:
            raise ValueError(f"FP4 weights: values must be uint8 [E, N, K/2], not {self.values.dtype} "
                             f"{tuple(self.values.shape)}")  # fmt: skip
        experts, rows, half = self.values.shape
        want = (experts, rows, -(-2 * half // GROUP[self.fmt]))
        scale_dtype = torch.float8_e4m3fn if self.fmt == NVFP4 else torch.uint8
        if tuple(self.scales.shape) != want or self.scales.dtype != scale_dtype:
            raise ValueError(f"{self.fmt} weights: scales must be {scale_dtype} {want}, not {self.scales.dtype} "
                             f"{tuple(self.scales.shape)}")  # fmt: skip
        gs = self.global_scale
        if (self.fmt == NVFP4) != (gs is not None):
            raise ValueError(f"{self.fmt} weights: a global scale {'is' if self.fmt == NVFP4 else 'is not'} needed")
        if gs is not None and (gs.dtype != torch.float32 or tuple(gs.shape) != (experts,)):
            raise ValueError(f"nvfp4 weights: the global scale must be float32 [{experts}], not {gs.dtype} "
                             f"{tuple(gs.shape)}")  # fmt: skip

    @property
    def shape(self) -> tuple[int, int, int]:
        """The logical [E, N, K]."""
        experts, rows, half = self.values.shape
        return experts, rows, 2 * half

    @property
    def group(self) -> int:
        """Values per block scale along k."""
        return GROUP[self.fmt]

    @property
    def nbytes(self) -> int:
        """Bytes stored: the packed values, the block scales and the global scales (`fp4_nbytes`)."""
        gs = self.global_scale.nbytes if self.global_scale is not None else 0
        return self.values.nbytes + self.scales.nbytes + gs

    def is_contiguous(self) -> bool:
        """Whether every part is contiguous (the kernel addresses them by their strides, unit along k)."""
        parts = (self.values, self.scales, self.global_scale)
        return all(p.is_contiguous() for p in parts if p is not None)

    def expert(self, e: int) -> torch.Tensor:
        """Expert e's weights [N, K] in fp32."""
        gs = self.global_scale[e] if self.global_scale is not None else None
        return dequant_fp4(self.values[e], self.scales[e], gs, self.fmt)


def fp4_nbytes(shape: tuple[int, int, int], fmt: str) -> int:
    """Bytes of FP4 experts of logical `shape` [E, N, K] stored as `fmt`: half a byte a value, a byte a block
    scale, NVFP4's 4-byte fp32 scale per expert."""
    experts, rows, width = shape
    per_row = -(-width // 2) + -(-width // GROUP[fmt])
    return experts * rows * per_row + (experts * 4 if fmt == NVFP4 else 0)


def dequant_fp4(
    values: torch.Tensor, scales: torch.Tensor, global_scale: torch.Tensor | None, fmt: str
) -> torch.Tensor:
    """FP4 weights [..., N, K/2] packed (`Fp4Weights`) as fp32 [..., N, K]: each code's E2M1 value times its
    block's scale (MXFP4: 2^(e − 127); NVFP4: the E4M3 value times the global scale, one per leading index)."""
    if fmt not in GROUP:
        raise ValueError(f"FP4 weights: format {fmt!r} is none of {', '.join(GROUP)}")
    table = torch.tensor(E2M1_VALUES, device=values.device)
    table = torch.cat([table, -table])
    codes = torch.stack([values & 15, values >> 4], dim=-1).flatten(-2).long()  # low nibble: the even element
    width = codes.shape[-1]
    if fmt == MXFP4:
        block = torch.exp2(scales.float() - E8M0_BIAS)
    else:
        block = scales.float()
        if global_scale is not None:
            block = block * global_scale.float().reshape(*global_scale.shape, 1, 1)
    per_value = block.repeat_interleave(GROUP[fmt], dim=-1)[..., :width]
    return table[codes] * per_value


def random_fp4(shape: tuple[int, int, int], fmt: str, device: torch.device) -> Fp4Weights:
    """Random FP4 experts of logical `shape` [E, N, K] (K even): random bytes for the values (every code,
    signs and zeros included), scales in a sane range (`E8M0_RANDOM`; NVFP4: [0.5, 1.5) and `NVFP4_GLOBAL_SCALE`)."""
    experts, rows, width = shape
    if fmt not in GROUP:
        raise ValueError(f"FP4 weights: format {fmt!r} is none of {', '.join(GROUP)}")
    if width % 2:
        raise ValueError(f"FP4 weights pack two values a byte along k: the width {width} is odd")
    blocks = -(-width // GROUP[fmt])
    values = torch.randint(0, 256, (experts, rows, width // 2), dtype=torch.uint8, device=device)
    if fmt == MXFP4:
        lo, hi = E8M0_RANDOM
        scales = torch.randint(lo, hi, (experts, rows, blocks), dtype=torch.uint8, device=device)
        return Fp4Weights(fmt, values, scales)
    block = (torch.rand(experts, rows, blocks, device=device) + NVFP4_SCALE_LOW).to(torch.float8_e4m3fn)
    gs = torch.full((experts,), NVFP4_GLOBAL_SCALE, dtype=torch.float32, device=device)
    return Fp4Weights(fmt, values, block, gs)
