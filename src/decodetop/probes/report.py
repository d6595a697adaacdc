"""Provides plain-text rendering of probe results: one table per probe, with units (stdlib only, no torch)."""

from __future__ import annotations

from collections.abc import Sequence

from decodetop.probes.results import Measurement, MeasurementStatus, ProbeResult, ProbeStatus
from decodetop.textfmt import format_bytes, format_number, table

#: Unit suffixes of metric and parameter keys, as shown in table headers.
_UNIT_SUFFIXES: tuple[tuple[str, str], ...] = (
    ("_gbps", "GB/s"),
    ("_tflops", "TFLOP/s"),
    ("_us", "µs"),
    ("_ms", "ms"),
    ("_s", "s"),
    ("_bytes", ""),
    ("_pct", "%"),
)
#: Metrics not worth a column: the median is already shown, and counts are bookkeeping.
_HIDDEN_METRICS = frozenset({"time_us", "ops_per_sample"})


def header_for(key: str) -> str:
    """'busbw_gbps' → 'busbw GB/s', 'size_bytes' → 'size', 'latency_us' → 'latency µs'."""
    for suffix, unit in _UNIT_SUFFIXES:
        if key.endswith(suffix):
            base = key[: -len(suffix)].replace("_", " ")
            return f"{base} {unit}".strip()
    return key.replace("_", " ")


def _value(key: str, value: object) -> object:
    """A table cell: sizes in bytes as KiB/MiB, floats to a few digits, the rest as given (None: empty)."""
    if value is None:
        return None
    if key.endswith("_bytes") and isinstance(value, (int, float)) and not isinstance(value, bool):
        return format_bytes(value)
    if isinstance(value, float):
        return format_number(value)
    return value


def summary_line(result: ProbeResult) -> str:
    """'allreduce: ok, 2 ranks (gloo, cpu), 8.1 s' or 'launch: failed on rank 1: ValueError: ...'."""
    env = result.environment
    where = f"{result.world_size} ranks"
    if env is not None:
        where += f" ({env.backend}, {env.device_kind})"
    head = f"{result.probe}: {result.status.value}, {where}, {result.duration_s:.1f} s"
    if result.status is ProbeStatus.FAILED:
        rank = f" on rank {result.error_rank}" if result.error_rank is not None else ""
        return f"{head}: failed{rank}: {result.error or result.message}"
    if result.message:
        return f"{head}: {result.message}"
    return head


def measurement_table(measurements: Sequence[Measurement], columns: Sequence[str] = ()) -> str:
    """A table: the measurement (or `columns` of its params), median/p10/p90 with unit, metrics, note."""
    metric_keys: list[str] = []
    for m in measurements:
        metric_keys.extend(k for k in m.metrics if k not in metric_keys and k not in _HIDDEN_METRICS)
    units = sorted({m.unit for m in measurements if m.stats is not None})
    unit = header_for(f"x_{units[0]}")[2:] if len(units) == 1 else ""
    lead = [header_for(c) for c in columns] if columns else ["measurement"]
    headers = [*lead, f"median {unit}".strip(), "p10", "p90", *[header_for(k) for k in metric_keys], "note"]
    rows: list[list[object]] = []
    for m in measurements:
        lead_values = [_value(c, m.params.get(c)) for c in columns] if columns else [m.name]
        stats = m.stats
        note = m.note
        if m.status is not MeasurementStatus.OK:
            note = f"{m.status.value}: {m.note}" if m.note else m.status.value
        rows.append(
            [
                *lead_values,
                _value("", stats.median) if stats else None,
                _value("", stats.p10) if stats else None,
                _value("", stats.p90) if stats else None,
                *[_value(k, m.metrics.get(k)) for k in metric_keys],
                note or None,
            ]
        )
    align = "l" * len(lead) + "r" * (3 + len(metric_keys)) + "l"
    return table(headers, rows, align=align)


def rank_output_line(result: ProbeResult) -> str:
    """'ranks showed 2 warnings: see /…/ranks-….log' when the ranks warned (or failed: their output may say why);
    '' otherwise."""
    if not result.rank_log or (result.rank_warnings == 0 and result.status is not ProbeStatus.FAILED):
        return ""
    if result.rank_warnings:
        plural = "s" if result.rank_warnings != 1 else ""
        return f"ranks showed {result.rank_warnings} warning{plural}: see {result.rank_log}"
    return f"rank output: {result.rank_log}"


def format_result(result: ProbeResult, columns: Sequence[str] = ()) -> str:
    """The summary line, the table (when there are measurements), and where the ranks' output went when it
    matters."""
    parts = [f"== {summary_line(result)}"]
    if result.measurements:
        parts.append(measurement_table(result.measurements, columns))
    line = rank_output_line(result)
    if line:
        parts.append(line)
    return "\n".join(parts)
