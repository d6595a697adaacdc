"""Provides `diff_budgets`: which component of a decode-step budget moved since a baseline, beyond its noise.

After a change on the host (a planted `NCCL_PROTO=Simple`, `CUDA_LAUNCH_BLOCKING=1`, a whole-cache cast in
attention, a new driver) the question is which component got slower, not whether the total did. Both sides are
`Budget.to_dict()` mappings; a whole `decodetop probe --model M --json` document (its `"budget"` key) or a
`decodetop budget --json` document (the same key) is accepted too, so any earlier `--json` output is a baseline.

Significance (the rule, and why): a component moved only when |Δ| exceeds

    noise = max(baseline p90 − p10, current p90 − p10, NOISE_FLOOR_MS, RELATIVE_FLOOR × baseline ms)

- the p10–p90 spread of *both* sides: a segment's p10/p90 are its ops' spreads summed (compose.py), the range a
  single step of that component falls in. A move that stays inside either side's own spread cannot be told apart
  from run-to-run variation. (This is conservative: the median is steadier than one sample.)
- an absolute and a relative floor: point figures carry no spread (the launch line is a fit, estimates and
  interpolations are single values), so without a floor any change of a zero-spread segment would count.

The all-reduce's kernel path (a segment's `path` / `path_text`, segment.Segment: NCCL, custom one-shot, …) is
compared too: when it changed between the two budgets the diff says so in one line, since a new path moves the
all-reduce with nothing changed on the host. Older files without those fields say nothing.

Comparable budgets only: two budgets of different models, tensor-parallel degrees, hardware (the GPU the figures
are for) or device kinds (GPU vs CPU ranks) have different components and figures by construction, so no move
between them says anything about the host. Such a pair is "not comparable: <what differs>" (`BudgetDiff.
not_comparable`), with no component compared and nothing headlined; `budget --diff` and `probe --baseline` exit 2.
A field an older file does not hold is not judged. Other deployment differences (batch, context, KV dtype) still
compare, with a note.

A component present on one side only counts as added (Δ = its ms) or removed (Δ = −its ms). A segment whose data
is missing on either side (status "missing": its ms is at most a lower bound) has no Δ and never counts. A roofline
estimate or a curve prediction beyond the measured points against a measurement (status "estimated", "extrapolated"
or "transferred" on one side only; "interpolated" counts as measured) has a Δ but never counts either: it says how
far the estimate or prediction was off, not that the host changed (two figures of the same kind do compare).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from decodetop import jsonio
from decodetop.budget.components import UNEXPLAINED_KEY, Component
from decodetop.budget.contention import contention_in
from decodetop.budget.noise import NOISE_FLOOR_MS, RELATIVE_FLOOR
from decodetop.budget.ranks import straggler_in
from decodetop.budget.segment import CURVE_STATUSES, STATUSES
from decodetop.errors import UserInputError
from decodetop.quantity import COMPONENT_MS, OBSERVED_MS, shown
from decodetop.textfmt import format_number, shorten, table

TAIL_FLOOR = 0.10
"""A step's tail (mean − median, ms) counts as moved when it grew past twice the baseline's and the mean step by at
least this fraction: on one H200, two clean Llama-3.1-70B (4-layer) runs had a tail under 0.003 ms and means 1 % apart,
and a GEMM loop from another process on the same GPU left every median in place but lifted the mean step from 2.45
to 4.67 ms (docs/benchmarks.md, "Plants on one H200")."""
ABSENT = "absent"
"""The status of a component that one side's budget does not have."""
CHANGES = ("changed", "added", "removed", "unknown", "estimate")
"""How a component compares: on both sides; only in the current budget; only in the baseline; missing data; a
roofline estimate on one side and a measurement on the other."""


@dataclass(frozen=True)
class BudgetIdentity:
    """What makes two budgets comparable: the model, the tensor-parallel degree, the hardware the figures are for
    and the device kind the measurements ran on ('' or None: the file does not say, so it is not judged)."""

    model: str
    tp: int | None
    hardware: str
    """The GPU's name without how it was chosen ('NVIDIA H200 141GB'), 'n/a on CPU', or ''."""
    device_kind: str
    """'cuda', 'cpu' or ''."""

    @classmethod
    def of(cls, budget: Mapping[str, Any]) -> BudgetIdentity:
        """The identity a `Budget.to_dict()` mapping states (its model, 'TP n' deployment, hardware, device kind)."""
        deployment = budget.get("deployment")
        match = _TP_RE.match(deployment) if isinstance(deployment, str) else None
        model, hardware, kind = (budget.get(k) for k in ("model", "hardware", "device_kind"))
        return cls(
            model=model if isinstance(model, str) else "",
            tp=int(match.group(1)) if match else None,
            hardware=hardware_name(hardware) if isinstance(hardware, str) else "",
            device_kind=kind if isinstance(kind, str) else "",
        )


