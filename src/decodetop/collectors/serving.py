"""Provides the observed decode step from a live serving engine's Prometheus `/metrics` (SGLang or vLLM).

The step time is the mean inter-token latency over a window, taken the way docs/reference/probes.md §6 says: Δsum/Δcount
of the engine's ITL histogram between two scrapes (the buckets are too coarse for 10-20 ms steps). Everything a server
can answer (nothing, a 404, an HTML page, garbage, an idle engine, a restart) becomes a `ServerStatus` with one line to
show; nothing here raises on what the server sends.

Engines differ in what one ITL sample is:

- SGLang observes `interval / num_new_tokens` per output token (the histogram's count advances by the number of new
  tokens; sglang `srt/metrics/collector.py`, `observe_inter_token_latency`), so with speculative decoding its mean
  ITL is per *token* and the step is ITL x accept length (docs/reference/probes.md §6). The accept length is the one
  given, or else the server's own `sglang:spec_accept_length` gauge when it reports one ≥ 1.
- vLLM (v1) appends one ITL sample per request per engine step, however many tokens the step accepted
  (vllm `v1/metrics/stats.py`, `update_from_output`), so its mean ITL already is the step and no factor applies.
"""

from __future__ import annotations

import collections
import enum
import math
import time
import urllib.parse
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

from decodetop.errors import UserInputError
from decodetop.httpget import BadUrlError, HttpAnswer, HttpRequestError, check_url, http_request, server_text
from decodetop.quantity import ACCEPT_LENGTH, OBSERVED_MS
from decodetop.textfmt import format_number

DEFAULT_TIMEOUT_S = 2.0
"""Overall deadline of one scrape (connect to last byte): a /metrics page answers in milliseconds; a hung or
trickling server must not stall the UI or the exporter."""
DEFAULT_WINDOW_S = 10.0
"""Δ window: long enough for a few hundred tokens at ~50 tok/s (docs/reference/probes.md §7.10 GLM-5 reference ~19
ms/step)."""
MAX_BODY_BYTES = 32 * 1024 * 1024
"""A real engine's /metrics is tens to hundreds of KiB; past this it is not a metrics page we want to parse."""

# (engine, histogram family) in order of preference: the current ITL histograms first, then the older names
# (docs/reference/probes.md §6: vllm:time_per_output_token_seconds is "DEPRECATED: Use
# vllm:inter_token_latency_seconds"; older
# SGLang versions serve sglang:time_per_output_token_seconds).
LATENCY_FAMILIES: tuple[tuple[str, str], ...] = (
    ("sglang", "sglang:inter_token_latency_seconds"),
    ("vllm", "vllm:inter_token_latency_seconds"),
    ("sglang", "sglang:time_per_output_token_seconds"),
    ("vllm", "vllm:time_per_output_token_seconds"),
)
_RUNNING_GAUGES = {"sglang": "sglang:num_running_reqs", "vllm": "vllm:num_requests_running"}
_SGLANG_ACCEPT_GAUGE = "sglang:spec_accept_length"
_MODEL_LABEL = "model_name"
_VLLM_NOTE = "vLLM's ITL is already per engine step, so the accept length is not applied"


class ServerState(str, enum.Enum):
    """Why a poll gave no step time. The value is stable (JSON, metrics)."""

    UNREACHABLE = "unreachable"
    TIMED_OUT = "timed_out"
    HTTP_ERROR = "http_error"
    NOT_METRICS = "not_metrics"
    UNPARSEABLE = "unparseable"
    NO_LATENCY_METRIC = "no_latency_metric"
    WAITING = "waiting"
    IDLE = "idle"
    RESET = "reset"


