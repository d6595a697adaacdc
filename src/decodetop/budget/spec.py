"""Provides `ModelSpec`: a model's architecture in canonical fields, read from an HF `config.json` (+ quantization
config) or a built-in preset, and the list of its weight modules with their storage format.

Field names differ by family (docs/reference/models.md §4): the reader dispatches on `model_type` (also inside
`text_config` of multimodal wrappers), treats MLA as "`kv_lora_rank` present" and DSA as "`index_topk` present", and
never uses `head_dim` when `qk_nope_head_dim` is present. Every value is checked: a missing key, a wrong type, a
negative or absurd size or an unknown family raises `ConfigError` naming the file and the key (exit code 2 in the CLI).

Parameter counts follow docs/reference/models.md §3: weights only, norms ignored, biases counted where the family has
them. `params_total` excludes the MTP layer(s) (as the published totals do); `params_active` is what one decode token
reads: attention, dense MLPs, top_k + shared experts, routers and lm_head, but not the input embedding (a row lookup).
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from decodetop import jsonio
from decodetop.budget.components import Component
from decodetop.budget.quant import (
    DTYPE_NAMES,
    ConfigError,
    QuantScheme,
    WeightFormat,
    no_quantization,
    read_hf_quant_config,
    read_quantization_config,
)
from decodetop.errors import UserInputError

MAX_CONFIG_BYTES = 16 * 1024 * 1024
"""A config.json is a few KB; anything this large is not one (and is not read)."""

GQA_FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "phi3", "granite", "olmo2")
"""Dense decoder families read by their standard keys (hidden_size, intermediate_size, num_key_value_heads...)."""
DEEPSEEK_FAMILIES = ("deepseek_v2", "deepseek_v3", "kimi_k2", "deepseek_v32", "glm_moe_dsa")
MOE_FAMILIES = ("mixtral", "qwen3_moe", "gpt_oss", "glm4_moe")
SUPPORTED_MODEL_TYPES = GQA_FAMILIES + MOE_FAMILIES + DEEPSEEK_FAMILIES

# Plausibility bounds: larger values are typos or garbage, not models (the largest published configs are far below).
_MAX_LAYERS = 4096
_MAX_WIDTH = 1 << 20
_MAX_VOCAB = 1 << 24
_MAX_HEADS = 1 << 14
_MAX_EXPERTS = 1 << 16


@dataclass(frozen=True)
class WeightModule:
    """One weight matrix (or a stack of identical ones: `copies` experts) and how it is stored."""

    name: str
    """Module name as in the checkpoint (experts: expert 0 stands for the stack), e.g. `model.layers.3.mlp.gate`."""
    kind: str
    """What it is, stable across families: q_a_proj, q_b_proj, kv_a_proj, kv_b_proj, q_proj, k_proj, v_proj,
    o_proj, indexer_wq_b, indexer_wk, indexer_weights_proj, gate_proj, up_proj, down_proj, router, expert_gate_proj,
    expert_up_proj, expert_down_proj, shared_gate_proj, shared_up_proj, shared_down_proj, eh_proj, embedding,
    lm_head."""
    component: Component
    role: str
    """"linear", "router", "embedding" or "lm_head" (decides whether a quantized format applies)."""
    layer: int
    """Decoder layer index (MTP layers follow the main ones); -1 for the embedding and lm_head."""
    in_features: int
    out_features: int
    copies: int
    bias: bool
    fmt: WeightFormat
    bits_per_weight: float

    @property
    def params(self) -> int:
        """Parameters of all copies, biases included."""
        return self.copies * (self.in_features * self.out_features + (self.out_features if self.bias else 0))

    def bytes_for(self, copies: float, out_fraction: float = 1.0, in_fraction: float = 1.0) -> float:
        """Stored bytes of `copies` copies, each cut to a fraction of its rows/columns (a TP shard)."""
        weights = self.in_features * in_fraction * self.out_features * out_fraction
        bias = self.out_features * out_fraction * 2 if self.bias else 0.0  # biases stay BF16
        return copies * (weights * self.bits_per_weight / 8 + bias)

    @property
    def bytes(self) -> float:
        """Stored bytes of all copies."""
        return self.bytes_for(self.copies)


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only LLM's architecture in canonical fields (docs/reference/models.md §4), plus its quantization."""

    name: str
    model_type: str
    source: str
    """Where it came from: `preset glm-5-nvfp4 (...)` or the config file's path."""
    n_layers: int
    n_mtp_layers: int
    d_model: int
    vocab_size: int
    tie_word_embeddings: bool
    n_heads: int
    n_kv_heads: int
    """KV heads of a GQA cache; 1 for MLA (one latent per token per layer)."""
    head_dim: int
    """Query/key head dim (MLA: qk_nope + qk_rope; never GLM-5's `head_dim` field, which is the rope slice)."""
    v_head_dim: int
    attention_kind: str
    """"gqa" or "mla"."""
    q_lora_rank: int
    """0 when queries are projected directly (no q_a/q_b)."""
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    rotary_dim: int
    """Dims rotary embedding applies to per head."""
    index_topk: int
    """DSA indexer: keys each query attends to (0: no indexer)."""
    index_n_heads: int
    index_head_dim: int
    sliding_window: int
    """Window of the sliding-attention layers (0: none)."""
    sliding_layers: tuple[int, ...]
    attention_bias: bool
    """q/k/v projections carry biases (GLM-4.5, Qwen2, gpt-oss)."""
    o_bias: bool
    qk_norm: bool
    ffn_dense: int
    ffn_expert: int
    n_experts: int
    top_k: int
    n_shared_experts: int
    moe_layers: tuple[int, ...]
    expert_bias: bool
    scoring_func: str
    """"softmax" or "sigmoid"."""
    n_group: int
    topk_group: int
    quant: QuantScheme

    # --- derived ------------------------------------------------------------------------------------------

    @property
    def is_moe(self) -> bool:
        """Whether any layer routes to experts."""
        return bool(self.moe_layers)

    @property
    def dense_layers(self) -> tuple[int, ...]:
        """Layers with a dense MLP."""
        moe = set(self.moe_layers)
        return tuple(i for i in range(self.n_layers) if i not in moe)

    @property
    def kv_cache_dims(self) -> int:
        """Values cached per token per layer (MLA: kv_lora_rank + qk_rope; GQA: 2 × kv heads × head_dim)."""
        if self.attention_kind == "mla":
            return self.kv_lora_rank + self.qk_rope_head_dim
        return 2 * self.n_kv_heads * self.head_dim

    @functools.cached_property
    def modules(self) -> tuple[WeightModule, ...]:
        """Every weight module of the main model (embedding, layers, lm_head), MTP layers excluded."""
        return _build_modules(self, list(range(self.n_layers)), model_level=True)

    @functools.cached_property
    def mtp_modules(self) -> tuple[WeightModule, ...]:
        """The modules of the MTP (next-token prediction) layers only."""
        return _build_modules(self, list(range(self.n_layers, self.n_layers + self.n_mtp_layers)), model_level=False)

    @property
    def params_total(self) -> int:
        """All parameters (tied embeddings counted once), MTP layers excluded."""
        return sum(m.params for m in self.modules)

    @property
    def params_embedding(self) -> int:
        """The input embedding (0 when tied to lm_head: then lm_head holds it)."""
        return sum(m.params for m in self.modules if m.kind == "embedding")

    @property
    def params_lm_head(self) -> int:
        """lm_head (the tied embedding matrix when tied)."""
        return self.vocab_size * self.d_model

    @property
    def params_active(self) -> int:
        """Parameters one decode token reads: all but the input embedding and the routed experts not chosen."""
        total = 0
        for m in self.modules:
            if m.kind == "embedding":
                continue
            if m.kind.startswith("expert_"):
                total += m.params // m.copies * self.top_k
            else:
                total += m.params
        return total

    def active_weight_bytes(self) -> float:
        """Bytes of weights one token reads at batch 1 on a single GPU (docs/reference/models.md §5's per-token
        table)."""
        total = 0.0
        for m in self.modules:
            if m.kind == "embedding":
                continue
            copies = self.top_k if m.kind.startswith("expert_") else m.copies
            total += m.bytes_for(copies)
        return total


