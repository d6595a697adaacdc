"""Provides the observed-step rule, said once for every surface (stdlib only): the step a budget is stacked against
is, in this order,

1. a flag (`--observed-ms`),
2. the settings file (`observed_ms`, the live UI),
3. a live serving engine (`--server`: its /metrics over a window; its last figure, said as such, while it is down),
4. a profiler trace of the engine's own steps (`--trace`, the trace command's file, a capture): the trace IS an
   observation — its file, how old it is, how many decode steps and their spread say where it came from,
5. the built-in default (`decodetop.defaults.DEFAULT_OBSERVED_MS`), then "assumed, not observed", saying why
   nothing was observed.

    observed = observed_step(flag_ms=args.observed_ms, server=answer, server_url=url, trace=traced, now_s=now)
    observed.text       # '2.84 ms observed in the trace t.json, 8 decode steps (2.80–2.91 ms), written 3m ago'

The unexplained remainder is then observed − composed: with a trace and nothing above it, traced − composed.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from decodetop.budget.compose import ObservedStep, default_observed
from decodetop.collectors.serving import ServerState, ServerStatus, ServerStep
from decodetop.history import format_ago
from decodetop.quantity import OBSERVED_MS
from decodetop.textfmt import format_number
from decodetop.traces.ranks import TraceSet
from decodetop.traces.trace_report import TraceReport

SERVER_FAILURES = frozenset(
    {
        ServerState.UNREACHABLE,
        ServerState.TIMED_OUT,
        ServerState.HTTP_ERROR,
        ServerState.NOT_METRICS,
        ServerState.UNPARSEABLE,
        ServerState.NO_LATENCY_METRIC,
    }
)
"""Server answers that mean it could not be read (its last figure is then not live: said in the budget's header)."""
WAITING = "waiting for the server's first window"


@dataclass(frozen=True)
class TracedStep:
    """A profiler trace's decode steps as an observation of the engine's step."""

    step_ms: float
    """The mean wall time of a decode step in the trace (the shown rank's)."""
    steps: int
    low_ms: float
    high_ms: float
    """The fastest and slowest decode step."""
    path: str
    written_s: float | None = None
    """When the trace was written (its newest file's mtime), for its age."""

    def detail(self, now_s: float) -> str:
        """'t.json, 8 decode steps (2.80–2.91 ms), written 3m ago'."""
        spread = f" ({format_number(self.low_ms)}–{format_number(self.high_ms)} ms)" if self.steps > 1 else ""
        plural = "s" if self.steps != 1 else ""
        age = f", written {format_ago(max(0.0, now_s - self.written_s))}" if self.written_s is not None else ""
        return f"{self.path}, {self.steps} decode step{plural}{spread}{age}"


def traced_step(traces: TraceSet | TraceReport, *, written_s: float | None = None) -> TracedStep | None:
    """The observation a trace gives (None where it holds no decode step)."""
    report = traces.report if isinstance(traces, TraceSet) else traces
    walls = [s.wall_us / 1000 for s in report.steps if s.wall_us > 0]
    if not walls or not OBSERVED_MS.accepts(report.step_wall_us_mean / 1000):  # a crafted trace's hour-long step
        return None
    return TracedStep(report.step_wall_us_mean / 1000, len(walls), min(walls), max(walls), report.path, written_s)


def trace_written_s(path: str | Path) -> float | None:
    """A trace file's (or per-rank directory's newest file's) modification time, None where it cannot be read."""
    target = Path(path)
    try:
        if target.is_dir():
            return max((f.stat().st_mtime for f in target.iterdir() if f.is_file()), default=None)
        return target.stat().st_mtime
    except OSError:
        return None


def _server_detail(step: ServerStep, now_s: float) -> str:
    age = step.age_s(now_s)
    when = f", {format_ago(age)}" if age is not None else ""  # "just now", never "now ago"
    return f"{step.url}, {step.window_s:.0f} s window{when}"


def _with_url(url: str, message: str) -> str:
    """`message` with the server's URL said once: the poller's own messages name it already ('URL: unreachable')."""
    return message if url and url in message else f"{url}: {message}"


def server_header(answer: ServerStep | ServerStatus | None) -> str:
    """The line a budget shows above its figures while the server cannot be read ('' otherwise)."""
    if isinstance(answer, ServerStatus) and answer.state in SERVER_FAILURES:
        return f"server {_with_url(answer.url, answer.message)} — the observed step is not live"
    return ""


def server_observed(answer: ServerStep | ServerStatus | None, now_s: float) -> ObservedStep | None:
    """The server's observed step: its latest window, or while it cannot be read its last one, said as such
    ('…; now: connection refused'); None where it has given none."""
    if isinstance(answer, ServerStep):
        if not OBSERVED_MS.accepts(answer.step_ms):  # collectors/serving never gives one; a rule never raises
            return None
        return ObservedStep(answer.step_ms, "server", _server_detail(answer, now_s))
    if answer is not None and answer.last_step is not None and OBSERVED_MS.accepts(answer.last_step.step_ms):
        detail = f"{_server_detail(answer.last_step, now_s)}; now: {answer.summary}"
        return ObservedStep(answer.last_step.step_ms, "server", detail)
    return None


def observed_step(
    *,
    flag_ms: float | None = None,
    settings_ms: float | None = None,
    server: ServerStep | ServerStatus | None = None,
    server_url: str | None = None,
    trace: TracedStep | None = None,
    now_s: float,
) -> ObservedStep:
    """The observed step by the one rule (module docstring): flag > settings > server > trace > default."""
    if flag_ms is not None:  # checked against OBSERVED_MS when the flag was read (one line, exit 2)
        return ObservedStep(flag_ms, "flag", "--observed-ms")
    if settings_ms is not None:  # and when the settings file was
        return ObservedStep(settings_ms, "settings", "")
    live = server_observed(server, now_s)
    if live is not None:
        return live
    if trace is not None:
        return ObservedStep(trace.step_ms, "trace", trace.detail(now_s))
    if server is not None or server_url is not None:
        url = server_url or (server.url if server is not None else "")
        why = server.summary if server is not None else WAITING
        return default_observed(f"the default; server {_with_url(url, why)}")
    return default_observed()
