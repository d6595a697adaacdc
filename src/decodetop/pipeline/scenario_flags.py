"""Provides `ScenarioFlags`: the scenario flags every command and the live UI share, as the fields of one frozen
dataclass (as vLLM's `EngineArgs`), each with its flag, help and kind; and their one reading into a `Scenario`, the
observed step from a flag and the target. Stdlib only.

    flags = ScenarioFlags.from_namespace(args)            # the parsed flags (commands/_scenario_args.py adds them)
    scenario = flags.scenario(group_size=2, group_label="CPU ranks")
    flags.observed_flag_ms()                              # --observed-ms checked (None: not given)
    flags.target_tps_or_default()                         # --target-tps, else decodetop.defaults.DEFAULT_TARGET_TPS

A field left None takes its default where it is read, in one place each: the model from `default_model` (the caller
says which: `decodetop.defaults.DEFAULT_MODEL`, the settings file's), TP from the probe group by the one TP rule
(`decodetop.budget.scenario.choose_tp`), every other deployment knob from `decodetop.budget.deployment.Deployment`,
the target from `decodetop.defaults`.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from decodetop.budget.engine_paths import ALLREDUCE_CHOICES
from decodetop.budget.scenario import ModelSource, Scenario, build_scenario, choose_tp, model_source
from decodetop.defaults import DEFAULT_TARGET_TPS
from decodetop.errors import UserInputError
from decodetop.settings import Settings

KV_DTYPES = ("auto", "bf16", "fp16", "fp8")
LAUNCH_MODES = ("graph", "eager")
PARTS = ("model", "tp", "deployment", "observed")
"""The groups of flags a command registers (`commands._scenario_args.add_scenario_arguments`)."""
ALLREDUCE_HELP = (
    "which all-reduce the engine runs: auto (default: what vLLM runs at this TP, message size and topology — its "
    "custom P2P all-reduce below 8 MiB where every GPU pair has P2P, NCCL otherwise), nccl, or custom (P2P "
    "one-shot / two-shot); the budget's all-reduce row says which it assumed and why"
)
TP_HELP = "tensor-parallel degree (default: the number of ranks in the probe group — its GPUs or CPU ranks —, else 1)"


@dataclass(frozen=True)
class Flag:
    """How one field of `ScenarioFlags` is spelt on a command line."""

    name: str
    """'--batch'."""
    help: str
    part: str
    """One of PARTS."""
    kind: type = str
    """The value's type: int, float or str."""
    metavar: str | None = None
    choices: tuple[str, ...] = ()
    positive: bool = True
    """A number that must be > 0 (checked as the command line is read); False: the deployment checks its range."""


def _flag(name: str, help: str, part: str, kind: type = str, metavar: str | None = None, **kw: Any) -> Any:
    """A `ScenarioFlags` field: None by default, its `Flag` in the metadata."""
    return field(default=None, metadata={"flag": Flag(name, help, part, kind, metavar, **kw)})


