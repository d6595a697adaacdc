"""Provides the probes' view types: a `ProbeResult` as its table row and detail screen (the headline point, its
spread, its ranks), and what the history keeps of a result."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime

from decodetop.inert import inert_data
from decodetop.probes.results import Measurement, ProbeResult
from decodetop.textfmt import format_bytes, format_duration_us, format_number
from decodetop.tui.model import ProbeState, ProbeView, RankValue

_STATUS_TO_STATE = {
    "ok": ProbeState.DONE,
    "failed": ProbeState.FAILED,
    "timed_out": ProbeState.TIMED_OUT,
    "unsupported": ProbeState.UNSUPPORTED,
    "cancelled": ProbeState.CANCELLED,
}


def ok_measurements(result: ProbeResult) -> list[Measurement]:
    return [m for m in result.measurements if m.status.value == "ok" and m.stats is not None]


def _fmt_value(value: float, unit: str) -> str:
    if unit == "us":
        return format_duration_us(value)  # 127993 µs reads 128 ms
    if unit == "ms":
        return format_duration_us(value * 1000.0)
    if unit == "gbps":
        return f"{format_number(value)} GB/s"
    return f"{format_number(value)} {unit}".rstrip()


KEY_PARAMS_HIDDEN = frozenset({"batch", "dtype", "kv_dtype", "ranks", "bias", "q_len"})
"""Point-key parameters the label leaves out: the same for every point of a plan (the detail screen has them)."""
KEY_PARAMS_SHOWN = 4
"""At most this many of a point key's parameters in a label (the first ones name the shape)."""
HEADLINE_ROLES = ("budget", "layer", "")
"""Which points make a probe's headline, best first: the figures the budget composes from, a whole layer, a point
of a probe without roles; never a reference copy, a peak, a part of a layer or a diagnostic."""
REFERENCE_POINTS = frozenset({"copy", "peak"})


def _key_label(key: str) -> str:
    """ "gemm:m=1,n=5120,k=8192,batch=1,dtype=bf16" → "m=1 n=5120 k=8192"; zero-valued and plan-wide ones left out."""
    _, _, body = key.partition(":")
    pairs = []
    for part in body.split(","):
        name, sep, value = part.partition("=")
        if sep and name not in KEY_PARAMS_HIDDEN and value not in ("0", ""):
            pairs.append(f"{name}={value}")
    return " ".join(pairs[:KEY_PARAMS_SHOWN])


def _point_label(m: Measurement) -> str:
    params = dict(m.params)
    key = params.get("key")
    what = params.get("what")
    if isinstance(key, str) and ":" in key:
        label = _key_label(key)
        if what == "part":
            label = f"{params.get('layer', '')} part {key.partition(':')[0]}".strip()
        for extra in ("variant", "sampler", "mode"):
            value = params.get(extra)
            if isinstance(value, str):
                label += f" [{value}]"
        return label or m.name
    if what == "layer":
        return f"{params.get('layer', '')} layer {params.get('mode', '')}".strip()
    parts = []
    size = params.pop("size_bytes", params.pop("size", None))
    if isinstance(size, int):
        parts.append(format_bytes(size))
    mode = params.pop("mode", None)
    if isinstance(mode, str):
        parts.append(mode)
    for name in ("what", "shape", "kind", "context", "m", "tokens", "nodes"):
        value = params.pop(name, None)
        if isinstance(value, (int, float, str)):
            parts.append(str(value) if name in ("what", "shape", "kind") else f"{name}={value}")
    parts.extend(f"[{params[extra]}]" for extra in ("variant", "sampler") if isinstance(params.get(extra), str))
    return " ".join(parts) or m.name


def _headline_rank(m: Measurement) -> int:
    role = m.params.get("role", "")
    if m.params.get("what") in REFERENCE_POINTS:
        return len(HEADLINE_ROLES)
    return HEADLINE_ROLES.index(role) if role in HEADLINE_ROLES else len(HEADLINE_ROLES)


def headline_point(result: ProbeResult) -> Measurement | None:
    """The point a probe's row shows: the first good one of the best role (a budget figure before a whole layer
    before a reference copy or a part)."""
    good = ok_measurements(result)
    return min(good, key=_headline_rank) if good else None


