"""Provides `Family`: what decodetop knows of one model family, as one record — how its config.json's keys give the
attention, the MLP and experts, the sliding window and the biases, and how its checkpoint names its expert weights —
with the readers and the expert layout most families share (docs/reference/models.md §4)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from decodetop.budget.components import Component
from decodetop.budget.config_reader import MAX_HEADS, ConfigReader


@dataclass(frozen=True)
class AttentionShape:
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


@dataclass(frozen=True)
class FfnShape:
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


class AddModule(Protocol):
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


class ExpertDims(Protocol):
    """The sizes an expert layout needs (a ModelSpec has them)."""

    @property
    def d_model(self) -> int: ...
    @property
    def ffn_expert(self) -> int: ...
    @property
    def n_experts(self) -> int: ...
    @property
    def n_shared_experts(self) -> int: ...


FfnReader = Callable[[ConfigReader, int], FfnShape]
"""(config, n_layers) → the family's MLP and experts."""
SlidingReader = Callable[[ConfigReader, int], tuple[int, tuple[int, ...]]]
"""(config, n_layers) → the sliding window in tokens (0: none) and the layers that use it."""
ExpertLayout = Callable[[ExpertDims, AddModule, int], None]
"""(sizes, add, layer) → adds layer's router, routed and shared expert weights under the checkpoint's names."""


def no_sliding_window(r: ConfigReader, n_layers: int) -> tuple[int, tuple[int, ...]]:
    """Full attention in every layer."""
    return 0, ()


def read_dense_ffn(r: ConfigReader, n_layers: int) -> FfnShape:
    """A dense MLP of `intermediate_size` in every layer."""
    return FfnShape(ffn_dense=r.int_("intermediate_size"))


def add_gate_and_experts(spec: ExpertDims, add: AddModule, i: int) -> None:
    """The layout most MoE checkpoints share: `mlp.gate`, `mlp.experts.N.{gate,up,down}_proj`, `mlp.shared_experts`."""
    d, ff, e = spec.d_model, spec.ffn_expert, spec.n_experts
    routed, shared = Component.ROUTED_EXPERTS, Component.SHARED_EXPERTS
    p = f"model.layers.{i}.mlp."
    add(p + "gate", "router", Component.ROUTING, "router", i, d, e)
    add(p + "experts.0.gate_proj", "expert_gate_proj", routed, "linear", i, d, ff, e)
    add(p + "experts.0.up_proj", "expert_up_proj", routed, "linear", i, d, ff, e)
    add(p + "experts.0.down_proj", "expert_down_proj", routed, "linear", i, ff, d, e)
    if spec.n_shared_experts:
        width = spec.n_shared_experts * ff
        add(p + "shared_experts.gate_proj", "shared_gate_proj", shared, "linear", i, d, width)
        add(p + "shared_experts.up_proj", "shared_up_proj", shared, "linear", i, d, width)
        add(p + "shared_experts.down_proj", "shared_down_proj", shared, "linear", i, width, d)


@dataclass(frozen=True)
class Family:
    """One model family: the `model_type`s it answers to and how their configs and checkpoints read."""

    model_types: tuple[str, ...]
    read_ffn: FfnReader = read_dense_ffn
    mla: bool = False
    """Multi-head latent attention always (DeepSeek's families); else MLA only where `kv_lora_rank` is present."""
    read_sliding_window: SlidingReader = no_sliding_window
    attention_bias_default: bool = False
    """q/k/v biases where the config has no `attention_bias` key."""
    attention_bias_always: bool = False
    """q/k/v biases whatever `attention_bias` says (Qwen2 has them in every checkpoint)."""
    o_bias_with_attention_bias: bool = False
    """o_proj carries a bias too where q/k/v do."""
    qk_norm_always: bool = False
    """Per-head RMSNorm on q and k whatever `use_qk_norm` says."""
    add_experts: ExpertLayout = add_gate_and_experts
    indexer_weights_name: str = "indexer.weights_proj"
    """DSA indexer's weights projection under `self_attn.` (the DeepSeek-V3.2 name)."""


def read_attention(r: ConfigReader, family: Family, d_model: int, n_heads: int, n_kv: int) -> AttentionShape:
    """MLA where the family is DeepSeek's or `kv_lora_rank` is present, else grouped-query attention."""
    if family.mla or r.has("kv_lora_rank"):
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
    return AttentionShape("gqa", head_dim, head_dim, n_kv, rotary)


def _read_mla(r: ConfigReader) -> AttentionShape:
    """Multi-head latent attention's ranks and head widths, and DSA's indexer where `index_topk` is present."""
    kv_lora = r.int_("kv_lora_rank", hi=65536)
    q_lora = r.int_("q_lora_rank", default=0, lo=0, hi=65536)
    nope = r.int_("qk_nope_head_dim", hi=8192)
    rope = r.int_("qk_rope_head_dim", hi=8192)
    v_dim = r.int_("v_head_dim", hi=8192)
    index_topk = index_heads = index_dim = 0
    if r.has("index_topk"):
        index_topk = r.int_("index_topk", hi=1 << 24)
        index_heads = r.int_("index_n_heads", hi=MAX_HEADS)
        index_dim = r.int_("index_head_dim", hi=8192)
    return AttentionShape(
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


def read_ffn(r: ConfigReader, family: Family, n_layers: int) -> FfnShape:
    """The family's MLP and experts, top_k checked against the expert count."""
    ffn = family.read_ffn(r, n_layers)
    if ffn.n_experts and ffn.top_k > ffn.n_experts:
        raise r.error("num_experts_per_tok", f"{ffn.top_k} is more than the {ffn.n_experts} experts")
    if ffn.n_experts and ffn.top_k < 1:
        raise r.error("num_experts_per_tok", "missing or zero for a model with routed experts")
    return ffn
