"""Provides how measured points form curves for the curve engine (`decodetop.budget.curves`): each probe's curve
family (`FAMILIES`: its size axes, the fields a transfer source must share, its dtype field), a measured point
(`CurvePoint`), a key's identity (the non-axis fields: one curve per identity) and position on its family's axes,
and a curve's points as a tree over those axes (`ShapeCurve`, `build_tree`). Stdlib only."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Union, cast

from decodetop.budget.gqa_launch import (
    CurveLaunch,
    GqaLaunch,
    GqaLaunchFacts,
    LaunchRegime,
    launch_regime,
    launch_rule,
)
from decodetop.budget.keys import AttentionKey, ProbeKey, parse_key_id
from decodetop.budget.selfcheck import Z80


@dataclass(frozen=True)
class Family:
    """How the keys of one probe form curves: their size axes (shape-like first), the fields a transfer source
    must share, the dtype field of the cross-dtype ladder, and the offset of each axis in log space."""

    axes: tuple[str, ...]
    match: tuple[str, ...] = ()
    dtype_field: str = "dtype"
    offsets: tuple[float, ...] = ()
    ignore: tuple[str, ...] = ()
    """Fields the time does not depend on (a KV write costs the same whatever the cache already holds)."""
    derived: tuple[str, ...] = ()
    """Axes that follow from the others (the experts a token count touches): moving along one rescales by the
    roofline (the touched experts' weights) without counting as extrapolation."""

    def offset(self, level: int) -> float:
        return self.offsets[level] if self.offsets else 0.0


FAMILIES: dict[str, Family] = {
    "gemm": Family(("batch", "m")),
    "attention": Family(("heads", "q_len", "batch", "context"), ("kind",), "kv_dtype", (0, 0, 0, 1)),
    "moe": Family(
        ("intermediate", "experts_local", "tokens", "experts_active"), ("bias",), derived=("experts_active",)
    ),
    "routing": Family(("tokens",), ("scoring",)),
    "norms": Family(("width", "tokens"), ("op",)),
    "sampling": Family(("vocab_shard", "tokens")),
    "kvcast": Family(("width", "tokens"), ("layout",), "kv_dtype", ignore=("context",)),
    "allreduce": Family(("ranks", "bytes"), ("collective", "variant")),
}
"""Probe → its curve family. Launch cost is per kernel (measured for any kernel count), not a curve."""
DTYPE_LADDER: dict[str, tuple[str, ...]] = {
    "nvfp4": ("fp8", "bf16"),
    "mxfp4": ("fp8", "bf16"),
    "fp8": ("bf16", "fp16"),
    "bf16": ("fp16",),
    "fp16": ("bf16",),
}
"""Where a dtype without any curve here borrows its efficiency from, nearest first."""

Identity = tuple[tuple[str, object], ...]


@dataclass(frozen=True)
class CurvePoint:
    """One measured point of a curve: a key (with an implementation variant where one key has several, e.g. the
    all-reduce's nccl / one_shot), its median and repeat spread of one instance in ms, where it came from, and the
    kernel launch it was timed with where its results say it (GQA's split-K kernel: `GqaLaunchFacts`)."""

    key: ProbeKey
    median_ms: float
    p10_ms: float
    p90_ms: float
    source: str = "probe"
    variant: str = ""
    launch: GqaLaunchFacts | None = None

    @property
    def sigma_log(self) -> float:
        """The repeat spread as σ in log space (p10–p90 is ±1.2816 σ)."""
        if self.p10_ms <= 0 or self.p90_ms <= self.p10_ms:
            return 0.0
        return math.log(self.p90_ms / self.p10_ms) / (2 * Z80)


@dataclass(frozen=True)
class Node:
    """One axis level: its measured values (sorted) and a subtree per value."""

    values: tuple[int, ...]
    children: tuple[Union[Node, CurvePoint], ...]  # noqa: UP007 - a runtime alias, Python 3.10


Tree = Union[Node, CurvePoint]  # noqa: UP007 - a runtime alias, Python 3.10


@dataclass
class ShapeCurve:
    """The points of one identity (a shape at a dtype and variant): a template key and a tree over the axes."""

    probe: str
    identity: Identity
    template: ProbeKey
    members: list[tuple[tuple[int, ...], CurvePoint]] = field(default_factory=list)
    """Every measured point with its coordinates (two keys of the same work share them: `coords_of`)."""
    points: dict[tuple[int, ...], CurvePoint] = field(default_factory=dict)
    """One point per coordinate (`merged`)."""
    tree: Tree | None = None
    regime_of: Callable[[tuple[int, ...]], LaunchRegime] | None = None
    """The kernel's launch regime at any coordinates of this curve, where its points' launch is known
    (`launch_regimes`; GQA's split-K kernel only)."""
    work_of: Callable[[tuple[int, ...]], float] | None = None
    """The tiles the kernel's time follows at any coordinates of this curve (`launch_regimes`), where its points were
    launched by the one-wave split; the curve is interpolated in them instead of the roofline."""

    @property
    def family(self) -> Family:
        return FAMILIES[self.probe]

    @property
    def is_gqa(self) -> bool:
        return isinstance(self.template, AttentionKey) and self.template.kind == "gqa"


def merged(items: Sequence[tuple[tuple[int, ...], CurvePoint]]) -> dict[tuple[int, ...], CurvePoint]:
    """One point per coordinate: where keys of the same work were measured apart (a TP shard's GQA attention at
    batch 8 and the whole model's at batch 1), their geometric-mean time, with a spread that holds them all."""
    by: dict[tuple[int, ...], list[CurvePoint]] = {}
    for coords, p in items:
        by.setdefault(coords, []).append(p)
    out: dict[tuple[int, ...], CurvePoint] = {}
    for coords, ps in by.items():
        if len(ps) == 1:
            out[coords] = ps[0]
            continue
        median = math.exp(sum(math.log(q.median_ms) for q in ps) / len(ps))
        low, high = min(q.p10_ms for q in ps), max(q.p90_ms for q in ps)
        out[coords] = dataclasses.replace(ps[0], median_ms=median, p10_ms=min(low, median), p90_ms=max(high, median))
    return out


def build_tree(items: Sequence[tuple[tuple[int, ...], CurvePoint]], level: int, depth: int) -> Tree:
    """The points below axis `level` as a tree over the remaining axes (the fastest point where two coincide)."""
    if level == depth:
        return min((p for _c, p in items), key=lambda p: p.median_ms)
    by: dict[int, list[tuple[tuple[int, ...], CurvePoint]]] = {}
    for coords, p in items:
        by.setdefault(coords[level], []).append((coords, p))
    values = sorted(by)
    return Node(tuple(values), tuple(build_tree(by[v], level + 1, depth) for v in values))


def identity_of(key: ProbeKey, variant: str = "") -> Identity:
    """The non-axis fields of a key (a GQA key's KV heads as its group size, so TP shards share a curve)."""
    fam = FAMILIES[key.PROBE]
    items: list[tuple[str, object]] = []
    for name, value in key.to_params().items():
        if name in fam.axes or name in fam.ignore:
            continue
        if name == "kv_heads" and isinstance(key, AttentionKey) and key.kind == "gqa":
            items.append(("group", max(1, key.heads // max(1, key.kv_heads))))
        else:
            items.append((name, value))
    if variant:
        items.append(("variant", variant))
    return tuple(items)


def coords_of(key: ProbeKey) -> tuple[int, ...]:
    """A key's position on its family's axes. A GQA attention key sits at one KV head of its group and as many
    sequences as it has (sequence, KV head) pairs: a decode kernel's work (the KV bytes read, the FLOPs, the query
    and output) and its grid (a program per pair and split) are both functions of the pairs, so a TP shard at
    batch 8 and the whole model at batch 1 are one point of one curve (on the H200 campaign's plans such points
    differ by 0.2–3.4 %: docs/benchmarks.md, "The second campaign")."""
    params = key.to_params()
    if isinstance(key, AttentionKey) and key.kind == "gqa" and key.kv_heads > 0 and key.heads % key.kv_heads == 0:
        params = {**params, "heads": key.heads // key.kv_heads, "batch": key.batch * key.kv_heads}
    return tuple(int(params[a]) for a in FAMILIES[key.PROBE].axes)


def key_at(template: ProbeKey, coords: Sequence[int]) -> ProbeKey:
    """`template` moved to `coords` on its family's axes (a GQA key keeps its group size)."""
    fam = FAMILIES[template.PROBE]
    changes: dict[str, int] = dict(zip(fam.axes, (int(c) for c in coords), strict=True))
    if isinstance(template, AttentionKey) and template.kind == "gqa":
        group = max(1, template.heads // max(1, template.kv_heads))
        changes["kv_heads"] = max(1, changes["heads"] // group)
    moved: ProbeKey = dataclasses.replace(cast(Any, template), **changes)
    return moved


def _launches(curve: ShapeCurve) -> tuple[CurveLaunch, Callable[[tuple[int, ...]], GqaLaunch]] | None:
    """The rule a GQA curve's points were launched by (`decodetop.budget.gqa_launch.launch_rule`) and the launch it
    gives at any of the curve's coordinates (each computed once); None where the points do not tell it (results
    written before the launch was recorded, or a rule that is neither today's nor one fixed shape)."""
    if not curve.is_gqa:
        return None
    rule = launch_rule((cast(AttentionKey, p.key), p.launch) for _c, p in curve.members if p.launch)
    if rule is None:
        return None
    found: dict[tuple[int, ...], GqaLaunch] = {}

    def at(coords: tuple[int, ...]) -> GqaLaunch:
        got = found.get(coords)
        if got is None:
            got = found[coords] = rule.launch(cast(AttentionKey, key_at(curve.template, coords)))
        return got

    return rule, at


def launch_regimes(
    curve: ShapeCurve,
) -> tuple[Callable[[tuple[int, ...]], LaunchRegime] | None, Callable[[tuple[int, ...]], float] | None]:
    """A GQA curve's launch regime at any of its coordinates (None where its points do not tell their launch), and
    the work in tiles its time follows there (`GqaLaunch.work_tiles`), where its points were split by the one-wave
    rule; None elsewhere: under the even rule the combine's serial steps over up to 513 splits weigh beside the
    tiles (~1.1 µs a step on an H200), and interpolated in tiles the third campaign's curves erred more than in
    roofline terms (docs/benchmarks.md, "The attention leave-one-out in the launch's work")."""
    found = _launches(curve)
    if found is None:
        return None, None
    rule, at = found

    def regime(coords: tuple[int, ...]) -> LaunchRegime:
        return launch_regime(at(coords))

    def work(coords: tuple[int, ...]) -> float:
        return at(coords).work_tiles

    return regime, (work if rule.split_rule == "one wave" else None)


def match_of(probe: str, identity: Identity, dtype: str | None = None) -> tuple[object, ...]:
    """The transfer group of an identity: its probe, the fields a source must share and its dtype."""
    fam = FAMILIES[probe]
    d = dict(identity)
    want = dtype if dtype is not None else d.get(fam.dtype_field, "")
    return (probe, tuple(d.get(name, "") for name in fam.match), want)


def floor_of(match: tuple[object, ...]) -> tuple[object, ...]:
    """The latency floor's group of a transfer group: its kind at any dtype (the fastest kernel of that kind)."""
    return match[:2]


def same_but_ignored(key: ProbeKey, anchors: Sequence[str]) -> bool:
    """Whether `key` is one of the measured `anchors` but for the fields its family ignores (a KV write's context)."""
    ignore = FAMILIES[key.PROBE].ignore
    mine = {k: v for k, v in key.to_params().items() if k not in ignore}
    for anchor in anchors:
        other = cast(ProbeKey, parse_key_id(anchor))
        if {k: v for k, v in other.to_params().items() if k not in ignore} == mine:
            return True
    return False


def nearest_id(curve: ShapeCurve, coords: tuple[int, ...]) -> str:
    """The key id of `curve`'s point nearest `coords` (in log space over its axes)."""

    def distance(c: tuple[int, ...]) -> float:
        return sum(abs(math.log((a + 1) / (b + 1))) for a, b in zip(c, coords, strict=True))

    return curve.points[min(curve.points, key=distance)].key.key_id
