"""Provides the live UI's trace source: `--trace FILE|DIR` and the capture key's background work (blocking calls,
run in a worker thread), each ending in a `TraceLoad` or a `UserInputError` with one line for the status bar.

Captured traces are kept under the state directory, one directory per capture with a `capture.json` that records
the scenario (model, TP) the trace was taken under, the server, the engine and the files, so a later session can
tell which budget a kept trace belongs to.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from decodetop.budget.deployment import Deployment
from decodetop.budget.inventory import build_inventory
from decodetop.budget.scenario import ModelSource, load_model
from decodetop.budget.spec import ModelSpec, load_preset
from decodetop.errors import UserInputError
from decodetop.traces.capture import capture, detect_engine
from decodetop.traces.mismatch import ModelShape, mismatch_line, trace_mismatches
from decodetop.traces.ranks import TraceSet, analyze_path, trace_files
from decodetop.traces.reader import MAX_TRACE_BYTES

TRACE_CAP_BYTES = MAX_TRACE_BYTES
"""Largest trace (all ranks together, counted once decompressed) the UI reads: 2 GiB. Reading and attributing one
peaks at about 0.45 × its size and takes ~75 s per GB on a 2-core machine (1 GB: 446 MiB,
benchmarks/results/traces/trace_load_cpu2.json); beyond this a capture of too many steps is more likely than a trace
worth minutes of reading."""
CAPTURE_STEPS = 5
"""Decode steps the capture key asks for (`decodetop trace --steps` has the same default)."""
CAPTURE_TIMEOUT_S = 120.0
"""Overall deadline of one capture (`decodetop trace --timeout` has the same default)."""

Progress = Callable[[str], None]
"""A one-line progress note, called from the worker thread."""


@dataclass(frozen=True)
class TraceOptions:
    """Where traces come from: a file or per-rank directory given with --trace, and the server for the capture key."""

    path: Path | None = None
    server: str | None = None
    """The serving engine's base URL (--server): /start_profile lives there."""
    state_dir: Path | None = None
    """Where captures are kept (None: the capture goes to a temporary directory)."""
    steps: int = CAPTURE_STEPS
    timeout_s: float = CAPTURE_TIMEOUT_S
    max_bytes: int = TRACE_CAP_BYTES


@dataclass(frozen=True)
class TraceLoad:
    """A trace read and attributed: what the traced bar draws, with where it came from."""

    traces: TraceSet
    path: Path
    """The file (or directory of per-rank files) read."""
    modified_s: float
    """When the newest file was written (wall clock): the traced bar shows its age."""
    origin: str
    """'--trace' or 'captured from URL (engine)'."""
    layers: int | None = None
    mismatch: str = ""
    """What the trace shows that the model and TP it was loaded for do not have, one line ('' when nothing was
    found or no model was set: `decodetop.traces.mismatch`)."""


def base_url(server: str) -> str:
    """The engine's base URL from --server, which may name its /metrics endpoint."""
    url = server.rstrip("/")
    return url.removesuffix("/metrics")


def check_size(paths: list[Path], max_bytes: int) -> None:
    """Refuse a trace whose files together exceed `max_bytes`, naming the size and the cap."""
    total = 0
    for path in paths:
        try:
            total += path.stat().st_size
        except OSError as exc:
            raise UserInputError(f"{path}: cannot read trace: {exc.strerror or exc}") from None
    if total > max_bytes:
        raise UserInputError(
            f"trace {paths[0].parent if len(paths) > 1 else paths[0]} is {total / 1e6:.0f} MB, over the "
            f"{max_bytes / 1e6:.0f} MB cap: capture fewer steps"
        )


def _spec_of(model: ModelSource | str | None) -> ModelSpec | None:
    """The model a `ModelSource` or the settings' preset name (`Settings.model`: a preset by its key, never guessed
    to be a path) names, or None where it names no model that reads."""
    if not model:
        return None
    try:
        return load_model(model) if isinstance(model, ModelSource) else load_preset(model)
    except (UserInputError, OSError, ValueError):
        return None


def layers_of(model: ModelSource | str | None) -> int | None:
    """The model's decoder layers (for 'N per layer'), or None where it names no model that reads."""
    spec = _spec_of(model)
    return spec.n_layers if spec is not None else None


