"""Provides the curve engine: every figure of a scenario that was not measured exactly, predicted from the curves
measured on this host, each labelled with how it was obtained and given an 80 % range (docs/reference/whatif.md
§5: AIConfigurator's interpolation semantics, measured here rather than elsewhere).

Every sweep a probe measures is a curve: GEMM time over M (and the batch of a bmm) at each (n, k, dtype); attention
over heads × query length × batch × context at each KV dtype; routed experts over width × local experts × tokens ×
active experts; norms over width × tokens; lm_head over vocabulary shard × tokens; KV writes over width × tokens;
all-reduce over ranks × bytes at each implementation. `CurveEngine.predict(key)`:

1. exact: a point measured at that key → its median verbatim (status measured), its range the repeat spread.
2. inside the measured grid, axis by axis (shape-like axes first, sizes last), between the two bracketing values:
   linear in roofline terms (the work the roofline counts: linear in the size on most axes, with GEMMs' switch
   from memory- to compute-bound in it), held between the two bracketing times; the spread and octaves carried are
   weighted in log space on the axis (status interpolated). Interpolating the efficiency with log-space weights
   instead (AIConfigurator's blend) was tried: on this host's recorded H200 plans it doubled the p90 of the
   interior leave-one-out error of attention and gave no better GEMMs (docs/benchmarks.md, "Curves"). No curve is
   fitted or smoothed: measured wave-quantisation steps stay where they were measured. A GQA figure whose
   bracketing points run in another launch regime of its kernel than its own (`decodetop.budget.gqa_launch`: a
   step in time lies between them) is labelled "across a launch change", where the curve's points say their launch.
3. outside the grid: the edge's time plus the change of work at the marginal cost (the line through the two
   outermost points in roofline terms; with one point, the work at the best efficiency this host reached), bounded
   by the edge's efficiency held and rescaled by the query's roofline (AIConfigurator's rule, which scales the
   whole time: above the grid no slower per unit of work than at the edge, below it no faster) and by the edge's
   time; never below the latency floor of its kind, the fastest latency-bound kernel of that kind on this host.
   Status extrapolated, with the octaves it reached. (Holding the marginal cost instead of the whole efficiency
   halved this host's own leave-one-out error of extrapolated attention on the recorded H200 plans.)
4. a shape never measured: the efficiencies of the measured shapes of the same kind and dtype at the query's
   sizes, blended with log-space weights over their roofline time (work of a like size runs at a like efficiency;
   across shapes the efficiency blend is the robust one), bounded the same way beyond them (status transferred,
   naming the nearest shape). A dtype without any curve here (NVFP4 on a GPU without FP4 tensor cores) transfers
   from the next one down (FP8, then BF16) with a ±35 % band (docs/reference/whatif.md §5: AIConfigurator's
   nvfp4←fp8 transfer errs 22–33 %).
5. nothing to anchor it: a `Refusal` saying why and which command measures it. Never a silent spec-sheet figure.

The 80 % range of a prediction combines, in log space: the repeat spread of the points it rests on (p10–p90), this
host's own leave-one-out error of that curve family (within one launch regime or across a change, where those are
told apart), a penalty per extrapolated octave (fitted on this host's grid
edges), the family's leave-one-shape-out error for a transfer, the cross-dtype band (`SelfCheck`), and the drift
between runs (`RUN_TO_RUN_SIGMA`); an exact point keeps its repeat spread. The roofline used for efficiencies is
`decodetop.budget.keywork.roofline_ms`; it is never shown as a figure. Stdlib only.
"""

from __future__ import annotations

