"""Provides `build_sources`: the real sources for the command-line options (NVML or fake or replay, probe group or
none, host checks, history), and `LaunchOptions`, the flags that choose them."""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from decodetop.budget.scenario import Scenario, parse_gpu_list
from decodetop.collectors.checks.result import CheckResult
from decodetop.collectors.fake_nvml import DEFAULT_RECORDING, FakeNvmlBackend, load_recording
from decodetop.collectors.nvml import Nvml
from decodetop.collectors.serving import ServerStepSource
from decodetop.errors import UserInputError
from decodetop.export.recording import Recorder, decode_replay, read_recording
from decodetop.history import History
from decodetop.pipeline.fingerprints import SessionFingerprints
from decodetop.pipeline.gpu_guard import GpuGuard
from decodetop.pipeline.result_history import ResultHistory
from decodetop.pipeline.scenario_flags import ScenarioFlags, recorded_scenario, scenario_record
from decodetop.probes.gpuinfo import GpuInfo
from decodetop.settings import Settings
from decodetop.tui.baseline import BASELINE_NAME, DEMO_BASELINE_NAME
from decodetop.tui.probe_group import GroupInfo, group_of, scenario_for
from decodetop.tui.sources import Sources
from decodetop.tui.sources.budget import PresetBudget
from decodetop.tui.sources.checks import HostChecks, RecordedChecks
from decodetop.tui.sources.probes import ControllerProbes, NoProbes, ReplayProbes, start_resource_tracker
from decodetop.tui.sources.server import ServerPoller
from decodetop.tui.sources.telemetry import CollectorTelemetry, ReplayTelemetry
from decodetop.tui.taps import Taps
from decodetop.tui.trace_source import TraceOptions

if TYPE_CHECKING:
    # types only: the controller module pulls in multiprocessing (--replay and --no-probes never load it)
    from decodetop.probes.controller import GroupLayout, ProbeController

DEMO_GPUS = 8
"""--demo replicates the H200 recording to this many GPUs (an 8-GPU host, the seed deployment's TP8)."""
MIN_COLUMNS = 60
MIN_ROWS = 16
"""The smallest terminal the live UI lays out (`tui.layout.MIN_SIZE` says what fits); below it the UI says "too
small" while running, and refuses to start."""
HEADLESS_HINT = "use the headless commands instead: `decodetop check`, `decodetop probe`, `decodetop budget` (--json)"
"""What to run where the live UI cannot."""
CPU_RANK_NICE = 10
"""CPU ranks spin at 100 % in gloo collectives; at nice 10 they yield to the UI on a 2-core box (GPU ranks are
left alone)."""


@dataclass(frozen=True)
class LaunchOptions:
    """What the top-level flags ask for (besides `Settings`)."""

    cpu_ranks: int | None = None
    gpus: tuple[int, ...] | None = None
    no_probes: bool = False
    demo: bool = False
    force: bool = False
    record: Path | None = None
    replay: Path | None = None
    prometheus: str | None = None
    server: str | None = None
    trace: TraceOptions | None = None
    """--trace and the capture key's server and state directory (the traced bar)."""
    history_path: Path | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)
    observed_from: str = "default"
    """Where the settings' observed step came from: "flag", "settings" or "default" (then it is assumed)."""
    flags: ScenarioFlags = field(default_factory=ScenarioFlags)
    """The scenario flags (the same as on every command: EP, batch, context, KV dtype, speculation, launch mode,
    all-reduce; the model and TP are folded into the settings), for the plan and the budget."""


def terminal_problem(stdin: TextIO, stdout: TextIO, environ: Mapping[str, str]) -> str | None:
    """Why the live UI cannot run here (one line naming the problem and what to run instead), or None.

    Checked before the app starts: without a terminal the UI would write escape codes to a file and wait for keys
    that never come; a `dumb` terminal cannot draw it; a tiny one cannot hold it."""
    if not stdout.isatty():
        return f"the live UI needs a terminal, and stdout is not one; {HEADLESS_HINT}"
    if not stdin.isatty():
        return f"the live UI reads keys from a terminal, and stdin is not one; {HEADLESS_HINT}"
    if environ.get("TERM", "") == "dumb":
        return f"the live UI cannot draw on TERM=dumb; {HEADLESS_HINT}"
    try:
        size = os.get_terminal_size(stdout.fileno())
    except (OSError, ValueError):
        return None  # the size is unknown here; the running UI says "too small" if it is
    if size.columns < MIN_COLUMNS or size.lines < MIN_ROWS:
        return (
            f"the terminal is {size.columns}×{size.lines}, the live UI needs at least {MIN_COLUMNS}×{MIN_ROWS}; "
            f"make it larger, or {HEADLESS_HINT}"
        )
    return None


