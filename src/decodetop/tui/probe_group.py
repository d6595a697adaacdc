"""Provides the probe group as the UI knows it without spawning it (`GroupInfo`: size, device kind, how its ranks are
named) and the scenario of the UI's settings and flags on it (`scenario_for`, by the one reading of the scenario
flags, `decodetop.pipeline.scenario_flags`)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING

from decodetop.budget.scenario import Scenario
from decodetop.pipeline.scenario_flags import ScenarioFlags, settings_source
from decodetop.settings import Settings

if TYPE_CHECKING:
    # types only: the controller module pulls in multiprocessing (a --replay or --no-probes session never loads it)
    from decodetop.probes.controller import GroupLayout


@dataclass(frozen=True)
class GroupInfo:
    """The probe group a budget is for, as far as the UI knows it without spawning it: its size and device kind."""

    size: int
    kind: str
    """cuda or cpu."""
    label: str
    """How to name its ranks: "GPUs", "CPU ranks", "fake GPUs"."""
    where: str = "of the probe group"
    """What they are: "of the probe group", "of the demo"."""


def group_of(layout: GroupLayout) -> GroupInfo:
    """A `probes.controller.GroupLayout` as a `GroupInfo`."""
    kind = str(layout.kind)
    return GroupInfo(int(layout.world_size), kind, "GPUs" if kind == "cuda" else "CPU ranks")


def scenario_for(
    settings: Settings,
    group: GroupInfo | None,
    flags: ScenarioFlags | None = None,
    tp_from: str = "--tp or the settings file",
) -> Scenario:
    """The scenario of the UI's settings and scenario flags on its probe group: the model and TP are the settings'
    (the flags over the settings file, or what `m` and `p` picked), TP else the group's size, else 1; every other
    knob (EP, batch, context, KV dtype, speculation, launch mode, all-reduce) is the flags', as on every command.
    `tp_from`: where the settings' TP came from, in words ("the recording" in a replay)."""
    # the model and TP flags were folded into the settings at start; `m` and `p` change the settings
    knobs = dataclasses.replace(flags or ScenarioFlags(), model=None, config=None, tp=None)
    return knobs.scenario(
        group.size if group is not None else None,
        group_label=group.label if group is not None else "ranks",
        group_where=group.where if group is not None else "of the probe group",
        source=settings_source(settings),
        tp=settings.tp,
        tp_from=tp_from,
    )
