"""Provides `capture`: ask a live SGLang or vLLM server for a profiler trace of a few decode steps (each request
under one overall deadline, `decodetop.httpget`).

SGLang: `POST /start_profile` with a JSON body {output_dir, num_steps, activities}; the server stops by itself after
`num_steps` forward steps and writes `<time>-TP-<rank>.trace.json.gz` into output_dir. vLLM (started with
VLLM_TORCH_PROFILER_DIR set, which is what registers the endpoints): `POST /start_profile`, let it run, then
`POST /stop_profile`; traces land in that directory. Either way we wait, with a deadline, for a new trace file whose
size has stopped changing. Every request has a timeout; every failure is one line that says what to do.
"""

from __future__ import annotations

import contextlib
import json
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from decodetop.errors import UserInputError
from decodetop.httpget import BadUrlError, HttpRequestError, check_url, http_request, server_text

HOW_TO_START = (
    "start a profiling-enabled server: SGLang has /start_profile built in (the trace is written on the server's "
    "host, so use a directory both can see with --output-dir); vLLM needs VLLM_TORCH_PROFILER_DIR=DIR in its "
    "environment (then pass --trace-dir DIR)"
)
PROBE_TIMEOUT_S = 3.0
"""Timeout of the engine-detection GETs: they answer at once on a live server."""
SETTLE_S = 1.0
"""A trace file counts as written once its size has not changed for this long (profilers write in bursts)."""


@dataclass(frozen=True)
class CaptureResult:
    """Where the captured trace is, and how it was obtained."""

    path: Path
    engine: str
    output_dir: Path
    waited_s: float
    other_files: tuple[Path, ...]


def _request(url: str, *, method: str, body: bytes | None, timeout_s: float) -> tuple[int, str]:
    """(status, first line of the body) within ONE overall deadline of `timeout_s` (`decodetop.httpget`: a server
    that trickles is cut off there); HTTP errors come back as their status, not as exceptions."""
    headers = {"Content-Type": "application/json"} if body is not None else {}
    try:
        answer = http_request(
            url, deadline_s=max(timeout_s, 0.1), method=method, body=body, headers=headers, max_body_bytes=4096
        )
    except HttpRequestError as exc:
        if exc.timed_out:
            raise UserInputError(f"no answer from {url} within {timeout_s:.0f} s") from None
        raise UserInputError(f"cannot reach {url}: {exc.reason}; {HOW_TO_START}") from None
    return answer.status, _first_line(answer.body)


def _first_line(data: bytes) -> str:
    """The first line of an answer's body, inert (`decodetop.httpget.server_text`): the server chose it."""
    text = data.decode("utf-8", "replace").strip()
    return server_text(text.splitlines()[0]) if text else ""


def detect_engine(base_url: str) -> str:
    """'sglang' if /get_server_info answers, 'vllm' if /version does; else a one-line error."""
    if _request(f"{base_url}/get_server_info", method="GET", body=None, timeout_s=PROBE_TIMEOUT_S)[0] == 200:
        return "sglang"
    if _request(f"{base_url}/version", method="GET", body=None, timeout_s=PROBE_TIMEOUT_S)[0] == 200:
        return "vllm"
    raise UserInputError(
        f"{base_url} answers neither SGLang's /get_server_info nor vLLM's /version: pass --engine sglang|vllm"
    )


def _trace_files(directory: Path) -> dict[Path, int]:
    if not directory.is_dir():
        return {}
    out = {}
    for path in directory.rglob("*"):
        if path.is_file() and path.name.endswith((".json", ".json.gz")):
            try:
                out[path] = path.stat().st_size
            except OSError:
                continue
    return out


def capture(
    url: str,
    *,
    steps: int = 5,
    output_dir: str | Path | None = None,
    engine: str = "auto",
    timeout_s: float = 120.0,
    duration_s: float = 3.0,
    poll_s: float = 0.25,
    settle_s: float = SETTLE_S,
    activities: Sequence[str] = ("CPU", "GPU"),
    sleep: Callable[[float], None] = time.sleep,
) -> CaptureResult:
    """Start the server's profiler, wait for the trace file (deadline `timeout_s`) and return where it is."""
    base = url.rstrip("/")
    _check_arguments(base, url, steps, timeout_s)
    started = time.monotonic()
    if engine == "auto":
        engine = detect_engine(base)
    if engine not in {"sglang", "vllm"}:
        raise UserInputError(f"--engine: {engine!r} is not sglang, vllm or auto")
    made: Path | None = None
    if output_dir is None:
        if engine == "vllm":
            raise UserInputError("vLLM writes traces to its VLLM_TORCH_PROFILER_DIR: pass --trace-dir with that path")
        made = Path(tempfile.mkdtemp(prefix="decodetop-trace-"))
        output_dir = made
    try:
        return _capture_into(
            base,
            Path(output_dir).resolve(),
            engine,
            steps=steps,
            activities=activities,
            started=started,
            timeout_s=timeout_s,
            duration_s=duration_s,
            poll_s=poll_s,
            settle_s=settle_s,
            sleep=sleep,
        )
    except BaseException:
        if made is not None:
            _remove_if_empty(made)  # a failed capture leaves no empty temporary directory behind
        raise


