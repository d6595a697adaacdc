"""Provides the what-if screen's knobs: each knob of `decodetop.pipeline.whatif.KNOBS` the screen turns, the keys
that turn it and the values it steps through, and `KnobState`, the current deployment's value of each knob with the
variant's turned ones (pure: the screen keeps one and replaces it per key press).

A knob steps through its values in order (TP 1, 2, 4, 8; batch 1 … 256; context 1K … 128K; the dtypes in their
order), with the current deployment's own value among them wherever it lies (TP 3 of a 6-GPU group, context 6000).
A lower-case key steps down, the upper-case one up; a knob of names (KV dtype, weights, launch, all-reduce) wraps.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from decodetop.budget.deployment import KV_DTYPES, LAUNCH_MODES
from decodetop.budget.engine_paths import ALLREDUCE_CHOICES
from decodetop.budget.gpus import GPUS
from decodetop.budget.precision import WEIGHT_CHOICES
from decodetop.budget.scenario import Scenario

CONTEXTS = tuple(2**n for n in range(10, 18))
"""1K … 128K tokens: the context grid the curve plan measures attention over (docs/architecture.md, `plan.py`)."""
BATCHES = tuple(2**n for n in range(9))
"""1 … 256 sequences: the curve plan sweeps GEMMs to max(256, batch × tokens verified)."""
ACCEPTS = ("1", "1.5", "2", "2.5", "3", "3.5", "4")
"""Accept lengths of speculative decoding (1 = off), the range the engines report for MTP drafts."""
DRAFTS = tuple(str(n) for n in range(1, 9))
"""Draft tokens verified per step: the counts speculative decoding is deployed with (1–8); `--vary draft` takes any
count the deployment allows. The current deployment's "auto" is the accept length's own count (⌈accept − 1⌉)."""
AUTO_DRAFTS = "auto"


@dataclass(frozen=True)
class Knob:
    """One knob of the screen."""

    name: str
    """The knob's name in `decodetop.pipeline.whatif.KNOBS` ('tp')."""
    title: str
    """What the screen calls it ('TP')."""
    down: str
    """The key that steps it down (or to the previous name)."""
    up: str
    """The key that steps it up."""
    values: tuple[str, ...]
    """Its steps, in order (the current deployment's value is added where it is not one)."""
    numeric: bool = True
    """Whether the values are numbers (sorted as such; a knob of names wraps around)."""

    def steps(self, current: str) -> tuple[str, ...]:
        """Its values with `current` among them, in order."""
        if current in self.values:
            return self.values
        if not self.numeric or not _is_number(current):
            return (current, *self.values)
        return tuple(sorted({*self.values, current}, key=float))

    def step(self, value: str, current: str, direction: int) -> str:
        """The value one step from `value` (`direction` +1 or -1); a number stops at the ends, a name wraps."""
        steps = self.steps(current)
        i = steps.index(value) if value in steps else steps.index(current)
        j = i + direction
        if self.numeric:
            return steps[min(max(j, 0), len(steps) - 1)]
        return steps[j % len(steps)]


KNOB_TABLE: tuple[Knob, ...] = (
    Knob("tp", "TP", "p", "P", ("1", "2", "4", "8")),
    Knob("ep", "EP", "e", "E", ("1", "2", "4", "8")),
    Knob("batch", "batch", "b", "B", tuple(str(b) for b in BATCHES)),
    Knob("context", "context", "c", "C", tuple(str(c) for c in CONTEXTS)),
    Knob("kv", "KV", "k", "K", tuple(k for k in KV_DTYPES if k != "auto"), numeric=False),
    Knob("weights", "weights", "f", "F", tuple(WEIGHT_CHOICES), numeric=False),
    Knob("accept", "accept", "a", "A", ACCEPTS),
    Knob("draft", "drafts", "d", "D", DRAFTS),
    Knob("launch", "launch", "l", "L", LAUNCH_MODES, numeric=False),
    Knob("allreduce", "all-reduce", "r", "R", ALLREDUCE_CHOICES, numeric=False),
    Knob("gpu", "GPU", "g", "G", tuple(GPUS), numeric=False),
)
"""The knobs the screen turns, in the order it lists them. The GPU knob names another model of the hardware table
(`decodetop.budget.gpus`): every figure carried from this host's curves, labelled transferred."""
HERE = "here"
"""The GPU knob's value for the GPU the results were measured on (no other model named)."""
KNOBS_BY_NAME = {k.name: k for k in KNOB_TABLE}