@dataclass(frozen=True)
class ServerStep:
    """The mean decode step a live server observed over a window."""

    step_ms: float
    """Mean decode step: `itl_ms` x `accept_length`."""
    itl_ms: float
    """Mean inter-token latency as the engine records it: Δsum/Δcount of its histogram over the window."""
    source: str
    """"sglang" or "vllm"."""
    metric: str
    """The histogram family the mean came from, e.g. "sglang:inter_token_latency_seconds"."""
    samples: int
    """Δcount: histogram observations in the window."""
    window_s: float
    """Time between the two scrapes compared."""
    accept_length: float
    """Factor applied to the ITL (1.0 without speculative decoding, and always 1.0 for vLLM)."""
    accept_length_from: str
    """Where the factor came from: "given", "server" (sglang:spec_accept_length), or "none"."""
    url: str
    running_requests: float | None = None
    """Concurrency the server reported at the end of the window (docs/reference/probes.md §6: at concurrency 1, ITL =
    step)."""
    model_names: tuple[str, ...] = ()
    """The model_name label values aggregated."""
    note: str = ""
    """Anything the reader should know about how the step was derived (e.g. a given accept length not applied)."""
    taken_unix_s: float | None = None
    """Wall-clock time of the scrape that closed the window (None where unknown, e.g. an old recording)."""

    def age_s(self, now_unix_s: float) -> float | None:
        """Seconds since the scrape that closed the window (None where that time is unknown)."""
        return None if self.taken_unix_s is None else max(0.0, now_unix_s - self.taken_unix_s)

    @property
    def summary(self) -> str:
        """One line for a status bar: value, source and sample count."""
        extra = f", x{self.accept_length:.2f} accept length" if self.accept_length != 1.0 else ""
        conc = f", {self.running_requests:g} running" if self.running_requests is not None else ""
        note = f"; {self.note}" if self.note else ""
        return (
            f"observed {self.step_ms:.2f} ms/step from {self.source} ({self.samples} samples over "
            f"{self.window_s:.0f} s{extra}{conc}){note}"
        )


@dataclass(frozen=True)
class ServerStatus:
    """A poll that gave no step time, with one line saying why."""

    state: ServerState
    message: str
    url: str
    source: str | None = None
    last_step: ServerStep | None = None
    """The last step this source did observe, if any: kept so a surface can say how old the last figure is."""

    @property
    def summary(self) -> str:
        """The one line to show."""
        return self.message


@dataclass(frozen=True)
class LatencyTotals:
    """One scrape's cumulative ITL histogram totals (aggregated over the selected label sets) and gauges."""

    source: str
    metric: str
    sum_s: float
    count: float
    model_names: tuple[str, ...]
    running_requests: float | None
    server_accept_length: float | None


def normalize_url(url: str) -> str:
    """The /metrics URL for what the user typed: `host:port`, `http://host:port`, or a full URL with a path.

    Raises UserInputError for what cannot be a metrics URL (another scheme, no host, a malformed host or port, a
    control character), naming the input (`decodetop.httpget.check_url`).
    """
    text = url.strip()
    if not text:
        raise UserInputError("--server: empty URL; expected e.g. http://127.0.0.1:30000")
    if "://" not in text:
        text = "http://" + text
    try:
        parts = check_url(text)
    except BadUrlError as exc:
        raise UserInputError(f"--server {shown_url(url)}: {exc}") from None
    path = parts.path if parts.path not in {"", "/"} else "/metrics"
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, path, parts.query, ""))


def shown_url(url: str) -> str:
    """A URL as a message quotes it: inert, in quotes, at most 200 characters."""
    return repr(server_text(url))


