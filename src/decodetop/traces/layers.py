"""Provides `layer_pattern`: the run of kernels one decode step repeats once per decoder layer, and how many times.

A decoder layer launches the same kernels in the same order in every layer (norm, projections, attention, the MLP or
the experts, the residual adds), so a step's kernel sequence is a head (embedding), the layer pattern repeated once
per layer, and a tail (final norm, lm_head, sampling). The pattern's length is the period p at which the sequence
matches itself over the longest stretch; the layers are that stretch over p. A model whose first layers are dense
and the rest MoE repeats its majority kind; an engine that fuses the first layer's norm into the embedding makes the
first layer differ by a kernel, so the count can fall one short. Candidate periods are the distances between
consecutive launches of one kernel name (a kernel launched once per layer recurs every p kernels), so a step of
2,400 kernels costs a few dozen passes over it, not thousands.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

CANDIDATE_PERIODS = 12
"""The most frequent distances between repeats of one kernel name tried as the layer's length."""
MIN_COVERAGE = 0.5
"""The repeated stretch must hold at least this share of the step's kernels to count as the layers: below it the
repetition is a detail inside a layer (four GEMMs in a row), not the layers."""
MIN_LAYERS = 2
"""A pattern seen once is no pattern."""


@dataclass(frozen=True)
class LayerPattern:
    """The per-layer kernel pattern of one decode step."""

    kernels_per_layer: int
    layers: int
    """How many times the pattern repeats back to back."""
    step_kernels: int
    """The step's kernels, the pattern's repeats and the head and tail around them."""


def layer_pattern(kernels: Sequence[int]) -> LayerPattern | None:
    """The per-layer pattern of one step's kernel sequence (kernel name ids in launch order), or None where no
    pattern covers `MIN_COVERAGE` of the step (a one-layer model, or layers whose kernels vary with the routing)."""
    n = len(kernels)
    best: tuple[int, int] | None = None  # (kernels covered by whole repeats, period)
    for period in _candidate_periods(kernels):
        run = longest = 0
        for i in range(n - period):
            run = run + 1 if kernels[i] == kernels[i + period] else 0
            longest = max(longest, run)
        repeats = (longest + period) // period
        if repeats < MIN_LAYERS:
            continue
        covered = repeats * period
        if best is None or covered > best[0] or (covered == best[0] and period < best[1]):
            best = (covered, period)
    if best is None or best[0] < MIN_COVERAGE * n:
        return None
    covered, period = best
    return LayerPattern(kernels_per_layer=period, layers=covered // period, step_kernels=n)


def _candidate_periods(kernels: Sequence[int]) -> list[int]:
    """The distances between consecutive launches of one kernel name, most frequent first (at least 2 kernels, at
    most half the step)."""
    last: dict[int, int] = {}
    gaps: Counter[int] = Counter()
    for i, name in enumerate(kernels):
        if name in last:
            gaps[i - last[name]] += 1
        last[name] = i
    return [p for p, _ in gaps.most_common() if 2 <= p <= len(kernels) // 2][:CANDIDATE_PERIODS]