def require_terminal(stdin: TextIO, stdout: TextIO, environ: Mapping[str, str]) -> None:
    """`terminal_problem` as a `UserInputError` (one line on stderr, exit 2)."""
    problem = terminal_problem(stdin, stdout, environ)
    if problem is not None:
        raise UserInputError(problem)


def parse_gpus(text: str) -> tuple[int, ...]:
    """ "0,1,2,3" or "0-3" → (0, 1, 2, 3): the one GPU-list grammar (`decodetop.budget.scenario.parse_gpu_list`)."""
    return parse_gpu_list(text)


def build_sources(settings: Settings, options: LaunchOptions) -> Sources:
    """The real sources. Nothing here blocks for long: NVML initialises lazily in the collector's thread, the probe
    group spawns on the first probe (in the UI's probe worker)."""
    notes: list[str] = list(options.notes)
    if options.replay is not None:
        return _replay_sources(settings, options, notes)
    nvml = _live_nvml(options, notes)
    history = History(options.history_path)
    fingerprints = SessionFingerprints()
    telemetry = CollectorTelemetry(nvml, interval_s=settings.tick_s)
    probes, guard = _live_probes(options, telemetry, history, fingerprints)
    budget = _live_budget(options, telemetry, probes, fingerprints)
    started = _session_scenario(settings, options, budget)
    taps = _build_taps(options, scenario_record(started, options.flags) if started is not None else None)
    if taps is not None:
        telemetry.extra_listener = taps.on_snapshot
        if isinstance(probes, ControllerProbes):
            probes.runner.on_result = (*probes.runner.on_result, taps.on_probe_result)
    return Sources(
        telemetry=telemetry,
        probes=probes,
        budget=budget,
        checks=HostChecks(nvml),
        history=history,
        run_probes_at_start=isinstance(probes, ControllerProbes),  # a probe group runs: probe at start (demo too)
        notes=tuple(notes),
        taps=taps,
        server=_build_server(options),
        trace=options.trace,
        gpu_guard=guard,
        baseline_name=DEMO_BASELINE_NAME if options.demo else BASELINE_NAME,
    )


def _session_scenario(settings: Settings, options: LaunchOptions, budget: PresetBudget) -> Scenario | None:
    """The scenario the session starts with (what --record keeps), None where the settings name none that reads
    (the budget says why on screen)."""
    try:
        return scenario_for(settings, budget.group() if budget.group is not None else None, options.flags)
    except UserInputError:
        return None


def _live_nvml(options: LaunchOptions, notes: list[str]) -> Nvml:
    """NVML of this host, or with --demo a fake one replaying a recording over DEMO_GPUS GPUs (said in `notes`)."""
    if not options.demo:
        return Nvml()
    recording = load_recording(os.environ.get("DECODETOP_DEMO_RECORDING", DEFAULT_RECORDING))
    notes.append(f"demo: fake NVML replaying {recording.label} replicated to {DEMO_GPUS} GPUs")
    return Nvml(FakeNvmlBackend(recording, replicate_to=DEMO_GPUS))


def _live_probes(
    options: LaunchOptions, telemetry: CollectorTelemetry, history: History, fingerprints: SessionFingerprints
) -> tuple[NoProbes | ControllerProbes, GpuGuard | None]:
    """The probes (off with --no-probes, and in the demo unless --cpu-ranks is given) and their GPU guard."""
    if options.no_probes:
        return NoProbes("probes are off (--no-probes)"), None
    if options.demo and options.cpu_ranks is None:
        return NoProbes("demo: no probes unless --cpu-ranks is given"), None
    return _controller_probes(options, telemetry, history, fingerprints)


