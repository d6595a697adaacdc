"""Provides the probe results as plain frozen dataclasses with a JSON round trip (stdlib only, no torch).

Shape of a result:

- `ProbeResult`: one probe run on the whole group: status (ok/failed/timed_out/unsupported/cancelled), the
  parameters it ran with, its `Measurement`s, the `Environment`, and for a failure the rank, error and traceback.
- `Measurement`: one measured point (e.g. all-reduce of 4 KiB in pipelined mode): its parameters, the unit of its
  samples, one `RankSeries` per rank (samples + `Stats` + that rank's derived metrics), the `Stats` of all ranks'
  samples pooled, and derived metrics (unit-suffixed keys: `time_us`, `algbw_gbps`, `busbw_gbps`) averaged over
  the ranks that reported them (nccl-tests also averages its time across ranks: docs/reference/probes.md §1).
- A point that cannot run here (a CUDA graph on a CPU rank) is a `Measurement` with status `unsupported` and a reason.

`load_results(path)` reads a `decodetop probe --json` file back; a malformed file gives one `UserInputError` line.
"""

from __future__ import annotations

import enum
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from decodetop import jsonio
from decodetop.budget.kernels import KernelClass
from decodetop.errors import UserInputError

#: Version of the JSON layout written by `results_to_json`; bump on an incompatible change.
RESULTS_FORMAT_VERSION = 1


class ProbeStatus(str, enum.Enum):
    """Outcome of one probe run."""

    OK = "ok"
    FAILED = "failed"
    TIMED_OUT = "timed_out"
    UNSUPPORTED = "unsupported"
    CANCELLED = "cancelled"


