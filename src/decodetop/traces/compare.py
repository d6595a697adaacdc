"""Provides `compare`: the probe-composed budget bar against the traced bar, component by component.

The budget may be a `decodetop.budget.compose.Budget`, the JSON that `decodetop budget --json` prints (or its
"budget" member, `Budget.to_dict()`), or a plain mapping of component → ms. Whatever it is, the difference per
component is the finding, and the biggest kernel behind a traced component is named in it. Every budget figure is
labelled by its source (`budget_sources`): probed (measured in this run), stored (measured earlier: the history or
a file) or roofline (an estimate) — a roofline figure is never called probed.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path

from decodetop import jsonio
from decodetop.budget.components import UNEXPLAINED_KEY, Component
from decodetop.budget.compose import Budget
from decodetop.budget.kernels import KernelClass, kernels_short
from decodetop.errors import UserInputError
from decodetop.quantity import COMPONENT_MS
from decodetop.textfmt import shorten
from decodetop.traces.trace_report import LAUNCH_KEY, Comparison, ComparisonRow, KernelStat, TraceReport

NAMED_SHARE = 0.3
"""A kernel is named in a component's finding when it carries at least this share of the component's time."""

VIA_CHARS = 100
"""Characters of a kernel's enclosing operators or module shown ('aten::to>aten::_to_copy>aten::copy_ in
attention' is 60; a crafted one of 100,000 would otherwise fill thousands of lines)."""

_NS = re.compile(r"\(anonymous namespace\)::|\b(?:[A-Za-z_]\w*::)+")


_WRAPPERS = (
    "unrolled_elementwise_kernel",
    "vectorized_elementwise_kernel",
    "elementwise_kernel",
    "index_elementwise_kernel",
    "reduce_kernel",
    "elementwise_kernel_with_index",
)
_GENERIC = {
    "gpu_kernel_impl",
    "gpu_kernel_impl_nocast",
    "BinaryFunctor",
    "AUnaryFunctor",
    "BUnaryFunctor",
    "ReduceOp",
    "func_wrapper_t",
}
_TELLING = re.compile(r"[A-Za-z_]\w*(?:kernel|Functor|Ops|_impl|_out)\w*")


def short_name(name: str, width: int = 60) -> str:
    """A kernel name without 'void' and namespaces; PyTorch's generic elementwise/reduce wrappers are shown with
    the functor they run (`unrolled_elementwise_kernel<direct_copy_kernel_cuda>`); cut at `width` characters."""
    if name.startswith("aten::"):  # a CPU operator: the namespace is part of its name
        return name if len(name) <= width else name[: width - 1] + "…"
    text = name[5:] if name.startswith("void ") else name
    text = _NS.sub("", text)
    outer = text.split("<", 1)[0]
    if outer in _WRAPPERS and "<" in text:
        inner = next((m for m in _TELLING.findall(text.split("<", 1)[1]) if m not in _GENERIC), None)
        if inner:
            text = f"{outer}<{inner}>"
    return text if len(text) <= width else text[: width - 1] + "…"


def budget_ms(budget: object) -> dict[str, float | None]:
    """Per-component ms of a budget in any of the accepted forms (see module docstring)."""
    if isinstance(budget, Budget):
        return {s.component: _ms(s.ms) for s in budget.segments}
    if isinstance(budget, Mapping):
        if isinstance(budget.get("budget"), Mapping):
            return budget_ms(budget["budget"])
        segs = budget.get("segments")
        if isinstance(segs, list):
            out: dict[str, float | None] = {}
            for seg in segs:
                if isinstance(seg, Mapping) and "component" in seg:
                    out[str(seg["component"])] = _ms(seg.get("ms"), f"segment {shorten(seg['component'], 60)!r} ms")
            return out
        flat: dict[str, float | None] = {}
        for key, raw in budget.items():
            value = raw.get("ms") if isinstance(raw, Mapping) else raw
            if isinstance(value, (int, float)) or value is None:
                flat[str(key)] = _ms(value, f"{shorten(key, 60)!r}")
        if flat:
            return flat
    raise UserInputError("budget: expected a Budget, `decodetop budget --json` output, or {component: ms}")


def budget_kernels(budget: object) -> dict[str, str]:
    """Per component, the short labels of the kernel classes its probed figure came from ('Triton', 'engine
    flashinfer', 'torch', 'CPU'); components whose budget says none are left out (older files, plain mappings)."""
    if isinstance(budget, Budget):
        return {s.component: kernels_short(s.kernels) for s in budget.segments if s.kernels}
    if not isinstance(budget, Mapping):
        return {}
    if isinstance(budget.get("budget"), Mapping):
        return budget_kernels(budget["budget"])
    out: dict[str, str] = {}
    segs = budget.get("segments")
    for seg in segs if isinstance(segs, list) else ():
        raw = seg.get("kernels") if isinstance(seg, Mapping) else None
        if not isinstance(raw, list) or "component" not in seg:
            continue
        try:
            classes = tuple(KernelClass.from_dict(k) for k in raw if isinstance(k, Mapping))
        except UserInputError:
            continue
        if classes:
            out[str(seg["component"])] = kernels_short(classes)
    return out


FIGURE_SOURCES = ("probed", "stored", "roofline")
"""Where a budget figure came from, in the word every surface prints: measured in this run, measured earlier (the
results history, a file), a roofline estimate."""


