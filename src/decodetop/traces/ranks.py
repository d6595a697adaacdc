"""Provides `load_traces`: one trace file or a directory of per-rank files (SGLang and vLLM write one per TP rank),
read one after another so memory holds one trace's columns at a time, with each rank's step and the spread.

The first rank's report is the one the traced bar shows; every rank contributes a `RankSummary`, and a rank whose
step, compute time or collective wait stands out from the others' median is named in words.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from decodetop.budget.components import Component
from decodetop.errors import UserInputError
from decodetop.traces.analysis import analyze
from decodetop.traces.classify import RuleSet
from decodetop.traces.reader import MAX_TRACE_BYTES, read_trace
from decodetop.traces.trace_report import TraceReport

TRACE_SUFFIXES = (".json", ".json.gz")
STANDS_OUT = 0.10
"""A rank stands out when its figure is this fraction above the other ranks' median. TP ranks run the same kernels
on the same shapes, so their steps agree to a few per cent (tests/fixtures/traces: 8 steps of one H200 vary by
under 3 %); 10 % is well clear of that noise."""
MIN_WAIT_MS = 0.02
"""A collective wait below this (20 µs: a few small all-reduce launches, docs/reference/probes.md §3) is never called
standing out."""
CAPTURE_WINDOW_S = 120.0
"""Files without a rank in their name written this close to the newest one belong to its capture: the ranks of one
capture flush together (benchmarks/traces/trace_load.py: a 1 GB trace is read in ~75 s, written faster), while captures
are started by hand, minutes apart."""
_RANK_PATTERNS = (
    re.compile(r"TP[-_]?(\d+)", re.IGNORECASE),
    re.compile(r"rank[-_]?(\d+)", re.IGNORECASE),
    re.compile(r"worker[-_]?(\d+)", re.IGNORECASE),
)


@dataclass(frozen=True)
class RankSummary:
    """One rank's trace in a few figures (ms per step)."""

    rank: int
    path: str
    step_ms: float
    busy_ms: float
    collective_ms: float
    """Time per step in collective kernels: where a fast rank waits for a slow one."""
    compute_ms: float
    """Busy time outside collectives: what differs on a slow rank."""


@dataclass(frozen=True)
class TraceSet:
    """What one `--trace` (a file or a directory of per-rank files) gave: the shown rank's report and every rank."""

    report: TraceReport
    ranks: tuple[RankSummary, ...]
    standing_out: tuple[str, ...]
    """One sentence per rank whose step, compute or collective wait stands out; empty when they agree."""

    @property
    def spread_ms(self) -> float:
        """Slowest minus fastest rank step (0 with one rank)."""
        steps = [r.step_ms for r in self.ranks]
        return max(steps) - min(steps) if steps else 0.0

    def spread_line(self) -> str:
        """'2 ranks: step 1.60–1.92 ms (spread 0.32 ms); rank 1 …' or '' for one rank."""
        if len(self.ranks) < 2:
            return ""
        steps = [r.step_ms for r in self.ranks]
        text = f"{len(self.ranks)} ranks: step {min(steps):.3g}–{max(steps):.3g} ms (spread {self.spread_ms:.3g} ms)"
        return "; ".join([text, *self.standing_out])


def rank_of(path: Path, default: int) -> int:
    """The TP rank a trace file's name carries ('…-TP-1.trace.json.gz', '…rank_1…'), else `default`."""
    for pattern in _RANK_PATTERNS:
        found = pattern.search(path.name)
        if found:
            return int(found.group(1))
    return default


def trace_files(path: Path) -> list[tuple[int, Path]]:
    """(rank, file) for a trace file or every trace file directly in a directory, lowest rank first."""
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.is_file() and p.name.endswith(TRACE_SUFFIXES))
        named = [p for p in files if ".trace." in p.name]  # torch.profiler's own names, beside any summary JSON
        files = named or files
        if not files:
            raise UserInputError(f"{path}: no trace files (*.json, *.json.gz) in this directory")
        return sorted(_latest_capture(files))
    return [(rank_of(path, 0), path)]  # a missing or unreadable file is the reader's one-line error


