"""Provides `decodetop exporter`: headless telemetry, checks, the probe plan and a live server's step, served as
Prometheus metrics until SIGINT or SIGTERM.

The scenario flags are every command's (`--model NAME | --config PATH`, `--tp`, …: `commands/_scenario_args.py`);
with one, the exporter runs that model's probe plan and exports its budget composed as `decodetop budget` does.
Module level imports nothing heavy (argparse and the shared flags); `run` imports the exporter, which never imports
textual or torch (probes run in spawned ranks).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from decodetop.argtypes import check_cpu_ranks, positive_int, server_url
from decodetop.commands._scenario_args import (
    add_gpus_argument,
    add_scenario_arguments,
    gpus_from_args,
    observed_from_args,
    scenario_from_args,
    target_from_args,
)

if TYPE_CHECKING:
    from decodetop.export.schedule import Exporter, ProbeRunner
    from decodetop.pipeline.gpu_guard import GpuGuard
    from decodetop.pipeline.observed import TracedStep
    from decodetop.probes.controller import GroupLayout


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register this command's flags."""
    parser.add_argument(
        "--listen",
        default="127.0.0.1:9464",
        metavar="HOST:PORT",
        help="where to serve /metrics (default 127.0.0.1:9464; 0.0.0.0:9464 exposes it on every interface)",
    )
    parser.add_argument("--tick", default="1s", metavar="DURATION", help="telemetry period (default 1s)")
    parser.add_argument("--check-every", default="5m", metavar="DURATION", help="health-check period (default 5m)")
    parser.add_argument("--no-checks", action="store_true", help="run no health checks")
    parser.add_argument("--probe-every", default="10m", metavar="DURATION", help="probe-plan period (default 10m)")
    parser.add_argument("--no-probes", action="store_true", help="run no probes (telemetry and checks only)")
    add_scenario_arguments(parser)
    add_gpus_argument(parser)
    parser.add_argument(
        "--cpu-ranks", type=positive_int, metavar="N", help="probe on N CPU ranks (gloo) where there is no GPU"
    )
    parser.add_argument(
        "--force", action="store_true", help="probe GPUs even while other processes (a serving engine) hold memory"
    )
    parser.add_argument(
        "--server",
        type=server_url,
        metavar="URL",
        help="SGLang/vLLM /metrics URL: export its observed step (with --accept-length for SGLang's speculative "
        "decoding: step = ITL x accept length; default: the server's own gauge, else 1)",
    )
    parser.add_argument(
        "--server-window", default="30s", metavar="DURATION", help="window of the observed step (default 30s)"
    )
    parser.add_argument(
        "--trace",
        metavar="FILE",
        help="a profiler trace (or a directory of per-rank traces) of the engine: its decode steps are the observed "
        "step where neither --observed-ms nor a live --server gives one",
    )
    parser.add_argument(
        "--demo", action="store_true", help="fake NVML replaying a bundled H200 recording (no GPU needed)"
    )


_POLL_S = 0.25
"""How often the main thread looks for SIGINT/SIGTERM: a stop starts within this."""


def run(args: argparse.Namespace) -> int:
    """Serve until SIGINT/SIGTERM; 0 on a clean stop."""
    from decodetop.export.prometheus import listen_warning, parse_listen

    host, _ = parse_listen(args.listen)
    exporter, lines = _build(args)
    warning = listen_warning(host)
    if warning is not None:
        lines.insert(0, f"warning: {warning}")
    try:
        _serve(exporter, lines)
    finally:
        if exporter.nvml is not None:
            exporter.nvml.close()
    return 0


