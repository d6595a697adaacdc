"""Provides the dense decoder families (Llama, Mistral, Qwen2/3, Phi-3, Granite, OLMo 2): grouped-query attention
and one dense MLP per layer, read by their standard keys (hidden_size, intermediate_size, num_key_value_heads...)."""

from __future__ import annotations

from decodetop.budget.config_reader import ConfigReader
from decodetop.budget.families.base import Family


def window_on_every_layer(r: ConfigReader, n_layers: int) -> tuple[int, tuple[int, ...]]:
    """Mistral: `sliding_window` (where set) on every layer."""
    window = r.int_("sliding_window", default=0, lo=0, hi=1 << 24)
    return window, (tuple(range(n_layers)) if window else ())


def window_if_used(r: ConfigReader, n_layers: int) -> tuple[int, tuple[int, ...]]:
    """Qwen2/3: `sliding_window` on every layer only where `use_sliding_window` is true."""
    if not r.bool_("use_sliding_window", False):
        return 0, ()
    return window_on_every_layer(r, n_layers)


FAMILIES = (
    Family(("llama",), o_bias_with_attention_bias=True),
    Family(("mistral",), read_sliding_window=window_on_every_layer, o_bias_with_attention_bias=True),
    Family(("qwen2",), read_sliding_window=window_if_used, attention_bias_default=True, attention_bias_always=True),
    Family(("qwen3",), read_sliding_window=window_if_used, qk_norm_always=True),
    Family(("phi3",)),
    Family(("granite",), o_bias_with_attention_bias=True),
    Family(("olmo2",), o_bias_with_attention_bias=True),
)
