"""Small model configs (config.json dicts) for tests that need a model of their own, e.g. a draft model."""

from __future__ import annotations


def small_llama() -> dict[str, object]:
    """A small Llama-shaped draft model's config.json (2 layers, hidden 2048, GQA 32/8)."""
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 2048,
        "intermediate_size": 8192,
        "num_hidden_layers": 2,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "vocab_size": 128256,
        "max_position_embeddings": 131072,
        "torch_dtype": "bfloat16",
        "tie_word_embeddings": False,
        "rope_theta": 500000.0,
    }
