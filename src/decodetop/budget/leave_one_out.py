"""Provides the curve engine's self-check on this host's own curves (docs/benchmarks.md, "How the leave-one-out
figure is defined"): each measured point removed and predicted from the rest of its curve (inside the grid, or per
octave at its edges) and each measured shape removed and predicted from the other shapes of its kind (transfer);
made once per (probe, hardware, best efficiency, the family's points) and kept for every engine over the same
family. The statistics and the σ they give are `decodetop.budget.selfcheck`'s. Stdlib only."""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Protocol

from decodetop.budget.curve_points import CurvePoint, ShapeCurve, Tree, build_tree, match_of, merged
from decodetop.budget.curve_rules import Eval, Limits
from decodetop.budget.keys import ProbeKey
from decodetop.budget.roofline import Hardware
from decodetop.budget.selfcheck import FamilyCheck, LaunchSplit, family_check


class CurveEngine(Protocol):
    """What the self-check asks of the curve engine (`decodetop.budget.curves.CurveEngine`, which calls it: a
    protocol here keeps the import one way)."""

    hardware: Hardware

    @property
    def best_efficiency(self) -> float: ...

    def curves_of(self, probe: str) -> list[ShapeCurve]: ...

    def transfer_group(self, curve: ShapeCurve) -> list[ShapeCurve]: ...

    def limits_of(self, match: tuple[object, ...]) -> Limits: ...

    def evaluate(self, curve: ShapeCurve, tree: Tree, coords: tuple[int, ...], limits: Limits) -> Eval: ...

    def transfer_evaluate(
        self, key: ProbeKey, coords: tuple[int, ...], group: Sequence[ShapeCurve], limits: Limits
    ) -> tuple[Eval, ShapeCurve]: ...


_FAMILY_CHECKS: OrderedDict[tuple[object, ...], FamilyCheck] = OrderedDict()
"""Leave-one-out checks of families already made, by (probe, hardware, best efficiency, the family's points and
their launches): the check is a function of those alone (its floors come from the family's points and the best
efficiency, its launch regimes from the points' launches)."""
_FAMILY_CHECKS_LOCK = threading.Lock()
_FAMILY_CHECKS_KEPT = 64
"""Families kept: a what-if screen's engines of one results file hold about ten families each."""
_TRANSFER_CASES = 240
"""Most leave-one-shape-out cases per family (a deterministic subsample keeps the self-check quick)."""


def family_check_once(engine: CurveEngine, probe: str) -> FamilyCheck:
    """`probe`'s leave-one-out check on `engine`'s curves, kept by what it depends on (`_FAMILY_CHECKS`): a what-if's
    TP change builds a new engine where only the all-reduce family's points differ."""
    points = tuple(
        sorted(
            (p.key.key_id, p.variant, p.median_ms, p.p10_ms, p.p90_ms, repr(p.launch))
            for c in engine.curves_of(probe)
            for _coords, p in c.members
        )
    )
    key = (probe, engine.hardware, engine.best_efficiency, points)
    with _FAMILY_CHECKS_LOCK:
        found = _FAMILY_CHECKS.get(key)
        if found is not None:
            _FAMILY_CHECKS.move_to_end(key)
            return found
    check = _family_check(engine, probe)
    with _FAMILY_CHECKS_LOCK:
        _FAMILY_CHECKS[key] = check
        while len(_FAMILY_CHECKS) > _FAMILY_CHECKS_KEPT:
            _FAMILY_CHECKS.popitem(last=False)
    return check


def _family_check(engine: CurveEngine, probe: str) -> FamilyCheck:
    """Each point of each curve of `probe` predicted from the rest of its curve; the interior ones told apart by
    their kernel's launch regimes where the curve's launch is known (`Eval.across`)."""
    curves = engine.curves_of(probe)
    interior: list[float] = []
    per_octave: list[float] = []
    within: list[float] = []
    across: list[float] = []
    for c in curves:
        limits = engine.limits_of(match_of(probe, c.identity))
        for i, (coords, p) in enumerate(c.members):
            rest = [m for j, m in enumerate(c.members) if j != i]
            if not rest:
                continue
            tree = build_tree(list(merged(rest).items()), 0, len(c.family.axes))
            ev = engine.evaluate(c, tree, coords, limits)
            err = math.log(ev.ms / p.median_ms)
            if ev.rank <= 1 and ev.octaves < 0.05:  # rank 0: another key of the same work
                interior.append(err)
                if c.regime_of is not None:
                    (across if ev.across else within).append(err)
            elif ev.octaves >= 0.5:
                per_octave.append(abs(err) / ev.octaves)
    transfer = _transfer_check(engine, probe, curves)
    gqa = [c for c in curves if c.is_gqa]
    launch = LaunchSplit(within, across, sum(c.regime_of is None for c in gqa)) if gqa else None
    points = sum(len(c.members) for c in curves)
    return family_check(probe, points, len(curves), interior, per_octave, transfer, launch)


def _transfer_check(engine: CurveEngine, probe: str, curves: Sequence[ShapeCurve]) -> list[float]:
    """Each curve left out and its points predicted from the other shapes of its group."""
    cases: list[tuple[ShapeCurve, list[ShapeCurve], tuple[int, ...], CurvePoint]] = []
    for c in curves:
        others = [o for o in engine.transfer_group(c) if o is not c]
        cases.extend((c, others, coords, p) for coords, p in c.members if others)
    step = max(1, math.ceil(len(cases) / _TRANSFER_CASES))
    errs = []
    for c, others, coords, p in cases[::step]:
        ev, _ = engine.transfer_evaluate(p.key, coords, others, engine.limits_of(match_of(probe, c.identity)))
        errs.append(math.log(ev.ms / p.median_ms))
    return errs