_TP_RE = re.compile(r"TP (\d+)\b")
"""The tensor-parallel degree at the start of `Deployment.describe` ('TP 2, EP 1, batch 1, …')."""


def hardware_name(text: str) -> str:
    """The GPU a budget's hardware text names, without how it was chosen: 'NVIDIA H200 141GB (detected by NVML)' →
    'NVIDIA H200 141GB'; 'X: not in the hardware table (…)' → 'X'."""
    return text.split(" (", 1)[0].split(": not in the hardware table", 1)[0].strip()


def not_comparable(baseline: BudgetIdentity, current: BudgetIdentity) -> tuple[str, ...]:
    """What differs between two budgets' identities ('model Llama-3.1-70B vs GLM-5', 'TP 2 vs 8', 'device kind cpu
    vs cuda', 'hardware n/a on CPU vs NVIDIA H200 141GB'; baseline first); empty when they compare. A field either
    side leaves unsaid is not judged."""
    out: list[str] = []
    pairs: tuple[tuple[str, object, object], ...] = (
        ("model", baseline.model, current.model),
        ("TP", baseline.tp, current.tp),
        ("device kind", baseline.device_kind, current.device_kind),
        ("hardware", baseline.hardware, current.hardware),
    )
    for what, before, after in pairs:
        if before not in (None, "") and after not in (None, "") and before != after:
            out.append(f"{what} {before} vs {after}")
    return tuple(out)


def not_comparable_line(reasons: Sequence[str]) -> str:
    """ "not comparable: model Llama-3.1-70B vs GLM-5; TP 2 vs 8 (baseline vs now): …" for `reasons`."""
    return (
        f"not comparable: {'; '.join(reasons)} (baseline vs now): a per-component diff needs the same model, TP, "
        "hardware and device kind"
    )


@dataclass(frozen=True)
class ComponentDelta:
    """One component's move from the baseline to the current budget, ms per step."""

    component: str
    """A `Component` value (or any component key a budget file holds)."""
    label: str
    baseline_ms: float | None
    """None when the baseline lacks the component or its data is missing."""
    current_ms: float | None
    delta_ms: float | None
    """current − baseline (absent counts as 0); None when either side's data is missing."""
    ratio: float | None
    """current / baseline; None when either is unknown, absent or 0."""
    significant: bool
    """|Δ| > noise_ms (module docstring)."""
    change: str
    """One of CHANGES."""
    noise_ms: float
    """The threshold |Δ| had to exceed."""
    baseline_status: str = "measured"
    """The baseline segment's status, or ABSENT."""
    current_status: str = "measured"


