"""Provides the what-if screen's views: a predicted `Variant` as the row the comparison draws (its bar segments,
step ms with its 80 % range, calibrated ms, tok/s per sequence and in all, the limiting component, Δ against now,
the labels that say how far each figure is from a measurement), the screen's header lines, and the chart's series
over one axis. Pure: every figure is the composition's, only formatted here."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from decodetop.budget.compose import Budget
from decodetop.budget.segment import CURVE_STATUSES
from decodetop.pipeline.composition import CPU_HARDWARE
from decodetop.pipeline.whatif import Variant
from decodetop.tui.screens.whatif_knobs import Axis, KnobState
from decodetop.tui.sources.whatif import WhatIfPredictor

NO_RESULTS = (
    "no probe results yet: every figure is a roofline estimate for {hardware}, not this host's curves; "
    "R on the main screen runs the plan that measures them (decodetop probe --model M --budget, headless)"
)


@dataclass(frozen=True)
class BarPart:
    """One component's share of a deployment's bar."""

    key: str
    """The component (`decodetop.budget.components.Component` value): its colour and fill pattern."""
    label: str
    ms: float
    estimated: bool
    """A roofline estimate (drawn dimmed, as on the main screen)."""


@dataclass(frozen=True)
class DeploymentRow:
    """One deployment of the comparison: the current one or the variant."""

    name: str
    """'now' or 'variant'."""
    knobs: str
    """'tp=4 batch=8' ('as now' for a variant with nothing turned)."""
    parts: tuple[BarPart, ...] = ()
    step_ms: float | None = None
    """The step (None: incomplete or refused; `total_ms` is then a lower bound)."""
    total_ms: float | None = None
    range_ms: tuple[float, float] | None = None
    calibrated_ms: float | None = None
    tokens_per_s: float | None = None
    tokens_per_s_total: float | None = None
    limiting: str = ""
    delta_pct: float | None = None
    """Step change against now, % (None for now itself or without a step)."""
    labels: tuple[str, ...] = ()
    """'CPU', 'measured', 'interpolated', 'extrapolated', 'transferred', 'roofline' (an incomplete budget says so
    in `problem`)."""
    weakest: str = ""
    problem: str = ""
    """Why it cannot be served so, or what does not fit ('' when it can)."""


@dataclass(frozen=True)
class WhatIfView:
    """What the comparison shows."""

    title: str
    lines: tuple[str, ...]
    """Where the figures come from, the budget's header (CPU ranks, another GPU), the calibration."""
    now: DeploymentRow
    variant: DeploymentRow


@dataclass(frozen=True)
class AxisSeries:
    """The chart: tok/s over one knob's values, the other knobs at the variant's."""

    title: str
    values: tuple[str, ...]
    """The knob's values as tick labels ('4K')."""
    tokens_per_s: tuple[float | None, ...]
    tokens_per_s_total: tuple[float | None, ...]
    now_index: int
    variant_index: int
    target_tps: float
    notes: tuple[str, ...] = ()
    """The points without a figure or that do not fit, and why."""


def labels_of(budget: Budget) -> tuple[str, ...]:
    """How far a budget's figures are from a measurement, in the words the CLI's rows use ('measured' only where
    the budget is complete and nothing was predicted)."""
    statuses = {s.status for s in budget.segments}
    out = ["CPU"] if budget.device_kind == "cpu" else []
    out.extend(s for s in CURVE_STATUSES if s in statuses)
    if any(s.estimated for s in budget.segments):
        out.append("roofline")
    if budget.complete and not any(x in out for x in (*CURVE_STATUSES, "roofline")):
        out.append("measured")
    return tuple(out)