@dataclass(frozen=True)
class ScenarioFlags:
    """The scenario flags: None where not given (the default is read where the flag is, module docstring)."""

    model: str | None = _flag(
        "--model", "built-in model preset; decodetop budget --list-models lists them", "model", metavar="NAME"
    )
    config: str | None = _flag(
        "--config",
        "a local checkpoint directory holding config.json, or the config.json file (weights are never read)",
        "model",
        metavar="PATH",
    )
    tp: int | None = _flag("--tp", TP_HELP, "tp", int, "N")
    ep: int | None = _flag("--ep", "expert-parallel degree (default 1)", "deployment", int, "N")
    batch: int | None = _flag("--batch", "concurrent sequences (default 1)", "deployment", int, "N")
    context: int | None = _flag(
        "--context", "tokens in each KV cache (default 4096)", "deployment", int, "N", positive=False
    )
    kv_dtype: str | None = _flag(
        "--kv-dtype", "KV-cache dtype (default auto: the checkpoint's)", "deployment", choices=KV_DTYPES
    )
    accept_length: float | None = _flag(
        "--accept-length", "speculative decoding (MTP): tokens accepted per step", "deployment", float, "X"
    )
    draft_tokens: int | None = _flag(
        "--draft-tokens", "draft tokens per step (default: from X)", "deployment", int, "N"
    )
    launch_mode: str | None = _flag(
        "--launch-mode", "kernel launches (default graph)", "deployment", choices=LAUNCH_MODES
    )
    allreduce: str | None = _flag("--allreduce", ALLREDUCE_HELP, "deployment", choices=ALLREDUCE_CHOICES)
    observed_ms: float | None = _flag(
        "--observed-ms",
        "observed step time, ms (default: --server's, else --trace's where the command has them, else 95 shown as "
        "assumed, not observed)",
        "observed",
        float,
        "MS",
    )
    target_tps: float | None = _flag(
        "--target-tps", "target tok/s per sequence (default 309)", "observed", float, "TPS"
    )

    @classmethod
    def flags(cls) -> tuple[tuple[str, Flag], ...]:
        """(field name, its `Flag`) in field order."""
        return tuple((f.name, f.metadata["flag"]) for f in dataclasses.fields(cls))

    @classmethod
    def from_namespace(cls, args: argparse.Namespace | Mapping[str, Any]) -> ScenarioFlags:
        """The flags a parsed command line holds (a field the command does not register stays None)."""
        get = args.get if isinstance(args, Mapping) else (lambda name: getattr(args, name, None))
        return cls(**{name: get(name) for name, _flag_ in cls.flags()})

    def given(self) -> dict[str, object]:
        """The fields that were given, by field name."""
        return {name: value for name, _f in self.flags() if (value := getattr(self, name)) is not None}

    def source(self, *, default_model: str | None = None) -> ModelSource:
        """The model `--model NAME` or `--config PATH` names (exactly one), else `default_model` (one-line error
        where neither is)."""
        return model_source(self.model, self.config, default_model=default_model)

    def deployment_fields(self) -> dict[str, object]:
        """The deployment knobs given (field → value in `Deployment`'s words); the rest stay `Deployment`'s."""
        names = {"ep": "ep", "batch": "batch", "context": "context_len", "kv_dtype": "kv_dtype"}
        names |= {"accept_length": "accept_length", "draft_tokens": "draft_tokens", "launch_mode": "launch_mode"}
        names |= {"allreduce": "allreduce"}
        return {names[k]: v for k, v in self.given().items() if k in names}

    def scenario(
        self,
        group_size: int | None = None,
        *,
        group_label: str = "ranks",
        group_where: str = "of the probe group",
        default_model: str | None = None,
        source: ModelSource | None = None,
        tp: int | None = None,
        tp_from: str = "--tp",
        defaults: Mapping[str, object] | None = None,
    ) -> Scenario:
        """The scenario these flags name. TP: `--tp` (or `tp`, from `tp_from`), else `group_size` (the probe group's
        ranks, named by `group_label`), else 1. `source` replaces the model flags (the live UI's settings);
        `defaults` are a surface's own deployment defaults, as `build_scenario` keywords (the trace's launch mode,
        read from the trace), under the flags. A bad value is one
        `UserInputError` line naming the flag."""
        chosen = choose_tp(
            self.tp if self.tp is not None else tp,
            group_size=group_size,
            group_label=group_label,
            group_where=group_where,
            tp_from="--tp" if self.tp is not None else tp_from,
        )
        knobs = {**(defaults or {}), **self.deployment_fields()}
        return build_scenario(source or self.source(default_model=default_model), chosen, **knobs)  # type: ignore[arg-type]

    def observed_flag_ms(self) -> float | None:
        """`--observed-ms`, checked (None where not given)."""
        return _positive(self.observed_ms, "--observed-ms")

    def target_tps_or_default(self) -> float:
        """`--target-tps`, checked, else the default target."""
        tps = _positive(self.target_tps, "--target-tps")
        return tps if tps is not None else DEFAULT_TARGET_TPS


def _positive(value: float | None, flag: str) -> float | None:
    if value is None:
        return None
    if not isinstance(value, (int, float)) or not math.isfinite(value) or not value > 0:
        raise UserInputError(f"{flag}: {value} must be a positive number")
    return float(value)


def settings_source(settings: Settings) -> ModelSource:
    """The model the live UI's settings name, as the key they store it under says (`config`: a checkpoint,
    else `model`: a preset); never guessed from the string."""
    kind, value = settings.model_ref
    return model_source(None, value) if kind == "config" else model_source(value, None)
