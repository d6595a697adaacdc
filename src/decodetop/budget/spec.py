"""Provides `ModelSpec`: a model's architecture in canonical fields, read from an HF `config.json` (+ quantization
config) or a built-in preset, and the list of its weight modules with their storage format.

Field names differ by family (docs/reference/models.md §4): the reader finds the config's `model_type` (also
inside `text_config` of multimodal wrappers) in the family registry (`budget/families/`, one module per family),
treats MLA as "`kv_lora_rank` present" and DSA as "`index_topk` present", and never uses `head_dim` when
`qk_nope_head_dim` is present. Every value is checked: a missing key, a wrong type, a negative or absurd size or an
unknown family raises `ConfigError` naming the file and the key (exit code 2 in the CLI).

Parameter counts follow docs/reference/models.md §3: weights only, norms ignored, biases counted where the family has
them. `params_total` excludes the MTP layer(s) (as the published totals do); `params_active` is what one decode token
reads: attention, dense MLPs, top_k + shared experts, routers and lm_head, but not the input embedding (a row lookup).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from decodetop import jsonio
from decodetop.budget.components import Component
from decodetop.budget.config_reader import MAX_HEADS, MAX_LAYERS, MAX_VOCAB, ConfigReader, short
from decodetop.budget.families import FAMILIES
from decodetop.budget.families.base import AddModule, Family, read_attention, read_ffn
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


def _base_format(r: ConfigReader) -> WeightFormat:
    for key in ("torch_dtype", "dtype"):
        value = r.cfg.get(key)
        if value is None:
            continue
        if not isinstance(value, str) or value not in DTYPE_NAMES:
            raise r.error(key, f"unknown dtype {short(value)} (known: {', '.join(DTYPE_NAMES)})")
        return DTYPE_NAMES[value]
    return WeightFormat.BF16  # docs/reference/models.md §4: gpt-oss has no dtype key; its non-expert weights are BF16


def _text_config(config: Mapping[str, Any], file: str) -> tuple[Mapping[str, Any], str]:
    """The dict holding the language model's keys, and its key prefix for messages."""
    model_type = config.get("model_type")
    inner = config.get("text_config")
    if isinstance(inner, dict) and (model_type not in FAMILIES or "num_hidden_layers" not in config):
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
    r = ConfigReader(cfg, file, prefix)
    model_type, family = _family(r)
    base = _base_format(r)
    quant = _read_quant(config, cfg=cfg, file=file, hf_quant=hf_quant_config, hf_quant_file=hf_quant_file, base=base)

    n_layers = r.int_("num_hidden_layers", hi=MAX_LAYERS)
    d_model = r.int_("hidden_size")
    vocab = r.int_("vocab_size", hi=MAX_VOCAB)
    n_heads = r.int_("num_attention_heads", hi=MAX_HEADS)
    n_kv = r.int_("num_key_value_heads", default=n_heads, hi=MAX_HEADS)
    tie = r.bool_("tie_word_embeddings", False)
    n_mtp = r.int_("num_nextn_predict_layers", default=0, lo=0, hi=16)
    attn = read_attention(r, family, d_model, n_heads, n_kv)
    attention_bias = r.bool_("attention_bias", family.attention_bias_default) or family.attention_bias_always
    o_bias = attention_bias and family.o_bias_with_attention_bias
    qk_norm = family.qk_norm_always or r.bool_("use_qk_norm", False)
    window, sliding = family.read_sliding_window(r, n_layers)
    ffn = read_ffn(r, family, n_layers)

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


def _family(r: ConfigReader) -> tuple[str, Family]:
    """The config's `model_type`, one of the families decodetop knows, and that family."""
    model_type = r.cfg.get("model_type")
    if model_type is None:
        raise r.error("model_type", "missing")
    if not isinstance(model_type, str) or model_type not in FAMILIES:
        raise r.error("model_type", f"{short(model_type)} is not a family decodetop knows ({', '.join(FAMILIES)})")
    return model_type, FAMILIES[model_type]


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


def _build_modules(spec: ModelSpec, layers: list[int], model_level: bool) -> tuple[WeightModule, ...]:
    """The modules of `layers` (MTP layers follow the main ones), plus embedding and lm_head if `model_level`."""
    out: list[WeightModule] = []
    quant = spec.quant
    family = FAMILIES[spec.model_type]

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
            family.add_experts(spec, add, i)
        else:
            m = f"model.layers.{i}.mlp."
            dense = Component.DENSE_MLP
            add(m + "gate_proj", "gate_proj", dense, "linear", i, d, spec.ffn_dense)
            add(m + "up_proj", "up_proj", dense, "linear", i, d, spec.ffn_dense)
            add(m + "down_proj", "down_proj", dense, "linear", i, spec.ffn_dense, d)
    if model_level:  # a tied lm_head is the embedding matrix: counted here once, read as lm_head
        add("lm_head", "lm_head", Component.LM_HEAD, "lm_head", -1, d, spec.vocab_size)
    return tuple(out)


def _add_mla(spec: ModelSpec, add: AddModule, i: int) -> None:
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
        wname = a + FAMILIES[spec.model_type].indexer_weights_name
        add(wname, "indexer_weights_proj", attn, "linear", i, d, spec.index_n_heads)


def _add_gqa(spec: ModelSpec, add: AddModule, i: int) -> None:
    """Layer `i`'s grouped-query attention projections, with the family's biases."""
    a = f"model.layers.{i}.self_attn."
    attn = Component.ATTENTION_PROJ
    d, hd, b = spec.d_model, spec.head_dim, spec.attention_bias
    add(a + "q_proj", "q_proj", attn, "linear", i, d, spec.n_heads * hd, bias=b)
    add(a + "k_proj", "k_proj", attn, "linear", i, d, spec.n_kv_heads * hd, bias=b)
    add(a + "v_proj", "v_proj", attn, "linear", i, d, spec.n_kv_heads * hd, bias=b)
    add(a + "o_proj", "o_proj", attn, "linear", i, spec.n_heads * hd, d, bias=spec.o_bias)


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