@dataclass(frozen=True)
class BudgetDiff:
    """Two budgets compared per component; components sorted by Δ descending (unknown Δ last)."""

    baseline_model: str
    baseline_deployment: str
    current_model: str
    current_deployment: str
    components: tuple[ComponentDelta, ...]
    total_before_ms: float
    total_after_ms: float
    complete_before: bool
    """False when the baseline misses data: its total is then a lower bound."""
    complete_after: bool
    notes: tuple[str, ...] = ()
    """Mismatched models or deployments, incomplete budgets."""
    straggler: str = ""
    """The current budget's straggler line ('straggler: GPU 1 (…)'; '' when it names none: budget.ranks)."""
    straggler_before: str = ""
    """The baseline's straggler label ('GPU 1'; '' when it named none)."""
    mean_before_ms: float | None = None
    """The baseline's mean step (what throughput pays), when it has one."""
    mean_after_ms: float | None = None
    tail_moved: bool = False
    """The mean step moved while the medians held: the tail grew (see TAIL_FLOOR)."""
    allreduce_path_before: str = ""
    """The baseline's all-reduce path in short words ('NCCL', 'custom one-shot ≤ 1 MiB, NCCL above'); '' when the
    file names none (older files, or no all-reduce)."""
    allreduce_path_after: str = ""
    not_comparable: tuple[str, ...] = ()
    """What differs between the two budgets' models, TP, hardware or device kinds (`not_comparable`); when any
    does, no component is compared (`components` is empty) and nothing moved."""
    likely_cause: str = ""
    """The current budget's likely-cause line when other processes ran on its GPUs during the measurements
    (`decodetop.budget.contention`; '' for a clean run or an older file)."""

    @property
    def comparable(self) -> bool:
        """The two budgets share model, TP, hardware and device kind (as far as both files say)."""
        return not self.not_comparable

    @property
    def allreduce_path_changed(self) -> bool:
        """Both budgets name an all-reduce path, and they differ."""
        before, after = self.allreduce_path_before, self.allreduce_path_after
        return bool(before) and bool(after) and before != after

    @property
    def total_delta_ms(self) -> float:
        """After − before, ms per step."""
        return self.total_after_ms - self.total_before_ms

    @property
    def moved(self) -> tuple[ComponentDelta, ...]:
        """The components that moved beyond their noise, either way."""
        return tuple(d for d in self.components if d.significant)

    @property
    def moved_most(self) -> ComponentDelta | None:
        """The component with the largest significant increase, or None when nothing got slower beyond its noise."""
        ups = [d for d in self.components if d.significant and d.delta_ms is not None and d.delta_ms > 0]
        return max(ups, key=lambda d: d.delta_ms or 0.0, default=None)

    def component(self, key: str) -> ComponentDelta | None:
        """The delta of one component, or None."""
        return next((d for d in self.components if d.component == key), None)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        most = self.moved_most
        return {
            "baseline": {
                "model": self.baseline_model,
                "deployment": self.baseline_deployment,
                "total_ms": self.total_before_ms,
                "complete": self.complete_before,
            },
            "current": {
                "model": self.current_model,
                "deployment": self.current_deployment,
                "total_ms": self.total_after_ms,
                "complete": self.complete_after,
            },
            "comparable": self.comparable,
            "not_comparable": list(self.not_comparable),
            "total_delta_ms": self.total_delta_ms,
            "moved_most": most.component if most is not None else None,
            "components": [
                {
                    "component": d.component,
                    "label": d.label,
                    "baseline_ms": d.baseline_ms,
                    "current_ms": d.current_ms,
                    "delta_ms": d.delta_ms,
                    "ratio": d.ratio,
                    "significant": d.significant,
                    "change": d.change,
                    "noise_ms": d.noise_ms,
                    "baseline_status": d.baseline_status,
                    "current_status": d.current_status,
                }
                for d in self.components
            ],
            "rule": {"noise_floor_ms": NOISE_FLOOR_MS, "relative_floor": RELATIVE_FLOOR},
            "notes": list(self.notes),
            "straggler": self.straggler or None,
            "straggler_before": self.straggler_before or None,
            "mean_before_ms": self.mean_before_ms,
            "mean_after_ms": self.mean_after_ms,
            "tail_moved": self.tail_moved,
            "allreduce_path_before": self.allreduce_path_before or None,
            "allreduce_path_after": self.allreduce_path_after or None,
            "allreduce_path_changed": self.allreduce_path_changed,
            "likely_cause": self.likely_cause or None,
        }


# --------------------------------------------------------------------------------------------- reading


@dataclass(frozen=True)
class _Seg:
    component: str
    label: str
    ms: float | None
    p10_ms: float | None
    p90_ms: float | None
    status: str
    path: str = ""
    """The kernel path the figure assumes ('NCCL', 'custom one-shot+NCCL'; '' where none or an older file)."""
    path_text: str = ""
    """That path in words with why ('custom one-shot ≤ 1 MiB, NCCL above (…)')."""

    @property
    def known_ms(self) -> float | None:
        """The figure, when the data is complete (a missing segment's ms is only a lower bound)."""
        return None if self.status == "missing" else self.ms

    @property
    def spread_ms(self) -> float:
        """p90 − p10, or 0 for a point figure."""
        if self.p10_ms is None or self.p90_ms is None:
            return 0.0
        return max(0.0, self.p90_ms - self.p10_ms)


@dataclass(frozen=True)
class _Side:
    model: str
    deployment: str
    segments: tuple[_Seg, ...]
    total_ms: float
    complete: bool
    missing: tuple[str, ...]


