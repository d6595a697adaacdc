"""Provides the kernel classification table (one data file, `kernel_rules.json`) and its lookups.

A kernel (or, in CPU-only traces, a CPU operator) gets a *rule* from its name (first matching regex wins), the
rule gives a *family* (gemm, attention, copy, ...), and the family plus the *context* (the enclosing host frames:
record_function annotations, `nn.Module` frames, aten operators) gives the budget component. A family whose
component cannot be decided (a GEMM with no telling context, a copy outside any known region) is *unattributed*, and
a name no rule matches is *unclassified*: both are reported, never hidden.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

from decodetop import jsonio
from decodetop.budget.components import Component
from decodetop.errors import UserInputError

RULES_FILE = "kernel_rules.json"
UNCLASSIFIED = "unclassified"
UNATTRIBUTED_PREFIX = "unattributed:"


@dataclass(frozen=True)
class KernelRule:
    """One row of the table: kernels whose name matches `pattern` belong to `family`."""

    id: str
    family: str
    pattern: re.Pattern[str]
    note: str
    examples: tuple[str, ...]


@dataclass(frozen=True)
class ContextRule:
    """Host frames (annotation, module or op names) matching `pattern` put the kernels below them in context `id`."""

    id: str
    pattern: re.Pattern[str]
    note: str
    examples: tuple[str, ...]
    within: Mapping[str, str] = field(default_factory=dict)
    """Outer context id → the context this one becomes inside it: an MLP module nested in an MoE block is its shared
    expert (DeepSeek's `shared_experts` is a DeepseekV3MLP, Qwen2-MoE's `shared_expert` a Qwen2MoeMLP), while the
    same class directly under a decoder layer is the dense MLP."""


@dataclass(frozen=True)
class Family:
    """A kind of kernel and how it maps to a budget component: by context where one applies, else `default`."""

    id: str
    label: str
    default: Component | None
    by_context: Mapping[str, Component]


@dataclass(frozen=True)
class MarkerRule:
    """Names of annotations that delimit one decode step each."""

    id: str
    pattern: re.Pattern[str]
    note: str


@dataclass(frozen=True, eq=False)
class RuleSet:
    """The whole classification table, compiled (hashed by identity, so lookups can be cached per table)."""

    source: str
    kernels: tuple[KernelRule, ...]
    contexts: tuple[ContextRule, ...]
    families: Mapping[str, Family]
    step_markers: tuple[MarkerRule, ...]

    def classify(self, name: str) -> KernelRule | None:
        """The first rule whose pattern occurs in `name`, or None (unclassified)."""
        return _classify_cached(self, name)

    def context_of(self, frames_inner_first: Sequence[str]) -> tuple[ContextRule | None, str | None]:
        """The context of a kernel from its enclosing frames (innermost first): the rule and the frame it matched."""
        frames = list(frames_inner_first)
        for index, frame in enumerate(frames):
            for rule in self.contexts:
                if rule.pattern.search(frame):
                    return self._refined(rule, frames[index + 1 :]), frame
        return None, None

    def _refined(self, rule: ContextRule, outer_frames: Sequence[str]) -> ContextRule:
        """`rule`, or what its `within` map makes of it when an outer frame is in one of the listed contexts."""
        if not rule.within:
            return rule
        by_id = {r.id: r for r in self.contexts}
        for frame in outer_frames:
            for outer_id, becomes in rule.within.items():
                outer = by_id.get(outer_id)
                if outer is not None and outer.pattern.search(frame) and becomes in by_id:
                    return by_id[becomes]
        return rule

    def component(self, family: str, context: str | None) -> Component | None:
        """The budget component of a kernel of `family` in `context` (None: unattributed)."""
        fam = self.families[family]
        if context is not None and context in fam.by_context:
            return fam.by_context[context]
        return fam.default


@functools.lru_cache(maxsize=65536)
def _classify_cached(rules: RuleSet, name: str) -> KernelRule | None:
    for rule in rules.kernels:
        if rule.pattern.search(name):
            return rule
    return None


def bucket_key(component: Component | None, family: str | None) -> str:
    """The key a kernel's time is summed under: a component value, 'unattributed:<family>' or 'unclassified'."""
    if family is None:
        return UNCLASSIFIED
    if component is None:
        return UNATTRIBUTED_PREFIX + family
    return component.value