import bisect
import dataclasses
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from decodetop.budget.curve_points import (
    DTYPE_LADDER,
    FAMILIES,
    CurvePoint,
    Identity,
    ShapeCurve,
    Tree,
    build_tree,
    coords_of,
    floor_of,
    identity_of,
    key_at,
    launch_regimes,
    match_of,
    merged,
    nearest_id,
    same_but_ignored,
)
from decodetop.budget.curve_rules import Eval, Limits, between, beyond, blend_ms, label_of
from decodetop.budget.keys import ProbeKey
from decodetop.budget.keywork import roofline_ms
from decodetop.budget.leave_one_out import family_check_once
from decodetop.budget.roofline import Hardware, hardware_for
from decodetop.budget.selfcheck import Z80, FamilyCheck, SelfCheck, default_check

PREDICTION_STATUSES = ("measured", "interpolated", "extrapolated", "transferred")
"""How a predicted figure was obtained, best first."""
CROSS_DTYPE_SIGMA = math.log(1.35) / Z80
"""±35 % at 80 % for a figure carried from another dtype (docs/reference/whatif.md §5 targets: 'show ±35 %')."""
LATENCY_BOUND = 0.25
"""A point that reached less than a quarter of the best efficiency seen on this host is latency-bound: its time is
mostly the kernel's fixed cost, a floor for anything of its kind with less work."""
CROSS_GPU_SIGMA = math.log(1.5) / Z80
"""±50 % at 80 % for a figure carried to another GPU model from this host's curves: AIConfigurator's cross-profile
leave-one-out errs 24–58 % (docs/reference/whatif.md §2), BLIS 13–16 % on unseen GPUs."""
ACROSS_LAUNCH = ", across a launch change"
"""Said after the label of a figure interpolated between points of another launch regime of its kernel."""
RUN_TO_RUN_SIGMA = 0.03
"""What a figure not measured in this very run may drift by between runs on one GPU (clocks, placement): two H200
plans of the same shapes, hours apart, differed by 2–3 % median and 4–5 % p90 for GEMMs and attention
(benchmarks/results/plans/*-tp2-h200x1 against *-tp2-h200x2; docs/benchmarks.md, "Curves")."""


@dataclass(frozen=True)
class Prediction:
    """A figure for one key: its median, 80 % range, how it was obtained (`status`, `label`) and what it rests on."""

    key_id: str
    ms: float
    p10_ms: float
    p90_ms: float
    status: str
    """measured | interpolated | extrapolated | transferred."""
    label: str
    """'measured', 'interpolated', 'extrapolated 2 octaves', 'transferred from gemm:…, extrapolated 1 octave'."""
    octaves: float = 0.0
    sigma_log: float = 0.0
    """σ of the whole 80 % range in log space."""
    spread_sigma: float = 0.0
    """σ of the repeat spread alone (the points' p10–p90) in log space: the figure's noise band."""
    anchors: tuple[str, ...] = ()
    """The measured keys the figure rests on."""
    source: str = ""
    floor_held: bool = False
    """True where the family's latency floor set the figure."""
    cross_dtype: str = ""
    """The dtype the efficiency was carried from ('' unless transferred across dtypes)."""
    variant: str = ""


@dataclass(frozen=True)
class Refusal:
    """No figure: why, and the command that measures it."""

    key_id: str
    why: str
    command: str

    @property
    def text(self) -> str:
        """'<key id>: cannot predict: <why>, measure it with <command>'."""
        return f"{self.key_id}: cannot predict: {self.why}, measure it with {self.command}"


# --- the engine -------------------------------------------------------------------------------------------------


