"""Provides Mixtral: grouped-query attention, routed experts in every layer (`block_sparse_moe`), no dense MLP and
no shared expert."""

from __future__ import annotations

from decodetop.budget.components import Component
from decodetop.budget.config_reader import MAX_EXPERTS, ConfigReader
from decodetop.budget.families.base import AddModule, ExpertDims, Family, FfnShape


def read_every_layer_moe(r: ConfigReader, n_layers: int, *, expert_bias: bool = False) -> FfnShape:
    """Experts in every layer, no dense MLP, no shared expert (Mixtral, gpt-oss)."""
    return FfnShape(
        # docs/reference/models.md §0.3: the *expert* FFN width in these two families
        ffn_expert=r.int_("intermediate_size"),
        n_experts=r.int_("num_local_experts", hi=MAX_EXPERTS),
        top_k=r.int_("num_experts_per_tok", default=r.int_("experts_per_token", default=0, lo=0), lo=1),
        moe_layers=tuple(range(n_layers)),
        expert_bias=expert_bias,
    )


def add_block_sparse_moe(spec: ExpertDims, add: AddModule, i: int) -> None:
    """Mixtral's names: `block_sparse_moe.gate` and `experts.N.w1/w3/w2` (gate, up, down)."""
    d, ff, e = spec.d_model, spec.ffn_expert, spec.n_experts
    routed = Component.ROUTED_EXPERTS
    p = f"model.layers.{i}.block_sparse_moe."
    add(p + "gate", "router", Component.ROUTING, "router", i, d, e)
    add(p + "experts.0.w1", "expert_gate_proj", routed, "linear", i, d, ff, e)
    add(p + "experts.0.w3", "expert_up_proj", routed, "linear", i, d, ff, e)
    add(p + "experts.0.w2", "expert_down_proj", routed, "linear", i, ff, d, e)


FAMILIES = (Family(("mixtral",), read_ffn=read_every_layer_moe, add_experts=add_block_sparse_moe),)