# --- reading config.json -------------------------------------------------------------------------------------

_MISSING = object()


class _Reader:
    """Typed, bounded access to a config dict; every failure is a ConfigError naming file and key."""

    def __init__(self, cfg: Mapping[str, Any], file: str, prefix: str = "") -> None:
        self.cfg = cfg
        self.file = file
        self.prefix = prefix

    def error(self, key: str, problem: str) -> ConfigError:
        return ConfigError(self.file, self.prefix + key, problem)

    def has(self, key: str) -> bool:
        return self.cfg.get(key) is not None

    def int_(self, key: str, default: object = _MISSING, lo: int = 1, hi: int = _MAX_WIDTH) -> int:
        value = self.cfg.get(key)
        if value is None:
            if default is _MISSING:
                raise self.error(key, "missing (required for this model_type)")
            assert isinstance(default, int)
            return default
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self.error(key, f"expected an integer, got {type(value).__name__} {_short(value)}")
        if isinstance(value, float):
            if not math.isfinite(value) or value != int(value):
                raise self.error(key, f"expected an integer, got {_short(value)}")
            value = int(value)
        if not lo <= value <= hi:
            raise self.error(key, f"{value} is out of range ({lo}..{hi})")
        return int(value)

    def float_(self, key: str, default: float, lo: float, hi: float) -> float:
        value = self.cfg.get(key)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise self.error(key, f"expected a number, got {_short(value)}")
        if not lo <= value <= hi:
            raise self.error(key, f"{value} is out of range ({lo}..{hi})")
        return float(value)

    def bool_(self, key: str, default: bool) -> bool:
        value = self.cfg.get(key)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise self.error(key, f"expected true or false, got {_short(value)}")
        return value

    def str_(self, key: str, default: str, allowed: tuple[str, ...]) -> str:
        value = self.cfg.get(key)
        if value is None:
            return default
        if not isinstance(value, str) or value not in allowed:
            raise self.error(key, f"expected one of {', '.join(allowed)}, got {_short(value)}")
        return value

    def int_list(self, key: str, hi: int) -> tuple[int, ...]:
        value = self.cfg.get(key)
        if value is None:
            return ()
        if not isinstance(value, list) or not all(
            isinstance(v, int) and not isinstance(v, bool) and 0 <= v < hi for v in value
        ):
            raise self.error(key, f"expected a list of layer indices below {hi}")
        return tuple(value)


