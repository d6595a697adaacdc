"""Provides `ProbeController`: spawns the probe group, runs probes on it, owns deadlines, cancel and shutdown.

The controller never imports torch. It spawns one process per chosen GPU (or `cpu_ranks` CPU processes where
there is no GPU) with the `spawn` start method; the ranks join torch.distributed through a FileStore in a private
temporary directory (no fixed port), NCCL on GPUs and gloo on CPUs. Each rank has one duplex pipe to the
controller; the controller waits on those pipes, the ranks' process sentinels and a wake-up pipe for `cancel()`.

- A probe that raises on a rank gives a `failed` result with that rank's error and traceback. Ranks that are
  left waiting in a collective get `error_grace_s` to finish; then the group is terminated and respawned lazily.
- A probe that outlives its deadline: the group is terminated, the result says "timed out after N s", and the next
  `run` spawns a fresh group.
- `cancel()` (from any thread) ends the running probe at once with a `cancelled` result.
- A rank that dies (a signal, `os._exit`, the OOM killer) gives a `failed` result naming that rank and how it
  died ("rank 1 died: killed by SIGKILL"), not the transport error its peers saw.
- The ranks' stdout and stderr (Python and C-level) go to one log file per controller under the state dir
  (`rank_log`), never to the terminal; each result carries the file's path and the count of Python warnings.
- `close()` asks idle ranks to leave (they free CUDA graphs, give `destroy_process_group` a deadline — it can
  hang after graph-captured collectives, docs/reference/h200-machine.md — and exit), then terminates and kills whatever
  is left, all within `close_timeout_s` (5 s).

Usage::

    with ProbeController(cpu_ranks=2) as pc:
        result = pc.run("allreduce", {"sizes": [8, 4096]}, on_progress=lambda p: print(p.line()))
"""

from __future__ import annotations

import contextlib
import datetime as dt
import multiprocessing
import os
import platform
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from pathlib import Path
from types import TracebackType
from typing import Any

from decodetop.errors import DecodetopError, UserInputError
from decodetop.paths import state_dir
from decodetop.probes.gpuinfo import GpuInfo, clock_snapshot, host_environment_fields, visible_gpus
from decodetop.probes.protocol import (
    RANK_ENV_DEFAULTS,
    Fatal,
    Progress,
    RankConfig,
    RankDone,
    Ready,
    RunProbe,
    Shutdown,
)
from decodetop.probes.rankmain import rank_entry
from decodetop.probes.registry import ProbeRegistry
from decodetop.probes.results import (
    Environment,
    ProbeResult,
    ProbeStatus,
    RankOutput,
    merge_rank_outputs,
)

ProgressCallback = Callable[[Progress], None]


#: Default number of CPU ranks where there is no GPU: 2, the fewest that make a real collective.
DEFAULT_CPU_RANKS = 2
#: Time the ranks get to import torch and join the group (torch import alone takes seconds on a cold disk).
DEFAULT_START_TIMEOUT_S = 180.0
#: After one rank fails, how long the others get to report before the group is restarted (they may be stuck in a
#: collective the failed rank never joined).
DEFAULT_ERROR_GRACE_S = 3.0
#: The bound on quitting (docs/architecture.md, Processes): closing ends every rank within 5 s.
DEFAULT_CLOSE_TIMEOUT_S = 5.0
#: Longest single wait between checks of the deadline and the cancel flag.
_POLL_S = 0.25


class ProbeGroupError(DecodetopError):
    """The probe group could not be started (a rank failed to import torch or to join the group)."""


@dataclass(frozen=True)
class GroupLayout:
    """Which devices the group runs on: `kind` "cuda" with `gpus`, or "cpu" with `world_size` ranks."""

    kind: str
    world_size: int
    gpus: tuple[GpuInfo, ...] = ()

    @property
    def backend(self) -> str:
        return "nccl" if self.kind == "cuda" else "gloo"