def bucket_label(key: str, rules: RuleSet) -> str:
    """Human title of a bucket key."""
    if key == UNCLASSIFIED:
        return "unclassified kernels"
    if key.startswith(UNATTRIBUTED_PREFIX):
        fam = rules.families.get(key[len(UNATTRIBUTED_PREFIX) :])
        return f"{fam.label if fam else key} (unattributed)"
    try:
        return Component(key).label
    except ValueError:
        return key


def _compile(pattern: object, where: str) -> re.Pattern[str]:
    if not isinstance(pattern, str) or not pattern:
        raise UserInputError(f"{where}: 'pattern' must be a non-empty string")
    try:
        return re.compile(pattern, re.IGNORECASE)
    except re.error as exc:
        raise UserInputError(f"{where}: bad regex {pattern!r}: {exc}") from None


def _component(value: object, where: str) -> Component | None:
    if value is None:
        return None
    try:
        return Component(str(value))
    except ValueError:
        raise UserInputError(f"{where}: {value!r} is not a budget component") from None


def parse_rules(data: Any, source: str) -> RuleSet:
    """Validate and compile a rules document (the JSON's parsed form)."""
    if not isinstance(data, dict):
        raise UserInputError(f"{source}: the rules file must hold a JSON object")
    families: dict[str, Family] = {}
    for fid, spec in dict(data.get("families") or {}).items():
        where = f"{source}: family {fid!r}"
        if not isinstance(spec, dict):
            raise UserInputError(f"{where}: must be an object")
        by_ctx = {str(k): _component(v, where) for k, v in dict(spec.get("by_context") or {}).items()}
        families[fid] = Family(
            id=fid,
            label=str(spec.get("label", fid)),
            default=_component(spec.get("default"), where),
            by_context={k: v for k, v in by_ctx.items() if v is not None},
        )
    kernels = []
    for i, spec in enumerate(data.get("kernels") or []):
        where = f"{source}: kernel rule #{i}"
        if not isinstance(spec, dict) or spec.get("family") not in families:
            raise UserInputError(f"{where}: needs an 'id' and a 'family' among {sorted(families)}")
        kernels.append(
            KernelRule(
                id=str(spec.get("id", f"rule{i}")),
                family=str(spec["family"]),
                pattern=_compile(spec.get("pattern"), where),
                note=str(spec.get("note", "")),
                examples=tuple(str(x) for x in spec.get("examples") or ()),
            )
        )
    contexts = [
        ContextRule(
            id=str(spec.get("id")),
            pattern=_compile(spec.get("pattern"), f"{source}: context rule #{i}"),
            note=str(spec.get("note", "")),
            examples=tuple(str(x) for x in spec.get("examples") or ()),
            within=_within(spec.get("within"), f"{source}: context rule #{i}"),
        )
        for i, spec in enumerate(data.get("contexts") or [])
    ]
    ids = {c.id for c in contexts}
    for c in contexts:
        unknown = sorted((set(c.within) | set(c.within.values())) - ids)
        if unknown:
            raise UserInputError(f"{source}: context rule {c.id!r}: 'within' names unknown contexts {unknown}")
    markers = [
        MarkerRule(
            id=str(spec.get("id")),
            pattern=_compile(spec.get("pattern"), f"{source}: step marker #{i}"),
            note=str(spec.get("note", "")),
        )
        for i, spec in enumerate(data.get("step_markers") or [])
    ]
    if not kernels:
        raise UserInputError(f"{source}: no kernel rules")
    return RuleSet(source, tuple(kernels), tuple(contexts), families, tuple(markers))


def _within(value: object, where: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise UserInputError(f"{where}: 'within' must map context ids to context ids")
    return dict(value)


@functools.lru_cache(maxsize=4)
def load_rules(path: str | None = None) -> RuleSet:
    """The packaged table, or a user's copy of it at `path`."""
    if path is None:
        text = resources.files("decodetop.traces").joinpath(RULES_FILE).read_text(encoding="utf-8")
        source = RULES_FILE
    else:
        source = path
        try:
            text = jsonio.read_bounded(path).decode("utf-8")  # a FIFO or device is refused unread
        except UnicodeDecodeError as exc:
            raise UserInputError(f"{path}: cannot read kernel rules: {exc}") from None
    try:
        data = jsonio.loads(text, source=source)  # nesting, huge numbers, NaN: one line naming the file
    except json.JSONDecodeError as exc:
        raise UserInputError(f"{source}: malformed JSON at line {exc.lineno}: {exc.msg}") from None
    return parse_rules(data, source)