def mismatch_of(traces: TraceSet, model: ModelSource | str | None, tp: int | None) -> str:
    """The one line of what `traces` shows that `model` at `tp` does not have ('' without a known model; TP not
    judged where it is not set)."""
    spec = _spec_of(model)
    if spec is None:
        return ""
    try:
        inventory = build_inventory(spec, Deployment(tp=tp or 1))
    except UserInputError:  # a TP the model cannot split into: the budget says so, not the trace
        return ""
    shape = ModelShape.of(inventory, tp_known=tp is not None)
    return mismatch_line(shape, trace_mismatches(traces, shape))


def load(
    path: Path,
    options: TraceOptions,
    *,
    origin: str = "--trace",
    model: ModelSource | str | None = None,
    tp: int | None = None,
) -> TraceLoad:
    """Read and attribute a trace file or directory (blocking), checked against `model` at `tp`; one-line
    UserInputError on any problem."""
    files = [f for _, f in trace_files(path)]
    check_size(files, options.max_bytes)  # the files on disk first; the reader counts what they unpack to
    traces = analyze_path(path, max_bytes=options.max_bytes)
    modified = max((f.stat().st_mtime for f in files if f.exists()), default=time.time())
    return TraceLoad(traces, path, modified, origin, layers_of(model), mismatch_of(traces, model, tp))


def capture_dir(state_dir: Path | None, now_s: float) -> Path | None:
    """A fresh directory for one capture under the state directory (None without one)."""
    if state_dir is None:
        return None
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now_s))
    directory = state_dir / "traces" / stamp
    suffix = 1
    while directory.exists():
        suffix += 1
        directory = state_dir / "traces" / f"{stamp}-{suffix}"
    directory.mkdir(parents=True)
    return directory


def capture_and_load(
    options: TraceOptions,
    scenario: Mapping[str, object],
    *,
    progress: Progress,
    sleep: Callable[[float], None] = time.sleep,
) -> TraceLoad:
    """Ask the --server for a trace of `options.steps` decode steps, keep it under the state directory with the
    scenario it was taken under, and read it. Every failure is one UserInputError line."""
    if not options.server:
        raise UserInputError("trace capture needs --server URL (a SGLang or vLLM server with its profiler on)")
    url = base_url(options.server)
    vllm_dir = options.path if options.path is not None and options.path.is_dir() else None
    started = time.monotonic()

    def tick(seconds: float) -> None:
        progress(f"trace: capturing {options.steps} steps from {url}… {time.monotonic() - started:.0f} s")
        sleep(seconds)

    progress(f"trace: capturing {options.steps} steps from {url}…")
    engine = detect_engine(url)
    keep = capture_dir(options.state_dir, time.time())
    if engine == "vllm" and vllm_dir is None:
        raise UserInputError(
            "trace: vLLM writes traces to its VLLM_TORCH_PROFILER_DIR: start decodetop with --trace DIR "
            "(that directory)"
        )
    result = capture(
        url,
        steps=options.steps,
        output_dir=keep if engine == "sglang" else vllm_dir,
        engine=engine,
        timeout_s=max(0.1, options.timeout_s - (time.monotonic() - started)),
        sleep=tick,
    )
    files = [result.path, *result.other_files]
    if keep is not None:
        record = {
            "scenario": dict(scenario),
            "server": url,
            "engine": result.engine,
            "files": [str(f) for f in files],
            "captured_at_s": time.time(),
        }
        (keep / "capture.json").write_text(json.dumps(record, indent=1, default=str), encoding="utf-8")
    check_size(files, options.max_bytes)
    progress(f"trace: reading {len(files)} trace file{'s' if len(files) > 1 else ''}…")
    traces = analyze_path(files)
    source = _source_of(scenario.get("model"))
    tp = scenario.get("tp")
    return TraceLoad(
        traces,
        result.path if len(files) == 1 else result.output_dir,
        max(f.stat().st_mtime for f in files),
        f"captured from {url} ({result.engine})",
        layers_of(source),
        mismatch_of(traces, source, tp if isinstance(tp, int) and not isinstance(tp, bool) else None),
    )


def _source_of(model: object) -> ModelSource | None:
    """The model of a capture's scenario ({"kind": "preset" | "config", "value": …}), None where it names none."""
    if not isinstance(model, Mapping):
        return None
    kind, value = model.get("kind"), model.get("value")
    if kind not in ("preset", "config") or not isinstance(value, str) or not value:
        return None
    return ModelSource(str(kind), value)