def resolve_layout(
    gpus: Sequence[int] | None = None,
    cpu_ranks: int | None = None,
    device: str = "auto",
    available: Sequence[GpuInfo] | None = None,
) -> GroupLayout:
    """Pick the group's devices; one-line `UserInputError` for a GPU that is not there or a bad rank count.

    device "auto" uses every visible GPU (or `gpus`), falling back to CPU ranks where there is none;
    "cpu" forces CPU ranks (gloo) even on a GPU host; "cuda" requires GPUs.
    """
    if device not in {"auto", "cpu", "cuda"}:
        raise UserInputError(f"device must be auto, cpu or cuda, got {device!r}")
    if cpu_ranks is not None and cpu_ranks < 1:
        raise UserInputError(f"--cpu-ranks must be at least 1, got {cpu_ranks}")
    found = list(visible_gpus() if available is None else available)
    if device == "cpu":
        if gpus:
            raise UserInputError("--gpus cannot be combined with CPU ranks")
        return GroupLayout("cpu", cpu_ranks or DEFAULT_CPU_RANKS)
    if gpus is not None:
        if not gpus:
            raise UserInputError("--gpus names no GPU")
        if len(set(gpus)) != len(gpus):
            raise UserInputError(f"--gpus names a GPU twice: {','.join(map(str, gpus))}")
        for index in gpus:
            if index < 0 or index >= len(found):
                have = (
                    f"this host shows {len(found)}: {', '.join(str(g.cuda_index) for g in found)}"
                    if found
                    else ("this host shows no CUDA GPU")
                )
                raise UserInputError(f"--gpus: no GPU {index} ({have})")
        return GroupLayout("cuda", len(gpus), tuple(found[i] for i in gpus))
    if found:
        return GroupLayout("cuda", len(found), tuple(found))
    if device == "cuda":
        raise UserInputError("no CUDA GPU visible on this host")
    return GroupLayout("cpu", cpu_ranks or DEFAULT_CPU_RANKS)


def _utc_now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def describe_exit(exitcode: int | None) -> str:
    """How a process ended, from its exit code: 'killed by SIGKILL', 'exit code 7'."""
    if exitcode is None:
        return "exit status unknown"
    if exitcode < 0:
        try:
            return f"killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"killed by signal {-exitcode}"
    return f"exit code {exitcode}"


#: Rank logs kept in the state dir's `logs/` (older ones are removed when a controller starts its first group).
KEEP_RANK_LOGS = 20


def default_rank_log() -> Path:
    """`<state dir>/logs/ranks-<UTC time>-<pid>.log`: one file per controller (per run of decodetop)."""
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return state_dir() / "logs" / f"ranks-{stamp}-{os.getpid()}.log"


@dataclass(frozen=True)
class _RunStart:
    """What a probe run knows from its start: the probe, its resolved parameters, when, and the clocks before."""

    probe: str
    params: Mapping[str, Any]
    started_utc: str
    t0: float
    nvml_before: list[dict[str, Any]]
    started_us: int = 0
    """Wall clock at the start, µs since the epoch (NVML's clock for per-process utilisation samples)."""
    group_pids: tuple[int, ...] = ()
    """The group's processes when the probe started (a group respawned during the probe had others)."""


@dataclass
class _Replies:
    """The ranks' replies to probe command `seq`."""

    seq: int
    on_progress: ProgressCallback | None
    outputs: dict[int, RankOutput] = field(default_factory=dict)
    errors: dict[int, tuple[str, str | None]] = field(default_factory=dict)
    died: dict[int, str] = field(default_factory=dict)
    """Ranks whose process ended during the probe, with how ('killed by SIGKILL')."""
    warnings: int = 0

    def answered(self, rank: int) -> bool:
        return rank in self.outputs or rank in self.errors

    def handle(self, msg: object, rank: int) -> None:
        if isinstance(msg, Progress):
            if msg.seq == self.seq and self.on_progress is not None:
                with contextlib.suppress(Exception):  # a broken UI callback must not break the probe
                    self.on_progress(msg)
        elif isinstance(msg, RankDone):
            if msg.seq != self.seq:
                return
            self.warnings += msg.warnings
            if msg.error is not None:
                self.errors[rank] = (msg.error, msg.traceback)
            elif msg.output is not None:
                self.outputs[rank] = msg.output
            else:
                self.errors[rank] = ("rank returned no output", None)
        elif isinstance(msg, Fatal):
            self.errors[rank] = (msg.error, msg.traceback)

    def read_pending(self, conn: Connection, rank: int) -> None:
        with contextlib.suppress(EOFError, OSError):
            while conn.poll(0):
                self.handle(conn.recv(), rank)