class MeasurementStatus(str, enum.Enum):
    """Outcome of one measured point inside a probe."""

    OK = "ok"
    UNSUPPORTED = "unsupported"
    FAILED = "failed"


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default method) of already sorted values; q in [0, 100]."""
    if not sorted_values:
        raise ValueError("percentile of no samples")
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"percentile q must be in [0, 100], got {q}")
    pos = (len(sorted_values) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    frac = pos - lo
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * frac


@dataclass(frozen=True)
class Stats:
    """Summary of a series of samples, all in `unit` (e.g. "us", "gbps")."""

    unit: str
    median: float
    p10: float
    p90: float
    p99: float
    min: float
    max: float
    mean: float
    count: int

    @classmethod
    def from_samples(cls, samples: Iterable[float], unit: str) -> Stats:
        """Stats of `samples` (at least one, all finite)."""
        values = sorted(float(v) for v in samples)
        if not values:
            raise ValueError("Stats.from_samples needs at least one sample")
        if not all(math.isfinite(v) for v in values):
            raise ValueError("Stats.from_samples got a non-finite sample")
        return cls(
            unit=unit,
            median=percentile(values, 50),
            p10=percentile(values, 10),
            p90=percentile(values, 90),
            p99=percentile(values, 99),
            min=values[0],
            max=values[-1],
            mean=math.fsum(values) / len(values),
            count=len(values),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "unit": self.unit,
            "median": self.median,
            "p10": self.p10,
            "p90": self.p90,
            "p99": self.p99,
            "min": self.min,
            "max": self.max,
            "mean": self.mean,
            "count": self.count,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Stats:
        return cls(
            unit=str(data["unit"]),
            median=float(data["median"]),
            p10=float(data["p10"]),
            p90=float(data["p90"]),
            p99=float(data["p99"]),
            min=float(data["min"]),
            max=float(data["max"]),
            mean=float(data["mean"]),
            count=int(data["count"]),
        )


@dataclass(frozen=True)
class RankSeries:
    """One rank's samples of one measurement, their stats, and the metrics that rank derived from them."""

    rank: int
    samples: tuple[float, ...]
    stats: Stats | None
    metrics: Mapping[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "samples": list(self.samples),
            "stats": self.stats.to_dict() if self.stats else None,
            "metrics": dict(self.metrics),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RankSeries:
        stats = data.get("stats")
        return cls(
            rank=int(data["rank"]),
            samples=tuple(float(v) for v in data.get("samples", ())),
            stats=Stats.from_dict(stats) if stats else None,
            metrics={str(k): float(v) for k, v in dict(data.get("metrics", {})).items()},
        )


@dataclass(frozen=True)
class Measurement:
    """One measured point of a probe, merged over the ranks that measured it."""

    name: str
    params: Mapping[str, Any]
    unit: str
    status: MeasurementStatus = MeasurementStatus.OK
    note: str = ""
    per_rank: tuple[RankSeries, ...] = ()
    stats: Stats | None = None
    metrics: Mapping[str, float] = field(default_factory=dict)
    kernel: KernelClass | None = None
    """The class of kernel the point timed (engine, decodetop Triton, torch, CPU); None where a probe has no
    choice of kernels (an all-reduce, a launch) or the file predates the field."""

    def to_dict(self) -> dict[str, Any]:
        out = {
            "name": self.name,
            "params": dict(self.params),
            "unit": self.unit,
            "status": self.status.value,
            "note": self.note,
            "per_rank": [r.to_dict() for r in self.per_rank],
            "stats": self.stats.to_dict() if self.stats else None,
            "metrics": dict(self.metrics),
        }
        if self.kernel is not None:
            out["kernel"] = self.kernel.to_dict()
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Measurement:
        stats = data.get("stats")
        return cls(
            name=str(data["name"]),
            params=dict(data.get("params", {})),
            unit=str(data["unit"]),
            status=MeasurementStatus(data.get("status", "ok")),
            note=str(data.get("note", "")),
            per_rank=tuple(RankSeries.from_dict(r) for r in data.get("per_rank", ())),
            stats=Stats.from_dict(stats) if stats else None,
            metrics={str(k): float(v) for k, v in dict(data.get("metrics", {})).items()},
            kernel=KernelClass.from_dict(kernel) if isinstance(kernel := data.get("kernel"), Mapping) else None,
        )


@dataclass(frozen=True)
class RankMeasurement:
    """What one rank's probe function reports for one point (merged by `merge_rank_outputs`)."""

    name: str
    params: Mapping[str, Any]
    unit: str
    samples: tuple[float, ...] = ()
    metrics: Mapping[str, float] = field(default_factory=dict)
    status: MeasurementStatus = MeasurementStatus.OK
    note: str = ""
    kernel: KernelClass | None = None
    """The class of kernel this rank timed (see `Measurement.kernel`)."""


@dataclass(frozen=True)
class RankOutput:
    """What one rank's probe function returns: its measurements, or that the probe cannot run here and why."""

    measurements: tuple[RankMeasurement, ...] = ()
    unsupported_reason: str | None = None


@dataclass(frozen=True)
class Environment:
    """Where a result was taken: versions, GPUs, topology, NCCL settings, host and time."""

    host: str
    time_utc: str
    python: str
    backend: str
    device_kind: str
    world_size: int
    launcher: str = "spawn"
    torch: str | None = None
    cuda: str | None = None
    nccl: str | None = None
    driver: str | None = None
    gpu_names: tuple[str, ...] = ()
    gpu_uuids: tuple[str, ...] = ()
    visible_devices: str | None = None
    topology: str | None = None
    nccl_env: Mapping[str, str] = field(default_factory=dict)
    extra: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "host": self.host,
            "time_utc": self.time_utc,
            "python": self.python,
            "backend": self.backend,
            "device_kind": self.device_kind,
            "world_size": self.world_size,
            "launcher": self.launcher,
            "torch": self.torch,
            "cuda": self.cuda,
            "nccl": self.nccl,
            "driver": self.driver,
            "gpu_names": list(self.gpu_names),
            "gpu_uuids": list(self.gpu_uuids),
            "visible_devices": self.visible_devices,
            "topology": self.topology,
            "nccl_env": dict(self.nccl_env),
            "extra": dict(self.extra),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Environment:
        def opt(key: str) -> str | None:
            value = data.get(key)
            return None if value is None else str(value)

        return cls(
            host=str(data["host"]),
            time_utc=str(data["time_utc"]),
            python=str(data["python"]),
            backend=str(data["backend"]),
            device_kind=str(data["device_kind"]),
            world_size=int(data["world_size"]),
            launcher=str(data.get("launcher", "spawn")),
            torch=opt("torch"),
            cuda=opt("cuda"),
            nccl=opt("nccl"),
            driver=opt("driver"),
            gpu_names=tuple(str(v) for v in data.get("gpu_names", ())),
            gpu_uuids=tuple(str(v) for v in data.get("gpu_uuids", ())),
            visible_devices=opt("visible_devices"),
            topology=opt("topology"),
            nccl_env={str(k): str(v) for k, v in dict(data.get("nccl_env", {})).items()},
            extra=dict(data.get("extra", {})),
        )


@dataclass(frozen=True)
class ProbeResult:
    """One probe run on the whole group."""

    probe: str
    status: ProbeStatus
    params: Mapping[str, Any]
    measurements: tuple[Measurement, ...] = ()
    environment: Environment | None = None
    started_utc: str = ""
    duration_s: float = 0.0
    world_size: int = 0
    message: str = ""
    error_rank: int | None = None
    error: str | None = None
    traceback: str | None = None
    rank_warnings: int = 0
    """Python warnings the ranks showed during this probe (and the group's start, when it started for it)."""
    rank_log: str = ""
    """The file the ranks' stdout and stderr went to ('' when not redirected)."""

    @property
    def ok(self) -> bool:
        return self.status is ProbeStatus.OK

    def measurement(self, **params: Any) -> Measurement:
        """The first measurement whose params include all of `params` (KeyError if none)."""
        for m in self.measurements:
            if all(m.params.get(k) == v for k, v in params.items()):
                return m
        raise KeyError(f"{self.probe}: no measurement with {params}")

    def to_dict(self) -> dict[str, Any]:
        return {
            "probe": self.probe,
            "status": self.status.value,
            "params": dict(self.params),
            "measurements": [m.to_dict() for m in self.measurements],
            "environment": self.environment.to_dict() if self.environment else None,
            "started_utc": self.started_utc,
            "duration_s": self.duration_s,
            "world_size": self.world_size,
            "message": self.message,
            "error_rank": self.error_rank,
            "error": self.error,
            "traceback": self.traceback,
            "rank_warnings": self.rank_warnings,
            "rank_log": self.rank_log,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ProbeResult:
        env = data.get("environment")
        error_rank = data.get("error_rank")
        error = data.get("error")
        tb = data.get("traceback")
        return cls(
            probe=str(data["probe"]),
            status=ProbeStatus(data["status"]),
            params=dict(data.get("params", {})),
            measurements=tuple(Measurement.from_dict(m) for m in data.get("measurements", ())),
            environment=Environment.from_dict(env) if env else None,
            started_utc=str(data.get("started_utc", "")),
            duration_s=float(data.get("duration_s", 0.0)),
            world_size=int(data.get("world_size", 0)),
            message=str(data.get("message", "")),
            error_rank=None if error_rank is None else int(error_rank),
            error=None if error is None else str(error),
            traceback=None if tb is None else str(tb),
            rank_warnings=int(data.get("rank_warnings", 0)),
            rank_log=str(data.get("rank_log", "")),
        )


def merge_rank_outputs(outputs: Mapping[int, RankOutput]) -> tuple[Measurement, ...]:
    """Merge the ranks' outputs point by point (matched by name, in the order rank 0 — or the lowest rank — gave).

    Pooled stats cover every rank's samples; merged metrics are the mean over the ranks that reported each key.
    A point that any rank marks unsupported or failed carries that status and note.
    """
    order: list[str] = []
    by_name: dict[str, list[tuple[int, RankMeasurement]]] = {}
    for rank in sorted(outputs):
        for m in outputs[rank].measurements:
            if m.name not in by_name:
                order.append(m.name)
                by_name[m.name] = []
            by_name[m.name].append((rank, m))
    merged: list[Measurement] = []
    for name in order:
        entries = by_name[name]
        first = entries[0][1]
        status = MeasurementStatus.OK
        note = ""
        for _, m in entries:
            if m.status is not MeasurementStatus.OK:
                status, note = m.status, m.note
                break
        if not note:
            note = next((m.note for _, m in entries if m.note), "")
        per_rank = tuple(
            RankSeries(
                rank=rank,
                samples=tuple(m.samples),
                stats=Stats.from_samples(m.samples, m.unit) if m.samples else None,
                metrics=dict(m.metrics),
            )
            for rank, m in entries
        )
        pooled = [s for _, m in entries for s in m.samples]
        keys: list[str] = []
        for _, m in entries:
            keys.extend(k for k in m.metrics if k not in keys)
        metrics = {
            k: math.fsum(m.metrics[k] for _, m in entries if k in m.metrics)
            / sum(1 for _, m in entries if k in m.metrics)
            for k in keys
        }
        merged.append(
            Measurement(
                name=name,
                params=dict(first.params),
                unit=first.unit,
                status=status,
                note=note,
                per_rank=per_rank,
                stats=Stats.from_samples(pooled, first.unit) if pooled else None,
                metrics=metrics,
                kernel=next((m.kernel for _, m in entries if m.kernel is not None), None),
            )
        )
    return tuple(merged)


def results_to_json(results: Sequence[ProbeResult]) -> str:
    """The JSON document `decodetop probe --json` writes."""
    doc = {"decodetop_probe_results": RESULTS_FORMAT_VERSION, "results": [r.to_dict() for r in results]}
    return json.dumps(doc, indent=1, allow_nan=False) + "\n"


def results_from_json(text: str, source: str = "<string>") -> list[ProbeResult]:
    """Parse a results document (or a bare list of results); one-line `UserInputError` when malformed."""
    try:
        doc = jsonio.loads(text, source=source)  # nesting, huge numbers, NaN: one line naming the file
    except json.JSONDecodeError as exc:
        raise UserInputError(f"{source}: not JSON ({exc.msg} at line {exc.lineno} column {exc.colno})") from None
    if isinstance(doc, dict):
        version = doc.get("decodetop_probe_results")
        if version is None:
            raise UserInputError(f"{source}: not a decodetop probe results file (no 'decodetop_probe_results' key)")
        if version != RESULTS_FORMAT_VERSION:
            raise UserInputError(
                f"{source}: results format version {version!r} is not supported (expected {RESULTS_FORMAT_VERSION})"
            )
        items = doc.get("results")
    else:
        items = doc
    if not isinstance(items, list):
        raise UserInputError(f"{source}: 'results' must be a list of probe results")
    out: list[ProbeResult] = []
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise UserInputError(f"{source}: result #{i} is not an object")
        try:
            out.append(ProbeResult.from_dict(item))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            what = f"missing key {exc}" if isinstance(exc, KeyError) else str(exc)
            raise UserInputError(f"{source}: result #{i} is malformed: {what}") from None
    return out


def load_results(path: str | Path) -> list[ProbeResult]:
    """Read a results JSON file written by `decodetop probe --json`, plain or gzip-compressed (as the benchmark
    results in this repository are stored); one-line `UserInputError` on any problem."""
    p = Path(path)
    if not p.exists() and not p.is_symlink():
        raise UserInputError(f"{p}: no such results file")
    try:
        text = jsonio.read_maybe_gzip(p).decode("utf-8")  # a FIFO or device is refused unread
    except UnicodeDecodeError as exc:
        raise UserInputError(f"{p}: cannot read results file ({exc})") from None
    return results_from_json(text, source=str(p))