def fetch_metrics_text(url: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> str | ServerStatus:
    """GET `url` within ONE overall deadline of `timeout_s` (`decodetop.httpget`: a server that trickles is cut off
    there) and return its body as text, or the status that says why it is not a metrics page."""
    try:
        answer = http_request(
            url,
            deadline_s=timeout_s,
            headers={"Accept": "text/plain;version=0.0.4;q=1,*/*;q=0.1"},
            max_body_bytes=MAX_BODY_BYTES,
        )
    except HttpRequestError as exc:
        state = ServerState.TIMED_OUT if exc.timed_out else ServerState.UNREACHABLE
        reason = exc.reason if exc.timed_out else f"unreachable ({exc.reason})"
        return ServerStatus(state, f"{url}: {reason}", url)
    if answer.status >= 300:
        hint = " (SGLang serves /metrics only with --enable-metrics)" if answer.status == 404 else ""
        return ServerStatus(ServerState.HTTP_ERROR, f"{url}: HTTP {answer.status} {answer.reason}{hint}", url)
    return _metrics_body(answer, url)


def _metrics_body(answer: HttpAnswer, url: str) -> str | ServerStatus:
    """A successful answer's body as text, or the status saying it is too large, not UTF-8, HTML or JSON."""
    if answer.truncated:
        return ServerStatus(ServerState.NOT_METRICS, f"{url}: answer larger than {MAX_BODY_BYTES} bytes", url)
    try:
        text = answer.body.decode("utf-8")
    except UnicodeDecodeError:
        return ServerStatus(ServerState.UNPARSEABLE, f"{url}: answer is not UTF-8 text", url)
    content_type = answer.content_type.lower()
    head = text.lstrip()[:256].lower()
    if "html" in content_type or head.startswith(("<!doctype", "<html", "<")):
        return ServerStatus(ServerState.NOT_METRICS, f"{url}: an HTML page, not Prometheus metrics", url)
    if "json" in content_type or head.startswith(("{", "[")):
        return ServerStatus(ServerState.NOT_METRICS, f"{url}: JSON, not Prometheus text metrics", url)
    return text


def parse_latency_totals(text: str, url: str, model_name: str | None = None) -> LatencyTotals | ServerStatus:
    """Cumulative ITL totals from one /metrics body, or the status naming what is wrong with it."""
    try:
        hist, gauges, n_families = _latency_families(text)
    except (ValueError, TypeError, IndexError, KeyError) as exc:
        first = server_text(str(exc).splitlines()[0][:120]) if str(exc).strip() else type(exc).__name__
        return ServerStatus(ServerState.UNPARSEABLE, f"{url}: not Prometheus text ({first})", url)
    if n_families == 0:
        return ServerStatus(ServerState.NO_LATENCY_METRIC, f"{url}: empty metrics page", url)
    for source, name in LATENCY_FAMILIES:
        series = hist.get(name)
        if not series:
            continue
        complete = {key: v for key, v in series.items() if "sum" in v and "count" in v}
        models = sorted({dict(key).get(_MODEL_LABEL, "") for key in complete} - {""})
        if model_name is not None:
            complete = {key: v for key, v in complete.items() if dict(key).get(_MODEL_LABEL) == model_name}
            if not complete:
                serving = server_text(", ".join(models)) or "no model_name label"
                return ServerStatus(
                    ServerState.NO_LATENCY_METRIC,
                    f"{url}: no {name} samples for model {model_name!r} (serving: {serving})",
                    url,
                    source,
                )
        if not complete:
            continue
        total_sum = _total(v["sum"] for v in complete.values())
        total_count = _total(v["count"] for v in complete.values())
        if total_sum is None or total_count is None:
            return ServerStatus(
                ServerState.UNPARSEABLE,
                f"{url}: {name} has non-finite, negative or out-of-range totals (each must be 0 to {MAX_TOTAL:g})",
                url,
            )
        picked = tuple(sorted({server_text(dict(key).get(_MODEL_LABEL, "")) for key in complete} - {""}))
        return LatencyTotals(
            source=source,
            metric=name,
            sum_s=total_sum,
            count=total_count,
            model_names=picked,
            running_requests=_gauge_sum(gauges.get(_RUNNING_GAUGES[source], []), model_name),
            server_accept_length=_gauge_mean(gauges.get(_SGLANG_ACCEPT_GAUGE, []), model_name)
            if source == "sglang"
            else None,
        )
    engines = sorted({name.split(":", 1)[0] for name in hist} | {n.split(":", 1)[0] for n in gauges})  # known names
    seen = f" ({'/'.join(engines)} metrics present)" if engines else ""
    return ServerStatus(
        ServerState.NO_LATENCY_METRIC,
        f"{url}: {n_families} metric families but no SGLang or vLLM inter-token latency histogram{seen}",
        url,
    )


_Histograms = dict[str, dict[tuple[tuple[str, str], ...], dict[str, float]]]
"""{family: {labels without `le`: {"sum": x, "count": y}}}"""
_Gauges = dict[str, list[tuple[dict[str, str], float]]]
"""{gauge name: [(labels, value)]}"""


def _latency_families(text: str) -> tuple[_Histograms, _Gauges, int]:
    """The latency histograms' sums and counts and the gauges decodetop reads from a /metrics body, and how many
    metric families it holds. prometheus_client's parse errors (ValueError, TypeError, IndexError, KeyError) pass
    through to the caller."""
    from prometheus_client.parser import text_string_to_metric_families  # only where a --server is read

    hist: _Histograms = {}
    gauges: _Gauges = {}
    wanted = {family for _, family in LATENCY_FAMILIES}
    wanted_gauges = {*_RUNNING_GAUGES.values(), _SGLANG_ACCEPT_GAUGE}
    n_families = 0
    for family in text_string_to_metric_families(text):
        n_families += 1
        if family.name in wanted_gauges:
            gauges[family.name] = [(dict(s.labels), float(s.value)) for s in family.samples]
        if family.name not in wanted:
            continue
        per_labels = hist.setdefault(family.name, {})
        for sample in family.samples:
            suffix = sample.name[len(family.name) :]
            if suffix not in {"_sum", "_count"}:
                continue
            key = tuple(sorted((k, v) for k, v in sample.labels.items() if k != "le"))
            per_labels.setdefault(key, {})[suffix[1:]] = float(sample.value)
    return hist, gauges, n_families


MAX_TOTAL = 1e15
"""Largest cumulative histogram sum (seconds) or count taken from a server: 31 million years of latency, or a
million tokens a second for 30 years; anything larger is a crafted page, and a difference of two such totals could
overflow."""


def _total(values: Iterable[float]) -> float | None:
    """The sum of a histogram's per-label totals, or None when one is not finite, negative or above `MAX_TOTAL`
    (checked before summing: `math.fsum` raises OverflowError on an intermediate overflow)."""
    kept = list(values)
    if any(not (math.isfinite(v) and 0 <= v <= MAX_TOTAL) for v in kept):
        return None
    total = math.fsum(kept)
    return total if total <= MAX_TOTAL * 1e3 else None


def _select(samples: Iterable[tuple[dict[str, str], float]], model_name: str | None) -> list[float]:
    return [
        value
        for labels, value in samples
        if math.isfinite(value) and (model_name is None or labels.get(_MODEL_LABEL) == model_name)
    ]


def _gauge_sum(samples: list[tuple[dict[str, str], float]], model_name: str | None) -> float | None:
    values = [v for v in _select(samples, model_name) if 0 <= v <= MAX_TOTAL]
    return math.fsum(values) if values else None


def _gauge_mean(samples: list[tuple[dict[str, str], float]], model_name: str | None) -> float | None:
    values = [v for v in _select(samples, model_name) if 0 <= v <= MAX_TOTAL]
    return math.fsum(values) / len(values) if values else None


@dataclass(frozen=True)
class _Scrape:
    t_s: float
    totals: LatencyTotals


class ServerStepSource:
    """Polls a serving engine's /metrics and derives the observed step over a sliding window.

    Each `poll()` scrapes once and compares with the newest earlier scrape at least `window_s` old (or the oldest
    kept, while the window fills). `accept_length` None means: the server's own SGLang accept length where it
    reports one, else 1. `model_name` picks one model's series; None aggregates all (a weighted mean).
    """

    def __init__(
        self,
        url: str,
        accept_length: float | None = None,
        *,
        model_name: str | None = None,
        window_s: float = DEFAULT_WINDOW_S,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        fetch: Callable[[str, float], str | ServerStatus] = fetch_metrics_text,
    ) -> None:
        self.url = normalize_url(url)
        if accept_length is not None and not ACCEPT_LENGTH.accepts(accept_length):
            raise UserInputError(f"accept length {accept_length!r}: must be a number {ACCEPT_LENGTH.range_text}")
        if not (math.isfinite(window_s) and window_s > 0):
            raise UserInputError(f"server window {window_s!r}: must be a positive number of seconds")
        if not (math.isfinite(timeout_s) and timeout_s > 0):
            raise UserInputError(f"server deadline {timeout_s!r}: must be a positive number of seconds")
        self.accept_length = accept_length
        self.model_name = model_name
        self.window_s = window_s
        self.timeout_s = timeout_s
        self._clock = clock
        self._wall_clock = wall_clock
        self._fetch = fetch
        self._history: collections.deque[_Scrape] = collections.deque()
        self.last_step: ServerStep | None = None
        """The latest step observed; a status returned later carries it (`ServerStatus.last_step`)."""

    def poll(self) -> ServerStep | ServerStatus:
        """Scrape once (within the `timeout_s` deadline); the observed step over the window, or the status that says
        why there is none, carrying the last step observed before it."""
        answer = self._poll()
        if isinstance(answer, ServerStep):
            self.last_step = answer
            return answer
        return replace(answer, last_step=self.last_step)

    def _poll(self) -> ServerStep | ServerStatus:
        now = self._clock()
        text = self._fetch(self.url, self.timeout_s)
        if isinstance(text, ServerStatus):
            return text
        totals = parse_latency_totals(text, self.url, self.model_name)
        if isinstance(totals, ServerStatus):
            return totals
        current = _Scrape(now, totals)
        if self._history and _is_reset(self._history[-1].totals, totals):
            self._history.clear()
            self._history.append(current)
            return ServerStatus(
                ServerState.RESET,
                f"{self.url}: {totals.metric} went backwards (server restarted?); measuring again",
                self.url,
                totals.source,
            )
        self._history.append(current)
        while len(self._history) > 2 and self._history[1].t_s <= now - self.window_s:
            self._history.popleft()
        base = self._history[0]
        if base is current:
            return ServerStatus(
                ServerState.WAITING,
                f"{totals.source} at {self.url}: first scrape taken; the step shows after the next",
                self.url,
                totals.source,
            )
        return self._step(totals, base, now)

    def _step(self, totals: LatencyTotals, base: _Scrape, now: float) -> ServerStep | ServerStatus:
        """The step between the `base` scrape and this one, or why there is none: idle, or a mean that is no
        observed step (outside `OBSERVED_MS`, or over less than one sample: a crafted page, never passed on)."""
        d_count = totals.count - base.totals.count
        d_sum = totals.sum_s - base.totals.sum_s
        window = now - base.t_s
        if d_count <= 0:
            return ServerStatus(
                ServerState.IDLE,
                f"{totals.source} at {self.url}: no tokens generated in the last {window:.0f} s (idle)",
                self.url,
                totals.source,
            )
        itl_ms = d_sum / d_count * 1e3
        factor, factor_from = self._factor(totals)
        if d_count < 1 or not OBSERVED_MS.accepts(itl_ms * factor):
            return ServerStatus(
                ServerState.UNPARSEABLE,
                f"{self.url}: {totals.metric} gives a mean step of {format_number(itl_ms * factor)} ms over "
                f"{format_number(d_count)} samples, not an observed step ({OBSERVED_MS.range_text} over at least 1 "
                "sample); not used",
                self.url,
                totals.source,
            )
        return ServerStep(
            step_ms=itl_ms * factor,
            itl_ms=itl_ms,
            source=totals.source,
            metric=totals.metric,
            samples=round(d_count),
            window_s=window,
            accept_length=factor,
            accept_length_from=factor_from,
            url=self.url,
            running_requests=totals.running_requests,
            model_names=totals.model_names,
            note=_VLLM_NOTE if totals.source == "vllm" and self.accept_length not in (None, 1.0) else "",
            taken_unix_s=self._wall_clock(),
        )

    def _factor(self, totals: LatencyTotals) -> tuple[float, str]:
        if totals.source != "sglang":
            return 1.0, "none"  # vLLM: one ITL sample per engine step already (module docstring)
        if self.accept_length is not None:
            return self.accept_length, "given"
        server = totals.server_accept_length
        if server is not None and ACCEPT_LENGTH.accepts(server):
            return server, "server"
        return 1.0, "none"


def _is_reset(old: LatencyTotals, new: LatencyTotals) -> bool:
    return old.metric != new.metric or new.count < old.count or new.sum_s < old.sum_s
