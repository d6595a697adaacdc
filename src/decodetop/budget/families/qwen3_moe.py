"""Provides Qwen3-MoE: grouped-query attention with q/k norms, routed experts every `decoder_sparse_step` layers
except `mlp_only_layers` (dense), no shared expert."""

from __future__ import annotations

from decodetop.budget.config_reader import MAX_EXPERTS, MAX_LAYERS, ConfigReader
from decodetop.budget.families.base import Family, FfnShape


def read_qwen3_moe(r: ConfigReader, n_layers: int) -> FfnShape:
    """Experts every `decoder_sparse_step` layers except `mlp_only_layers`, which are dense."""
    ffn_expert = r.int_("moe_intermediate_size")
    n_experts = r.int_("num_experts", default=0, lo=0, hi=MAX_EXPERTS)
    mlp_only = set(r.int_list("mlp_only_layers", n_layers))
    step = r.int_("decoder_sparse_step", default=1, hi=MAX_LAYERS)
    top_k = 0
    moe_layers: tuple[int, ...] = ()
    if n_experts:
        top_k = r.int_("num_experts_per_tok")
        moe_layers = tuple(i for i in range(n_layers) if i not in mlp_only and (i + 1) % step == 0)
    ffn_dense = r.int_("intermediate_size") if len(moe_layers) < n_layers else 0
    return FfnShape(ffn_dense, ffn_expert, n_experts, top_k, moe_layers=moe_layers)


FAMILIES = (Family(("qwen3_moe",), read_ffn=read_qwen3_moe, qk_norm_always=True),)
