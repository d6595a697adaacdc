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
from decodetop.quantity import OBSERVED_MS, TARGET_TPS, Quantity, shown
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
    quantity: Quantity | None = None
    """The range a number must fall in (`decodetop.quantity`), checked as the command line is read; it replaces
    `positive` where given (1e308 or 1e-320 is positive and still no step time)."""


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
        quantity=OBSERVED_MS,
    )
    target_tps: float | None = _flag(
        "--target-tps", "target tok/s per sequence (default 309)", "observed", float, "TPS", quantity=TARGET_TPS
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
        """`--observed-ms`, checked against `OBSERVED_MS` (None where not given)."""
        return None if self.observed_ms is None else OBSERVED_MS.check(self.observed_ms, "--observed-ms")

    def target_tps_or_default(self) -> float:
        """`--target-tps`, checked against `TARGET_TPS`, else the default target."""
        return DEFAULT_TARGET_TPS if self.target_tps is None else TARGET_TPS.check(self.target_tps, "--target-tps")


def settings_source(settings: Settings) -> ModelSource:
    """The model the live UI's settings name, as the key they store it under says (`config`: a checkpoint,
    else `model`: a preset); never guessed from the string."""
    kind, value = settings.model_ref
    return model_source(None, value) if kind == "config" else model_source(value, None)


KNOB_FIELDS = ("ep", "batch", "context", "kv_dtype", "accept_length", "draft_tokens", "launch_mode", "allreduce")
"""The deployment knobs of `ScenarioFlags` (beside the model, TP and the observed and target figures)."""
MAX_RECORDED_TEXT = 4096
"""A recorded model name or path longer than this is not one."""


def scenario_record(scenario: Scenario, flags: ScenarioFlags) -> dict[str, object]:
    """What a recording keeps of the scenario it was made under: the model as what it is, TP, and the knobs given."""
    knobs = {k: v for k, v in flags.given().items() if k in KNOB_FIELDS}
    return {"model": {"kind": scenario.source.kind, "value": scenario.source.value}, "tp": scenario.tp, "flags": knobs}


@dataclass(frozen=True)
class RecordedScenario:
    """A recording's scenario, read back (`recorded_scenario`)."""

    source: ModelSource
    tp: int
    flags: ScenarioFlags
    """The knobs it was recorded with (no model, TP, observed or target)."""


def _recorded_knob(name: str, value: object, where: str) -> object:
    flag = dict(ScenarioFlags.flags())[name]
    ok = isinstance(value, flag.kind) and not isinstance(value, bool)
    if flag.kind is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or (flag.choices and value not in flag.choices):
        raise UserInputError(f"{where}: the recorded {flag.name} {shown(value)} is not one it can take")
    return float(value) if flag.kind is float else value  # type: ignore[arg-type]


def recorded_scenario(data: object, where: str) -> RecordedScenario:
    """A recording's "scenario" (`scenario_record`) read as hostile input: one `UserInputError` line naming
    `where` for anything that is not a preset or config, a TP in range and known knobs of the right kinds."""
    if not isinstance(data, Mapping):
        raise UserInputError(f"{where}: the recorded scenario is not an object")
    model, tp, knobs = data.get("model"), data.get("tp"), data.get("flags", {})
    kind = model.get("kind") if isinstance(model, Mapping) else None
    value = model.get("value") if isinstance(model, Mapping) else None
    if kind not in ("preset", "config") or not isinstance(value, str) or not 0 < len(value) <= MAX_RECORDED_TEXT:
        raise UserInputError(f"{where}: the recorded model is not a preset name or a config path")
    if not isinstance(tp, int) or isinstance(tp, bool) or not 1 <= tp <= 1024:
        raise UserInputError(f"{where}: the recorded TP is not a number from 1 to 1024")
    if not isinstance(knobs, Mapping) or not set(knobs) <= set(KNOB_FIELDS):
        raise UserInputError(f"{where}: the recorded flags are not the scenario's knobs")
    flags = ScenarioFlags(**{k: _recorded_knob(k, v, where) for k, v in knobs.items()})  # type: ignore[arg-type]
    return RecordedScenario(ModelSource(str(kind), value), tp, flags)
