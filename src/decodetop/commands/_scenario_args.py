"""Provides the scenario flags every command shares (`--model NAME | --config PATH`, `--tp`, `--ep`, `--batch`,
`--context`, `--kv-dtype`, `--accept-length`, `--draft-tokens`, `--launch-mode`, `--allreduce`, `--observed-ms`,
`--target-tps`, `--gpus`) and their one reading (`decodetop.budget.scenario`), so `decodetop`, `decodetop budget`,
`decodetop probe` and `decodetop exporter` name and default them the same way.

    add_scenario_arguments(parser)                 # in a command's add_arguments
    scenario = scenario_from_args(args, group_size=2, group_label="CPU ranks")
    observed = observed_from_args(args)            # ObservedStep: the flag, or the default marked as assumed
"""

from __future__ import annotations

import argparse
import math

from decodetop.budget.compose import ObservedStep, default_observed
from decodetop.budget.deployment import DEFAULT_CONTEXT
from decodetop.budget.engine_paths import ALLREDUCE_CHOICES
from decodetop.budget.scenario import (
    GPU_LIST_HELP,
    Scenario,
    build_scenario,
    choose_tp,
    model_source,
    parse_gpu_list,
)
from decodetop.defaults import DEFAULT_TARGET_TPS
from decodetop.errors import UserInputError

ALLREDUCE_HELP = (
    "which all-reduce the engine runs: auto (default: what vLLM runs at this TP, message size and topology — its "
    "custom P2P all-reduce below 8 MiB where every GPU pair has P2P, NCCL otherwise), nccl, or custom (P2P "
    "one-shot / two-shot); the budget's all-reduce row says which it assumed and why"
)
TP_HELP = "tensor-parallel degree (default: the number of ranks in the probe group — its GPUs or CPU ranks —, else 1)"


def add_model_arguments(parser: argparse.ArgumentParser | argparse._ArgumentGroup, *, default: str | None) -> None:
    """`--model NAME | --config PATH` (mutually exclusive)."""
    group = parser.add_mutually_exclusive_group()
    dflt = f" (default {default})" if default else ""
    group.add_argument(
        "--model", metavar="NAME", help=f"built-in model preset{dflt}; decodetop budget --list-models lists them"
    )
    group.add_argument(
        "--config",
        metavar="PATH",
        help="a local checkpoint directory holding config.json, or the config.json file (weights are never read)",
    )


def add_allreduce_argument(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """`--allreduce {auto,nccl,custom}`, spelt out in full (a command with `--allreduce-us` keeps both apart)."""
    parser.add_argument("--allreduce", choices=ALLREDUCE_CHOICES, help=ALLREDUCE_HELP)


def add_scenario_arguments(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    *,
    default_model: str | None = None,
    model: bool = True,
    deployment: bool = True,
    observed: bool = True,
) -> None:
    """Register the shared scenario flags (each group can be left out where a command has its own)."""
    if model:
        add_model_arguments(parser, default=default_model)
    parser.add_argument("--tp", type=int, metavar="N", help=TP_HELP)
    if deployment:
        parser.add_argument("--ep", type=int, metavar="N", help="expert-parallel degree (default 1)")
        parser.add_argument("--batch", type=int, metavar="N", help="concurrent sequences (default 1)")
        parser.add_argument("--context", type=int, metavar="N", help="tokens in each KV cache (default 4096)")
        parser.add_argument(
            "--kv-dtype",
            choices=("auto", "bf16", "fp16", "fp8"),
            help="KV-cache dtype (default auto: the checkpoint's)",
        )
        parser.add_argument(
            "--accept-length", type=float, metavar="X", help="speculative decoding (MTP): tokens accepted per step"
        )
        parser.add_argument("--draft-tokens", type=int, metavar="N", help="draft tokens per step (default: from X)")
        parser.add_argument("--launch-mode", choices=("graph", "eager"), help="kernel launches (default graph)")
        add_allreduce_argument(parser)
    if observed:
        parser.add_argument(
            "--observed-ms",
            type=float,
            metavar="MS",
            help="observed step time, ms (default: 95, shown as assumed, not observed)",
        )
        parser.add_argument("--target-tps", type=float, metavar="TPS", help="target tok/s per sequence (default 309)")


def add_gpus_argument(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """`--gpus LIST` with the one grammar (`decodetop.budget.scenario.parse_gpu_list`)."""
    parser.add_argument(
        "--gpus", metavar="LIST", help=f"GPUs for the probe group (default: every visible GPU); {GPU_LIST_HELP}"
    )


def gpus_from_args(args: argparse.Namespace) -> tuple[int, ...] | None:
    """`--gpus` parsed (None when not given); one `UserInputError` line for a bad list."""
    text = getattr(args, "gpus", None)
    return parse_gpu_list(text) if text is not None else None


def _opt(args: argparse.Namespace, name: str) -> object:
    return getattr(args, name, None)


def scenario_from_args(
    args: argparse.Namespace,
    group_size: int | None,
    *,
    group_label: str = "ranks",
    group_where: str = "of the probe group",
    default_model: str | None = None,
) -> Scenario:
    """The scenario named by the shared flags. TP: `--tp`, else `group_size` (the probe group's ranks, named by
    `group_label`), else 1. A bad flag is one `UserInputError` line naming it."""
    source = model_source(_opt(args, "model"), _opt(args, "config"), default_model=default_model)  # type: ignore[arg-type]
    tp = choose_tp(_opt(args, "tp"), group_size=group_size, group_label=group_label, group_where=group_where)  # type: ignore[arg-type]
    ep, batch, context = _opt(args, "ep"), _opt(args, "batch"), _opt(args, "context")
    kv, accept, draft, launch, allreduce = (
        _opt(args, "kv_dtype"),
        _opt(args, "accept_length"),
        _opt(args, "draft_tokens"),
        _opt(args, "launch_mode"),
        _opt(args, "allreduce"),
    )
    return build_scenario(
        source,
        tp,
        ep=int(ep) if isinstance(ep, int) else 1,
        batch=int(batch) if isinstance(batch, int) else 1,
        context_len=int(context) if isinstance(context, int) else DEFAULT_CONTEXT,
        kv_dtype=str(kv) if isinstance(kv, str) else "auto",
        accept_length=float(accept) if isinstance(accept, (int, float)) else None,
        draft_tokens=int(draft) if isinstance(draft, int) else None,
        launch_mode=str(launch) if isinstance(launch, str) else "graph",
        allreduce=str(allreduce) if isinstance(allreduce, str) else "auto",
    )


def _positive(value: object, flag: str) -> float | None:
    if value is None:
        return None
    if not isinstance(value, (int, float)) or not math.isfinite(value) or not value > 0:
        raise UserInputError(f"{flag}: {value} must be a positive number")
    return float(value)


def observed_from_args(args: argparse.Namespace) -> ObservedStep:
    """`--observed-ms` as an observed step from the flag; without it, the default marked as assumed."""
    ms = _positive(_opt(args, "observed_ms"), "--observed-ms")
    return ObservedStep(ms, "flag", "--observed-ms") if ms is not None else default_observed()


def target_from_args(args: argparse.Namespace) -> float:
    """`--target-tps`, else the default."""
    tps = _positive(_opt(args, "target_tps"), "--target-tps")
    return tps if tps is not None else DEFAULT_TARGET_TPS