def _short(value: object) -> str:
    text = json.dumps(value) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _base_format(r: _Reader) -> WeightFormat:
    for key in ("torch_dtype", "dtype"):
        value = r.cfg.get(key)
        if value is None:
            continue
        if not isinstance(value, str) or value not in DTYPE_NAMES:
            raise r.error(key, f"unknown dtype {_short(value)} (known: {', '.join(DTYPE_NAMES)})")
        return DTYPE_NAMES[value]
    return WeightFormat.BF16  # docs/reference/models.md §4: gpt-oss has no dtype key; its non-expert weights are BF16


def _text_config(config: Mapping[str, Any], file: str) -> tuple[Mapping[str, Any], str]:
    """The dict holding the language model's keys, and its key prefix for messages."""
    model_type = config.get("model_type")
    inner = config.get("text_config")
    if isinstance(inner, dict) and (model_type not in SUPPORTED_MODEL_TYPES or "num_hidden_layers" not in config):
        return inner, "text_config."
    if inner is not None and not isinstance(inner, dict):
        raise ConfigError(file, "text_config", "expected a JSON object")
    return config, ""


def spec_from_config(
    config: object,
    *,
    file: str = "config.json",
    hf_quant_config: object | None = None,
    hf_quant_file: str = "hf_quant_config.json",
    name: str | None = None,
    source: str | None = None,
) -> ModelSpec:
    """Build a ModelSpec from a parsed config.json (and a parsed hf_quant_config.json, if the checkpoint has one)."""
    if not isinstance(config, dict):
        raise ConfigError(file, "", f"expected a JSON object at the top level, got {type(config).__name__}")
    cfg, prefix = _text_config(config, file)
    r = _Reader(cfg, file, prefix)
    model_type = _model_type(r)
    base = _base_format(r)
    quant = _read_quant(config, cfg=cfg, file=file, hf_quant=hf_quant_config, hf_quant_file=hf_quant_file, base=base)

    n_layers = r.int_("num_hidden_layers", hi=_MAX_LAYERS)
    d_model = r.int_("hidden_size")
    vocab = r.int_("vocab_size", hi=_MAX_VOCAB)
    n_heads = r.int_("num_attention_heads", hi=_MAX_HEADS)
    n_kv = r.int_("num_key_value_heads", default=n_heads, hi=_MAX_HEADS)
    tie = r.bool_("tie_word_embeddings", False)
    n_mtp = r.int_("num_nextn_predict_layers", default=0, lo=0, hi=16)
    attn = _read_attention(r, model_type, d_model, n_heads, n_kv)
    default_bias = model_type in ("qwen2", "gpt_oss")  # Qwen2 always has q/k/v biases; gpt-oss has every bias
    attention_bias = r.bool_("attention_bias", default_bias) or model_type == "qwen2"
    o_bias = attention_bias and model_type in ("llama", "gpt_oss", "mistral", "granite", "olmo2")
    qk_norm = model_type in ("qwen3", "qwen3_moe") or r.bool_("use_qk_norm", False)
    window, sliding = _read_sliding_window(r, model_type, n_layers)
    ffn = _read_ffn(r, model_type, n_layers)

    spec = ModelSpec(
        name=name or str(cfg.get("_name_or_path") or model_type),
        model_type=model_type,
        source=source or file,
        n_layers=n_layers,
        n_mtp_layers=n_mtp,
        d_model=d_model,
        vocab_size=vocab,
        tie_word_embeddings=tie,
        n_heads=n_heads,
        n_kv_heads=attn.n_kv_heads,
        head_dim=attn.head_dim,
        v_head_dim=attn.v_head_dim,
        attention_kind=attn.kind,
        q_lora_rank=attn.q_lora_rank,
        kv_lora_rank=attn.kv_lora_rank,
        qk_nope_head_dim=attn.qk_nope_head_dim,
        qk_rope_head_dim=attn.qk_rope_head_dim,
        rotary_dim=attn.rotary_dim,
        index_topk=attn.index_topk,
        index_n_heads=attn.index_n_heads,
        index_head_dim=attn.index_head_dim,
        sliding_window=window,
        sliding_layers=sliding,
        attention_bias=attention_bias,
        o_bias=o_bias,
        qk_norm=qk_norm,
        ffn_dense=ffn.ffn_dense,
        ffn_expert=ffn.ffn_expert,
        n_experts=ffn.n_experts,
        top_k=ffn.top_k,
        n_shared_experts=ffn.n_shared_experts,
        moe_layers=ffn.moe_layers,
        expert_bias=ffn.expert_bias,
        scoring_func=ffn.scoring_func,
        n_group=ffn.n_group,
        topk_group=ffn.topk_group,
        quant=quant,
    )
    if spec.params_total > 10**15:
        raise ConfigError(file, prefix + "hidden_size", "the sizes add up to more than 10^15 parameters")
    return spec