def _controller_probes(
    options: LaunchOptions, telemetry: CollectorTelemetry, history: History, fingerprints: SessionFingerprints
) -> tuple[ControllerProbes, GpuGuard]:
    """A probe group on the chosen GPUs or CPU ranks, spawned on the first probe, its runs through the one plan
    runner: behind the GPU guard, telemetry paused around latency-sensitive probes, each result into the history."""
    from decodetop.probes.controller import ProbeController  # multiprocessing: only where probes run

    cpu_ranks = options.cpu_ranks
    gpus = list(options.gpus) if options.gpus is not None else None
    device = "cpu" if options.demo or cpu_ranks is not None else "auto"

    def make_controller() -> ProbeController:
        controller = ProbeController(gpus=gpus, cpu_ranks=cpu_ranks, device=device)
        controller.start()
        return controller

    start_resource_tracker()

    def layout() -> GroupLayout:
        from decodetop.probes.controller import resolve_layout  # read at call time: tests stand in a fake group

        return resolve_layout(gpus, cpu_ranks, device)

    def group_gpus() -> tuple[GpuInfo, ...]:
        """The CUDA GPUs the probe group would use (none for CPU ranks)."""
        group = layout()
        return tuple(group.gpus) if group.kind == "cuda" else ()

    # GPU probes wait while another process (a serving engine) holds one of the group's GPUs: the UI shows the
    # serving-time view, and a key asks before probing; --force consents for the session (gpu_guard).
    guard = GpuGuard(group_gpus, forced=options.force)
    probes = ControllerProbes(
        make_controller,
        functools.partial(_telemetry_line, telemetry),
        cpu_rank_nice=CPU_RANK_NICE,
        layout=layout,
        guard=guard,
        pause=telemetry.latency_probe,
        flags=options.flags,
    )

    def scenario() -> Scenario:
        assert probes.scenario is not None  # a probe runs only once its plan was made
        return probes.scenario

    probes.runner.on_result = (ResultHistory(history, scenario=scenario, fingerprints=fingerprints),)
    guard.own_pids = probes.rank_pids
    return probes, guard


def _telemetry_line(telemetry: CollectorTelemetry) -> str:
    """The clocks, clock-event reasons and PCIe links of the latest snapshot, stored beside each probe result."""
    snap = telemetry.collector.latest
    if snap is None or not snap.gpus:
        return ""
    clocks = sorted({g.sm_clock_mhz for g in snap.gpus if g.sm_clock_mhz is not None})
    reasons = sorted({r for g in snap.gpus for r in g.clock_event_reasons})
    links = sorted({f"{g.pcie_gen}x{g.pcie_width}" for g in snap.gpus if g.pcie_gen is not None})
    return (
        f"SM {'/'.join(str(c) for c in clocks) or '?'} MHz · clock events {','.join(reasons) or 'none'} · "
        f"PCIe {'/'.join(links) or '?'}"
    )


def _live_budget(
    options: LaunchOptions,
    telemetry: CollectorTelemetry,
    probes: NoProbes | ControllerProbes,
    fingerprints: SessionFingerprints,
) -> PresetBudget:
    """The budget for the GPU NVML sees, at the probe group's size."""

    def gpu_name() -> str | None:
        snap = telemetry.collector.latest
        return snap.gpus[0].name if snap is not None and snap.gpus else None

    return PresetBudget(
        gpu_name,
        group=functools.cache(functools.partial(_probe_group, options, probes)),
        gpu_how="fake NVML of the demo" if options.demo else "detected by NVML",
        observed_from=options.observed_from,
        server_url=options.server,
        flags=options.flags,
        fingerprints=fingerprints,
    )


def _probe_group(options: LaunchOptions, probes: NoProbes | ControllerProbes) -> GroupInfo | None:
    """The probe group (its size is the default TP); with --no-probes, the group a run would use."""
    if isinstance(probes, ControllerProbes) and probes.layout is not None:
        return group_of(probes.layout())
    if options.demo:
        return GroupInfo(DEMO_GPUS, "cuda", "fake GPUs", "of the demo")
    from decodetop.probes.controller import resolve_layout  # multiprocessing: only once a group is asked for

    try:
        gpus = list(options.gpus) if options.gpus is not None else None
        return group_of(resolve_layout(gpus, options.cpu_ranks, "auto"))
    except UserInputError:
        return None