def _build(args: argparse.Namespace) -> tuple[Exporter, list[str]]:
    """The exporter the flags describe (nothing started yet), and the lines to say once it serves."""
    from decodetop.collectors.fake_nvml import fake_nvml
    from decodetop.collectors.nvml import Nvml
    from decodetop.collectors.serving import ServerStepSource
    from decodetop.export.schedule import BudgetComposer, Exporter, PlannedRun, parse_duration, probe_plan_runs
    from decodetop.probes.controller import resolve_layout
    from decodetop.probes.registry import ProbeRegistry

    tick_s = parse_duration(args.tick, "--tick")
    check_every_s = None if args.no_checks else parse_duration(args.check_every, "--check-every")
    probe_every_s = parse_duration(args.probe_every, "--probe-every")
    server_window_s = parse_duration(args.server_window, "--server-window")
    observed = observed_from_args(args)
    target_tps = target_from_args(args)
    gpus = gpus_from_args(args)
    check_cpu_ranks(args.cpu_ranks, force=args.force)
    traced = _traced(args.trace) if args.trace is not None else None
    server_source = None
    if args.server is not None:
        server_source = ServerStepSource(args.server, accept_length=args.accept_length, window_s=server_window_s)
    layout = None if args.no_probes else resolve_layout(list(gpus) if gpus is not None else None, args.cpu_ranks)
    scenario = None
    if args.model is not None or args.config is not None:
        label = "GPUs" if layout is not None and layout.kind == "cuda" else "CPU ranks"
        scenario = scenario_from_args(args, layout.world_size if layout is not None else None, group_label=label)
    plan: tuple[PlannedRun, ...] = ()
    lines: list[str] = [f"budget: {scenario.describe()}"] if scenario is not None else []
    if traced is not None:
        lines.append(f"trace: {traced.detail(time.time())}")
    if layout is not None:
        plan, notes = probe_plan_runs(scenario, ProbeRegistry(), world_size=layout.world_size, device_kind=layout.kind)
        lines.extend(f"plan: {note}" for note in notes)
    budget_for = None
    if scenario is not None:
        budget_for = BudgetComposer(
            scenario,
            target_tps,
            group_kind=layout.kind if layout is not None else None,
            observed_ms=None if observed.assumed else observed.ms,
            server_url=args.server,
            trace=traced,
        )
    exporter = Exporter(
        listen=args.listen,
        nvml=fake_nvml() if args.demo else Nvml(),
        tick_s=tick_s,
        check_every_s=check_every_s,
        probe_every_s=probe_every_s if layout is not None else None,
        plan=plan,
        make_controller=_make_controller(layout) if layout is not None else None,
        server_source=server_source,
        budget_for=budget_for,
        guard=_gpu_guard(layout, force=args.force),
    )
    return exporter, lines


def _traced(path: str) -> TracedStep:
    """--trace read once at start: the engine's decode steps as the observed step (one line for a bad file)."""
    from pathlib import Path

    from decodetop.errors import UserInputError
    from decodetop.pipeline.observed import trace_written_s, traced_step
    from decodetop.traces.ranks import analyze_path

    if not path:
        raise UserInputError("--trace: empty path")
    traced = traced_step(analyze_path(Path(path)), written_s=trace_written_s(path))
    if traced is None:
        raise UserInputError(f"--trace {path}: no decode step found in the trace")
    return traced


def _make_controller(layout: GroupLayout) -> Callable[[], ProbeRunner]:
    """How the exporter makes its probe group (spawned on the first probe)."""
    from decodetop.probes.controller import ProbeController

    def make_controller() -> ProbeRunner:
        return ProbeController(layout=layout)

    return make_controller


def _gpu_guard(layout: GroupLayout | None, *, force: bool) -> GpuGuard | None:
    """The exporter's look at the GPUs before each probe: a serving engine holding them skips the cycle unless
    --force, as `decodetop probe` refuses (None for CPU ranks and without probes)."""
    from decodetop.pipeline.gpu_guard import GpuGuard

    if layout is None or layout.kind != "cuda":
        return None
    return GpuGuard(lambda: layout.gpus, forced=force)


def _serve(exporter: Exporter, lines: Sequence[str]) -> None:
    """Start, say `lines`, and serve until SIGINT/SIGTERM; everything stopped on the way out."""
    import signal
    import threading
    from types import FrameType

    # The handler only flips a flag: taking a lock in a signal handler (Event.set) can deadlock against the main
    # thread interrupted while it holds that lock. The main loop polls the flag and stops the exporter itself.
    signalled: list[int] = []

    def on_signal(signum: int, frame: FrameType | None) -> None:
        signalled.append(signum)

    previous: dict[signal.Signals, signal.Handlers | Callable[[int, FrameType | None], object] | int | None] = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, on_signal)
    try:
        exporter.start()
        for line in lines:
            exporter.say(line)
        while not signalled and not exporter.wait(_POLL_S):
            pass
        exporter.say("stopping")
    finally:
        exporter.stop()
        for signum, handler in previous.items():
            signal.signal(signum, handler)