def _model_type(r: _Reader) -> str:
    """The config's `model_type`, one of the families decodetop knows."""
    model_type = r.cfg.get("model_type")
    if model_type is None:
        raise r.error("model_type", "missing")
    if not isinstance(model_type, str) or model_type not in SUPPORTED_MODEL_TYPES:
        raise r.error(
            "model_type", f"{_short(model_type)} is not a family decodetop knows ({', '.join(SUPPORTED_MODEL_TYPES)})"
        )
    return model_type


@dataclass(frozen=True)
class _AttentionShape:
    """The attention fields of a ModelSpec, as one family's keys give them (zeros where the kind has none)."""

    kind: str
    head_dim: int
    v_head_dim: int
    n_kv_heads: int
    """KV heads in the cache: 1 latent head under MLA."""
    rotary_dim: int
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    index_topk: int = 0
    index_n_heads: int = 0
    index_head_dim: int = 0


def _read_attention(r: _Reader, model_type: str, d_model: int, n_heads: int, n_kv: int) -> _AttentionShape:
    """MLA where the family is DeepSeek's or `kv_lora_rank` is present, else grouped-query attention."""
    if model_type in DEEPSEEK_FAMILIES or r.has("kv_lora_rank"):
        return _read_mla(r)
    if n_kv > n_heads or n_heads % n_kv:
        raise r.error("num_key_value_heads", f"{n_kv} does not divide num_attention_heads {n_heads}")
    if r.has("head_dim"):
        head_dim = r.int_("head_dim", hi=8192)
    else:
        if d_model % n_heads:
            raise r.error("num_attention_heads", f"{n_heads} does not divide hidden_size {d_model}")
        head_dim = d_model // n_heads
    rotary = max(2, int(head_dim * r.float_("partial_rotary_factor", 1.0, 0.0, 1.0)))
    return _AttentionShape("gqa", head_dim, head_dim, n_kv, rotary)


def _read_mla(r: _Reader) -> _AttentionShape:
    """Multi-head latent attention's ranks and head widths, and DSA's indexer where `index_topk` is present."""
    kv_lora = r.int_("kv_lora_rank", hi=65536)
    q_lora = r.int_("q_lora_rank", default=0, lo=0, hi=65536)
    nope = r.int_("qk_nope_head_dim", hi=8192)
    rope = r.int_("qk_rope_head_dim", hi=8192)
    v_dim = r.int_("v_head_dim", hi=8192)
    index_topk = index_heads = index_dim = 0
    if r.has("index_topk"):
        index_topk = r.int_("index_topk", hi=1 << 24)
        index_heads = r.int_("index_n_heads", hi=_MAX_HEADS)
        index_dim = r.int_("index_head_dim", hi=8192)
    return _AttentionShape(
        kind="mla",
        head_dim=nope + rope,  # docs/reference/models.md §4 rule 4: never `head_dim` when qk_nope_head_dim is present
        v_head_dim=v_dim,
        n_kv_heads=1,
        rotary_dim=rope,
        q_lora_rank=q_lora,
        kv_lora_rank=kv_lora,
        qk_nope_head_dim=nope,
        qk_rope_head_dim=rope,
        index_topk=index_topk,
        index_n_heads=index_heads,
        index_head_dim=index_dim,
    )


