"""Provides the probe group as the UI knows it without spawning it (`GroupInfo`: size, device kind, how its ranks are
named) and the scenario of the UI's settings on it (`scenario_for`, by the one rule of `decodetop.budget.scenario`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from decodetop.budget.scenario import Scenario, build_scenario, choose_tp, source_from_setting
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


def scenario_for(settings: Settings, group: GroupInfo | None, allreduce: str = "auto") -> Scenario:
    """The scenario of the UI's settings on its probe group, by the one rule (`decodetop.budget.scenario`): TP is
    the settings' (from --tp or the settings file), else the group's size, else 1; `allreduce` is --allreduce."""
    tp = choose_tp(
        settings.tp,
        group_size=group.size if group is not None else None,
        group_label=group.label if group is not None else "ranks",
        group_where=group.where if group is not None else "of the probe group",
        tp_from="--tp or the settings file",
    )
    return build_scenario(source_from_setting(settings.model), tp, allreduce=allreduce)
