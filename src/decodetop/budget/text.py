"""Provides the budget as text lines, the same in `decodetop budget` and `decodetop probe --budget`: one row per
component with its ms, share of the observed step, status, bar and provenance; the total and the unexplained
remainder; the observed / target / roofline line and the verdict; the mean step and the ranks (stdlib only)."""

from __future__ import annotations

from decodetop.budget.compose import Budget
from decodetop.budget.kernels import kernels_short
from decodetop.budget.ranks import STRAGGLER_RULE
from decodetop.budget.remainder import remainder_text
from decodetop.textfmt import format_number, table

TEXT_BAR_WIDTH = 40
MEASURED_CHAR = "█"
ESTIMATED_CHAR = "▒"
REMAINDER_CHAR = "░"


def _bar(ms: float | None, scale: float, char: str) -> str:
    if ms is None or scale <= 0:
        return "?"
    cells = ms / scale * TEXT_BAR_WIDTH
    full = int(cells)
    text = char * full
    if cells - full >= 0.5 or (ms > 0 and not text):
        text += "▌" if char == MEASURED_CHAR else char
    return text


def observed_line(budget: Budget) -> str:
    """'observed 95 ms assumed, not observed (…) | target 309 tok/s = 3.24 ms/step | roofline 4.17 ms/step …'."""
    obs = budget.observed_step
    roof = (
        f"roofline {format_number(budget.roofline_ms)} ms/step for {budget.hardware_text}"
        if budget.roofline_ms is not None
        else f"roofline: {budget.hardware_text or 'n/a here'}"
    )
    return (
        f"observed {obs.text} | target {format_number(budget.target_tps)} tok/s = "
        f"{format_number(budget.target_ms)} ms/step | {roof}"
    )


def format_budget_table(budget: Budget, *, bars: bool = True) -> list[str]:
    """The budget as text lines, the same in `decodetop budget` and `decodetop probe --budget`: a header (CPU ranks),
    one row per component with ms, share of observed, status, bar (measured █, estimated ▒) and where the figure came
    from, with the class of kernel it was timed with ('measured in this run (Triton)'); total and unexplained; the
    observed/target/roofline line; the roofline verdict; the summary."""
    b = budget
    scale = max(b.observed_ms, b.total_ms, 1e-9)
    rows: list[list[object]] = []
    for seg in b.segments:
        share = f"{seg.ms / b.observed_ms * 100:.1f}%" if seg.ms is not None else "-"
        char = ESTIMATED_CHAR if seg.estimated else MEASURED_CHAR
        row: list[object] = [seg.label, format_number(seg.ms) if seg.ms is not None else "missing", share, seg.status]
        if bars:
            row.append(_bar(seg.ms, scale, char))
        row.append(seg.provenance + (f" ({kernels_short(seg.kernels)})" if seg.kernels else ""))
        rows.append(row)
    total: list[object] = [
        "total" + ("" if b.complete else " (≥, incomplete)"),
        format_number(b.total_ms),
        f"{b.total_ms / b.observed_ms * 100:.1f}%",
        "",
    ]
    un = b.unexplained
    left = un.ms or 0.0
    over = left < 0  # the parts exceed the observed step: said in words, never as a negative remainder
    rest: list[object] = [
        "over observed" if over else "unexplained" + ("" if b.complete else " (≤)"),
        format_number(abs(left)),
        f"{abs(left) / b.observed_ms * 100:.1f}%",
        un.status,
    ]
    if bars:
        total.append(_bar(b.total_ms, scale, MEASURED_CHAR))
        rest.append(_bar(max(un.ms or 0.0, 0.0), scale, REMAINDER_CHAR))
    total.append("")
    reason = remainder_text(left, complete=b.complete) if over else un.reason
    rest.append(reason + ("; the observed step is assumed, not observed" if b.observed_step.assumed else ""))
    rows += [total, rest]
    headers = ["component", "ms", "of observed", "status", *(["bar"] if bars else []), "where it came from"]
    lines: list[str] = [line for line in (b.header, *b.warnings) if line]
    lines.append(table(headers, rows, align="lrrl" + ("l" if bars else "") + "l"))
    lines.append(observed_line(b))
    if b.verdict:
        lines.append(b.verdict)
    lines.append(b.summary() + (f"; estimates for {b.hardware_text}" if any(s.estimated for s in b.segments) else ""))
    lines.extend(range_lines(b))
    lines.extend(line for line in (mean_line(b), *rank_lines(b)) if line)
    if b.contention:  # what the figures above measure besides the host
        lines.append(b.contention.line())
    return lines


def range_lines(budget: Budget) -> list[str]:
    """Where the curve engine predicted a figure: the total's 80 % range, its weakest figure and the component that
    dominates its uncertainty, then the engine's self-check on this host's curves (nothing where all was measured)."""
    b = budget
    if b.self_check is None or b.range_p10_ms is None or b.range_p90_ms is None:
        return []
    parts = [f"80 % range of the total {format_number(b.range_p10_ms)}–{format_number(b.range_p90_ms)} ms"]
    if b.weakest:
        parts.append(f"weakest figure: {b.weakest}")
    if b.dominant:
        parts.append(f"most of the uncertainty: {b.dominant}")
    if any(s.estimated for s in b.segments):
        parts.append("roofline estimates carry no range")
    lines = ["; ".join(parts)]
    checks = b.self_check.lines()
    if checks:
        lines.append("self-check (leave-one-out on this host's curves): " + "; ".join(checks))
    return lines


def mean_line(budget: Budget) -> str:
    """'mean step 1.31 ms = 763 tok/s (means: what throughput pays; the rows are medians); step p50 / p90 / p99
    1.30 / 1.42 / 1.51 ms' ('' when nothing was measured)."""
    tps = budget.mean_tokens_per_s
    if tps is None or not any(s.status in ("measured", "interpolated") for s in budget.segments):
        return ""  # estimates only: no samples, so no mean to tell from the median
    ge, le = ("", "") if budget.complete else ("≥ ", "≤ ")
    line = (
        f"mean step {ge}{budget.mean_total_ms:.3g} ms = {le}{tps:.4g} tok/s (means: what throughput pays; the rows "
        "are medians)"
    )
    spread = budget.step_percentiles()
    if spread is not None:
        line += f"; step p50 / p90 / p99 {spread['p50']:.3g} / {spread['p90']:.3g} / {spread['p99']:.3g} ms"
    return line


def rank_lines(budget: Budget) -> list[str]:
    """The per-rank line and the straggler line (or that no rank stands out); empty for a one-rank budget."""
    spread = budget.ranks
    if spread is None:
        return []
    lines = [spread.line()]
    if spread.straggler is not None:
        lines.append(spread.straggler.text)
    else:
        lines.append(f"no straggler: no rank stands out (the rule: {STRAGGLER_RULE})")
    return lines