def _read_sliding_window(r: _Reader, model_type: str, n_layers: int) -> tuple[int, tuple[int, ...]]:
    """The sliding window in tokens (0: none) and the layers that use it."""
    if model_type == "gpt_oss":
        window = r.int_("sliding_window", default=0, lo=0, hi=1 << 24)
        types = r.cfg.get("layer_types")
        if types is not None:
            if not isinstance(types, list) or len(types) != n_layers or not all(isinstance(t, str) for t in types):
                raise r.error("layer_types", f"expected {n_layers} layer type strings")
            return window, tuple(i for i, t in enumerate(types) if t == "sliding_attention")
        # gpt-oss alternates sliding and full attention (docs/reference/models.md §2)
        return window, (tuple(range(0, n_layers, 2)) if window else ())
    if model_type == "mistral" or (model_type in ("qwen2", "qwen3") and r.bool_("use_sliding_window", False)):
        window = r.int_("sliding_window", default=0, lo=0, hi=1 << 24)
        return window, (tuple(range(n_layers)) if window else ())
    return 0, ()


@dataclass(frozen=True)
class _FfnShape:
    """The MLP and MoE fields of a ModelSpec (zeros and defaults where the family has no experts)."""

    ffn_dense: int = 0
    ffn_expert: int = 0
    n_experts: int = 0
    top_k: int = 0
    n_shared_experts: int = 0
    moe_layers: tuple[int, ...] = ()
    expert_bias: bool = False
    scoring_func: str = "softmax"
    n_group: int = 1
    topk_group: int = 1


def _read_ffn(r: _Reader, model_type: str, n_layers: int) -> _FfnShape:
    """The dense MLP width and the experts, by family; top_k checked against the expert count."""
    if model_type in GQA_FAMILIES:
        ffn = _FfnShape(ffn_dense=r.int_("intermediate_size"))
    elif model_type in ("mixtral", "gpt_oss"):
        ffn = _read_every_layer_moe(r, model_type, n_layers)
    elif model_type == "qwen3_moe":
        ffn = _read_qwen3_moe(r, n_layers)
    else:  # deepseek families and glm4_moe
        ffn = _read_deepseek_moe(r, model_type, n_layers)
    if ffn.n_experts and ffn.top_k > ffn.n_experts:
        raise r.error("num_experts_per_tok", f"{ffn.top_k} is more than the {ffn.n_experts} experts")
    if ffn.n_experts and ffn.top_k < 1:
        raise r.error("num_experts_per_tok", "missing or zero for a model with routed experts")
    return ffn


def _read_every_layer_moe(r: _Reader, model_type: str, n_layers: int) -> _FfnShape:
    """Mixtral and gpt-oss: experts in every layer, no dense MLP, no shared expert."""
    return _FfnShape(
        # docs/reference/models.md §0.3: the *expert* FFN width in these two families
        ffn_expert=r.int_("intermediate_size"),
        n_experts=r.int_("num_local_experts", hi=_MAX_EXPERTS),
        top_k=r.int_("num_experts_per_tok", default=r.int_("experts_per_token", default=0, lo=0), lo=1),
        moe_layers=tuple(range(n_layers)),
        expert_bias=model_type == "gpt_oss",
    )


def _read_qwen3_moe(r: _Reader, n_layers: int) -> _FfnShape:
    """Qwen3-MoE: experts every `decoder_sparse_step` layers except `mlp_only_layers`, which are dense."""
    ffn_expert = r.int_("moe_intermediate_size")
    n_experts = r.int_("num_experts", default=0, lo=0, hi=_MAX_EXPERTS)
    mlp_only = set(r.int_list("mlp_only_layers", n_layers))
    step = r.int_("decoder_sparse_step", default=1, hi=_MAX_LAYERS)
    top_k = 0
    moe_layers: tuple[int, ...] = ()
    if n_experts:
        top_k = r.int_("num_experts_per_tok")
        moe_layers = tuple(i for i in range(n_layers) if i not in mlp_only and (i + 1) % step == 0)
    ffn_dense = r.int_("intermediate_size") if len(moe_layers) < n_layers else 0
    return _FfnShape(ffn_dense, ffn_expert, n_experts, top_k, moe_layers=moe_layers)


