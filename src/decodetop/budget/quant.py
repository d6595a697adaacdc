"""Provides weight formats and the quantization reader: bytes per weight per module, from `config.json`'s
`quantization_config` and/or a ModelOpt `hf_quant_config.json` (docs/reference/models.md §5).

A checkpoint's quantization covers some modules and not others (nvidia/GLM-5-NVFP4 keeps every attention
projection and lm_head in BF16), so the answer is per module name: `QuantScheme.format_for(name, role)`.
Exclusion lists come in three pattern styles, each honoured as its producer does:

- ModelOpt (`exclude_modules` in hf_quant_config.json, `ignore` with `quant_method: modelopt`): fnmatch globs,
  e.g. `model.layers.0*`, `model.layers.*.self_attn*`.
- compressed-tensors (`ignore`): exact module names, or regexes written `re:<regex>` (matched from the start).
- `modules_to_not_convert` (FP8 block, MXFP4) and vLLM's `ignored_layers`: exact names or name prefixes (a parent
  module covers its children), `*` globs allowed (gpt-oss writes `model.layers.*.self_attn`).

In every style a pattern that names a parent module covers its children. Multimodal wrappers prefix module names
(`language_model.model.layers...`, `model.language_model.layers...`); patterns are normalised to the plain
`model.layers...` names this package uses.
"""

from __future__ import annotations

import enum
import fnmatch
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from decodetop.errors import UserInputError


class ConfigError(UserInputError):
    """A model config (or quantization config) decodetop cannot use: the message names the file and the key."""

    def __init__(self, file: str, key: str, problem: str) -> None:
        super().__init__(f"{file}: {key}: {problem}" if key else f"{file}: {problem}")
        self.file = file
        self.key = key
        self.problem = problem


class WeightFormat(str, enum.Enum):
    """How one weight is stored. The value is the stable key used in JSON and probe params."""

    FP32 = "fp32"
    BF16 = "bf16"
    FP16 = "fp16"
    FP8_BLOCK = "fp8_block"
    FP8_TENSOR = "fp8_tensor"
    NVFP4 = "nvfp4"
    MXFP4 = "mxfp4"

    @property
    def probe_dtype(self) -> str:
        """The dtype a GEMM probe runs at: bf16, fp16, fp32, fp8, nvfp4 or mxfp4."""
        if self in (WeightFormat.FP8_BLOCK, WeightFormat.FP8_TENSOR):
            return "fp8"
        return str(self.value)

    @property
    def label(self) -> str:
        """Human name: BF16, FP8 block, NVFP4..."""
        return _FORMAT_LABELS[self]


_FORMAT_LABELS = {
    WeightFormat.FP32: "FP32",
    WeightFormat.BF16: "BF16",
    WeightFormat.FP16: "FP16",
    WeightFormat.FP8_BLOCK: "FP8 block",
    WeightFormat.FP8_TENSOR: "FP8 per-tensor",
    WeightFormat.NVFP4: "NVFP4",
    WeightFormat.MXFP4: "MXFP4",
}

# Effective bits per weight, docs/reference/models.md §5 (scales included; per-tensor FP32 scalars are negligible).
FP8_BLOCK_SCALE_BITS = 32
"""One FP32 `weight_scale_inv` per block (DeepSeek FP8, docs/reference/models.md §5)."""
NVFP4_GROUP_SIZE = 16
"""ModelOpt / compressed-tensors NVFP4: one FP8-E4M3 scale per 16 E2M1 values (docs/reference/models.md §5)."""
MXFP4_BLOCK_SIZE = 32
"""MXFP4: one E8M0 scale byte per 32 E2M1 values (docs/reference/models.md §5: 16 B per 32-value block + 1 scale
byte)."""

_FIXED_BITS = {
    WeightFormat.FP32: 32.0,
    WeightFormat.BF16: 16.0,
    WeightFormat.FP16: 16.0,
    WeightFormat.FP8_TENSOR: 8.0,
    WeightFormat.MXFP4: 4.0 + 8.0 / MXFP4_BLOCK_SIZE,
}


def bits_per_weight(fmt: WeightFormat, *, block: tuple[int, int] = (128, 128), group_size: int = 16) -> float:
    """Effective storage bits per weight of a format (element bits + scale bits spread over their block)."""
    if fmt is WeightFormat.FP8_BLOCK:
        return 8.0 + FP8_BLOCK_SCALE_BITS / (block[0] * block[1])
    if fmt is WeightFormat.NVFP4:
        return 4.0 + 8.0 / group_size  # FP8-E4M3 scale per group
    return _FIXED_BITS[fmt]