def _is_number(value: str) -> bool:
    try:
        float(value)
    except ValueError:
        return False
    return True


def current_values(scenario: Scenario) -> dict[str, str]:
    """The current deployment's value of each knob, as the knob spells it."""
    dep = scenario.deployment
    quant = scenario.spec.quant
    declared = quant.weight_format if quant.quantized else quant.base_format
    weights = next((n for n, f in WEIGHT_CHOICES.items() if f.probe_dtype == declared.probe_dtype), declared.label)
    accept = dep.accept_length if dep.accept_length is not None else 1.0
    return {
        "tp": str(dep.tp),
        "ep": str(dep.ep),
        "batch": str(dep.batch),
        "context": str(dep.context_len),
        "kv": scenario.kv_dtype,
        "weights": weights,
        "accept": f"{accept:g}",
        "draft": str(dep.draft_tokens) if dep.draft_tokens is not None else AUTO_DRAFTS,
        "launch": dep.launch_mode,
        "allreduce": dep.allreduce,
        "gpu": HERE,
    }


@dataclass(frozen=True)
class KnobState:
    """The current deployment's knob values (`now`) and the variant's: the knobs turned away from now."""

    now: Mapping[str, str]
    turned: Mapping[str, str] = field(default_factory=dict)

    def value(self, name: str) -> str:
        """The variant's value of knob `name`."""
        return self.turned.get(name, self.now[name])

    def step(self, name: str, direction: int) -> KnobState:
        """The state with knob `name` one step up (+1) or down (-1); a knob back at now's value is not turned."""
        knob = KNOBS_BY_NAME[name]
        value = knob.step(self.value(name), self.now[name], direction)
        turned = {k: v for k, v in self.turned.items() if k != name}
        if value != self.now[name]:
            turned[name] = value
        return KnobState(self.now, _ordered(turned))

    def with_value(self, name: str, value: str) -> KnobState:
        """The state with knob `name` at `value` (not turned where that is now's)."""
        turned = {k: v for k, v in self.turned.items() if k != name}
        if value != self.now[name]:
            turned[name] = value
        return KnobState(self.now, _ordered(turned))

    def reset(self) -> KnobState:
        """Every knob back at the current deployment."""
        return KnobState(self.now)

    @property
    def label(self) -> str:
        """'tp=4 batch=8' ('now' with nothing turned), as `decodetop whatif` labels a variant."""
        return " ".join(f"{k}={v}" for k, v in self.turned.items()) or "now"


def _ordered(turned: Mapping[str, str]) -> dict[str, str]:
    """The turned knobs in the screen's order (one label and one cache key per variant)."""
    return {k.name: turned[k.name] for k in KNOB_TABLE if k.name in turned}


@dataclass(frozen=True)
class Axis:
    """The chart's axis: a knob and the values the chart predicts along it."""

    knob: Knob
    values: tuple[str, ...]


def chart_axis(name: str, state: KnobState) -> Axis:
    """The axis of knob `name` over its steps (with now's value among them)."""
    knob = KNOBS_BY_NAME[name]
    return Axis(knob, knob.steps(state.now[name]))


def next_axis(name: str) -> str:
    """The knob after `name` in `KNOB_TABLE` (the chart's next axis)."""
    names = [k.name for k in KNOB_TABLE]
    return names[(names.index(name) + 1) % len(names)]