def _read_deepseek_moe(r: _Reader, model_type: str, n_layers: int) -> _FfnShape:
    """DeepSeek families and GLM-4.5 MoE: dense first layers, then routed + shared experts with group routing."""
    n_experts = r.int_(
        "n_routed_experts",
        default=r.int_("num_local_experts", default=r.int_("num_experts", default=0, lo=0), lo=0),
        lo=0,
        hi=_MAX_EXPERTS,
    )
    if not n_experts:  # a dense model of this family: every layer is a dense MLP
        return _FfnShape(ffn_dense=r.int_("intermediate_size"))
    top_k = r.int_("num_experts_per_tok")
    ffn_expert = r.int_("moe_intermediate_size")
    n_shared = r.int_("n_shared_experts", default=0, lo=0, hi=64)
    moe_layers = _deepseek_moe_layers(r, n_layers)
    scoring = r.str_("scoring_func", "sigmoid" if model_type != "deepseek_v2" else "softmax", ("softmax", "sigmoid"))
    n_group = r.int_("n_group", default=1, hi=_MAX_EXPERTS)
    topk_group = r.int_("topk_group", default=1, hi=n_group)
    if n_experts % n_group:
        raise r.error("n_group", f"{n_group} does not divide the {n_experts} routed experts")
    ffn_dense = r.int_("intermediate_size") if len(moe_layers) < n_layers else 0
    return _FfnShape(ffn_dense, ffn_expert, n_experts, top_k, n_shared, moe_layers, False, scoring, n_group, topk_group)


def _deepseek_moe_layers(r: _Reader, n_layers: int) -> tuple[int, ...]:
    """The MoE layers: every `moe_layer_freq`-th after `first_k_dense_replace`, or as `mlp_layer_types` lists them."""
    first_dense = r.int_("first_k_dense_replace", default=0, lo=0, hi=n_layers)
    freq = r.int_("moe_layer_freq", default=1, hi=_MAX_LAYERS)
    moe_layers = tuple(i for i in range(first_dense, n_layers) if i % freq == 0)
    types = r.cfg.get("mlp_layer_types")
    if types is not None:  # transformers >= 5 may write the list instead (docs/reference/models.md §4)
        if not isinstance(types, list) or len(types) != n_layers or not all(isinstance(t, str) for t in types):
            raise r.error("mlp_layer_types", f"expected {n_layers} layer type strings")
        moe_layers = tuple(i for i, t in enumerate(types) if t != "dense")
    return moe_layers


def _read_quant(
    top: Mapping[str, Any],
    *,
    cfg: Mapping[str, Any],
    file: str,
    hf_quant: object | None,
    hf_quant_file: str,
    base: WeightFormat,
) -> QuantScheme:
    """config.json's quantization_config wins; else hf_quant_config.json; else none (docs/reference/models.md §5: look
    in both)."""
    qc = top.get("quantization_config", cfg.get("quantization_config"))
    if qc is not None:
        scheme = read_quantization_config(qc, file, base)
        if hf_quant is not None and scheme.kv_cache_dtype is None:
            legacy = read_hf_quant_config(hf_quant, hf_quant_file, base)
            return QuantScheme(
                scheme.method,
                scheme.source,
                scheme.base_format,
                scheme.weight_format,
                scheme.weight_bits,
                scheme.exclusions,
                scheme.quantize_lm_head,
                legacy.kv_cache_dtype,
            )
        return scheme
    if hf_quant is not None:
        return read_hf_quant_config(hf_quant, hf_quant_file, base)
    return no_quantization(base)


# --- module list ---------------------------------------------------------------------------------------------


class _AddModule(Protocol):
    """Appends one row to the module table being built (its format and bits from the checkpoint's quantization)."""

    def __call__(  # noqa: PLR0917 - one row of the module table
        self,
        name: str,
        kind: str,
        comp: Component,
        role: str,
        layer: int,
        n_in: int,
        n_out: int,
        copies: int = 1,
        bias: bool = False,
    ) -> None: ...


