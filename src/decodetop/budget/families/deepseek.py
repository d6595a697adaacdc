"""Provides the DeepSeek-style MoE families: GLM-4.5 (grouped-query attention) and DeepSeek-V2/V3/V3.2, Kimi K2 and
GLM-5 (multi-head latent attention, V3.2 and GLM-5 with DSA's indexer): dense first layers, then routed + shared
experts with group routing."""

from __future__ import annotations

import functools

from decodetop.budget.config_reader import MAX_EXPERTS, MAX_LAYERS, ConfigReader
from decodetop.budget.families.base import Family, FfnShape


def read_deepseek_moe(r: ConfigReader, n_layers: int, *, scoring_default: str = "sigmoid") -> FfnShape:
    """Dense first layers, then routed + shared experts with group routing (a dense model where none are routed)."""
    n_experts = r.int_(
        "n_routed_experts",
        default=r.int_("num_local_experts", default=r.int_("num_experts", default=0, lo=0), lo=0),
        lo=0,
        hi=MAX_EXPERTS,
    )
    if not n_experts:  # a dense model of this family: every layer is a dense MLP
        return FfnShape(ffn_dense=r.int_("intermediate_size"))
    top_k = r.int_("num_experts_per_tok")
    ffn_expert = r.int_("moe_intermediate_size")
    n_shared = r.int_("n_shared_experts", default=0, lo=0, hi=64)
    moe_layers = _moe_layers(r, n_layers)
    scoring = r.str_("scoring_func", scoring_default, ("softmax", "sigmoid"))
    n_group = r.int_("n_group", default=1, hi=MAX_EXPERTS)
    topk_group = r.int_("topk_group", default=1, hi=n_group)
    if n_experts % n_group:
        raise r.error("n_group", f"{n_group} does not divide the {n_experts} routed experts")
    ffn_dense = r.int_("intermediate_size") if len(moe_layers) < n_layers else 0
    return FfnShape(ffn_dense, ffn_expert, n_experts, top_k, n_shared, moe_layers, False, scoring, n_group, topk_group)


def _moe_layers(r: ConfigReader, n_layers: int) -> tuple[int, ...]:
    """The MoE layers: every `moe_layer_freq`-th after `first_k_dense_replace`, or as `mlp_layer_types` lists them."""
    first_dense = r.int_("first_k_dense_replace", default=0, lo=0, hi=n_layers)
    freq = r.int_("moe_layer_freq", default=1, hi=MAX_LAYERS)
    moe_layers = tuple(i for i in range(first_dense, n_layers) if i % freq == 0)
    types = r.layer_types("mlp_layer_types", n_layers)
    if types is not None:  # transformers >= 5 may write the list instead (docs/reference/models.md §4)
        moe_layers = tuple(i for i, t in enumerate(types) if t != "dense")
    return moe_layers


FAMILIES = (
    Family(("glm4_moe",), read_ffn=read_deepseek_moe),
    # DeepSeek-V2 scores its router by softmax; V3 onwards by sigmoid (their configs' `scoring_func`)
    Family(("deepseek_v2",), read_ffn=functools.partial(read_deepseek_moe, scoring_default="softmax"), mla=True),
    Family(("deepseek_v3", "kimi_k2", "deepseek_v32"), read_ffn=read_deepseek_moe, mla=True),
    # GLM-5 names the DSA weights projection `indexers_proj` (its FP8 modules_to_not_convert,
    # docs/reference/model_configs.json)
    Family(("glm_moe_dsa",), read_ffn=read_deepseek_moe, mla=True, indexer_weights_name="indexers_proj"),
)
