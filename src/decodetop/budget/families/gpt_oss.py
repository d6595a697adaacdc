"""Provides gpt-oss: every bias present, routed experts in every layer with a fused gate/up tensor, sliding and full
attention alternating (docs/reference/models.md §2)."""

from __future__ import annotations

import functools

from decodetop.budget.components import Component
from decodetop.budget.config_reader import ConfigReader
from decodetop.budget.families.base import AddModule, ExpertDims, Family
from decodetop.budget.families.mixtral import read_every_layer_moe


def alternating_window(r: ConfigReader, n_layers: int) -> tuple[int, tuple[int, ...]]:
    """The layers `layer_types` names sliding, else every other layer from the first (where a window is set)."""
    window = r.int_("sliding_window", default=0, lo=0, hi=1 << 24)
    types = r.layer_types("layer_types", n_layers)
    if types is not None:
        return window, tuple(i for i, t in enumerate(types) if t == "sliding_attention")
    # gpt-oss alternates sliding and full attention (docs/reference/models.md §2)
    return window, (tuple(range(0, n_layers, 2)) if window else ())


def add_fused_experts(spec: ExpertDims, add: AddModule, i: int) -> None:
    """gpt-oss's names: `mlp.router` and `experts.gate_up_proj` / `experts.down_proj`, every one with a bias."""
    d, ff, e = spec.d_model, spec.ffn_expert, spec.n_experts
    routed = Component.ROUTED_EXPERTS
    p = f"model.layers.{i}.mlp."
    add(p + "router", "router", Component.ROUTING, "router", i, d, e, bias=True)
    # gate and up are one fused tensor `experts.gate_up_proj` in gpt-oss; split here in two halves of the
    # same name so every family has the same kinds.
    add(p + "experts.gate_up_proj", "expert_gate_proj", routed, "linear", i, d, ff, e, bias=True)
    add(p + "experts.gate_up_proj", "expert_up_proj", routed, "linear", i, d, ff, e, bias=True)
    add(p + "experts.down_proj", "expert_down_proj", routed, "linear", i, ff, d, e, bias=True)


FAMILIES = (
    Family(
        ("gpt_oss",),
        read_ffn=functools.partial(read_every_layer_moe, expert_bias=True),
        read_sliding_window=alternating_window,
        attention_bias_default=True,
        o_bias_with_attention_bias=True,
        add_experts=add_fused_experts,
    ),
)
