"""Provides the tensors the component probes build their ops from (torch side): random values at a key's shape,
the weight cache of a GEMM sweep, rotated copies above the last-level cache, dtypes by name, FP8 `_scaled_mm`.

Values are random (never zeros): a kernel's time can depend on them (sparsity shortcuts, denormals). Rotation keeps
the working set above 2× the last-level cache so weight-streaming work reads DRAM, not L2 (docs/reference/probes.md §4);
CPU ranks skip it (one copy) to stay fast."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Sequence

import torch

from decodetop.probes.worker.context import ProbeContext
from decodetop.probes.worker.timing import Rotation, rotation_count

#: Scale of random weights and activations (typical init std; keeps bf16 sums finite, never all zeros).
INIT_STD = 0.02
#: Largest number of rotated copies of one op's inputs (memory bound; 64 copies of a small weight is < 100 MB).
MAX_ROTATION = 64
#: FP8 E4M3's largest finite value (OCP FP8 spec), for dynamic scales.
FP8_E4M3_MAX = 448.0
#: Elements drawn at random for a large CPU tensor, then tiled (see `randn`).
CPU_RANDOM_BLOCK = 1 << 20

#: Plain (non-quantized) dtypes by the name measurement keys use.
DTYPES: dict[str, torch.dtype] = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def sm_tag(ctx: ProbeContext) -> str:
    """`sm_90` for an H200, `cpu` on CPU ranks."""
    if not ctx.is_cuda:
        return "cpu"
    major, minor = torch.cuda.get_device_capability(ctx.device)
    return f"sm_{major}{minor}"


def randn(shape: Sequence[int], dtype: torch.dtype, device: torch.device, std: float = INIT_STD) -> torch.Tensor:
    """Random values (never zeros) of `dtype`; FP8 tensors are drawn in fp32 and cast. Large CPU tensors tile a
    random block (drawing 200M normal values takes seconds on a CPU; a dense kernel's time does not depend on the
    values)."""
    numel = math.prod(shape)
    if device.type == "cpu" and numel > CPU_RANDOM_BLOCK:
        block = randn((CPU_RANDOM_BLOCK,), dtype, device, std)
        return block.repeat(-(-numel // CPU_RANDOM_BLOCK))[:numel].view(*shape)
    if dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        # ×100: FP8 weights are stored pre-scaled (std ≈ 2 here), well inside e4m3's normal range, never 0.
        return (torch.randn(*shape, device=device) * std * 100).clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX).to(dtype)
    return torch.randn(*shape, device=device, dtype=torch.float32 if dtype.itemsize < 2 else dtype).mul_(std).to(dtype)


_WeightKey = tuple[tuple[int, ...], torch.dtype, str, int]
_WEIGHT_CACHE: dict[_WeightKey, list[torch.Tensor]] | None = None


@contextlib.contextmanager
def weight_cache() -> Iterator[None]:
    """Within the block, `weights(...)` reuses tensors of the same shape, dtype and copy count (the GEMM sweep
    varies M over one weight shape); they are dropped at the end."""
    global _WEIGHT_CACHE
    _WEIGHT_CACHE = {}
    try:
        yield
    finally:
        _WEIGHT_CACHE = None


def weights(shape: Sequence[int], dtype: torch.dtype, device: torch.device, copies: int) -> Rotation[torch.Tensor]:
    """`copies` random weight tensors in a Rotation (shared within a `weight_cache()` block)."""
    key = (tuple(shape), dtype, str(device), copies)
    if _WEIGHT_CACHE is not None and key in _WEIGHT_CACHE:
        return Rotation(_WEIGHT_CACHE[key])
    items = [randn(shape, dtype, device) for _ in range(copies)]
    if _WEIGHT_CACHE is not None:
        _WEIGHT_CACHE[key] = items
    return Rotation(items)


def copies_for(ctx: ProbeContext, nbytes: float, rotate: bool) -> int:
    """Rotated copies needed so `nbytes` × copies exceeds 2× the cache (1 when rotation is off)."""
    if not rotate or nbytes <= 0:
        return 1
    return rotation_count(max(1, int(nbytes)), ctx.cache_bytes(), max_copies=MAX_ROTATION)


def require_free(ctx: ProbeContext, nbytes: float, what: str) -> None:
    """`InsufficientMemoryError` unless `nbytes` (rounded down) fit on this rank's device with the margin."""
    ctx.require_free_bytes(int(nbytes), what)


def scaled_mm(a: torch.Tensor, b: torch.Tensor, sa: torch.Tensor, sb: torch.Tensor) -> torch.Tensor:
    """`torch._scaled_mm` with BF16 output, whatever the torch version returns."""
    out: torch.Tensor | tuple[torch.Tensor, torch.Tensor] = torch._scaled_mm(a, b, sa, sb, out_dtype=torch.bfloat16)
    return out[0] if isinstance(out, tuple) else out  # torch ≤ 2.3: (out, amax)


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message (its type name when empty)."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
