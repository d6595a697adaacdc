"""Provides `status_text`: the one status line under the tables (model, TP, the running probe and the queue, NVML's
cost per tick, why probes wait, other scenarios stored, the server's and the trace's last word, the latest notes)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from decodetop.settings import Settings
from decodetop.tui.model import TelemetryFrame
from decodetop.tui.other_scenarios import OtherScenario, others_summary

NOTES_SHOWN = 2
"""The latest notes (plan, history, budget problems) the line keeps."""


@dataclass(frozen=True)
class StatusState:
    """What the status line says, gathered from the app."""

    settings: Settings
    running_probe: str | None = None
    queued: int = 0
    frame: TelemetryFrame | None = None
    held: bool = False
    others: tuple[OtherScenario, ...] = ()
    server_note: str = ""
    trace_note: str = ""
    notes: Sequence[str] = ()


def status_text(state: StatusState) -> str:
    """The parts that apply, joined by " · ", what changes first (the line ends in "…" where it is cut): the probe
    running and the queue, why probes wait, the trace's and the server's last word, the latest notes, other
    scenarios stored, NVML's cost per tick, then the model and TP (the budget box's title says them too)."""
    parts = []
    if state.running_probe:
        parts.append(f"probing {state.running_probe}")
    if state.queued:
        parts.append(f"{state.queued} queued")
    if state.held:
        parts.append("GPUs in use: probes wait for R")
    if state.trace_note:
        parts.append(state.trace_note)
    if state.server_note:
        parts.append(state.server_note)
    parts.extend(state.notes[-NOTES_SHOWN:])
    if state.others:
        parts.append(f"{others_summary(state.others)} (b)")
    frame = state.frame
    if frame is not None and not frame.gpus:
        parts.append("no GPU telemetry")
    elif frame is not None and frame.sample_ms is not None:
        parts.append(f"NVML {frame.sample_ms:.1f} ms/tick")
    parts.append(f"model {state.settings.model}")
    if state.settings.tp is not None:
        parts.append(f"tp {state.settings.tp}")
    return " · ".join(parts)