@dataclass
class _Group:
    procs: list[BaseProcess]
    conns: list[Connection]
    tmpdir: str
    environment: Environment | None = None
    busy: bool = False
    dead: bool = False  # a rank exited: the group must be replaced before the next probe


class ProbeController:
    """Runs probes on a spawned group of ranks. Context manager; `run` is blocking, `cancel` works from any thread."""

    def __init__(
        self,
        *,
        gpus: Sequence[int] | None = None,
        cpu_ranks: int | None = None,
        device: str = "auto",
        registry: ProbeRegistry | None = None,
        rank_env: Mapping[str, str] | None = None,
        start_timeout_s: float = DEFAULT_START_TIMEOUT_S,
        error_grace_s: float = DEFAULT_ERROR_GRACE_S,
        close_timeout_s: float = DEFAULT_CLOSE_TIMEOUT_S,
        layout: GroupLayout | None = None,
        rank_log: Path | None = None,
    ) -> None:
        self.layout = layout or resolve_layout(gpus, cpu_ranks, device)
        self.rank_log: Path = rank_log or default_rank_log()
        """Where the ranks' stdout and stderr go (appended; created with the first group)."""
        self.registry = registry or ProbeRegistry()
        self._rank_env_extra = dict(rank_env or {})
        self.start_timeout_s = start_timeout_s
        self.error_grace_s = error_grace_s
        self.close_timeout_s = close_timeout_s
        self._group: _Group | None = None
        self._run_lock = threading.Lock()
        self._state_lock = threading.Lock()
        self._cancel = threading.Event()
        self._wake_r, self._wake_w = multiprocessing.Pipe(duplex=False)
        self._seq = 0
        self._closed = False
        self._start_warnings = 0  # Python warnings the ranks showed while starting, told with the next result

    # ----------------------------------------------------------------------------------------------- lifecycle
    @property
    def world_size(self) -> int:
        return self.layout.world_size

    @property
    def backend(self) -> str:
        return self.layout.backend

    @property
    def environment(self) -> Environment | None:
        """The environment rank 0 reported when the current group started (None before `start`)."""
        group = self._group
        return group.environment if group else None

    def _group_pids(self) -> list[int]:
        """The ranks' pids and their children's (a rank's helper processes hold GPU memory under its name too)."""
        import psutil

        pids = set(self.rank_pids())
        for pid in list(pids):
            with contextlib.suppress(psutil.Error):
                pids.update(c.pid for c in psutil.Process(pid).children(recursive=True))
        return sorted(pids)

    def rank_pids(self) -> list[int]:
        """PIDs of the live ranks (for tests and the UI's process list)."""
        group = self._group
        return [p.pid for p in group.procs if p.pid is not None and p.is_alive()] if group else []

    def __enter__(self) -> ProbeController:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def start(self) -> None:
        """Spawn the group and wait until every rank joined (no-op when it is up). Raises `ProbeGroupError`."""
        with self._run_lock:
            self._ensure_group()

    def close(self) -> None:
        """End every rank (graceful when idle, else terminate/kill) within `close_timeout_s`; idempotent."""
        self._closed = True
        self.cancel()
        with self._run_lock:
            self._stop_group(graceful=True)
            self._cancel.clear()

    def cancel(self) -> None:
        """End the running probe now (its result is `cancelled`); a no-op when nothing runs."""
        self._cancel.set()
        with contextlib.suppress(OSError):
            self._wake_w.send(None)

    # ----------------------------------------------------------------------------------------------- probing
    def run(
        self,
        probe: str,
        params: Mapping[str, Any] | None = None,
        *,
        timeout_s: float | None = None,
        on_progress: ProgressCallback | None = None,
    ) -> ProbeResult:
        """Run `probe` on every rank and return the merged result (never raises for a probe's own failure)."""
        spec = self.registry.get(probe)
        resolved = spec.resolve_params(params)
        deadline_s = spec.default_timeout_s if timeout_s is None else float(timeout_s)
        if deadline_s <= 0:
            raise UserInputError(f"timeout must be positive, got {deadline_s}")
        with self._run_lock:
            if self._closed:
                raise DecodetopError("probe controller is closed")
            self._drain_wake()
            self._cancel.clear()
            started_us = int(time.time() * 1e6)
            before = clock_snapshot(self.layout.gpus)
            start = _RunStart(
                probe, resolved, _utc_now(), time.monotonic(), before, started_us, tuple(self._group_pids())
            )
            if self._group is not None and (self._group.dead or not all(p.is_alive() for p in self._group.procs)):
                self._stop_group(graceful=False)  # a rank died since the last probe: start afresh
            try:
                group = self._ensure_group()
            except ProbeGroupError as exc:
                if self._cancel.is_set() or self._closed:
                    return self._finish(start, ProbeStatus.CANCELLED, "cancelled while the probe group was starting")
                return self._finish(start, ProbeStatus.FAILED, str(exc), error=str(exc))
            self._seq += 1
            group.busy = True
            try:
                try:
                    for conn in group.conns:
                        conn.send(RunProbe(seq=self._seq, probe=probe, module=spec.module, params=resolved))
                except OSError as exc:
                    self._stop_group(graceful=False)
                    msg = f"probe group lost before the probe started ({exc}); it restarts with the next probe"
                    return self._finish(start, ProbeStatus.FAILED, msg, error=msg)
                replies = _Replies(seq=self._seq, on_progress=on_progress)
                return self._collect(group, replies, start, deadline_s=deadline_s)
            except BaseException:
                # KeyboardInterrupt or a broken pipe mid-probe: ranks are in an unknown state; end them now.
                self._stop_group(graceful=False)
                raise

    def _finish(
        self,
        start: _RunStart,
        status: ProbeStatus,
        message: str = "",
        *,
        error: str | None = None,
        error_rank: int | None = None,
        traceback: str | None = None,
        replies: _Replies | None = None,
    ) -> ProbeResult:
        """The result of the run that began at `start`: what the ranks said, the run's timing and environment."""
        env = self._group.environment if self._group else None
        if env is not None:
            extra = dict(env.extra)
            if start.nvml_before:
                extra["nvml_before"] = start.nvml_before
                extra["nvml_after"] = clock_snapshot(self.layout.gpus, since_us=start.started_us)
                # the group's own processes, so a snapshot's other compute processes are someone else's
                extra["probe_pids"] = sorted({*start.group_pids, *self._group_pids()})
            env = replace(env, time_utc=start.started_utc, extra=extra)
        return ProbeResult(
            probe=start.probe,
            status=status,
            params=start.params,
            environment=env,
            started_utc=start.started_utc,
            duration_s=round(time.monotonic() - start.t0, 3),
            world_size=self.world_size,
            message=message,
            error=error,
            error_rank=error_rank,
            traceback=traceback,
            measurements=merge_rank_outputs(replies.outputs) if replies is not None else (),
            rank_warnings=(replies.warnings if replies is not None else 0) + self._take_start_warnings(),
            rank_log=str(self.rank_log),
        )

    def _collect(self, group: _Group, replies: _Replies, start: _RunStart, *, deadline_s: float) -> ProbeResult:
        """Wait for every rank's reply (or death), the deadline, a cancel, or the grace after a rank's error."""
        first_error_at: float | None = None
        conn_rank = {id(c): r for r, c in enumerate(group.conns)}
        sentinel_rank = {p.sentinel: r for r, p in enumerate(group.procs)}
        open_conns = list(group.conns)
        while True:
            now = time.monotonic()
            if self._cancel.is_set() or self._closed:
                self._stop_group(graceful=False)
                return self._finish(start, ProbeStatus.CANCELLED, "cancelled")
            if now - start.t0 >= deadline_s:
                self._stop_group(graceful=False)
                msg = f"timed out after {deadline_s:g} s"
                return self._finish(start, ProbeStatus.TIMED_OUT, msg, error=msg)
            if len(replies.outputs) + len(replies.errors) == self.world_size:
                break
            if first_error_at is not None and now - first_error_at >= self.error_grace_s:
                self._stop_group(graceful=False)  # ranks left in a collective the failed rank never joined
                break
            wait_s = min(_POLL_S, deadline_s - (now - start.t0))
            for obj in wait([*open_conns, *sentinel_rank, self._wake_r], timeout=max(wait_s, 0.0)):
                if obj is self._wake_r:
                    self._drain_wake()
                    continue
                if isinstance(obj, int):  # a process sentinel: that rank exited
                    rank = sentinel_rank.pop(obj)
                    self._on_rank_exit(group, rank, replies)
                else:
                    assert isinstance(obj, Connection)
                    rank = conn_rank[id(obj)]
                    try:
                        replies.handle(obj.recv(), rank)
                    except (EOFError, OSError):
                        open_conns.remove(obj)
                        continue
                if rank in replies.errors and first_error_at is None:
                    first_error_at = time.monotonic()
        group.busy = False
        return self._result_from(group, replies, start)

    @staticmethod
    def _on_rank_exit(group: _Group, rank: int, replies: _Replies) -> None:
        """A rank's process ended: unless it answered first, it died, and how (signal or exit code) is its error."""
        group.dead = True
        if replies.answered(rank):
            return
        # The sentinel closes just before the process can be reaped: wait for the exit code.
        group.procs[rank].join(timeout=1.0)
        replies.read_pending(group.conns[rank], rank)  # it may have replied just before dying
        if not replies.answered(rank):
            replies.died[rank] = describe_exit(group.procs[rank].exitcode)
            replies.errors[rank] = (f"rank {rank} died: {replies.died[rank]}", None)

    def _result_from(self, group: _Group, replies: _Replies, start: _RunStart) -> ProbeResult:
        """Every rank's reply as one result: failed (naming the rank that died, else the first that raised),
        unsupported (no rank measured anything, with the reason), or ok."""
        errors, outputs = replies.errors, replies.outputs
        if errors:
            # A rank that died is the cause; its peers' errors (a closed connection in the collective) follow.
            rank = min(replies.died) if replies.died else min(errors)
            error, tb = errors[rank]
            message = f"rank {rank}: {error}"
            if rank in replies.died:
                message = error
                others = [f"rank {r} then failed: {errors[r][0]}" for r in sorted(errors) if r != rank]
                tb = "\n".join(others) or None
            if group is self._group and (group.dead or any(not p.is_alive() for p in group.procs)):
                self._stop_group(graceful=False)
            return self._finish(
                start, ProbeStatus.FAILED, message, error=error, error_rank=rank, traceback=tb, replies=replies
            )
        reasons = [o.unsupported_reason for o in outputs.values() if o.unsupported_reason]
        if reasons and not any(o.measurements for o in outputs.values()):
            return self._finish(
                start,
                ProbeStatus.UNSUPPORTED,
                reasons[0],
                replies=replies,
            )
        return self._finish(start, ProbeStatus.OK, reasons[0] if reasons else "", replies=replies)

    def _take_start_warnings(self) -> int:
        count, self._start_warnings = self._start_warnings, 0
        return count

    def _drain_wake(self) -> None:
        with contextlib.suppress(EOFError, OSError):
            while self._wake_r.poll(0):
                self._wake_r.recv()

    # ----------------------------------------------------------------------------------------------- the group
    def _rank_env(self) -> dict[str, str]:
        env = {k: v for k, v in RANK_ENV_DEFAULTS.items() if k not in os.environ}
        if self.layout.kind == "cuda":
            if "CUDA_DEVICE_ORDER" not in os.environ:
                env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"  # CUDA numbering = NVML's, so --gpus means what smi shows
            env["CUDA_VISIBLE_DEVICES"] = ",".join(g.uuid for g in self.layout.gpus)
        else:
            env["CUDA_VISIBLE_DEVICES"] = ""  # CPU ranks must not touch a GPU even where one exists
        env.update(self._rank_env_extra)
        return env

    def _ensure_group(self) -> _Group:
        if self._group is not None:
            return self._group
        ctx = multiprocessing.get_context("spawn")
        tmpdir = tempfile.mkdtemp(prefix="decodetop-probe-")
        env = self._rank_env()
        log_path = self._prepare_rank_log()
        procs: list[BaseProcess] = []
        conns: list[Connection] = []
        group = _Group(procs=procs, conns=conns, tmpdir=tmpdir, busy=True)
        self._group = group
        try:
            for rank in range(self.world_size):
                parent_conn, child_conn = ctx.Pipe(duplex=True)
                config = RankConfig(
                    rank=rank,
                    world_size=self.world_size,
                    device_kind=self.layout.kind,
                    store_path=str(Path(tmpdir) / "store"),
                    env=env,
                    extra_probe_modules=self.registry.extra_modules,
                    parent_pid=os.getpid(),
                    join_timeout_s=self.start_timeout_s,
                    log_path=log_path,
                )
                proc = ctx.Process(
                    target=rank_entry, args=(config, child_conn), name=f"decodetop-probe-rank{rank}", daemon=True
                )
                proc.start()
                child_conn.close()
                procs.append(proc)
                conns.append(parent_conn)
            self._await_ready(group)
        except BaseException:
            self._stop_group(graceful=False)
            raise
        group.busy = False
        return group

    def _prepare_rank_log(self) -> str:
        """Create the rank log (or append to it) with a line marking this group's start; where the state dir cannot
        be written, a file in the temp dir instead. '' when neither can (the ranks keep the terminal's fds)."""
        header = f"== {_utc_now()} probe group: {self.world_size} {self.layout.kind} rank(s), pid {os.getpid()} ==\n"
        fallback = Path(tempfile.gettempdir()) / f"decodetop-ranks-{os.getpid()}.log"
        for path in (self.rank_log, fallback):
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                if not path.exists():
                    _prune_rank_logs(path.parent, keep=KEEP_RANK_LOGS - 1)
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
                try:
                    os.write(fd, header.encode())
                finally:
                    os.close(fd)
            except OSError:
                continue
            self.rank_log = path
            return str(path)
        return ""

    def _await_ready(self, group: _Group) -> None:
        ready: set[int] = set()
        deadline = time.monotonic() + self.start_timeout_s
        conn_rank = {id(c): r for r, c in enumerate(group.conns)}
        sentinels = {p.sentinel: r for r, p in enumerate(group.procs)}
        while len(ready) < self.world_size:
            remaining = deadline - time.monotonic()
            if self._cancel.is_set() or self._closed:
                raise ProbeGroupError("probe group start cancelled")
            if remaining <= 0:
                raise ProbeGroupError(
                    f"probe group did not start within {self.start_timeout_s:g} s "
                    f"({len(ready)}/{self.world_size} ranks joined)"
                )
            for obj in wait([*group.conns, *sentinels, self._wake_r], timeout=min(remaining, _POLL_S)):
                if obj is self._wake_r:
                    self._drain_wake()
                    continue
                if isinstance(obj, int):
                    rank = sentinels[obj]
                    conn = group.conns[rank]
                    with contextlib.suppress(EOFError, OSError):
                        if conn.poll(0):
                            msg = conn.recv()
                            if isinstance(msg, Fatal):
                                raise ProbeGroupError(f"probe rank {rank} failed to start: {msg.error}")
                    group.procs[rank].join(timeout=1.0)  # the sentinel closes just before the exit code is known
                    how = describe_exit(group.procs[rank].exitcode)
                    raise ProbeGroupError(f"probe rank {rank} died during start: {how}")
                assert isinstance(obj, Connection)
                rank = conn_rank[id(obj)]
                try:
                    msg = obj.recv()
                except (EOFError, OSError):
                    continue  # its sentinel reports the exit
                if isinstance(msg, Fatal):
                    raise ProbeGroupError(f"probe rank {rank} failed to start: {msg.error}")
                if isinstance(msg, Ready):
                    ready.add(rank)
                    self._start_warnings += msg.warnings
                    if msg.environment is not None:
                        group.environment = self._complete_environment(msg.environment)

    def _complete_environment(self, env: Environment) -> Environment:
        host = host_environment_fields(self.layout.gpus)
        # Rank 0 knows torch's view; the controller adds the host's (driver, NVML names, topology, NCCL_* here).
        nccl_env = {**host.nccl_env, **dict(env.nccl_env)}
        return replace(
            env,
            host=host.host or env.host,
            driver=host.driver or env.driver,
            gpu_names=host.gpu_names or env.gpu_names,
            gpu_uuids=host.gpu_uuids or env.gpu_uuids,
            topology=host.topology or env.topology,
            nccl_env=nccl_env,
            extra={**dict(env.extra), "controller_python": platform.python_version()},
        )

    def _stop_group(self, graceful: bool) -> None:
        """End the group: ask idle ranks to leave, then terminate and kill; never takes longer than close_timeout_s."""
        with self._state_lock:
            group, self._group = self._group, None
        if group is None:
            return
        t_end = time.monotonic() + self.close_timeout_s
        if graceful and not group.busy:
            for conn in group.conns:
                with contextlib.suppress(OSError, EOFError, BrokenPipeError):
                    conn.send(Shutdown(destroy_timeout_s=max(0.5, self.close_timeout_s - 3.0)))
            # Leave 1.5 s of the budget for terminate + kill.
            soft_end = t_end - 1.5
            for proc in group.procs:
                proc.join(timeout=max(0.0, soft_end - time.monotonic()))
        _end_processes(group.procs, deadline=t_end)
        for conn in group.conns:
            with contextlib.suppress(OSError):
                conn.close()
        shutil.rmtree(group.tmpdir, ignore_errors=True)