def deployment_row(name: str, v: Variant, now: Variant | None) -> DeploymentRow:
    """`v` as a row of the comparison (`now`: what Δ is taken against; None for now itself)."""
    knobs = v.label if now is not None else "the current deployment"
    if now is not None and not v.knobs:
        knobs = "as now: turn a knob"
    b = v.budget
    if b is None:
        return DeploymentRow(name, knobs, problem=f"cannot be served so: {v.refused}", labels=("refused",))
    parts = tuple(BarPart(s.component, s.label, s.ms, s.estimated) for s in b.segments if s.ms)
    delta = None
    if now is not None and v.knobs and v.step_ms is not None and now.step_ms:
        delta = (v.step_ms / now.step_ms - 1.0) * 100.0
    missing = f"incomplete: {', '.join(b.missing)} without a figure" if not b.complete else ""
    return DeploymentRow(
        name,
        knobs,
        parts=parts,
        step_ms=v.step_ms,
        total_ms=b.total_ms,
        range_ms=v.range_ms,
        calibrated_ms=v.calibrated_ms,
        tokens_per_s=v.tokens_per_s,
        tokens_per_s_total=v.tokens_per_s_total,
        limiting=v.limiting,
        delta_pct=delta,
        labels=labels_of(b),
        weakest=b.weakest,
        problem="; ".join(p for p in (v.fit_text, missing) if p),
    )


def whatif_view(predictor: WhatIfPredictor, variant: Variant) -> WhatIfView:
    """The comparison of the current deployment and `variant` (predicted by `predictor`: this only formats)."""
    now = predictor.now
    b = now.budget
    assert b is not None and now.scenario is not None
    lines = [line for line in b.header.splitlines() if line]  # CPU ranks, another GPU: the label that matters most
    lines.append(source_line(predictor))
    lines.append(predictor.calibration.text if predictor.calibration is not None else predictor.calibration_note)
    return WhatIfView(
        title=f"what-if · {now.scenario.spec.name}: the current deployment (now) beside a variant",
        lines=tuple(lines),
        now=deployment_row("now", now, None),
        variant=deployment_row("variant", variant, now),
    )


def source_line(predictor: WhatIfPredictor) -> str:
    """Where the figures come from, in words (the results, or none: the roofline)."""
    base = predictor.base
    results = [r for r in base.results if r.ok]
    b = predictor.now.budget
    assert b is not None
    if not results:
        return NO_RESULTS.format(hardware=b.hardware_text or CPU_HARDWARE)
    stored = sum(1 for r in results if r.probe in base.stored_at_s)
    where = f"{len(results)} probe results of this host" + (f" ({stored} stored)" if stored else "")
    return f"from the curves of {where}; no probing here"


def tick_label(value: str) -> str:
    """A knob value as a tick: 4096 → '4K', 131072 → '128K'."""
    if value.isdigit() and int(value) >= 1024 and int(value) % 1024 == 0:
        return f"{int(value) // 1024}K"
    return value


def axis_points(axis: Axis, state: KnobState) -> list[Mapping[str, str]]:
    """The knobs of each point of the chart: the variant's, with the axis knob at each of its values."""
    return [state.with_value(axis.knob.name, value).turned for value in axis.values]


def axis_series(axis: Axis, state: KnobState, variants: Sequence[Variant], target_tps: float) -> AxisSeries:
    """The chart's series from the predictions of `axis_points(axis, state)`."""
    why: dict[str, list[str]] = {}
    for value, v in zip(axis.values, variants, strict=True):
        what = v.refused or v.fit_text or ("" if v.step_ms is not None else "incomplete")
        if what:  # one note per reason ('weights do not fit'), the values it holds for listed
            why.setdefault(what.split(":")[0], []).append(tick_label(value))
    name = axis.knob.name
    return AxisSeries(
        title=f"tok/s over {axis.knob.title}",
        values=tuple(tick_label(v) for v in axis.values),
        tokens_per_s=tuple(v.tokens_per_s for v in variants),
        tokens_per_s_total=tuple(v.tokens_per_s_total for v in variants),
        now_index=axis.values.index(state.now[name]),
        variant_index=axis.values.index(state.value(name)),
        target_tps=target_tps,
        notes=tuple(f"{axis.knob.title} {', '.join(values)}: {reason}" for reason, values in why.items()),
    )