DTYPE_NAMES: dict[str, WeightFormat] = {
    "bfloat16": WeightFormat.BF16,
    "float16": WeightFormat.FP16,
    "half": WeightFormat.FP16,
    "float32": WeightFormat.FP32,
    "float": WeightFormat.FP32,
}
"""`torch_dtype` / `dtype` values of config.json and the base format they mean."""


# --- exclusion patterns -------------------------------------------------------------------------------------

_WRAPPER_PREFIXES = (("model.language_model.", "model."), ("language_model.model.", "model."), ("language_model.", ""))


def _normalise(pattern: str) -> str:
    raw = pattern[3:] if pattern.startswith("re:") else pattern
    for prefix, replacement in _WRAPPER_PREFIXES:
        if raw.startswith(prefix):
            raw = replacement + raw[len(prefix) :]
            break
    return ("re:" + raw) if pattern.startswith("re:") else raw


def _self_and_ancestors(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(len(parts), 0, -1)]


@dataclass(frozen=True)
class Exclusions:
    """A list of modules a quantization format leaves alone, in one producer's pattern style."""

    style: str
    """"glob" (ModelOpt), "ct" (compressed-tensors: exact or `re:`), or "prefix" (modules_to_not_convert)."""
    patterns: tuple[str, ...] = ()
    _exact: frozenset[str] = field(default=frozenset(), init=False, repr=False, compare=False)
    _regex: re.Pattern[str] | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        exact: set[str] = set()
        regexes: list[str] = []
        for raw in self.patterns:
            pattern = _normalise(raw)
            if self.style == "ct" and pattern.startswith("re:"):
                regexes.append(f"(?:{pattern[3:]})")
            elif self.style != "ct" and any(c in pattern for c in "*?["):
                regexes.append(fnmatch.translate(pattern))
            else:
                exact.add(pattern)
        object.__setattr__(self, "_exact", frozenset(exact))
        object.__setattr__(self, "_regex", re.compile("|".join(regexes)) if regexes else None)

    def matches(self, name: str) -> bool:
        """Whether module `name` (or a parent module of it) is excluded."""
        for candidate in _self_and_ancestors(name):
            if candidate in self._exact:
                return True
            if self._regex is not None and self._regex.match(candidate):
                return True
        return False

    def __len__(self) -> int:
        return len(self.patterns)


# --- the scheme ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class QuantScheme:
    """Which format each weight of a checkpoint is stored in.

    Quantized formats apply to Linear modules (attention projections, MLPs, experts) that the exclusion list
    does not name. Routers, norms, embeddings and lm_head keep the base dtype (docs/reference/models.md §5), except
    lm_head when a compressed-tensors config targets it explicitly."""

    method: str
    """"none", "fp8", "modelopt", "compressed-tensors" or "mxfp4"."""
    source: str
    """Where it was declared: "config.json:quantization_config", "hf_quant_config.json", or "" for none."""
    base_format: WeightFormat = WeightFormat.BF16
    weight_format: WeightFormat = WeightFormat.BF16
    weight_bits: float = 16.0
    exclusions: Exclusions = field(default_factory=lambda: Exclusions("prefix"))
    quantize_lm_head: bool = False
    kv_cache_dtype: str | None = None
    """KV-cache dtype the checkpoint declares ("fp8"), or None to use the activation dtype."""

    @property
    def quantized(self) -> bool:
        """Whether any weight is stored below the base dtype."""
        return self.method != "none"

    def format_for(self, name: str, role: str) -> WeightFormat:
        """Storage format of module `name` with `role` "linear", "router", "lm_head", "embedding" or "norm"."""
        if not self.quantized:
            return self.base_format
        if role == "lm_head":
            if not self.quantize_lm_head or self.exclusions.matches(name):
                return self.base_format
            return self.weight_format
        if role != "linear" or self.exclusions.matches(name):
            return self.base_format
        return self.weight_format

    def bits_for(self, fmt: WeightFormat) -> float:
        """Bits per weight of `fmt` in this checkpoint (its block/group sizes)."""
        return self.weight_bits if fmt is self.weight_format else bits_per_weight(fmt)

    def describe(self) -> str:
        """One line: format, where it was declared, what stays in the base dtype."""
        if not self.quantized:
            return f"{self.base_format.label} (no quantization config)"
        always = "routers, norms, embedding" + ("" if self.quantize_lm_head else ", lm_head")
        return (
            f"{self.weight_format.label} ({self.weight_bits:g} bits/weight; {self.method}, {self.source}); "
            f"{always} and {len(self.exclusions)} excluded module pattern(s) stay {self.base_format.label}"
        )


