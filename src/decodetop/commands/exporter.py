"""Provides `decodetop exporter`: headless telemetry, checks, the probe plan and a live server's step, served as
Prometheus metrics until SIGINT or SIGTERM.

Module level imports nothing heavy (argparse only); `run` imports the exporter, which never imports textual or
torch (probes run in spawned ranks).
"""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register this command's flags."""
    parser.add_argument(
        "--listen",
        default="127.0.0.1:9464",
        metavar="HOST:PORT",
        help="where to serve /metrics (default 127.0.0.1:9464; 0.0.0.0:9464 for every interface)",
    )
    parser.add_argument("--tick", default="1s", metavar="DURATION", help="telemetry period (default 1s)")
    parser.add_argument("--check-every", default="5m", metavar="DURATION", help="health-check period (default 5m)")
    parser.add_argument("--no-checks", action="store_true", help="run no health checks")
    parser.add_argument("--probe-every", default="10m", metavar="DURATION", help="probe-plan period (default 10m)")
    parser.add_argument("--no-probes", action="store_true", help="run no probes (telemetry and checks only)")
    parser.add_argument("--model", help="model preset or HF config.json: probe at its shapes (default: every probe)")
    parser.add_argument("--tp", type=int, help="tensor-parallel degree for --model (default: the probe group's size)")
    parser.add_argument("--gpus", metavar="LIST", help="GPUs for the probe group, e.g. 0,1 (default: every GPU)")
    parser.add_argument("--cpu-ranks", type=int, metavar="N", help="probe on N CPU ranks (gloo) where there is no GPU")
    parser.add_argument(
        "--force", action="store_true", help="probe GPUs even while other processes (a serving engine) hold memory"
    )
    parser.add_argument("--server", metavar="URL", help="SGLang/vLLM /metrics URL: export its observed step")
    parser.add_argument(
        "--accept-length",
        type=float,
        metavar="X",
        help="speculative accept length (SGLang: step = ITL x X; default: the server's own gauge, else 1)",
    )
    parser.add_argument(
        "--server-window", default="30s", metavar="DURATION", help="window of the observed step (default 30s)"
    )
    parser.add_argument(
        "--demo", action="store_true", help="fake NVML replaying a bundled H200 recording (no GPU needed)"
    )


_POLL_S = 0.25
"""How often the main thread looks for SIGINT/SIGTERM: a stop starts within this."""


def _gpus(text: str) -> list[int]:
    from decodetop.errors import UserInputError

    try:
        gpus = [int(p) for p in text.split(",") if p.strip()]
    except ValueError:
        raise UserInputError(f"--gpus {text!r}: give GPU indices like 0,1,2,3") from None
    if not gpus or min(gpus) < 0:
        raise UserInputError(f"--gpus {text!r}: give GPU indices like 0,1,2,3")
    return gpus


def run(args: argparse.Namespace) -> int:
    """Serve until SIGINT/SIGTERM; 0 on a clean stop."""
    import os
    import signal
    import threading
    from collections.abc import Sequence
    from typing import Any

    from decodetop.errors import UserInputError
    from decodetop.export.service import Exporter, budget_composer, parse_duration, probe_plan_runs

    tick_s = parse_duration(args.tick, "--tick")
    check_every_s: float | None = parse_duration(args.check_every, "--check-every")
    probe_every_s: float | None = parse_duration(args.probe_every, "--probe-every")
    server_window_s = parse_duration(args.server_window, "--server-window")
    if args.no_checks:
        check_every_s = None
    if args.no_probes:
        probe_every_s = None
    if args.tp is not None and args.tp < 1:
        raise UserInputError(f"--tp {args.tp}: must be at least 1")
    if args.cpu_ranks is not None and args.cpu_ranks < 1:
        raise UserInputError(f"--cpu-ranks {args.cpu_ranks}: must be at least 1")

    server_source = None
    if args.server:
        from decodetop.collectors.serving import ServerStepSource

        server_source = ServerStepSource(
            args.server,
            accept_length=args.accept_length,
            window_s=server_window_s,
        )

    from decodetop.collectors.nvml import Nvml

    if args.demo:
        from decodetop.collectors.fake_nvml import fake_nvml

        nvml = fake_nvml()
    else:
        nvml = Nvml()

    tp: int | None = args.tp
    plan: tuple[Any, ...] = ()
    plan_notes: tuple[str, ...] = ()
    make_controller = None
    preflight = None
    if probe_every_s is not None:
        from decodetop.probes.controller import resolve_layout
        from decodetop.probes.registry import ProbeRegistry

        layout = resolve_layout(_gpus(args.gpus) if args.gpus else None, args.cpu_ranks)
        if tp is None and args.model:
            tp = layout.world_size  # as `decodetop probe --model`: the plan for this group's TP
        plan, plan_notes = probe_plan_runs(
            args.model, tp, ProbeRegistry(), world_size=layout.world_size, device_kind=layout.kind
        )

        def make_controller() -> Any:
            from decodetop.probes.controller import ProbeController

            return ProbeController(layout=layout)

        if layout.kind == "cuda" and not args.force:

            def preflight(own_pids: Sequence[int]) -> str | None:
                from decodetop.probes.gpuinfo import compute_processes

                busy = compute_processes(layout.gpus, exclude_pids=(os.getpid(), *own_pids))
                if not busy:
                    return None
                who = "; ".join(f"GPU {p.cuda_index}: pid {p.pid} ({p.name})" for p in busy)
                return f"other processes hold GPU memory ({who}); pass --force to probe anyway"

    exporter = Exporter(
        listen=args.listen,
        nvml=nvml,
        tick_s=tick_s,
        check_every_s=check_every_s,
        probe_every_s=probe_every_s,
        plan=plan,
        make_controller=make_controller,
        server_source=server_source,
        budget_for=None,
        preflight=preflight,
    )
    if args.model:
        exporter.budget_for = budget_composer(args.model, tp)
    # The handler only flips a flag: taking a lock in a signal handler (Event.set) can deadlock against the main
    # thread interrupted while it holds that lock. The main loop polls the flag and stops the exporter itself.
    signalled: list[int] = []
    previous: dict[signal.Signals, Any] = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, lambda signum, frame: signalled.append(signum))
    try:
        exporter.start()
        for note in plan_notes:
            exporter.say(f"plan: {note}")
        while not signalled and not exporter.wait(_POLL_S):
            pass
        exporter.say("stopping")
    finally:
        exporter.stop()
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        close = getattr(nvml, "close", None)
        if callable(close):
            close()
    return 0
