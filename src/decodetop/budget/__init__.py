"""Provides model specs, the decode-step inventory, the roofline and budget composition (stdlib only).

Data flow (docs/architecture.md): `load_preset` / `load_config` → `ModelSpec` → `Deployment` → `build_inventory`
→ `StepInventory` → `build_plan` → `ProbePlan` (the keys the probes measure) → `compose_budget` (measured times
per key id + curves) → `Budget`; `roofline(inventory, hardware_for(gpu))` → `Roofline`;
`diff_budgets(baseline, current)` → `BudgetDiff` (which component moved beyond its noise).

The names below are importable from `decodetop.budget` directly; they load lazily, so importing this package (as
`decodetop.budget.components` users do) costs nothing.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS: dict[str, str] = {
    "ModelSpec": "spec",
    "WeightModule": "spec",
    "load_preset": "spec",
    "load_config": "spec",
    "preset_names": "spec",
    "preset_info": "spec",
    "spec_from_config": "spec",
    "ConfigError": "quant",
    "QuantScheme": "quant",
    "WeightFormat": "quant",
    "Deployment": "deployment",
    "Op": "inventory",
    "StepInventory": "inventory",
    "build_inventory": "inventory",
    "Hardware": "roofline",
    "Roofline": "roofline",
    "hardware_for": "roofline",
    "GPUS": "gpus",
    "find_gpu": "gpus",
    "ProbePlan": "plan",
    "GemmSweep": "plan",
    "build_plan": "plan",
    "MeasuredTime": "compose",
    "Curve": "compose",
    "Segment": "compose",
    "Budget": "compose",
    "compose_budget": "compose",
    "BudgetDiff": "diff",
    "ComponentDelta": "diff",
    "diff_budgets": "diff",
    "Component": "components",
    "parse_key_id": "keys",
}

__all__ = [
    "GPUS",
    "Budget",
    "BudgetDiff",
    "Component",
    "ComponentDelta",
    "ConfigError",
    "Curve",
    "Deployment",
    "GemmSweep",
    "Hardware",
    "MeasuredTime",
    "ModelSpec",
    "Op",
    "ProbePlan",
    "QuantScheme",
    "Roofline",
    "Segment",
    "StepInventory",
    "WeightFormat",
    "WeightModule",
    "build_inventory",
    "build_plan",
    "compose_budget",
    "diff_budgets",
    "find_gpu",
    "hardware_for",
    "load_config",
    "load_preset",
    "parse_key_id",
    "preset_info",
    "preset_names",
    "spec_from_config",
]
# `roofline` (the function) stays in `decodetop.budget.roofline`: the submodule of the same name would shadow it.


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'decodetop.budget' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"decodetop.budget.{module}"), name)
    globals()[name] = value
    return value