def _prune_rank_logs(directory: Path, keep: int) -> None:
    """Remove all but the `keep` newest `ranks-*.log` files of `directory` (only files decodetop named so)."""
    logs = sorted(directory.glob("ranks-*.log"), key=lambda p: p.name, reverse=True)
    for old in logs[keep:]:
        with contextlib.suppress(OSError):
            old.unlink()


def _end_processes(procs: Sequence[BaseProcess], deadline: float) -> None:
    """SIGTERM the living ranks (and any children they made), wait until near `deadline`, then SIGKILL."""
    extra: list[Any] = []
    try:
        import psutil

        for proc in procs:
            if proc.pid is not None and proc.is_alive():
                with contextlib.suppress(psutil.Error):
                    extra.extend(psutil.Process(proc.pid).children(recursive=True))
    except ImportError:
        psutil = None  # type: ignore[assignment]
    for proc in procs:
        if proc.is_alive():
            with contextlib.suppress(OSError):
                proc.terminate()
    kill_at = max(time.monotonic() + 0.2, deadline - 0.5)
    for proc in procs:
        proc.join(timeout=max(0.0, kill_at - time.monotonic()))
    for proc in procs:
        if proc.is_alive():
            with contextlib.suppress(OSError):
                proc.kill()
    for proc in procs:
        proc.join(timeout=max(0.1, deadline - time.monotonic()))
    for child in extra:
        with contextlib.suppress(Exception):
            child.kill()