def headline(result: ProbeResult) -> str:
    """One line for the table: the headline point's median and where it was taken ("" without a good point)."""
    point = headline_point(result)
    if point is None or point.stats is None:
        return ""
    return f"{_fmt_value(point.stats.median, point.unit)} @ {_point_label(point)}"


def all_unsupported(result: ProbeResult) -> str:
    """The reason when a probe measured nothing because every point is unsupported here ("" otherwise)."""
    points = result.measurements
    if not points or any(m.status.value != "unsupported" for m in points):
        return ""
    notes = sorted({m.note for m in points if m.note})
    return "; ".join(notes) or "every point is unsupported here"


def probe_view(result: ProbeResult, title: str = "") -> ProbeView:
    """A `ProbeResult` as the table row and detail screen."""
    state = _STATUS_TO_STATE.get(result.status.value, ProbeState.FAILED)
    good = ok_measurements(result)
    unsupported = all_unsupported(result)
    if state is ProbeState.DONE and unsupported:
        state = ProbeState.UNSUPPORTED  # "done" with no value would hide that nothing could be measured
    ranks: tuple[RankValue, ...] = ()
    spread = ""
    first = headline_point(result)
    if first is not None:
        assert first.stats is not None
        ranks = tuple(
            RankValue(r.rank, _fmt_value(r.stats.median, first.unit)) for r in first.per_rank if r.stats is not None
        )
        stats = first.stats
        spread = (
            f"p10 {_fmt_value(stats.p10, first.unit)} · p90 {_fmt_value(stats.p90, first.unit)} · "
            f"p99 {_fmt_value(stats.p99, first.unit)} · {stats.count} samples"
        )
        medians = [r.stats.median for r in first.per_rank if r.stats is not None]
        if len(medians) > 1 and min(medians) > 0:
            spread += f" · ranks ±{(max(medians) / min(medians) - 1) * 50:.1f}%"
    details: list[tuple[str, str]] = [
        (f"point {_point_label(m)}", _fmt_value(m.stats.median, m.unit)) for m in good if m.stats
    ]
    details.extend(
        (f"point {_point_label(m)}", f"{m.status.value}: {m.note}")
        for m in result.measurements
        if m.status.value != "ok"
    )
    telemetry: list[str] = []
    env = result.environment
    if env is not None:
        details.append(("backend", f"{env.backend} × {env.world_size} ({env.device_kind})"))
        versions = ", ".join(
            f"{k} {v}"
            for k, v in (("torch", env.torch), ("cuda", env.cuda), ("nccl", env.nccl), ("driver", env.driver))
            if v
        )
        if versions:
            details.append(("versions", versions))
        if env.gpu_names:
            details.append(("GPUs", ", ".join(env.gpu_names)))
        for key, value in sorted(env.extra.items()):
            if "telemetry" in key or "clock" in key or "pcie" in key:
                telemetry.append(f"{key}: {value}")
    details.append(("duration", f"{result.duration_s:.1f} s"))
    if result.rank_log and (result.rank_warnings or state is ProbeState.FAILED):
        plural = "s" if result.rank_warnings != 1 else ""
        warned = f"{result.rank_warnings} warning{plural} in " if result.rank_warnings else ""
        details.append(("rank output", f"{warned}{result.rank_log}"))
    error = result.error or ("" if state is ProbeState.DONE else result.message) or unsupported
    if result.error_rank is not None and error and not error.startswith(f"rank {result.error_rank} "):
        error = f"rank {result.error_rank}: {error}"
    view = ProbeView(
        probe_id=result.probe,
        title=title,
        state=state,
        value_text=headline(result) or (f"unsupported: {unsupported}" if unsupported else ""),
        error=error,
        traceback=result.traceback or "",
        ranks=ranks,
        spread_text=spread,
        telemetry_text=tuple(telemetry),
        details=tuple(details),
    )
    return inert_data(view)  # a result from the history or a replay is outside text (notes, GPU names, errors)


def utc_to_unix(text: str) -> float | None:
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def measured_at(results: Mapping[str, ProbeResult]) -> dict[str, float]:
    """Probe id → Unix time the result was taken."""
    times: dict[str, float] = {}
    for probe_id, result in results.items():
        started = result.started_utc
        if started:
            at = utc_to_unix(started)
            if at is not None:
                times[probe_id] = at
    return times
