"""Provides the noise floors a change of a budget figure must clear to count: the baseline diff's significance rule
(`decodetop.budget.diff`) and the straggler rule (`decodetop.budget.ranks`) share them (stdlib only)."""

from __future__ import annotations

NOISE_FLOOR_MS = 0.01
"""Absolute floor of the noise, ms per step. The two H200 plan runs of Llama-3.1-70B TP 2 (benchmarks/results/
plans/plan_llama-3.1-70b-tp2-h200x{1,2}.json, nothing changed in between) moved lm_head by +0.0077 ms (just beyond its
0.0073 ms spread) and the zero-spread launch line by +0.0055 ms: both under 0.01 ms."""
RELATIVE_FLOOR = 0.03
"""Relative floor of the noise, a fraction of the baseline's ms. The same two runs moved narrow-spread components by
up to 2.9 % (lm_head +2.9 %, norms −2.5 %, attention projections +0.6 %)."""
