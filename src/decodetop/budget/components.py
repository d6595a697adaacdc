"""Provides the components a decode step's time is split into, shared by the budget, the probes, traces and the UI."""

from __future__ import annotations

import enum


class Component(str, enum.Enum):
    """One segment of the per-token budget. The value is the stable key used in JSON, metrics and themes."""

    ATTENTION = "attention"
    ATTENTION_PROJ = "attention_proj"
    DENSE_MLP = "dense_mlp"
    ROUTED_EXPERTS = "routed_experts"
    SHARED_EXPERTS = "shared_experts"
    ROUTING = "routing"
    COMMUNICATION = "communication"
    NORMS = "norms"
    LM_HEAD = "lm_head"
    LAUNCH = "launch"

    @property
    def label(self) -> str:
        """Human title for tables and legends."""
        return _TITLES[self]


_TITLES: dict[Component, str] = {
    Component.ATTENTION: "attention",
    Component.ATTENTION_PROJ: "attention projections",
    Component.DENSE_MLP: "dense MLP",
    Component.ROUTED_EXPERTS: "routed experts",
    Component.SHARED_EXPERTS: "shared experts",
    Component.ROUTING: "routing",
    Component.COMMUNICATION: "all-reduce / all-to-all",
    Component.NORMS: "norms & elementwise",
    Component.LM_HEAD: "lm_head & sampling",
    Component.LAUNCH: "kernel launch overhead",
}

UNEXPLAINED_KEY = "unexplained"
"""The key of the remainder segment: observed step time minus the sum of the components."""