def find_budget(document: object, name: str) -> Mapping[str, Any]:
    """The budget mapping in `document`: the document itself when it has "segments" (a `Budget.to_dict()`), else
    its "budget" key (a `decodetop probe --model M --json` plan-run document, a `decodetop budget --json` document).
    One-line UserInputError naming `name` otherwise."""
    if not isinstance(document, Mapping):
        raise UserInputError(f"{name}: expected a JSON object with a budget, got {type(document).__name__}")
    if "segments" in document:
        return document
    budget = document.get("budget")
    if isinstance(budget, Mapping):
        return budget
    if budget is not None:
        raise UserInputError(f"{name}: 'budget' is {type(budget).__name__}, not an object")
    if "decodetop_probe_results" in document:
        raise UserInputError(
            f"{name}: probe results without a budget (a plan run writes one: `decodetop probe --model M --json PATH`)"
        )
    raise UserInputError(f"{name}: no budget in this file (neither 'segments' nor 'budget' at the top level)")


def _number(value: object, where: str, *, optional: bool = True) -> float | None:
    """A time from a budget file, in range for `COMPONENT_MS` (0 to an hour), or None where it may be missing."""
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not COMPONENT_MS.accepts(value):
        raise UserInputError(f"{where} is {shown(value)}, not a number {COMPONENT_MS.range_text}")
    return float(value)


def _string(value: object, where: str, default: str = "") -> str:
    if value is None:
        return default
    if not isinstance(value, str):
        raise UserInputError(f"{where} is {shown(value)}, not a string")
    return value


MAX_LABEL_CHARS = 60
"""Characters of a component name from a file shown as its label (the built-in labels are under 30)."""


def _label(component: str) -> str:
    if component == UNEXPLAINED_KEY:
        return "unexplained"
    try:
        return Component(component).label
    except ValueError:
        return shorten(component, MAX_LABEL_CHARS)  # a name from the file: inert, one line, short


def _side(document: object, name: str) -> _Side:
    budget = find_budget(document, name)
    raw = budget.get("segments")
    if not isinstance(raw, Sequence) or isinstance(raw, (str, bytes)):
        raise UserInputError(f"{name}: budget 'segments' is {type(raw).__name__}, not a list")
    segments: list[_Seg] = []
    seen: set[str] = set()
    for i, item in enumerate(raw):
        where = f"{name}: budget segment {i + 1}"
        if not isinstance(item, Mapping):
            raise UserInputError(f"{where} is {type(item).__name__}, not an object")
        component = item.get("component")
        if not isinstance(component, str) or not component:
            raise UserInputError(f"{where}: 'component' is {component!r}, not a component name")
        where = f"{name}: budget segment {component!r}"
        if component in seen:
            raise UserInputError(f"{where} appears twice")
        seen.add(component)
        ms = _number(item.get("ms"), f"{where}: 'ms'")
        status = _string(item.get("status"), f"{where}: 'status'", "measured" if ms is not None else "missing")
        if status not in STATUSES:
            raise UserInputError(f"{where}: 'status' is {status!r} (known: {', '.join(STATUSES)})")
        if ms is None and status != "missing":
            raise UserInputError(f"{where}: 'ms' is null but the status is {status!r}")
        segments.append(
            _Seg(
                component,
                _string(item.get("label"), f"{where}: 'label'") or _label(component),
                ms,
                _number(item.get("p10_ms"), f"{where}: 'p10_ms'"),
                _number(item.get("p90_ms"), f"{where}: 'p90_ms'"),
                status,
                _string(item.get("path"), f"{where}: 'path'"),
                _string(item.get("path_text"), f"{where}: 'path_text'"),
            )
        )
    if not segments:
        raise UserInputError(f"{name}: the budget has no segments")
    total = budget.get("total_ms")
    total_ms = (
        _number(total, f"{name}: budget 'total_ms'", optional=False)
        if total is not None
        else sum(s.ms for s in segments if s.ms is not None)
    )
    missing = tuple(s.component for s in segments if s.status == "missing")
    complete = budget.get("complete", not missing)
    if not isinstance(complete, bool):
        raise UserInputError(f"{name}: budget 'complete' is {complete!r}, not true or false")
    return _Side(
        _string(budget.get("model"), f"{name}: budget 'model'"),
        _string(budget.get("deployment"), f"{name}: budget 'deployment'"),
        tuple(segments),
        total_ms or 0.0,
        complete and not missing,
        missing,
    )


