"""Provides the scenario flags every command shares on the command line: the fields of
`decodetop.pipeline.scenario_flags.ScenarioFlags` (`--model NAME | --config PATH`, `--tp`, `--ep`, `--batch`,
`--context`, `--kv-dtype`, `--accept-length`, `--draft-tokens`, `--launch-mode`, `--allreduce`, `--observed-ms`,
`--target-tps`) registered from that one dataclass, plus `--gpus`, so `decodetop`, `decodetop budget`, `decodetop
probe`, `decodetop trace` and `decodetop exporter` name, check and default them the same way.

    add_scenario_arguments(parser)                 # in a command's add_arguments
    flags = flags_from_args(args)                  # ScenarioFlags
    scenario = scenario_from_args(args, group_size=2, group_label="CPU ranks")
    observed = observed_from_args(args)            # ObservedStep: the flag, or the default marked as assumed
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping

from decodetop.argtypes import positive_finite_float, positive_int
from decodetop.budget.compose import ObservedStep, default_observed
from decodetop.budget.scenario import GPU_LIST_HELP, Scenario, parse_gpu_list
from decodetop.pipeline.scenario_flags import PARTS, ScenarioFlags

Group = argparse.ArgumentParser | argparse._ArgumentGroup | argparse._MutuallyExclusiveGroup


def add_scenario_arguments(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    *,
    default_model: str | None = None,
    parts: tuple[str, ...] = PARTS,
    model_group: argparse._MutuallyExclusiveGroup | None = None,
    helps: Mapping[str, str] | None = None,
) -> None:
    """Register the shared scenario flags of `parts` (model, tp, deployment, observed) from `ScenarioFlags`'s
    fields. `--model` and `--config` exclude each other (in `model_group` where the command has a third way to name
    what it compares with); `default_model` is said in `--model`'s help; `helps` (field → text) words a flag whose
    default this command takes from elsewhere (the trace's ranks, its launch mode)."""
    mutex = None
    for name, flag in ScenarioFlags.flags():
        if flag.part not in parts:
            continue
        target: Group = parser
        if flag.part == "model":
            mutex = mutex or model_group or parser.add_mutually_exclusive_group()
            target = mutex
        help_text = (helps or {}).get(name, flag.help)
        help_text += f" (default {default_model})" if name == "model" and default_model else ""
        kw: dict[str, object] = {"dest": name, "help": help_text, "metavar": flag.metavar}
        if flag.choices:
            kw = {"dest": name, "help": help_text, "choices": flag.choices}
        elif flag.quantity is not None:  # checked as it is read: a number in its quantity's range
            kw["type"] = flag.quantity.arg
        elif flag.kind is not str:  # checked as it is read: a positive whole number, or a positive finite number
            kw["type"] = flag.kind if not flag.positive else positive_int if flag.kind is int else positive_finite_float
        target.add_argument(flag.name, **kw)  # type: ignore[arg-type]


def add_gpus_argument(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """`--gpus LIST` with the one grammar (`decodetop.budget.scenario.parse_gpu_list`)."""
    parser.add_argument(
        "--gpus", metavar="LIST", help=f"GPUs for the probe group (default: every visible GPU); {GPU_LIST_HELP}"
    )


def gpus_from_args(args: argparse.Namespace) -> tuple[int, ...] | None:
    """`--gpus` parsed (None when not given); one `UserInputError` line for a bad list."""
    text = getattr(args, "gpus", None)
    return parse_gpu_list(text) if text is not None else None


def flags_from_args(args: argparse.Namespace) -> ScenarioFlags:
    """The scenario flags of a parsed command line."""
    return ScenarioFlags.from_namespace(args)


def scenario_from_args(
    args: argparse.Namespace,
    group_size: int | None,
    *,
    group_label: str = "ranks",
    group_where: str = "of the probe group",
    default_model: str | None = None,
) -> Scenario:
    """The scenario named by the shared flags (`ScenarioFlags.scenario`). TP: `--tp`, else `group_size` (the probe
    group's ranks, named by `group_label`), else 1. A bad flag is one `UserInputError` line naming it."""
    return flags_from_args(args).scenario(
        group_size, group_label=group_label, group_where=group_where, default_model=default_model
    )


def observed_from_args(args: argparse.Namespace) -> ObservedStep:
    """`--observed-ms` as an observed step from the flag; without it, the default marked as assumed."""
    ms = flags_from_args(args).observed_flag_ms()
    return ObservedStep(ms, "flag", "--observed-ms") if ms is not None else default_observed()


def target_from_args(args: argparse.Namespace) -> float:
    """`--target-tps`, else the default."""
    return flags_from_args(args).target_tps_or_default()
