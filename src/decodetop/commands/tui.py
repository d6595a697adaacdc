"""Provides the live UI's top-level flags (`decodetop` with no subcommand) and its entry point.

Module level imports nothing heavy: textual is imported inside `run`, so building the parser for a headless
subcommand never loads it.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from decodetop.errors import UserInputError
from decodetop.paths import state_dir
from decodetop.quantity import TICK_S

if TYPE_CHECKING:
    from decodetop.pipeline.scenario_flags import ScenarioFlags
    from decodetop.settings import Settings
    from decodetop.tui.trace_source import TraceOptions

from decodetop.argtypes import check_cpu_ranks, output_file, regular_file, server_url
from decodetop.commands._scenario_args import add_gpus_argument, add_scenario_arguments, flags_from_args, gpus_from_args


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1: {text!r}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the live UI's flags on the main parser."""
    group = parser.add_argument_group("live UI (no subcommand): the scenario flags of every command, and its own")
    add_scenario_arguments(group, default_model="the settings file's, else glm-5-nvfp4")
    group.add_argument(
        "--settings", metavar="FILE", help="settings TOML (default: settings.toml in the user config directory)"
    )
    group.add_argument("--theme", help="decodetop-dark, decodetop-light or decodetop-contrast (t cycles them)")
    group.add_argument("--cpu-ranks", type=_positive_int, metavar="N", help="run probes on N CPU ranks (gloo)")
    add_gpus_argument(group)
    group.add_argument("--no-probes", action="store_true", help="run no probes (telemetry, checks, history only)")
    group.add_argument("--tick", type=TICK_S.arg, metavar="S", help="telemetry period in seconds (default 1)")
    group.add_argument(
        "--record",
        type=output_file,
        metavar="FILE",
        help="record telemetry and probe results to FILE (gzip JSON lines: zcat FILE; a second session appends)",
    )
    group.add_argument("--replay", type=regular_file, metavar="FILE", help="replay a recording instead of reading NVML")
    group.add_argument("--prometheus", metavar="HOST:PORT", help="also serve Prometheus metrics there")
    group.add_argument(
        "--server", type=server_url, metavar="URL", help="serving engine /metrics URL for the observed step time"
    )
    group.add_argument(
        "--trace",
        metavar="FILE",
        help="a profiler trace, or a directory of per-rank traces, for the traced bar (with --server and vLLM: "
        "its VLLM_TORCH_PROFILER_DIR, where c captures land)",
    )
    group.add_argument(
        "--demo", action="store_true", help="fake NVML replaying an H200 recording on 8 GPUs; no probes unless asked"
    )
    group.add_argument(
        "--force",
        action="store_true",
        help="probe GPUs at start even when other processes (a serving engine) use them; without it the UI shows "
        "the stored budget and asks before probing (R)",
    )


def run(args: argparse.Namespace) -> int:
    """Start the live UI; returns its exit code. Quitting closes the probe group and the collector."""
    from decodetop.settings import default_settings_path
    from decodetop.tui.launch import LaunchOptions, build_sources, require_terminal

    flags = flags_from_args(args)
    settings, observed_from = _settings(args, flags)
    if args.record and args.replay:
        raise UserInputError("--record and --replay cannot be combined")
    check_cpu_ranks(args.cpu_ranks, force=args.force)
    options = LaunchOptions(
        cpu_ranks=args.cpu_ranks,
        gpus=gpus_from_args(args),
        observed_from=observed_from,
        flags=flags,
        no_probes=args.no_probes,
        demo=args.demo,
        force=args.force,
        record=Path(args.record) if args.record else None,
        replay=Path(args.replay) if args.replay else None,
        prometheus=args.prometheus,
        server=args.server,
        trace=_trace_options(args),
    )
    require_terminal(sys.stdin, sys.stdout, os.environ)  # before anything starts: no escape codes into a file
    sources = build_sources(settings, options)
    settings = sources.settings or settings  # a replay restores its recording's scenario

    from decodetop.tui.app import DecodetopApp

    app = DecodetopApp(
        sources,
        settings,
        Path(args.settings) if args.settings else default_settings_path(),
        save_theme=args.theme is None,
    )
    try:
        result = app.run()
    finally:
        app.shutdown_sources()
    app.crash_report.raise_if_crashed()  # an internal error: exit 70, one line naming the crash log
    if result is not None:
        return int(result)
    return int(app.return_code or 0)


def _settings(args: argparse.Namespace, flags: ScenarioFlags) -> tuple[Settings, str]:
    """The settings file with this run's flags over it (never written back), and where the observed step came from
    (flag, settings or default). The model and the deployment are checked here, before any screen opens: an
    unknown preset, a config that does not read or a knob the model cannot take is one line and exit 2."""
    from decodetop.defaults import DEFAULT_OBSERVED_MS
    from decodetop.pipeline.scenario_flags import settings_source
    from decodetop.settings import load_settings, with_overrides
    from decodetop.themes import THEME_NAMES

    settings = load_settings(Path(args.settings) if args.settings else None, themes=THEME_NAMES)
    named = flags.source() if flags.model is not None or flags.config is not None else None
    base_observed = settings.observed_ms
    observed_ms = flags.observed_flag_ms()
    settings = with_overrides(
        settings,
        model=named.value if named is not None and named.kind == "preset" else None,
        config=named.value if named is not None and named.kind == "config" else None,
        tp=flags.tp,
        observed_ms=observed_ms,
        target_tps=flags.target_tps_or_default() if flags.target_tps is not None else None,
        theme=args.theme,
        tick_s=args.tick,
    )
    if settings.theme not in THEME_NAMES:
        raise UserInputError(f"--theme {settings.theme!r} is not one of {', '.join(THEME_NAMES)}")
    # TP is the probe group's when not given: checked with the group once the UI knows it
    flags.scenario(source=settings_source(settings), tp=settings.tp, tp_from="--tp or the settings file")
    if observed_ms is not None:
        return settings, "flag"
    return settings, "settings" if base_observed != DEFAULT_OBSERVED_MS else "default"


def _trace_options(args: argparse.Namespace) -> TraceOptions:
    """--trace and the capture key's sources (the traced bar)."""
    from decodetop.tui.trace_source import TraceOptions

    if args.trace == "":
        raise UserInputError("--trace: empty path")
    return TraceOptions(path=Path(args.trace) if args.trace else None, server=args.server, state_dir=state_dir())