def _build_taps(options: LaunchOptions, scenario: Mapping[str, object] | None = None) -> Taps | None:
    """--record (its first line keeps the session's scenario, so a replay restores it) and --prometheus."""
    if options.record is None and options.prometheus is None:
        return None
    taps = Taps()
    if options.record is not None:
        meta: dict[str, object] = {"source": "decodetop tui", **({"scenario": dict(scenario)} if scenario else {})}
        taps.recorder = Recorder(options.record, meta=meta)
    if options.prometheus is not None:
        from decodetop.export.prometheus import StateBox, start_metrics_server  # prometheus_client: only if asked

        taps.state_box = StateBox()
        try:
            taps.metrics_server = start_metrics_server(options.prometheus, taps.state_box)
        except UserInputError as exc:
            taps.close()
            raise UserInputError(str(exc).replace("--listen", "--prometheus")) from None
    return taps


def _build_server(options: LaunchOptions) -> ServerPoller | None:
    """--server's poller (the app hands each answer to the budget source and the taps)."""
    if options.server is None:
        return None
    return ServerPoller(ServerStepSource(options.server))


def _replay_sources(settings: Settings, options: LaunchOptions, notes: list[str]) -> Sources:
    """--replay: telemetry, probe results and checks from a recording; no NVML, no probes. The recording's scenario
    (model, TP, knobs) is restored where the command line does not name one, so its budget is the one recorded."""
    assert options.replay is not None
    decoded = decode_replay(read_recording(options.replay))
    snapshots = [i.value for i in decoded.items if i.event.kind == "telemetry"]
    results = [i.value for i in decoded.items if i.event.kind == "probe_result"]
    checks: list[CheckResult] = []
    for item in decoded.items:
        if item.event.kind == "checks":
            checks = list(item.value) if isinstance(item.value, (list, tuple)) else [item.value]
    notes.append(f"replay of {options.replay.name}: {decoded.replay.summary}")
    notes.extend(decoded.warnings)
    settings, flags, tp_from = _recorded(settings, options, decoded.replay.meta, notes)
    telemetry = ReplayTelemetry(snapshots, interval_s=settings.tick_s)

    def gpu_name() -> str | None:
        for snap in snapshots:
            if snap.gpus:
                return str(snap.gpus[0].name)
        return None

    taps = _build_taps(options)
    hooks = (taps.on_probe_result,) if taps is not None else ()
    probes = ReplayProbes(results, hooks) if results else NoProbes("replay: the recording holds no probe results")
    budget = PresetBudget(
        gpu_name, gpu_how="from the recording", observed_from=options.observed_from, flags=flags, tp_from=tp_from
    )
    return Sources(
        telemetry=telemetry,
        probes=probes,
        budget=budget,
        checks=RecordedChecks(checks),
        history=None,
        run_probes_at_start=bool(results),
        notes=tuple(notes),
        taps=taps,
        trace=options.trace,
        settings=settings,
    )


def _recorded(
    settings: Settings, options: LaunchOptions, meta: Mapping[str, object], notes: list[str]
) -> tuple[Settings, ScenarioFlags, str]:
    """The settings and flags of a replay: the recording's scenario under what the command line names, and the
    words for where its TP came from."""
    flags, tp_from = options.flags, "--tp or the settings file"
    if "scenario" not in meta:
        return settings, flags, tp_from
    try:
        recorded = recorded_scenario(meta["scenario"], options.replay.name if options.replay else "--replay")
    except UserInputError as exc:
        notes.append(f"{exc}; the settings' scenario is shown instead")
        return settings, flags, tp_from
    if flags.model is None and flags.config is None:
        kind, value = recorded.source.kind, recorded.source.value
        model = {"model": value, "config": None} if kind == "preset" else {"config": value}
        settings = dataclasses.replace(settings, **model)
    if flags.tp is None:
        settings, tp_from = dataclasses.replace(settings, tp=recorded.tp), "the recording"
    knobs: dict[str, Any] = {**recorded.flags.given(), **flags.given()}
    return settings, ScenarioFlags(**knobs), tp_from