def _build_modules(spec: ModelSpec, layers: list[int], model_level: bool) -> tuple[WeightModule, ...]:
    """The modules of `layers` (MTP layers follow the main ones), plus embedding and lm_head if `model_level`."""
    out: list[WeightModule] = []
    quant = spec.quant

    def add(  # noqa: PLR0917 - one row of the module table
        name: str,
        kind: str,
        comp: Component,
        role: str,
        layer: int,
        n_in: int,
        n_out: int,
        copies: int = 1,
        bias: bool = False,
    ) -> None:
        fmt = quant.format_for(name, role)
        out.append(WeightModule(name, kind, comp, role, layer, n_in, n_out, copies, bias, fmt, quant.bits_for(fmt)))

    d = spec.d_model
    if model_level and not spec.tie_word_embeddings:
        add("model.embed_tokens", "embedding", Component.LM_HEAD, "embedding", -1, spec.vocab_size, d)
    moe = set(spec.moe_layers)
    for i in layers:
        mtp = i >= spec.n_layers
        if mtp:
            add(f"model.layers.{i}.eh_proj", "eh_proj", Component.ATTENTION_PROJ, "linear", i, 2 * d, d)
        if spec.attention_kind == "mla":
            _add_mla(spec, add, i)
        else:
            _add_gqa(spec, add, i)
        if i in moe or (mtp and spec.is_moe):
            _add_moe(spec, add, i)
        else:
            m = f"model.layers.{i}.mlp."
            dense = Component.DENSE_MLP
            add(m + "gate_proj", "gate_proj", dense, "linear", i, d, spec.ffn_dense)
            add(m + "up_proj", "up_proj", dense, "linear", i, d, spec.ffn_dense)
            add(m + "down_proj", "down_proj", dense, "linear", i, spec.ffn_dense, d)
    if model_level:  # a tied lm_head is the embedding matrix: counted here once, read as lm_head
        add("lm_head", "lm_head", Component.LM_HEAD, "lm_head", -1, d, spec.vocab_size)
    return tuple(out)


def _add_mla(spec: ModelSpec, add: _AddModule, i: int) -> None:
    """Layer `i`'s MLA projections (q through a LoRA rank where the model has one), and DSA's indexer."""
    a = f"model.layers.{i}.self_attn."
    attn = Component.ATTENTION_PROJ
    d, h = spec.d_model, spec.n_heads
    if spec.q_lora_rank:
        add(a + "q_a_proj", "q_a_proj", attn, "linear", i, d, spec.q_lora_rank)
        add(a + "q_b_proj", "q_b_proj", attn, "linear", i, spec.q_lora_rank, h * spec.head_dim)
    else:
        add(a + "q_proj", "q_proj", attn, "linear", i, d, h * spec.head_dim)
    add(a + "kv_a_proj_with_mqa", "kv_a_proj", attn, "linear", i, d, spec.kv_lora_rank + spec.qk_rope_head_dim)
    add(
        a + "kv_b_proj",
        "kv_b_proj",
        attn,
        "linear",
        i,
        spec.kv_lora_rank,
        h * (spec.qk_nope_head_dim + spec.v_head_dim),
    )
    add(a + "o_proj", "o_proj", attn, "linear", i, h * spec.v_head_dim, d)
    if spec.index_topk:
        # DeepSeek-V3.2 indexer layout, assumed for GLM-5 (docs/reference/models.md §3, UNCONFIRMED there); GLM-5
        # names the weights projection `indexers_proj` (its FP8 modules_to_not_convert,
        # docs/reference/model_configs.json).
        q_in = spec.q_lora_rank or d
        add(a + "indexer.wq_b", "indexer_wq_b", attn, "linear", i, q_in, spec.index_n_heads * spec.index_head_dim)
        add(a + "indexer.wk", "indexer_wk", attn, "linear", i, d, spec.index_head_dim)
        wname = a + ("indexers_proj" if spec.model_type == "glm_moe_dsa" else "indexer.weights_proj")
        add(wname, "indexer_weights_proj", attn, "linear", i, d, spec.index_n_heads)


def _add_gqa(spec: ModelSpec, add: _AddModule, i: int) -> None:
    """Layer `i`'s grouped-query attention projections, with the family's biases."""
    a = f"model.layers.{i}.self_attn."
    attn = Component.ATTENTION_PROJ
    d, hd, b = spec.d_model, spec.head_dim, spec.attention_bias
    add(a + "q_proj", "q_proj", attn, "linear", i, d, spec.n_heads * hd, bias=b)
    add(a + "k_proj", "k_proj", attn, "linear", i, d, spec.n_kv_heads * hd, bias=b)
    add(a + "v_proj", "v_proj", attn, "linear", i, d, spec.n_kv_heads * hd, bias=b)
    add(a + "o_proj", "o_proj", attn, "linear", i, spec.n_heads * hd, d, bias=spec.o_bias)