def load_budget_document(path: str | Path) -> dict[str, Any]:
    """The JSON document at `path` (a budget or a document holding one), checked to hold a readable budget.
    One-line UserInputError naming the file: unreadable, not JSON, no budget, a malformed segment."""
    p = Path(path)
    try:
        text = jsonio.read_bounded(p).decode("utf-8")  # a FIFO or device is refused unread
    except UnicodeDecodeError as exc:
        raise UserInputError(f"{path}: cannot read: {exc}") from None
    try:
        document = jsonio.loads(text, source=str(path))  # nesting, huge numbers, NaN: one line naming the file
    except json.JSONDecodeError as exc:
        raise UserInputError(f"{path}: not JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})") from None
    if not isinstance(document, dict):
        raise UserInputError(f"{path}: expected a JSON object with a budget, got {type(document).__name__}")
    _side(document, str(path))
    return document


# --------------------------------------------------------------------------------------------- diff


def _noise_ms(baseline: _Seg | None, current: _Seg | None) -> float:
    """The threshold a move must exceed (module docstring): both spreads, the absolute and the relative floor."""
    reference = baseline.known_ms if baseline is not None else None
    if reference is None and current is not None:
        reference = current.known_ms
    spreads = [s.spread_ms for s in (baseline, current) if s is not None]
    return max(*spreads, NOISE_FLOOR_MS, RELATIVE_FLOOR * (reference or 0.0))


def _figure_kind(status: str) -> str:
    """What a figure of this status is: a measurement (interpolated between measured points counts as one), a
    prediction beyond this host's measured points (extrapolated, transferred), or a roofline estimate. Figures of two
    kinds compare only as how far one was off, never as a change of the host."""
    if status == "interpolated":
        return "measured"
    return "predicted" if status in CURVE_STATUSES else status


def _delta(component: str, before: _Seg | None, after: _Seg | None) -> ComponentDelta:
    either = after if after is not None else before
    label = either.label if either is not None else _label(component)
    b = before.known_ms if before is not None else None
    a = after.known_ms if after is not None else None
    if before is not None and after is not None:
        change = "changed" if a is not None and b is not None else "unknown"
        delta = a - b if a is not None and b is not None else None
        if change == "changed" and _figure_kind(before.status) != _figure_kind(after.status):
            change = "estimate"
    elif after is not None:
        change, delta = ("added", a) if a is not None else ("unknown", None)
    else:
        change, delta = ("removed", -b) if b is not None else ("unknown", None)
    noise = _noise_ms(before, after)
    return ComponentDelta(
        component=component,
        label=label,
        baseline_ms=b,
        current_ms=a,
        delta_ms=delta,
        ratio=a / b if a is not None and b else None,
        significant=delta is not None and change != "estimate" and abs(delta) > noise,
        change=change,
        noise_ms=noise,
        baseline_status=before.status if before is not None else ABSENT,
        current_status=after.status if after is not None else ABSENT,
    )


