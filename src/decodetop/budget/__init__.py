"""Provides model specs, the decode-step inventory, the roofline and budget composition (stdlib only).

Data flow (docs/architecture.md): `scenario.build_scenario` (`spec.load_preset` / `spec.load_config` → `ModelSpec`,
`deployment.Deployment`) → `inventory.build_inventory` → `StepInventory` → `plan.build_plan` → `ProbePlan` (the keys
the probes measure) → `compose.compose_budget` (measured times per key id + curves) → `Budget`;
`roofline.roofline(inventory, roofline.hardware_for(gpu))` → `Roofline`; `diff.diff_budgets(baseline, current)` →
`BudgetDiff` (which component moved beyond its noise); `ranks` (per-rank totals and the straggler);
`engine_paths` (the all-reduce a serving engine runs). Import the submodule that holds a name.
"""