def _add_moe(spec: ModelSpec, add: _AddModule, i: int) -> None:
    d, ff, e = spec.d_model, spec.ffn_expert, spec.n_experts
    routed, shared, routing = Component.ROUTED_EXPERTS, Component.SHARED_EXPERTS, Component.ROUTING
    mt = spec.model_type
    if mt == "mixtral":
        p = f"model.layers.{i}.block_sparse_moe."
        add(p + "gate", "router", routing, "router", i, d, e)
        add(p + "experts.0.w1", "expert_gate_proj", routed, "linear", i, d, ff, e)
        add(p + "experts.0.w3", "expert_up_proj", routed, "linear", i, d, ff, e)
        add(p + "experts.0.w2", "expert_down_proj", routed, "linear", i, ff, d, e)
        return
    p = f"model.layers.{i}.mlp."
    if mt == "gpt_oss":
        add(p + "router", "router", routing, "router", i, d, e, bias=True)
        # gate and up are one fused tensor `experts.gate_up_proj` in gpt-oss; split here in two halves of the
        # same name so every family has the same kinds.
        add(p + "experts.gate_up_proj", "expert_gate_proj", routed, "linear", i, d, ff, e, bias=True)
        add(p + "experts.gate_up_proj", "expert_up_proj", routed, "linear", i, d, ff, e, bias=True)
        add(p + "experts.down_proj", "expert_down_proj", routed, "linear", i, ff, d, e, bias=True)
        return
    add(p + "gate", "router", routing, "router", i, d, e)
    add(p + "experts.0.gate_proj", "expert_gate_proj", routed, "linear", i, d, ff, e)
    add(p + "experts.0.up_proj", "expert_up_proj", routed, "linear", i, d, ff, e)
    add(p + "experts.0.down_proj", "expert_down_proj", routed, "linear", i, ff, d, e)
    if spec.n_shared_experts:
        width = spec.n_shared_experts * ff
        add(p + "shared_experts.gate_proj", "shared_gate_proj", shared, "linear", i, d, width)
        add(p + "shared_experts.up_proj", "shared_up_proj", shared, "linear", i, d, width)
        add(p + "shared_experts.down_proj", "shared_down_proj", shared, "linear", i, width, d)


# --- files and presets ---------------------------------------------------------------------------------------


def _read_json(path: Path) -> object:
    try:
        raw = jsonio.read_bounded(path, max_bytes=MAX_CONFIG_BYTES)  # a FIFO or /dev/zero is refused unread
    except UserInputError as exc:
        raise ConfigError(str(path), "", str(exc).removeprefix(f"{path}: ")) from None
    try:
        return jsonio.loads(raw, source=str(path))
    except json.JSONDecodeError as exc:
        raise ConfigError(str(path), "", f"not valid JSON (line {exc.lineno} column {exc.colno}: {exc.msg})") from None
    except jsonio.JsonInputError as exc:  # nesting, huge numbers, NaN, not UTF-8
        raise ConfigError(str(path), "", exc.problem) from None


def load_config(path: str | Path, name: str | None = None) -> ModelSpec:
    """Read a local checkpoint's config: a directory holding config.json, or the config.json file itself.

    A `hf_quant_config.json` beside it is read too. Weight files are never opened.
    """
    p = Path(path).expanduser()
    if p.is_dir():
        config_path = p / "config.json"
        if not config_path.is_file():
            raise ConfigError(str(p), "", "no config.json in this directory")
    elif p.exists():
        config_path = p
    else:
        raise ConfigError(str(p), "", "no such file or directory")
    config = _read_json(config_path)
    quant_path = config_path.parent / "hf_quant_config.json"
    hf_quant = _read_json(quant_path) if quant_path.is_file() else None
    default_name = config_path.parent.name if config_path.name == "config.json" else config_path.stem
    return spec_from_config(
        config,
        file=str(config_path),
        hf_quant_config=hf_quant,
        hf_quant_file=str(quant_path),
        name=name or default_name or None,
        source=str(config_path),
    )


PRESET_DIR = Path(__file__).resolve().parent / "presets"


def preset_names() -> tuple[str, ...]:
    """The built-in presets, sorted."""
    return tuple(sorted(p.stem for p in PRESET_DIR.glob("*.json")))


@functools.lru_cache(maxsize=64)
def load_preset(name: str) -> ModelSpec:
    """A built-in preset by name (`glm-5-nvfp4`); its data file holds the real config.json it came from."""
    key = name.strip().lower()
    path = PRESET_DIR / f"{key}.json"
    if not key or "/" in key or not path.is_file():
        raise ConfigError("--model", "", f"unknown preset {name!r} (known: {', '.join(preset_names())})")
    data = _read_json(path)
    if not isinstance(data, dict):
        raise ConfigError(str(path), "", "expected a JSON object")
    return spec_from_config(
        data.get("config"),
        file=f"preset {key}",
        hf_quant_config=data.get("hf_quant_config"),
        hf_quant_file=f"preset {key} hf_quant_config",
        name=str(data.get("display_name") or key),
        source=f"preset {key} ({data.get('hf_repo', '?')})",
    )


def preset_info(name: str) -> Mapping[str, Any]:
    """The preset file's metadata (hf_repo, sources, notes), without the config."""
    data = _read_json(PRESET_DIR / f"{name}.json")
    assert isinstance(data, dict)
    return {k: v for k, v in data.items() if k not in ("config", "hf_quant_config")}
