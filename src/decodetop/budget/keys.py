"""Provides the measurement keys: hashable, frozen descriptions of one thing a probe measures, at the exact shape a
model's decode step needs (docs/architecture.md "Data flow": the inventory decides what is measured).

Each key has a stable string id (`key_id`, e.g. `gemm:m=1,n=2048,k=6144,batch=1,dtype=nvfp4`) that results are
stored under, and converts to and from the flat parameter dict a probe reads (`to_params()` / `from_params()`).
Keys are grouped by the probe that measures them (`PROBE` class attribute): gemm, moe, routing, attention,
kvcast, norms, sampling, allreduce, launch.

What the measured time of each key means (the probes must report exactly this, median over repetitions):
- gemm: one GEMM (or batched GEMM when batch > 1) of [m×k]·[k×n] at dtype, weights streamed from DRAM.
- moe: one MoE layer's routed-expert work on one rank: dispatch/sort, gate_up grouped GEMM, activation, down
  grouped GEMM, combine, for `tokens` tokens routed top_k ways over `experts_local` experts of which
  `experts_active` are touched.
- routing: router GEMM [tokens×hidden]·[hidden×n_experts] plus the scoring and top-k selection.
- attention: one layer's decode attention for `batch` sequences of `q_len` new tokens against `context` cached
  tokens (for mla+dsa: the indexer's scoring over the whole context and top-k selection included).
- kvcast: writing (casting) one layer's new K/V (or latent) entries into a cache of `context` tokens.
- norms: one elementwise op (`op`: rmsnorm, add_rmsnorm, layernorm, silu_mul, rotary, embedding).
- sampling: lm_head on this rank's vocab shard plus sampling from the logits.
- allreduce: one collective (`collective`: all_reduce or all_gather) of exactly `bytes` bytes per rank.
- launch: the cost of launching one kernel in `mode` (eager: host launch per kernel; graph: per node of a replayed
  CUDA graph). `kernels` is the number per decode step, for probes that time a chain of that length; the time
  stored under the key is per kernel.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import ClassVar, Union

from decodetop.errors import UserInputError

Param = Union[int, str, float]  # noqa: UP007 - a runtime alias, Python 3.10


class MeasurementKeyError(UserInputError):
    """A key id or parameter dict that does not describe a valid key."""


@dataclasses.dataclass(frozen=True)
class _Key:
    """Common behaviour: stable id, flat params, validation."""

    PROBE: ClassVar[str] = ""

    def __post_init__(self) -> None:
        for name, type_name in _field_types(type(self)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, _TYPES[type_name]):
                raise MeasurementKeyError(f"{self.PROBE} key: {name}={value!r} is not {type_name}")
            if type_name == "str":
                if any(c in str(value) for c in ",=:"):
                    raise MeasurementKeyError(f"{self.PROBE} key: {name}={value!r} holds a separator character")
            elif isinstance(value, (int, float)) and value < 0:
                raise MeasurementKeyError(f"{self.PROBE} key: {name}={value!r} is negative")
        self._check()

    def _check(self) -> None:
        """Per-key invariants (override)."""

    @property
    def probe(self) -> str:
        """The probe that measures this key."""
        return self.PROBE

    def to_params(self) -> dict[str, Param]:
        """The flat parameter dict a probe reads (field order)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    @property
    def key_id(self) -> str:
        """Stable string id: `<probe>:<field>=<value>,...` in field order."""
        parts = ",".join(f"{k}={_fmt(v)}" for k, v in self.to_params().items())
        return f"{self.PROBE}:{parts}"

    @classmethod
    def from_params(cls, params: Mapping[str, object]) -> _Key:
        """Rebuild a key from `to_params()` output (ints may arrive as floats from JSON: 3.0 is accepted)."""
        names = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(params) - set(names))
        if unknown:
            raise MeasurementKeyError(f"{cls.PROBE} key: unknown parameter(s) {', '.join(unknown)}")
        values: dict[str, object] = {}
        for f in dataclasses.fields(cls):
            if f.name not in params:
                if f.default is not dataclasses.MISSING:
                    continue
                raise MeasurementKeyError(f"{cls.PROBE} key: missing parameter {f.name}")
            values[f.name] = _coerce(params[f.name], str(f.type))
        return cls(**values)

    def __str__(self) -> str:
        return self.key_id


_TYPES: dict[str, type | tuple[type, ...]] = {"int": int, "str": str, "float": (int, float)}


_FIELD_TYPES: dict[type, tuple[tuple[str, str], ...]] = {}


def _field_types(cls: type[_Key]) -> tuple[tuple[str, str], ...]:
    """(name, type name) of a key class's fields, computed once per class (keys are made by the thousand)."""
    found = _FIELD_TYPES.get(cls)
    if found is None:
        found = _FIELD_TYPES[cls] = tuple((f.name, str(f.type)) for f in dataclasses.fields(cls))
    return found


def _fmt(value: Param) -> str:
    if isinstance(value, float):
        return repr(value)
    return str(value)


def _coerce(value: object, type_name: str) -> object:
    if type_name == "int" and isinstance(value, float) and value.is_integer():
        return int(value)
    if type_name == "float" and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if type_name in ("int", "float") and isinstance(value, str):
        try:
            return int(value) if type_name == "int" else float(value)
        except ValueError:
            return value
    return value


