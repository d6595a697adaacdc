"""Provides a model served at another weight precision (a what-if knob): the same architecture with its linear
layers stored as BF16, FP8 or NVFP4, the modules a quantized checkpoint keeps in its base dtype kept so (routers,
norms, embedding, lm_head, the checkpoint's own exclusions: docs/reference/models.md §5). Stdlib only.

Whether the GPU can run the format is the curve engine's concern, not this module's: where this host measured no
curve of the dtype (NVFP4 on an H200, which has no FP4 tensor cores), its figures are carried from FP8 with a ±35 %
band and labelled so (`decodetop.budget.curves`).
"""

from __future__ import annotations

import dataclasses
import threading
from collections import OrderedDict

from decodetop.budget.quant import QuantScheme, WeightFormat, bits_per_weight, no_quantization
from decodetop.budget.spec import ModelSpec
from decodetop.errors import UserInputError

WEIGHT_CHOICES: dict[str, WeightFormat] = {
    "bf16": WeightFormat.BF16,
    "fp8": WeightFormat.FP8_TENSOR,
    "nvfp4": WeightFormat.NVFP4,
    "mxfp4": WeightFormat.MXFP4,
}
"""`--vary weights=…` values and the storage format each stands for."""


_HELD = 16
_made: OrderedDict[tuple[int, str], tuple[ModelSpec, ModelSpec]] = OrderedDict()
_made_lock = threading.Lock()


def with_weights(spec: ModelSpec, weights: str) -> ModelSpec:
    """`spec` with its linear layers stored as `weights` (bf16, fp8, nvfp4, mxfp4); the checkpoint's own scheme
    where `weights` is what it already declares. The same object for the same model and precision (the last few
    kept): a what-if asks for it at every knob turned, and a model's modules take tens of ms to build."""
    with _made_lock:
        hit = _made.get((id(spec), weights))
        if hit is not None and hit[0] is spec:
            _made.move_to_end((id(spec), weights))
            return hit[1]
    made = _with_weights(spec, weights)
    with _made_lock:
        _made[(id(spec), weights)] = (spec, made)
        while len(_made) > _HELD:
            _made.popitem(last=False)
    return made


def _with_weights(spec: ModelSpec, weights: str) -> ModelSpec:
    fmt = WEIGHT_CHOICES.get(weights)
    if fmt is None:
        raise UserInputError(f"weights={weights!r} is not one of {', '.join(WEIGHT_CHOICES)}")
    quant = spec.quant
    declared = quant.weight_format if quant.quantized else quant.base_format
    if declared.probe_dtype == fmt.probe_dtype:  # what the checkpoint declares (FP8 block or per-tensor alike)
        return spec
    if fmt is quant.base_format:
        scheme = no_quantization(quant.base_format)
    else:
        scheme = QuantScheme(
            method="what-if",
            source=f"--vary weights={weights}",
            base_format=quant.base_format,
            weight_format=fmt,
            weight_bits=bits_per_weight(fmt),
            exclusions=quant.exclusions,
            kv_cache_dtype=quant.kv_cache_dtype,
        )
    scheme = dataclasses.replace(scheme, kv_cache_dtype=quant.kv_cache_dtype)
    return dataclasses.replace(spec, quant=scheme, name=f"{spec.name} ({fmt.label} weights)")
