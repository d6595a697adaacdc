"""Provides the defaults every surface shares, said once: the observed step a budget assumes where nothing was
observed, the target throughput and the model shown when none is named (stdlib only, imports nothing).

The deployment's own defaults (TP from the probe group, EP 1, batch 1, context 4096, graph launches, the checkpoint's
KV dtype, the `auto` all-reduce) are the fields of `decodetop.budget.deployment.Deployment`.
"""

from __future__ import annotations

DEFAULT_OBSERVED_MS = 95.0
"""The observed step time decodetop was built to explain (docs/reference/probes.md §0: 10.4 tok/s on GLM-5-NVFP4 at
TP 8 = 95 ms/step). A budget that uses it says so: it is assumed, not observed."""
DEFAULT_TARGET_TPS = 309.0
"""The target throughput of the seed deployment (docs/architecture.md: 309 tok/s = 3.24 ms per token)."""
DEFAULT_MODEL = "glm-5-nvfp4"
"""docs/reference/probes.md §0: the seed computation is GLM-5-NVFP4 at TP 8 (a `decodetop.budget` preset): what
`decodetop budget`, `decodetop trace --model` and the live UI show where no model is named."""