@dataclasses.dataclass(frozen=True)
class GemmKey(_Key):
    """[m×k]·[k×n] at `dtype` (bf16, fp16, fp8, nvfp4, mxfp4), `batch` independent matrices (MLA's absorbed bmm)."""

    PROBE: ClassVar[str] = "gemm"
    m: int
    n: int
    k: int
    batch: int
    dtype: str

    def _check(self) -> None:
        if min(self.m, self.n, self.k, self.batch) < 1:
            raise MeasurementKeyError(f"gemm key: sizes must be positive ({self.key_id})")

    @property
    def curve_id(self) -> str:
        """Id of the GEMM-vs-M curve this shape lies on (everything but m)."""
        return f"gemm:n={self.n},k={self.k},batch={self.batch},dtype={self.dtype}"


@dataclasses.dataclass(frozen=True)
class MoeKey(_Key):
    """One MoE layer's routed experts on one rank (per-expert gate_up N=2·intermediate, K=hidden; down N=hidden)."""

    PROBE: ClassVar[str] = "moe"
    tokens: int
    top_k: int
    experts_local: int
    experts_active: int
    hidden: int
    intermediate: int
    """Per-expert FFN width held by this rank (the expert width / MoE-TP degree)."""
    dtype: str
    bias: int
    """1 when experts carry biases (gpt-oss)."""


@dataclasses.dataclass(frozen=True)
class RoutingKey(_Key):
    """Router GEMM [tokens×hidden]·[hidden×n_experts] + scoring (softmax|sigmoid) + grouped top-k."""

    PROBE: ClassVar[str] = "routing"
    tokens: int
    hidden: int
    n_experts: int
    scoring: str
    n_group: int
    topk_group: int
    top_k: int
    dtype: str


@dataclasses.dataclass(frozen=True)
class AttentionKey(_Key):
    """One layer's decode attention on one rank. kind: gqa, mla (absorbed, over the latent cache) or mla+dsa."""

    PROBE: ClassVar[str] = "attention"
    kind: str
    batch: int
    q_len: int
    context: int
    heads: int
    kv_heads: int
    head_dim: int
    """q/k dim per head as the kernel sees it (MLA absorbed: kv_lora_rank + rope)."""
    v_head_dim: int
    kv_lora_rank: int
    rope_dim: int
    index_heads: int
    index_head_dim: int
    index_topk: int
    window: int
    kv_dtype: str


@dataclasses.dataclass(frozen=True)
class KvcastKey(_Key):
    """Write one layer's new cache entries: `width` values per token (layout gqa|mla|dsa_index) at kv_dtype."""

    PROBE: ClassVar[str] = "kvcast"
    layout: str
    tokens: int
    width: int
    context: int
    kv_dtype: str


@dataclasses.dataclass(frozen=True)
class NormKey(_Key):
    """One elementwise op over [tokens×width]: rmsnorm, add_rmsnorm, layernorm, silu_mul, rotary, embedding."""

    PROBE: ClassVar[str] = "norms"
    op: str
    tokens: int
    width: int
    dtype: str


@dataclasses.dataclass(frozen=True)
class SamplingKey(_Key):
    """lm_head on a vocab shard ([tokens×hidden]·[hidden×vocab_shard] at dtype) + sampling."""

    PROBE: ClassVar[str] = "sampling"
    tokens: int
    vocab_shard: int
    hidden: int
    dtype: str


@dataclasses.dataclass(frozen=True)
class AllreduceKey(_Key):
    """One collective of exactly `bytes` bytes per rank over `ranks` GPUs (all_reduce or all_gather)."""

    PROBE: ClassVar[str] = "allreduce"
    collective: str
    bytes: int
    ranks: int
    dtype: str


@dataclasses.dataclass(frozen=True)
class LaunchKey(_Key):
    """Per-kernel launch cost in `mode` (eager|graph); `kernels` is the per-step count the chain should have."""

    PROBE: ClassVar[str] = "launch"
    mode: str
    kernels: int


ProbeKey = Union[  # noqa: UP007 - a runtime alias, Python 3.10
    GemmKey, MoeKey, RoutingKey, AttentionKey, KvcastKey, NormKey, SamplingKey, AllreduceKey, LaunchKey
]
KEY_TYPES: dict[str, type[_Key]] = {
    cls.PROBE: cls
    for cls in (GemmKey, MoeKey, RoutingKey, AttentionKey, KvcastKey, NormKey, SamplingKey, AllreduceKey, LaunchKey)
}
"""Probe name → key class."""
PROBES: tuple[str, ...] = tuple(KEY_TYPES)


def parse_key_id(key_id: str) -> _Key:
    """The key a `key_id` string stands for (inverse of `key_id`)."""
    probe, sep, rest = key_id.partition(":")
    if not sep or probe not in KEY_TYPES:
        raise MeasurementKeyError(f"not a measurement key id: {key_id!r}")
    params: dict[str, object] = {}
    for part in rest.split(",") if rest else []:
        name, eq, value = part.partition("=")
        if not eq:
            raise MeasurementKeyError(f"not a measurement key id: {key_id!r}")
        params[name] = value
    return KEY_TYPES[probe].from_params(params)
