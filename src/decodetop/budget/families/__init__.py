"""Provides the model-family registry: `model_type` → the `Family` that knows it, as vLLM maps an architecture
name to its model module. Adding a family is one module here (its readers and expert layout) and one line below."""

from __future__ import annotations

from collections.abc import Mapping

from decodetop.budget.families import deepseek, dense, gpt_oss, mixtral, qwen3_moe
from decodetop.budget.families.base import Family

_ALL: tuple[Family, ...] = (
    *dense.FAMILIES,
    *mixtral.FAMILIES,
    *qwen3_moe.FAMILIES,
    *gpt_oss.FAMILIES,
    *deepseek.FAMILIES,
)


def _registry(families: tuple[Family, ...]) -> Mapping[str, Family]:
    """`model_type` → family; a `model_type` claimed twice is a programming error."""
    out: dict[str, Family] = {}
    for family in families:
        for model_type in family.model_types:
            if model_type in out:
                raise ValueError(f"model_type {model_type!r} is claimed by two families")
            out[model_type] = family
    return out


FAMILIES: Mapping[str, Family] = _registry(_ALL)
"""Every `model_type` decodetop reads → its family, in the order messages list them."""