def _remove_if_empty(directory: Path) -> None:
    """Remove `directory` and its empty subdirectories; a directory holding any file is kept (a trace is data)."""
    for sub in sorted(directory.rglob("*"), key=lambda p: len(p.parts), reverse=True):
        if sub.is_dir() and not sub.is_symlink():
            with contextlib.suppress(OSError):
                sub.rmdir()
    with contextlib.suppress(OSError):
        directory.rmdir()


def _capture_into(
    base: str,
    directory: Path,
    engine: str,
    *,
    steps: int,
    activities: Sequence[str],
    started: float,
    timeout_s: float,
    duration_s: float,
    poll_s: float,
    settle_s: float,
    sleep: Callable[[float], None],
) -> CaptureResult:
    """Start the profiler, wait for its files in `directory` and say where they are."""
    deadline = started + timeout_s
    before = _trace_files(directory)

    def remaining() -> float:
        return max(0.1, deadline - time.monotonic())

    start = f"{base}/start_profile"
    if engine == "sglang":
        body = json.dumps({"output_dir": str(directory), "num_steps": steps, "activities": list(activities)})
        _check(*_request(start, method="POST", body=body.encode(), timeout_s=remaining()), start)
    else:
        _check(*_request(start, method="POST", body=None, timeout_s=remaining()), start)
        sleep(min(duration_s, remaining()))
        stop = f"{base}/stop_profile"
        _check(*_request(stop, method="POST", body=None, timeout_s=remaining()), stop)
    done = _wait_for_files(directory, before, deadline=deadline, poll_s=poll_s, settle_s=settle_s, sleep=sleep)
    if not done:
        raise UserInputError(
            f"no trace file appeared in {directory} within {timeout_s:.0f} s after {engine} accepted the request "
            "(is the server idle, so no decode steps ran? is that directory on the server's host?)"
        )
    done.sort(key=lambda p: (0 if "TP-0" in p.name else 1, p.name))
    return CaptureResult(done[0], engine, directory, time.monotonic() - started, tuple(done[1:]))


def _check_arguments(base: str, url: str, steps: int, timeout_s: float) -> None:
    if not base.startswith(("http://", "https://")):
        raise UserInputError(f"--server: {server_text(url)!r} is not an http(s) URL")
    try:
        check_url(base)
    except BadUrlError as exc:
        raise UserInputError(f"--server {server_text(url)!r}: {exc}") from None
    if steps < 1:
        raise UserInputError(f"--steps: {steps} must be at least 1")
    if timeout_s <= 0:
        raise UserInputError(f"--timeout: {timeout_s} must be positive")


def _wait_for_files(
    directory: Path,
    before: dict[Path, int],
    *,
    deadline: float,
    poll_s: float,
    settle_s: float,
    sleep: Callable[[float], None],
) -> list[Path]:
    """The new trace files (one per rank) once every one has stopped growing for `settle_s`; [] at the deadline."""
    sizes: dict[Path, tuple[int, float]] = {}
    while True:
        now = _trace_files(directory)
        clock = time.monotonic()
        fresh = {p: s for p, s in now.items() if p not in before or before[p] != s}
        done = []
        for path, size in fresh.items():
            last, since = sizes.get(path, (-1, clock))
            if size != last:
                since = clock
            sizes[path] = (size, since)
            if size > 0 and clock - since >= settle_s:
                done.append(path)
        if done and len(done) == len(fresh):
            return done
        if time.monotonic() >= deadline:
            return []
        sleep(poll_s)


def _check(status: int, text: str, url: str) -> None:
    if status == 404:
        raise UserInputError(f"{url}: not found (404): this server has no profiling endpoint; {HOW_TO_START}")
    if not 200 <= status < 300:
        raise UserInputError(f"{url} refused ({status}): {text or 'no message'}")