def diff_budgets(
    baseline: Mapping[str, Any],
    current: Mapping[str, Any],
    *,
    baseline_name: str = "baseline",
    current_name: str = "current",
) -> BudgetDiff:
    """Compare two budgets per component (`Budget.to_dict()` mappings, or documents holding one under "budget").

    Different models, TP, hardware or device kinds do not compare (`BudgetDiff.not_comparable` says what differs,
    no component is compared); other deployment differences compare with a note. Malformed input raises a one-line
    UserInputError naming `baseline_name` or `current_name` (file paths, in the CLI) and the problem."""
    old = _side(baseline, baseline_name)
    new = _side(current, current_name)
    differs = not_comparable(
        BudgetIdentity.of(find_budget(baseline, baseline_name)), BudgetIdentity.of(find_budget(current, current_name))
    )
    now_straggler = straggler_in(find_budget(current, current_name))
    was_straggler = straggler_in(find_budget(baseline, baseline_name))
    before = {s.component: s for s in old.segments}
    after = {s.component: s for s in new.segments}
    order = [s.component for s in new.segments] + [s.component for s in old.segments if s.component not in after]
    deltas = [] if differs else [_delta(c, before.get(c), after.get(c)) for c in order]
    rank = {c: i for i, c in enumerate(order)}
    deltas.sort(key=lambda d: (d.delta_ms is None, -(d.delta_ms or 0.0), rank[d.component]))
    notes: list[str] = []
    if old.model != new.model and not differs:
        notes.append(f"different models: baseline {old.model or '?'}, now {new.model or '?'}")
    if old.deployment != new.deployment and not differs:
        notes.append(f"different deployments: baseline {old.deployment or '?'}, now {new.deployment or '?'}")
    for side, what in ((old, "baseline"), (new, "current budget")):
        if side.missing:
            notes.append(
                f"the {what} misses data for {', '.join(_label(c) for c in side.missing)}: no Δ there, and its total "
                "is a lower bound"
            )
    mean_before, mean_after = _mean_step(baseline, baseline_name), _mean_step(current, current_name)
    path_before, path_after = _allreduce_path(old), _allreduce_path(new)
    if path_before == path_after and _allreduce_path(old, short=False) != _allreduce_path(new, short=False):
        path_before, path_after = _allreduce_path(old, short=False), _allreduce_path(new, short=False)
    return BudgetDiff(
        baseline_model=old.model,
        baseline_deployment=old.deployment,
        current_model=new.model,
        current_deployment=new.deployment,
        components=tuple(deltas),
        total_before_ms=old.total_ms,
        total_after_ms=new.total_ms,
        complete_before=old.complete,
        complete_after=new.complete,
        notes=tuple(notes),
        straggler=now_straggler[1] if now_straggler is not None else "",
        straggler_before=was_straggler[0] if was_straggler is not None else "",
        mean_before_ms=mean_before,
        mean_after_ms=mean_after,
        tail_moved=not differs and _tail_moved(old.total_ms, mean_before, new.total_ms, mean_after),
        allreduce_path_before=path_before,
        allreduce_path_after=path_after,
        not_comparable=differs,
        likely_cause=contention_in(find_budget(current, current_name)),
    )


def _allreduce_path(side: _Side, *, short: bool = True) -> str:
    """The all-reduce path a budget assumed, '' where it names none: the communication segment's (else the first
    segment's that names one). `short`: its words without the why ('custom one-shot ≤ 1 MiB, NCCL above', 'NCCL
    assumed'), else the whole text, so two paths that read alike short still tell apart."""
    named = [s for s in side.segments if s.path or s.path_text]
    seg = next((s for s in named if s.component == Component.COMMUNICATION.value), named[0] if named else None)
    if seg is None:
        return ""
    if not short:
        return f"{seg.path}: {seg.path_text}" if seg.path and seg.path_text else seg.path or seg.path_text
    text = seg.path_text.split(" (", 1)[0].split(":", 1)[0].strip()
    return text or seg.path


def _mean_step(document: object, name: str) -> float | None:
    """The budget's mean step in ms (`mean_total_ms`), or None where the file has none (older files)."""
    value = find_budget(document, name).get("mean_total_ms")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not OBSERVED_MS.accepts(value):
        return None
    return float(value)


def _tail_moved(median_before: float, mean_before: float | None, median_after: float, mean_after: float | None) -> bool:
    """True when the mean step rose beyond TAIL_FLOOR and the floors while the tail (mean − median) more than
    doubled: what a time-sliced GPU or host jitter does to a step whose medians stay put."""
    if mean_before is None or mean_after is None:
        return False
    rise = mean_after - mean_before
    floor = max(NOISE_FLOOR_MS, TAIL_FLOOR * mean_before)
    tail_before = max(mean_before - median_before, 0.0)
    tail_after = mean_after - median_after
    return rise > floor and tail_after > 2 * tail_before + NOISE_FLOOR_MS


def tail_line(diff: BudgetDiff) -> str:
    """ "the tail moved: mean step 2.45 → 4.67 ms (+2.21 ms, ×1.9) while the medians held (…)", or ""."""
    if not diff.tail_moved or diff.mean_before_ms is None or diff.mean_after_ms is None:
        return ""
    rise = diff.mean_after_ms - diff.mean_before_ms
    return (
        f"the tail moved: mean step {diff.mean_before_ms:.3g} → {diff.mean_after_ms:.3g} ms ({_signed(rise)} ms, "
        f"×{diff.mean_after_ms / diff.mean_before_ms:.1f}) while the medians held — time slicing on a shared GPU or "
        "host jitter; throughput pays the mean"
    )


def diff_budget_files(baseline_path: str | Path, current_path: str | Path) -> BudgetDiff:
    """`diff_budgets` over two JSON files (earlier `--json` outputs); errors name the file."""
    old = load_budget_document(baseline_path)
    new = load_budget_document(current_path)
    return diff_budgets(old, new, baseline_name=str(baseline_path), current_name=str(current_path))