def _latest_capture(files: list[Path]) -> list[tuple[int, Path]]:
    """(rank, file) of the newest capture in a directory that may hold several (a vLLM trace directory keeps every
    capture): the newest file of each rank its name carries; for names without ranks, the files written within
    CAPTURE_WINDOW_S of the newest one, in name order."""
    stamped = [(_mtime(p), p) for p in files]
    by_rank: dict[int, tuple[float, Path]] = {}
    for mtime, p in stamped:
        rank = rank_of(p, -1)
        if rank < 0:
            break
        if rank not in by_rank or mtime > by_rank[rank][0]:
            by_rank[rank] = (mtime, p)
    else:
        return [(rank, p) for rank, (_m, p) in by_rank.items()]
    newest = max(m for m, _ in stamped)
    recent = sorted(p for m, p in stamped if m >= newest - CAPTURE_WINDOW_S)
    return list(enumerate(recent))


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def summarize(rank: int, report: TraceReport) -> RankSummary:
    """A rank's figures from its report."""
    comm = report.bucket(Component.COMMUNICATION.value)
    collective = comm.time_us_per_step / 1000 if comm else 0.0
    busy = report.gpu_busy_us_mean / 1000
    return RankSummary(
        rank=rank,
        path=report.path,
        step_ms=report.step_wall_us_mean / 1000,
        busy_ms=busy,
        collective_ms=collective,
        compute_ms=max(0.0, busy - collective),
    )


def standing_out(ranks: list[RankSummary]) -> list[str]:
    """Sentences naming the ranks whose step or compute is above the others' median by STANDS_OUT, and the ranks
    that wait in collectives that much longer than the others (they wait for a slower rank)."""
    out: list[str] = []
    if len(ranks) < 2:
        return out
    for r in ranks:
        others = [o for o in ranks if o.rank != r.rank]
        step = statistics.median(o.step_ms for o in others)
        compute = statistics.median(o.compute_ms for o in others)
        wait = statistics.median(o.collective_ms for o in others)
        waits = r.collective_ms > MIN_WAIT_MS and r.collective_ms > wait * (1 + STANDS_OUT) + MIN_WAIT_MS
        if compute > 0 and r.compute_ms > compute * (1 + STANDS_OUT) and not waits:
            out.append(
                f"rank {r.rank} is slow: it computes {r.compute_ms:.3g} ms per step vs {compute:.3g} ms on the others"
            )
        elif step > 0 and r.step_ms > step * (1 + STANDS_OUT) and not waits:
            out.append(f"rank {r.rank} is slow: step {r.step_ms:.3g} ms vs {step:.3g} ms on the others")
        if waits:
            out.append(
                f"rank {r.rank} waits {r.collective_ms:.3g} ms per step in collectives vs {wait:.3g} ms on the others "
                "(it waits for a slower rank)"
            )
    return sorted(out, key=lambda line: "waits" in line)  # the slow rank first


def analyze_path(
    path: str | Path | Sequence[Path],
    *,
    rules: RuleSet | None = None,
    vocab_size: int | None = None,
    gemm_shapes: Mapping[tuple[int, int], Component] | None = None,
    max_bytes: int = MAX_TRACE_BYTES,
) -> TraceSet:
    """Read and attribute a trace file or a directory of per-rank files (what `--trace` in the live UI loads), at
    most `max_bytes` once decompressed for all files together."""
    left = [max_bytes]

    def one(file: Path) -> TraceReport:
        if left[0] <= 0:
            raise UserInputError(f"{file}: the ranks' traces hold more than {max_bytes:,} bytes once decompressed")
        trace = read_trace(file, max_bytes=left[0])
        left[0] -= trace.bytes_read
        return analyze(trace, rules=rules, vocab_size=vocab_size, gemm_shapes=gemm_shapes)

    return load_traces(path, one)


def load_traces(path: str | Path | Sequence[Path], analyze_file: Callable[[Path], TraceReport]) -> TraceSet:
    """Analyse a trace file, every per-rank file of a directory, or the listed files, one at a time (only the small
    reports stay in memory); the lowest rank's report is the one shown."""
    if isinstance(path, (str, Path)):
        files = trace_files(Path(path))
    else:
        files = sorted((rank_of(p, i), p) for i, p in enumerate(path))
    reports: list[tuple[int, TraceReport]] = []
    for rank, file in files:
        reports.append((rank, analyze_file(file)))
    summaries = [summarize(rank, report) for rank, report in reports]
    return TraceSet(report=reports[0][1], ranks=tuple(summaries), standing_out=tuple(standing_out(summaries)))
