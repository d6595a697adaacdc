"""The stock model the fidelity reference's fused forms are checked against in the CPU tests: a tiny `preset` of
`layers` layers (fp32, random weights, fixed seeds) from the fidelity proof's reduced config, and a 4-token prompt."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks" / "fidelity"))


def tiny_stock_model(preset: str, layers: int) -> tuple[Any, Any]:
    """(model, prompt ids): the tiny stock model in eval mode and a 4-token prompt of its vocabulary."""
    import torch
    from transformers import AutoModelForCausalLM

    fidelity: Any = importlib.import_module("fidelity")
    cfg = fidelity.reduced_config(preset, layers, fidelity.model_overrides(preset, tiny=True))
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(fidelity._hf_config(cfg), dtype=torch.float32).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.05)
    ids = torch.randint(0, int(cfg["vocab_size"]), (1, 4), generator=torch.Generator().manual_seed(1))
    return model, ids