# --------------------------------------------------------------------------------------------- text


#: Finest Δ shown, ms: 1 µs. A step budget's components are tens of µs and up; finer digits are noise.
DELTA_RESOLUTION_MS = 0.001


def _signed(value: float) -> str:
    """A signed Δ in ms: 3 significant digits, rounded to 1 µs ("+0.062", "-0.016", "+1.12", "0")."""
    if abs(value) < DELTA_RESOLUTION_MS / 2:
        return "0"
    return ("-" if value < 0 else "+") + f"{round(abs(value), 3):.3g}"


def moved_most_line(diff: BudgetDiff) -> str:
    """ "moved most: attention (+0.612 ms, ×1.9)" or "no component moved beyond its noise"."""
    most = diff.moved_most
    if most is None:
        down = [d for d in diff.moved if d.delta_ms is not None and d.delta_ms < 0]
        if down:
            return "no component got slower beyond its noise (faster: " + ", ".join(d.label for d in down) + ")"
        return "no component moved beyond its noise"
    ratio = f"×{most.ratio:.1f}" if most.ratio is not None else most.change
    return f"moved most: {most.label} ({_signed(most.delta_ms or 0.0)} ms, {ratio})"


def allreduce_path_line(diff: BudgetDiff) -> str:
    """ "all-reduce path: NCCL assumed → custom one-shot ≤ 1 MiB, NCCL above", or "" where it did not change (or a
    file names no path)."""
    if not diff.allreduce_path_changed:
        return ""
    return f"all-reduce path: {diff.allreduce_path_before} → {diff.allreduce_path_after}"


def format_budget_diff(diff: BudgetDiff, baseline_name: str) -> str:
    """The diff as text: a title naming the baseline, one row per component (before, after, Δ, ×, the noise it had
    to exceed, and what happened), the totals, the notes and the "moved most" line."""

    def ms(value: float | None, status: str) -> str:
        if value is not None:
            return format_number(value)
        return "missing" if status == "missing" else "-"

    rows: list[list[str]] = []
    for d in diff.components:
        if d.change in ("added", "removed"):
            note = d.change + (", moved" if d.significant else "")
        elif d.change == "unknown":
            note = "data missing"
        elif d.change == "estimate":
            note = "estimate vs measured"
        elif d.significant:
            note = "moved ▲" if (d.delta_ms or 0.0) > 0 else "moved ▼"
        else:
            note = ""
        rows.append(
            [
                d.label,
                ms(d.baseline_ms, d.baseline_status),
                ms(d.current_ms, d.current_status),
                _signed(d.delta_ms) if d.delta_ms is not None else "-",
                f"{d.ratio:.2f}" if d.ratio is not None else "-",
                format_number(d.noise_ms) if d.change != "unknown" else "-",
                note,
            ]
        )
    total_ratio = diff.total_after_ms / diff.total_before_ms if diff.total_before_ms > 0 else None
    rows.append(
        [
            "total" + ("" if diff.complete_before and diff.complete_after else " (≥, incomplete)"),
            format_number(diff.total_before_ms),
            format_number(diff.total_after_ms),
            _signed(diff.total_delta_ms),
            f"{total_ratio:.2f}" if total_ratio is not None else "-",
            "",
            "",
        ]
    )
    what = diff.current_model or diff.baseline_model
    if not diff.comparable:
        return f"vs baseline {baseline_name}: {not_comparable_line(diff.not_comparable)}\n"
    lines = [f"vs baseline {baseline_name}" + (f" ({what})" if what else "") + ": ms per decode step"]
    lines.append(table(["component", "before ms", "after ms", "Δ ms", "×", "noise ms", "note"], rows, "lrrrrrl"))
    lines.extend(f"note: {n}" for n in diff.notes)
    lines.append(moved_most_line(diff))
    if allreduce_path_line(diff):
        lines.append(allreduce_path_line(diff))
    if tail_line(diff):
        lines.append(tail_line(diff))
    if diff.likely_cause:  # what the moves above most likely measure
        lines.append(diff.likely_cause)
    if diff.straggler:
        lines.append(
            diff.straggler + (f" (the baseline's too: {diff.straggler_before})" if diff.straggler_before else "")
        )
    elif diff.straggler_before:
        lines.append(f"no straggler now (the baseline's was {diff.straggler_before})")
    return "\n".join(lines) + "\n"