def no_quantization(base: WeightFormat) -> QuantScheme:
    """The scheme of an unquantized checkpoint."""
    return QuantScheme(
        method="none", source="", base_format=base, weight_format=base, weight_bits=bits_per_weight(base)
    )


# --- readers -------------------------------------------------------------------------------------------------

KNOWN_METHODS = ("fp8", "modelopt", "compressed-tensors", "mxfp4")


def _str_list(value: object, file: str, key: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(file, key, "expected a list of module names or patterns")
    return tuple(value)


def _mapping(value: object, file: str, key: str) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise ConfigError(file, key, f"expected a JSON object, got {type(value).__name__}")
    return value


def _kv_from_algo(value: object, file: str, key: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise ConfigError(file, key, "expected a string such as 'FP8'")
    if value.upper() == "FP8":
        return "fp8"
    if value.upper() in ("NONE", ""):
        return None
    raise ConfigError(file, key, f"KV-cache quantization {value!r} is not known (known: FP8)")


def _modelopt_algo(algo: object, file: str, key: str, group_size: int) -> tuple[WeightFormat, float]:
    if not isinstance(algo, str):
        raise ConfigError(file, key, "expected a string such as 'NVFP4' or 'FP8'")
    if algo.upper() == "NVFP4":
        return WeightFormat.NVFP4, bits_per_weight(WeightFormat.NVFP4, group_size=group_size)
    if algo.upper() == "FP8":
        return WeightFormat.FP8_TENSOR, bits_per_weight(WeightFormat.FP8_TENSOR)
    raise ConfigError(file, key, f"ModelOpt quant_algo {algo!r} is not known (known: NVFP4, FP8)")


def _group_size(value: object, file: str, key: str) -> int:
    if value is None:
        return NVFP4_GROUP_SIZE
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 4096:
        raise ConfigError(file, key, f"expected a group size between 1 and 4096, got {value!r}")
    return value


def read_hf_quant_config(data: object, file: str, base: WeightFormat) -> QuantScheme:
    """A ModelOpt `hf_quant_config.json` (legacy layout: `{"producer": ..., "quantization": {...}}`)."""
    top = _mapping(data, file, "")
    quant = _mapping(top.get("quantization"), file, "quantization")
    group = _group_size(quant.get("group_size"), file, "quantization.group_size")
    fmt, bits = _modelopt_algo(quant.get("quant_algo"), file, "quantization.quant_algo", group)
    excl = _str_list(quant.get("exclude_modules"), file, "quantization.exclude_modules")
    return QuantScheme(
        method="modelopt",
        source="hf_quant_config.json",
        base_format=base,
        weight_format=fmt,
        weight_bits=bits,
        exclusions=Exclusions("glob", excl),
        kv_cache_dtype=_kv_from_algo(quant.get("kv_cache_quant_algo"), file, "quantization.kv_cache_quant_algo"),
    )


def _kv_scheme(value: object, file: str, key: str) -> str | None:
    if value is None:
        return None
    scheme = _mapping(value, file, key)
    bits, kind = scheme.get("num_bits"), scheme.get("type")
    if bits == 8 and kind == "float":
        return "fp8"
    raise ConfigError(file, key, f"KV-cache scheme num_bits={bits!r} type={kind!r} is not known (known: 8-bit float)")


def _ct_weights(qc: Mapping[str, Any], file: str) -> tuple[WeightFormat, float, bool]:
    """Format, bits and whether lm_head is targeted, from compressed-tensors / ModelOpt `config_groups`."""
    groups = _mapping(qc.get("config_groups"), file, "quantization_config.config_groups")
    if not groups:
        raise ConfigError(file, "quantization_config.config_groups", "is empty")
    found: tuple[WeightFormat, float] | None = None
    lm_head = False
    for gname, gvalue in groups.items():
        key = f"quantization_config.config_groups.{gname}"
        group = _mapping(gvalue, file, key)
        weights = _mapping(group.get("weights"), file, f"{key}.weights")
        targets = _str_list(group.get("targets", []), file, f"{key}.targets")
        lm_head = lm_head or "lm_head" in targets
        bits, kind, strategy = weights.get("num_bits"), weights.get("type"), weights.get("strategy")
        gsize = weights.get("group_size")
        if bits == 4 and kind == "float":
            this = (WeightFormat.NVFP4, bits_per_weight(WeightFormat.NVFP4, group_size=_group_size(gsize, file, key)))
        elif bits == 8 and kind == "float":
            if strategy == "block":
                shape = weights.get("block_structure")
                if (
                    not isinstance(shape, list)
                    or len(shape) != 2
                    or not all(isinstance(v, int) and not isinstance(v, bool) and 0 < v <= 65536 for v in shape)
                ):
                    raise ConfigError(file, f"{key}.weights.block_structure", "expected two positive block sizes")
                this = (WeightFormat.FP8_BLOCK, bits_per_weight(WeightFormat.FP8_BLOCK, block=(shape[0], shape[1])))
            else:
                this = (WeightFormat.FP8_TENSOR, bits_per_weight(WeightFormat.FP8_TENSOR))
        else:
            raise ConfigError(
                file,
                f"{key}.weights",
                f"num_bits={bits!r} type={kind!r} is not a format decodetop knows (known: 4-bit float = NVFP4, "
                "8-bit float = FP8)",
            )
        if found is not None and found != this:
            raise ConfigError(file, key, "config groups with different weight formats are not supported")
        found = this
    assert found is not None
    return found[0], found[1], lm_head


def read_quantization_config(qc_value: object, file: str, base: WeightFormat) -> QuantScheme:
    """config.json's `quantization_config`: fp8 (block or per-tensor), mxfp4, modelopt, compressed-tensors."""
    qc = _mapping(qc_value, file, "quantization_config")
    method = qc.get("quant_method")
    source = "config.json:quantization_config"
    if method == "fp8":
        block = qc.get("weight_block_size")
        excl = _str_list(qc.get("modules_to_not_convert"), file, "quantization_config.modules_to_not_convert")
        excl += _str_list(qc.get("ignored_layers"), file, "quantization_config.ignored_layers")
        fmt_name = qc.get("fmt", "e4m3")
        if fmt_name not in ("e4m3", "e5m2"):
            raise ConfigError(file, "quantization_config.fmt", f"FP8 format {fmt_name!r} is not known (e4m3, e5m2)")
        if block is None:
            fmt, bits = WeightFormat.FP8_TENSOR, bits_per_weight(WeightFormat.FP8_TENSOR)
        else:
            if (
                not isinstance(block, list)
                or len(block) != 2
                or not all(isinstance(v, int) and not isinstance(v, bool) and 0 < v <= 65536 for v in block)
            ):
                raise ConfigError(file, "quantization_config.weight_block_size", "expected two positive block sizes")
            fmt, bits = WeightFormat.FP8_BLOCK, bits_per_weight(WeightFormat.FP8_BLOCK, block=(block[0], block[1]))
        return QuantScheme("fp8", source, base, fmt, bits, Exclusions("prefix", excl))
    if method == "mxfp4":
        excl = _str_list(qc.get("modules_to_not_convert"), file, "quantization_config.modules_to_not_convert")
        return QuantScheme(
            "mxfp4", source, base, WeightFormat.MXFP4, bits_per_weight(WeightFormat.MXFP4), Exclusions("prefix", excl)
        )
    if method == "modelopt":
        excl = _str_list(qc.get("ignore"), file, "quantization_config.ignore")
        excl += _str_list(qc.get("exclude_modules"), file, "quantization_config.exclude_modules")
        if "config_groups" in qc:
            fmt, bits, _ = _ct_weights(qc, file)
        else:
            group = _group_size(qc.get("group_size"), file, "quantization_config.group_size")
            fmt, bits = _modelopt_algo(qc.get("quant_algo"), file, "quantization_config.quant_algo", group)
        kv = _kv_scheme(qc.get("kv_cache_scheme"), file, "quantization_config.kv_cache_scheme")
        if kv is None:
            kv = _kv_from_algo(qc.get("kv_cache_quant_algo"), file, "quantization_config.kv_cache_quant_algo")
        return QuantScheme("modelopt", source, base, fmt, bits, Exclusions("glob", excl), kv_cache_dtype=kv)
    if method == "compressed-tensors":
        excl = _str_list(qc.get("ignore"), file, "quantization_config.ignore")
        fmt, bits, lm_head = _ct_weights(qc, file)
        kv = _kv_scheme(qc.get("kv_cache_scheme"), file, "quantization_config.kv_cache_scheme")
        return QuantScheme(
            "compressed-tensors",
            source,
            base,
            fmt,
            bits,
            Exclusions("ct", excl),
            quantize_lm_head=lm_head,
            kv_cache_dtype=kv,
        )
    raise ConfigError(
        file,
        "quantization_config.quant_method",
        f"{method!r} is not a quantization format decodetop knows (known: {', '.join(KNOWN_METHODS)})",
    )