def figure_source(status: object, provenance_kind: object, *, stored: bool) -> str:
    """One segment's source word from its status and provenance kind (`decodetop.budget.compose`); `stored`: the
    budget was read back (a file, the history), so what was measured then is stored now. '' for no figure."""
    if status == "missing" or provenance_kind in ("missing", "not_applicable"):
        return ""
    if status == "estimated" or provenance_kind == "estimate":
        return "roofline"
    if stored or provenance_kind == "measured_earlier":
        return "stored"
    return "probed"


def budget_sources(budget: object, *, stored: bool = False) -> dict[str, str]:
    """Component → source word ('probed', 'stored', 'roofline'; '' without a figure) of a budget in any accepted
    form; a JSON budget or a plain {component: ms} mapping is a file read back, so its measurements are stored."""
    if isinstance(budget, Budget):
        return {s.component: figure_source(s.status, s.provenance_kind, stored=stored) for s in budget.segments}
    if isinstance(budget, Mapping):
        if isinstance(budget.get("budget"), Mapping):
            return budget_sources(budget["budget"], stored=True)
        segs = budget.get("segments")
        if isinstance(segs, list):
            return {
                str(seg["component"]): figure_source(seg.get("status"), seg.get("provenance_kind"), stored=True)
                for seg in segs
                if isinstance(seg, Mapping) and "component" in seg
            }
        return {str(k): "stored" for k in budget}
    return {}


def source_word(sources: Mapping[str, str]) -> str:
    """The one source word of a budget's figures where they all agree, else 'budget' (a mix)."""
    words = {w for w in sources.values() if w}
    return words.pop() if len(words) == 1 else "budget"


def _ms(value: object, where: str = "a component's ms") -> float | None:
    """A component's time from a budget: None where there is none; a number outside `COMPONENT_MS` (negative,
    NaN, 1e308, an integer no float holds) is a one-line `UserInputError` naming the component."""
    if value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return COMPONENT_MS.check(value, where)


def load_budget_json(path: str | Path) -> Mapping[str, object]:
    """Read a budget JSON file (any form `budget_ms` accepts, checked to give figures) with one-line errors."""
    try:
        data = jsonio.loads(jsonio.read_bounded(path), source=str(path))  # bounded; hostile JSON named
    except OSError as exc:
        raise UserInputError(f"{path}: cannot read budget: {exc.strerror or exc}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise UserInputError(f"{path}: not a JSON budget ({exc})") from None
    try:
        budget_ms(data)
    except UserInputError as exc:
        raise UserInputError(f"{path}: {exc}") from None
    if not isinstance(data, Mapping):
        raise UserInputError(f"{path}: expected a JSON object with a budget")
    return data


def _fmt(ms: float | None) -> str:
    if ms is None:
        return "?"
    return f"{ms:.3g} ms" if ms >= 0.01 else f"{ms * 1000:.3g} µs"


def _named(top: tuple[KernelStat, ...], total_ms: float) -> str:
    if not top or total_ms <= 0:
        return ""
    k = top[0]
    k_ms = k.time_us_per_step / 1000
    if k_ms < NAMED_SHARE * total_ms:
        return ""
    via = f" ({shorten(k.via, VIA_CHARS)})" if k.via else ""
    return f", of which {_fmt(k_ms)} is `{short_name(k.name, 60)}`{via}"


def compare(report: TraceReport, budget: object, sources: Mapping[str, str] | None = None) -> Comparison:
    """Row per component: the budget's ms (labelled by its source: `sources`, else `budget_sources(budget)`), the
    trace's ms per step, the difference and the finding."""
    probed = budget_ms(budget)
    kernels = budget_kernels(budget)
    sources = dict(sources) if sources is not None else budget_sources(budget)
    traced = report.traced_ms()
    rows: list[ComparisonRow] = []
    keys = [c.value for c in Component]
    keys += sorted(k for k in traced if k not in keys)
    for key in keys:
        p = probed.get(key)
        t = traced.get(key, 0.0)
        if p is None and t == 0.0 and key not in probed:
            continue
        bucket = report.bucket(key)
        try:
            label = Component(key).label
        except ValueError:
            label = bucket.label if bucket else key
        source = sources.get(key, "")
        said = f"{source or 'budget'} {_fmt(p)}"
        if key == LAUNCH_KEY:
            finding = f"{label}: {said}, traced {_fmt(t)} of GPU idle inside the step (host-bound gaps" + (
                f"; {report.kernels_per_step_mean:.0f} kernels per step)" if report.kernels_per_step_mean else ")"
            )
        elif key in {c.value for c in Component}:
            how = f" ({kernels[key]})" if key in kernels else ""
            finding = f"{label}: {said}{how}, traced {_fmt(t)}" + _named(bucket.top if bucket else (), t)
        else:
            finding = f"{label}: not in the budget; traced {_fmt(t)}" + _named(bucket.top if bucket else (), t)
        rows.append(ComparisonRow(key, label, p, t, (t - p) if p is not None else None, finding, source))
    known = [v for k, v in probed.items() if v is not None and k != UNEXPLAINED_KEY]
    notes = []
    if any(v is None for k, v in probed.items() if k != UNEXPLAINED_KEY):
        notes.append("some budget components have no figure (missing measurements): their difference is unknown")
    if report.source == "cpu":
        notes.append("the trace is CPU-only: its times are host times, not comparable with a GPU budget")
    return Comparison(
        rows=tuple(rows),
        probed_total_ms=sum(known) if known else None,
        traced_total_ms=sum(traced.values()),
        traced_step_ms=report.step_wall_us_mean / 1000,
        notes=tuple(notes),
        source=source_word(sources),
    )