class CurveEngine:
    """Predictions from the curves measured on one host (see the module docstring for the rules).

    points: every measured point (`CurvePoint`); hardware: the roofline the efficiencies are taken against (the
    measured GPU's; on CPU ranks nominal rates, used for ratios only); measure_hint: the command a refusal names.
    The self-check (`self_check`) runs once, on the first prediction that needs it (or is given: an engine over a
    subset of the points, as a hold-out test builds, can take its parent's); `checked=False` skips it, the ranges
    then resting on the published defaults (a per-rank composition needs the figures, not their ranges).
    `exact_only` answers measured points only and refuses the rest (the roofline view of
    `decodetop.pipeline.context.UNMEASURED_ROOFLINE`). `target`: another GPU model to predict for from this host's
    curves (every figure transferred, `CROSS_GPU_SIGMA` wide)."""

    def __init__(
        self,
        points: Iterable[CurvePoint],
        hardware: Hardware,
        *,
        measure_hint: str = "",
        self_check: SelfCheck | None = None,
        exact_only: bool = False,
        checked: bool = True,
        target: Hardware | None = None,
    ) -> None:
        self.hardware = hardware
        self.exact_only = exact_only
        self.checked = checked
        self.target = target
        self.measure_hint = measure_hint
        self._exact: dict[tuple[str, str], CurvePoint] = {}
        self._curves: dict[tuple[str, Identity], ShapeCurve] = {}
        for p in points:
            if p.key.PROBE not in FAMILIES or not p.median_ms > 0:
                continue
            slot = (p.key.key_id, p.variant)
            prev = self._exact.get(slot)
            if prev is None or p.median_ms < prev.median_ms:
                self._exact[slot] = p
        for p in self._exact.values():
            ident = identity_of(p.key, p.variant)
            curve = self._curves.setdefault((p.key.PROBE, ident), ShapeCurve(p.key.PROBE, ident, p.key))
            curve.members.append((coords_of(p.key), p))
        self._groups: dict[tuple[object, ...], list[ShapeCurve]] = {}
        for curve in self._curves.values():
            curve.points = merged(curve.members)
            curve.tree = build_tree(list(curve.points.items()), 0, len(curve.family.axes))
            curve.regime_of, curve.work_of = launch_regimes(curve)
            self._groups.setdefault(match_of(curve.probe, curve.identity), []).append(curve)
        self._roofs: dict[ProbeKey, float] = {}
        self._roof_coords: dict[tuple[ProbeKey, tuple[int, ...]], float] = {}
        self._check: SelfCheck | None = self_check
        self._floors, self._floor_p10, self._best = self._bounds()

    def _bounds(self) -> tuple[dict[tuple[object, ...], float], dict[tuple[object, ...], float], float]:
        """Per kind, the latency floor (median and p10 of its fastest latency-bound point: efficiency below
        `LATENCY_BOUND` of the best this host reached), and that best efficiency (at most 1)."""
        effs = {id(p): self.roofline_ms(p.key) / p.median_ms for p in self._exact.values()}
        best = min(1.0, max(effs.values(), default=1.0))
        floors: dict[tuple[object, ...], float] = {}
        p10s: dict[tuple[object, ...], float] = {}
        for curve in self._curves.values():
            kind = floor_of(match_of(curve.probe, curve.identity))
            for _c, p in curve.members:
                if effs[id(p)] < LATENCY_BOUND * best and p.median_ms < floors.get(kind, math.inf):
                    floors[kind], p10s[kind] = p.median_ms, min(p.p10_ms, p.median_ms)
        return floors, p10s, best

    def _limits(self, match: tuple[object, ...]) -> Limits:
        return Limits(self._floors.get(floor_of(match), 0.0), self._best)

    @property
    def n_points(self) -> int:
        return len(self._exact)

    def probes(self) -> tuple[str, ...]:
        """The probes with at least one curve here."""
        return tuple(sorted({c.probe for c in self._curves.values()}))

    def roofline_ms(self, key: ProbeKey) -> float:
        """The roofline of one instance of `key` (cached)."""
        found = self._roofs.get(key)
        if found is None:
            found = self._roofs[key] = roofline_ms(key, self.hardware)
        return found

    # --- predicting -----------------------------------------------------------------------------------------

    def predict(self, key: ProbeKey, variant: str = "") -> Prediction | Refusal:
        """The figure of one instance of `key` (see the module docstring), or why there is none; on `target`
        hardware where one is set (`elsewhere`)."""
        got = self._predict_here(key, variant)
        if self.target is None or isinstance(got, Refusal):
            return got
        return self._elsewhere(key, got)

    def _elsewhere(self, key: ProbeKey, got: Prediction) -> Prediction | Refusal:
        """A figure of this host carried to another GPU model: the share of its time that is work (its efficiency
        over the best this host reached) rescaled by the two rooflines, the rest (latency) kept; labelled
        transferred, with `CROSS_GPU_SIGMA` added. The all-reduce does not carry (another interconnect)."""
        assert self.target is not None
        src, dst = self.hardware.gpu_name, self.target.gpu_name
        if key.PROBE == "allreduce":
            return self._refuse(key, f"all-reduce curves of {src} do not carry to {dst} (another interconnect)")
        here, there = self.roofline_ms(key), roofline_ms(key, self.target)
        work = min(1.0, here / got.ms / self._best) if got.ms > 0 else 1.0
        ms = got.ms * (1 - work) + got.ms * work * there / here
        sigma = math.sqrt(got.sigma_log**2 + CROSS_GPU_SIGMA**2)
        label = f"transferred from {src}: {got.label}"
        return dataclasses.replace(
            got, ms=ms, p10_ms=ms * math.exp(-Z80 * sigma), p90_ms=ms * math.exp(Z80 * sigma), status="transferred",
            label=label, sigma_log=sigma,
        )  # fmt: skip

    def _predict_here(self, key: ProbeKey, variant: str) -> Prediction | Refusal:
        """The figure of `key` on this host."""
        exact = self._exact.get((key.key_id, variant))
        if exact is not None:
            return Prediction(
                key.key_id, exact.median_ms, exact.p10_ms, exact.p90_ms, "measured", "measured",
                sigma_log=exact.sigma_log, spread_sigma=exact.sigma_log, anchors=(key.key_id,), source=exact.source,
                variant=variant,
            )  # fmt: skip
        if key.PROBE not in FAMILIES:
            return self._refuse(key, f"{key.PROBE} is measured per key, not on a curve ({key.key_id} was not)")
        if self.exact_only:
            return self._refuse(key, "exact points only (the roofline view): it was not measured at this key")
        ident = identity_of(key, variant)
        coords = coords_of(key)
        curve = self._curves.get((key.PROBE, ident))
        if curve is not None and curve.tree is not None:
            match = match_of(key.PROBE, ident)
            ev = self._eval(curve, curve.tree, 0, coords, (), self._limits(match))
            status = ("measured", "interpolated", "extrapolated")[ev.rank]
            if ev.rank == 0 and not same_but_ignored(key, ev.anchors):
                status = "interpolated"  # another shape of the same work (`coords_of`), not this key measured
            label = label_of(status, ev.octaves) + (ACROSS_LAUNCH if ev.across else "")
            return self._prediction(key, variant, ev, (status, label), curve, match)
        return self._transfer(key, variant, ident, coords)

    @property
    def points(self) -> tuple[CurvePoint, ...]:
        """Every point the engine holds (the fastest per key and variant)."""
        return tuple(self._exact.values())

    def _refuse(self, key: ProbeKey, why: str) -> Refusal:
        command = self.measure_hint or f"`decodetop probe {key.PROBE}` (or a model's plan: `decodetop probe --budget`)"
        return Refusal(key.key_id, why, command)

    def _prediction(  # noqa: PLR0917 - private; one figure's parts
        self,
        key: ProbeKey,
        variant: str,
        ev: Eval,
        how: tuple[str, str],
        curve: ShapeCurve,
        match: tuple[object, ...],
        cross: str = "",
    ) -> Prediction:
        """The figure with its 80 % range (never below the family's floor: the fastest point's p10)."""
        status, label = how
        sig = self._sigmas(key.PROBE)
        var = ev.sigma_rep**2 + (ev.octaves * sig.octave_sigma) ** 2
        if status != "measured":
            var += (sig.across_sigma if ev.across else sig.interior_sigma) ** 2 + RUN_TO_RUN_SIGMA**2
        if status == "transferred":
            var += sig.transfer_sigma**2
        if cross:
            var += CROSS_DTYPE_SIGMA**2
        sigma = math.sqrt(var)
        source = next(iter(curve.points.values())).source
        low = max(ev.ms * math.exp(-Z80 * sigma), min(ev.ms, self._floor_p10.get(floor_of(match), 0.0)))
        return Prediction(
            key.key_id, ev.ms, low, ev.ms * math.exp(Z80 * sigma), status, label,
            ev.octaves, sigma, ev.sigma_rep, ev.anchors, source, ev.floor_held, cross, variant,
        )  # fmt: skip

    def _roof_at(self, curve: ShapeCurve, coords: tuple[int, ...]) -> float:
        """The roofline of `curve`'s shape at `coords` (cached: the self-check asks for the same ones often)."""
        slot = (curve.template, coords)
        found = self._roof_coords.get(slot)
        if found is None:
            found = self._roof_coords[slot] = roofline_ms(key_at(curve.template, coords), self.hardware)
        return found

    def _eval(  # noqa: PLR0917 - private recursion state
        self, curve: ShapeCurve, node: Tree, level: int, q: tuple[int, ...], fixed: tuple[int, ...], floor: Limits
    ) -> Eval:
        """The figure at `q` on `curve` below `node` (axes before `level` fixed at `fixed`)."""
        if isinstance(node, CurvePoint):
            return Eval(node.median_ms, fixed, node.sigma_log, 0.0, 0, (node.key.key_id,))
        x, values = q[level], node.values
        i = bisect.bisect_left(values, x)
        if i < len(values) and values[i] == x:
            return self._eval(curve, node.children[i], level + 1, q, (*fixed, x), floor)
        target = (*fixed, x, *q[level + 1 :])
        if 0 < i < len(values):
            lo = self._eval(curve, node.children[i - 1], level + 1, q, (*fixed, values[i - 1]), floor)
            hi = self._eval(curve, node.children[i], level + 1, q, (*fixed, values[i]), floor)
            return self._blend(curve, level, lo, hi, target)
        near, second = (0, 1) if i == 0 else (len(values) - 1, len(values) - 2)
        a = self._eval(curve, node.children[near], level + 1, q, (*fixed, values[near]), floor)
        b = None
        if 0 <= second < len(values):
            b = self._eval(curve, node.children[second], level + 1, q, (*fixed, values[second]), floor)
        return self._extrapolate(curve, level, a, b, target, floor)

    def _blend(self, curve: ShapeCurve, level: int, a: Eval, b: Eval, target: tuple[int, ...]) -> Eval:
        """Between two bracketing figures along axis `level` (`between`): linear in roofline terms, or in the
        tiles the launch's time follows where the curve's points say a one-wave launch (`ShapeCurve.work_of`); the
        spread and octaves they carry are weighted by the target's position between them in log space on the axis.
        Where the curve's launch regimes are known and either figure stands in another regime than the target, the
        figure spans a step of the kernel's time (`Eval.across`): the same blend (no other rule predicted such
        points better on this host's curves: docs/benchmarks.md, "Leave-one-out across the GQA kernel's launch
        regimes"), its own error."""
        off = curve.family.offset(level)
        la, lb = math.log(a.coords[level] + off), math.log(b.coords[level] + off)
        u = (math.log(target[level] + off) - la) / (lb - la) if lb != la else 0.5
        work = curve.work_of
        if work is not None:  # the tiles the launch's time follows, where the points' launch tells them
            ms = between((work(a.coords), a.ms), (work(b.coords), b.ms), work(target))
        else:
            ra, rb = self._roof_at(curve, a.coords), self._roof_at(curve, b.coords)
            ms = between((ra, a.ms), (rb, b.ms), self._roof_at(curve, target))
        regime = curve.regime_of
        across = a.across or b.across
        if regime is not None and not across:
            across = not regime(a.coords) == regime(target) == regime(b.coords)
        return Eval(
            ms, target, (1 - u) * a.sigma_rep + u * b.sigma_rep, (1 - u) * a.octaves + u * b.octaves,
            max(1, a.rank, b.rank), (*a.anchors, *b.anchors), a.floor_held or b.floor_held, across,
        )  # fmt: skip

    def _extrapolate(  # noqa: PLR0917 - private recursion state
        self, curve: ShapeCurve, level: int, a: Eval, b: Eval | None, target: tuple[int, ...], floor: Limits
    ) -> Eval:
        """Beyond the grid along axis `level`, from its nearest value (`a`) and the next one (`b`, below the grid)."""
        ra, rx = self._roof_at(curve, a.coords), self._roof_at(curve, target)
        second = (self._roof_at(curve, b.coords), b.ms) if b is not None else None
        fam = curve.family
        if fam.axes[level] in fam.derived:
            return dataclasses.replace(a, ms=a.ms * rx / ra, coords=target)
        ms, held = beyond((ra, a.ms), rx, second, floor)
        off = fam.offset(level)
        octaves = abs(math.log2((target[level] + off) / (a.coords[level] + off)))
        return Eval(ms, target, a.sigma_rep, a.octaves + octaves, 2, a.anchors, held or a.floor_held, a.across)

    # --- transfer -------------------------------------------------------------------------------------------

    def _transfer(self, key: ProbeKey, variant: str, ident: Identity, coords: tuple[int, ...]) -> Prediction | Refusal:
        """A shape never measured: from the measured shapes of its kind and dtype (else the next dtype down)."""
        fam = FAMILIES[key.PROBE]
        dtype = str(dict(ident).get(fam.dtype_field, ""))
        cross = ""
        match = match_of(key.PROBE, ident)
        group = self._groups.get(match, [])
        for alt in DTYPE_LADDER.get(dtype, ()) if not group else ():
            match = match_of(key.PROBE, ident, alt)
            group = self._groups.get(match, [])
            if group:
                cross = alt
                break
        if not group:
            d = dict(ident)
            what = ", ".join(f"{n}={d[n]}" for n in fam.match if d.get(n, "") != "")
            kind = f"{key.PROBE} curve" + (f" ({what})" if what else "")
            return self._refuse(key, f"no {kind} at {dtype or 'any dtype'} was measured on this host")
        ev, source = self._transfer_eval(key, coords, group, self._limits(match))
        label = f"transferred from {source.template.key_id if not source.points else nearest_id(source, coords)}"
        if cross:
            label += f" (its {cross} efficiency: no {dtype} curve here)"
        if ev.octaves >= 0.05:
            label += ", " + label_of("extrapolated", ev.octaves)
        label += ACROSS_LAUNCH if ev.across else ""
        return self._prediction(key, variant, ev, ("transferred", label), source, match, cross)

    def _transfer_eval(
        self, key: ProbeKey, coords: tuple[int, ...], group: Sequence[ShapeCurve], floor: Limits
    ) -> tuple[Eval, ShapeCurve]:
        """The efficiencies of `group`'s curves at the query's sizes, blended over their roofline time."""
        rq = self.roofline_ms(key)
        found = []
        for c in group:
            assert c.tree is not None
            found.append((self._roof_at(c, coords), self._eval(c, c.tree, 0, coords, (), floor), c))
        found.sort(key=lambda f: f[0])
        roofs = [f[0] for f in found]
        i = bisect.bisect_left(roofs, rq)
        if 0 < i < len(found):
            (ra, a, ca), (rb, b, cb) = found[i - 1], found[i]
            u = (math.log(rq) - math.log(ra)) / (math.log(rb) - math.log(ra)) if rb != ra else 0.5
            ms = blend_ms((ra, a.ms), (rb, b.ms), rq, u)
            ev = Eval(
                ms, coords, (1 - u) * a.sigma_rep + u * b.sigma_rep, (1 - u) * a.octaves + u * b.octaves, 1,
                (*a.anchors, *b.anchors), a.floor_held or b.floor_held, a.across or b.across,
            )  # fmt: skip
            return ev, ca if u < 0.5 else cb
        near, second = (0, 1) if i == 0 else (len(found) - 1, len(found) - 2)
        ra, a, ca = found[near]
        other = (found[second][0], found[second][1].ms) if 0 <= second < len(found) else None
        if other is None:  # one shape of its kind here (or another dtype's): its efficiency held, as AIConfigurator
            ms = max(a.ms * rq / ra, min(floor.floor_ms, a.ms))
            held = ms > a.ms * rq / ra
        else:
            ms, held = beyond((ra, a.ms), rq, other, floor)
        return Eval(ms, coords, a.sigma_rep, a.octaves, 1, a.anchors, held or a.floor_held, a.across), ca

    # --- self-check -----------------------------------------------------------------------------------------

    def self_check(self) -> SelfCheck:
        """Leave-one-out error per family on this host's curves (computed once; a family whose points, hardware and
        best efficiency another engine already checked takes that engine's figure: a what-if's TP change builds a new
        engine where only the all-reduce family's points differ)."""
        if self._check is None:
            self._check = SelfCheck(tuple(family_check_once(self, p) for p in self.probes()))
        return self._check

    def _sigmas(self, probe: str) -> FamilyCheck:
        if not self.checked and self._check is None:
            return default_check(probe)
        found = self.self_check().family(probe)
        return found if found is not None else default_check(probe)

    # --- what the self-check (`decodetop.budget.leave_one_out`) evaluates -----------------------------------

    @property
    def best_efficiency(self) -> float:
        """The best efficiency this host reached (at most 1): the rate extra work costs at least."""
        return self._best

    def curves_of(self, probe: str) -> list[ShapeCurve]:
        """The curves of `probe`, one per measured shape."""
        return [c for c in self._curves.values() if c.probe == probe]

    def transfer_group(self, curve: ShapeCurve) -> list[ShapeCurve]:
        """The curves a shape of `curve`'s kind and dtype transfers from (`curve` among them)."""
        return self._groups.get(match_of(curve.probe, curve.identity), [])

    def limits_of(self, match: tuple[object, ...]) -> Limits:
        """The latency floor and best efficiency that bound figures of transfer group `match`."""
        return self._limits(match)

    def evaluate(self, curve: ShapeCurve, tree: Tree, coords: tuple[int, ...], limits: Limits) -> Eval:
        """The figure at `coords` from the points of `tree` (a curve's, or some of them) on `curve`'s shape."""
        return self._eval(curve, tree, 0, coords, (), limits)

    def transfer_evaluate(
        self, key: ProbeKey, coords: tuple[int, ...], group: Sequence[ShapeCurve], limits: Limits
    ) -> tuple[Eval, ShapeCurve]:
        """The figure of `key` carried from the curves of `group`, and the one it rests on most."""
        return self._transfer_eval(key, coords, group, limits)


NOMINAL_CPU_GBPS = 20.0
NOMINAL_CPU_TFLOPS = 0.5
"""Rates for a CPU-rank engine without the gemm probe's references: efficiencies are only ever ratios (held or
carried between points of one host), so only their ratio (the ridge point) matters; these are a desktop core's
order of magnitude."""


def nominal_hardware(copy_gbps: float | None = None, peak_tflops: float | None = None) -> Hardware:
    """The roofline a CPU-rank engine takes efficiencies against: the measured copy bandwidth and matrix peak where
    the results hold them (the gemm probe's references), else nominal rates; never shown as a figure."""
    hw = hardware_for(
        None,
        bandwidth_gbps=copy_gbps or NOMINAL_CPU_GBPS,
        bandwidth_source="measured device copy" if copy_gbps else "nominal (ratios only)",
        interconnect="pcie4",
        gpu_name="CPU ranks (rates for efficiency ratios only)",
    )
    return dataclasses.replace(hw, bf16_dense_tflops=peak_tflops or NOMINAL_CPU_TFLOPS)
