"""Provides what-ifs: the current deployment against variants of it, each predicted through the one composition
from the curves measured on this host (`decodetop.pipeline.composition.compose`, its curve engine), with its 80 %
range, tok/s, the component that limits it and the change against now; calibrated by the observed step where there
is one, beside the uncalibrated figures. Stdlib only.

    base = BudgetContext(scenario, results, observed=observed)
    now = predict(base, {})                                     # the current deployment
    tp4 = predict(base, {"tp": "4", "batch": "8"})              # a pure function of scenario + curves + knobs
    report = compare(base, [{"tp": v} for v in ("1", "2", "4")])

Knobs (`KNOBS`): tp, ep, batch, context, kv (KV-cache dtype), weights (bf16, fp8, nvfp4, mxfp4), launch (graph,
eager), allreduce (auto, nccl, custom), accept (accept length of speculative decoding: MTP layers where the model
has them), draft (draft tokens verified per step), gpu (another GPU model: every figure carried from this host's
curves, labelled transferred). A variant the model cannot be served as (TP 3 of 64 heads)
carries the reason instead of a budget. The TUI's what-if screen calls `predict` per key press.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from decodetop.budget.calibration import Calibration, calibration_of
from decodetop.budget.compose import Budget
from decodetop.budget.deployment import KV_DTYPES, LAUNCH_MODES
from decodetop.budget.engine_paths import ALLREDUCE_CHOICES
from decodetop.budget.gpus import find_gpu
from decodetop.budget.precision import WEIGHT_CHOICES, with_weights
from decodetop.budget.scenario import Scenario
from decodetop.budget.segment import segments_range
from decodetop.errors import UserInputError
from decodetop.pipeline.composition import Composition, compose
from decodetop.pipeline.context import BudgetContext, gpu_hint
from decodetop.quantity import shown

KNOBS: dict[str, str] = {
    "tp": "tensor-parallel degree",
    "ep": "expert-parallel degree",
    "batch": "concurrent sequences",
    "context": "tokens in each KV cache",
    "kv": f"KV-cache dtype ({', '.join(k for k in KV_DTYPES if k != 'auto')})",
    "weights": f"weight precision ({', '.join(WEIGHT_CHOICES)})",
    "launch": f"kernel launches ({', '.join(LAUNCH_MODES)})",
    "allreduce": f"all-reduce path ({', '.join(ALLREDUCE_CHOICES)})",
    "accept": "accept length of speculative decoding (1 = off; MTP layers draft)",
    "draft": "draft tokens verified per step (auto: as many as the accept length needs)",
    "gpu": "another GPU model (a hardware-table row): figures carried from this host's curves",
}
"""Every knob a variant can turn, with what it means."""
MEMORY_HEADROOM = 0.9
"""Share of a GPU's memory weights and KV cache may take: the engines keep the rest for activations, CUDA graphs
and the allocator (vLLM's `gpu_memory_utilization` defaults to 0.9)."""


@dataclass(frozen=True)
class Variant:
    """One deployment's prediction: the knobs turned, its budget (None where the model cannot be served so, with
    the reason), whether its weights and KV cache fit a GPU, and its calibrated figures."""

    knobs: Mapping[str, str]
    scenario: Scenario | None
    composition: Composition | None
    refused: str = ""
    fits: bool = True
    fit_text: str = ""
    calibration: Calibration | None = None

    @property
    def budget(self) -> Budget | None:
        return self.composition.budget if self.composition is not None else None

    @property
    def label(self) -> str:
        """'tp=4 batch=8', or 'now' for the current deployment."""
        return " ".join(f"{k}={v}" for k, v in self.knobs.items()) or "now"

    @property
    def step_ms(self) -> float | None:
        b = self.budget
        return b.total_ms if b is not None and b.complete else None

    @property
    def range_ms(self) -> tuple[float, float] | None:
        b = self.budget
        if b is None or b.range_p10_ms is None or b.range_p90_ms is None:
            return None
        return b.range_p10_ms, b.range_p90_ms

    @property
    def tokens_per_s(self) -> float | None:
        """Tokens per second of one sequence (tokens per step × 1000 / step)."""
        b, ms = self.budget, self.step_ms
        return b.tokens_per_step * 1000.0 / ms if b is not None and ms else None

    @property
    def tokens_per_s_total(self) -> float | None:
        tps = self.tokens_per_s
        return tps * self.scenario.deployment.batch if tps is not None and self.scenario is not None else None

    @property
    def calibrated_ms(self) -> float | None:
        ms = self.step_ms
        return self.calibration.scale(ms) if ms is not None and self.calibration is not None else None

    @property
    def limiting(self) -> str:
        """The component taking the largest share of the step ('' without a budget)."""
        b = self.budget
        known = [s for s in b.segments if s.ms is not None] if b is not None else []
        return max(known, key=lambda s: s.ms or 0.0).label if known else ""

    @property
    def compute_range_ms(self) -> tuple[float, float] | None:
        """The 80 % range of every row but the all-reduce (what one GPU's curves predict)."""
        b = self.budget
        if b is None:
            return None
        total = segments_range([s for s in b.segments if s.component != "communication"])
        return total.p10_ms, total.p90_ms


def variant_scenario(scenario: Scenario, knobs: Mapping[str, str]) -> Scenario:
    """`scenario` with `knobs` turned (a `UserInputError` naming the knob where a value is not one, or the model
    cannot be served so). Speculative decoding drafts with the model's MTP layers where it has them, else with the
    scenario's draft model (`Scenario.draft_spec`: `decodetop whatif --draft-config`)."""
    dep, spec = scenario.deployment, scenario.spec
    changes: dict[str, Any] = {}
    variant = scenario.model_variant
    for name, value in knobs.items():
        if name not in KNOBS:
            raise UserInputError(f"--vary: unknown knob {name!r} (known: {', '.join(KNOBS)})")
        if name == "weights":
            spec = with_weights(spec, value)
            if spec is not scenario.spec:
                variant = ";".join(v for v in (variant, f"weights={value}") if v)
            continue
        if name == "gpu":
            continue  # not the deployment: the hardware the composition predicts for (`predict`)
        changes.update(_deployment_change(name, value))
    if "accept" in knobs and changes.get("accept_length") is None:
        changes["draft_tokens"] = None  # speculative decoding off
    new = dataclasses.replace(dep, **changes)
    new = dataclasses.replace(new, draft_model=new.speculative and spec.n_mtp_layers == 0)
    new.validate(spec)
    if new.draft_model and scenario.draft_spec is None:
        raise UserInputError(
            f"accept={knobs.get('accept', new.accept_length)}: {spec.name} has no MTP layer to draft with; give the "
            "draft model's config (--draft-config PATH)"
        )
    tp_source = scenario.tp_source if "tp" not in knobs else "--vary tp"
    return dataclasses.replace(scenario, spec=spec, deployment=new, tp_source=tp_source, model_variant=variant)


def _deployment_change(name: str, value: str) -> dict[str, Any]:
    """The Deployment fields one knob sets."""
    if name == "draft" and value == "auto":
        return {"draft_tokens": None}  # as many drafts as the accept length needs (`Deployment.n_draft`)
    if name in ("tp", "ep", "batch", "context", "draft"):
        field_name = {"context": "context_len", "draft": "draft_tokens"}.get(name, name)
        try:
            return {field_name: int(value)}
        except ValueError:
            raise UserInputError(f"--vary {name}={shown(value)}: not a whole number") from None
    if name == "accept":
        try:
            accept = float(value)
        except ValueError:
            raise UserInputError(f"--vary accept={shown(value)}: not a number") from None
        return {"accept_length": None if accept == 1.0 else accept}
    field_name = {"kv": "kv_dtype", "launch": "launch_mode"}.get(name, name)
    return {field_name: value}


def fits(scenario: Scenario, gpu_name: str | None) -> tuple[bool, str]:
    """Whether the busiest GPU holds its weights and KV cache within `MEMORY_HEADROOM` of its memory (True with
    nothing said where the GPU's memory is not known)."""
    row = find_gpu(gpu_name) if gpu_name else None
    if row is None:
        return True, ""
    inv = scenario.inventory()
    dep = scenario.deployment
    kv = dep.batch * (dep.context_len + dep.query_len) * _kv_bytes_per_token(scenario)
    need = inv.resident_weight_bytes + kv
    have = row.memory_gib * 2**30 * MEMORY_HEADROOM
    if need <= have:
        return True, ""
    what = "weights do not fit" if inv.resident_weight_bytes > have else "weights and KV cache do not fit"
    return False, f"{what}: {need / 1e9:.0f} GB per GPU > {have / 1e9:.0f} GB ({MEMORY_HEADROOM:.0%} of {row.name})"


def _kv_bytes_per_token(scenario: Scenario) -> float:
    """KV-cache bytes one sequence's token takes on the busiest GPU, every layer."""
    inv = scenario.inventory()
    per_step = sum(op.kv_bytes * op.count for op in inv.ops if op.kind == "attention")
    dep = scenario.deployment
    return per_step / max(1, dep.batch * (dep.context_len + dep.query_len))


def predict(ctx: BudgetContext, knobs: Mapping[str, str], *, calibration: Calibration | None = None) -> Variant:
    """One variant of `ctx.scenario`, composed from `ctx.results` (module docstring): a pure function of the
    scenario, the curves and the knobs."""
    try:
        scenario = variant_scenario(ctx.scenario, knobs)
        target = gpu_hint(named=knobs["gpu"]) if "gpu" in knobs else ctx.target_gpu
    except UserInputError as exc:
        return Variant(dict(knobs), None, None, refused=str(exc))
    comp = compose(dataclasses.replace(ctx, scenario=scenario, plan=None, target_gpu=target, per_rank=False))
    gpu = target.name if target is not None else comp.hardware.gpu_name if comp.hardware is not None else None
    ok, why = fits(scenario, gpu)
    return Variant(dict(knobs), scenario, comp, fits=ok, fit_text=why, calibration=calibration)


@dataclass(frozen=True)
class WhatIf:
    """The current deployment and its variants, the calibration the observed step offers, and the target."""

    now: Variant
    variants: tuple[Variant, ...]
    calibration: Calibration | None
    calibration_note: str
    target_tps: float
    notes: tuple[str, ...] = field(default=())

    def reaching(self) -> tuple[list[Variant], list[tuple[Variant, str]]]:
        """The variants that reach the target tok/s per sequence, best first, and the others with why not."""
        ok: list[Variant] = []
        not_ok: list[tuple[Variant, str]] = []
        for v in self.variants:
            why = self.short_of_target(v)
            if why:
                not_ok.append((v, why))
            else:
                ok.append(v)
        ok.sort(key=lambda v: -(v.tokens_per_s or 0.0))
        return ok, not_ok

    def short_of_target(self, v: Variant) -> str:
        """'' where `v` reaches the target, else why not, in words."""
        if v.refused:
            return f"cannot be served so: {v.refused}"
        if not v.fits:
            return v.fit_text
        b = v.budget
        assert b is not None
        if b.roofline_ms is not None and b.roofline_ms > b.target_ms:
            return f"roofline above target: {b.roofline_ms:.3g} ms/step > {b.target_ms:.3g} ms/step"
        tps = v.tokens_per_s
        if tps is None:
            return "incomplete: " + ", ".join(b.missing) + " without a figure"
        if tps < self.target_tps:
            return f"predicted {tps:.3g} tok/s per sequence < {self.target_tps:g} (limited by {v.limiting})"
        return ""


def compare(ctx: BudgetContext, variants: Sequence[Mapping[str, str]]) -> WhatIf:
    """The current deployment (`ctx.scenario`) against each of `variants` (knobs), one composition each."""
    now = predict(ctx, {})
    assert now.budget is not None
    cal, why = calibration_of(now.budget)
    now = dataclasses.replace(now, calibration=cal)
    out = tuple(predict(ctx, knobs, calibration=cal) for knobs in variants)
    return WhatIf(now, out, cal, why, ctx.target_tps)


DEFAULT_TP_DEGREES = (1, 2, 4, 8)
"""TP degrees of the default grid: one node's GPUs, where a decode deployment's TP usually stops."""
DEFAULT_ACCEPT = ("1", "3")
"""Accept lengths of the default grid where the model has MTP layers: off, and 3 (two drafts kept of three, a
typical MTP accept length on chat traffic)."""


def default_axes(scenario: Scenario) -> list[tuple[str, tuple[str, ...]]]:
    """The variants a what-if without `--vary` compares: the TP degrees the model can be split by, each weight
    precision at or below the checkpoint's (BF16, FP8, NVFP4), and MTP speculation off / on where the model has it."""
    spec, dep = scenario.spec, scenario.deployment
    tps = []
    for tp in DEFAULT_TP_DEGREES:
        try:
            dataclasses.replace(dep, tp=tp).validate(spec)
        except UserInputError:
            continue
        tps.append(str(tp))
    own = spec.quant.weight_format if spec.quant.quantized else spec.quant.base_format
    order = ("bf16", "fp8", "nvfp4")
    rank = next((i for i, w in enumerate(order) if WEIGHT_CHOICES[w].probe_dtype == own.probe_dtype), 0)
    axes: list[tuple[str, tuple[str, ...]]] = [("tp", tuple(tps)), ("weights", order[rank:])]
    if spec.n_mtp_layers > 0:
        axes.append(("accept", DEFAULT_ACCEPT))
    return [(name, values) for name, values in axes if values]


def vary_grid(axes: Sequence[tuple[str, Sequence[str]]]) -> list[dict[str, str]]:
    """Every combination of the axes' values ('tp=1,2 batch=1,8' → four variants), in the given order."""
    grid: list[dict[str, str]] = [{}]
    for name, values in axes:
        grid = [{**g, name: v} for g in grid for v in values]
    return [g for g in grid if g]


def parse_vary(items: Sequence[str]) -> list[tuple[str, tuple[str, ...]]]:
    """`--vary tp=1,2,4 batch=1,8` → [("tp", ("1", "2", "4")), ("batch", ("1", "8"))] (one-line errors; each value
    is checked against the model by `check_vary`)."""
    axes: list[tuple[str, tuple[str, ...]]] = []
    for item in items:
        name, eq, values = item.partition("=")
        name = name.strip().lower()
        vals = tuple(v.strip() for v in values.split(","))
        if not eq or not any(vals):
            raise UserInputError(f"--vary {shown(item)}: give KNOB=V1,V2 (knobs: {', '.join(KNOBS)})")
        if not all(vals):
            raise UserInputError(f"--vary {shown(item)}: an empty value between the commas")
        if name not in KNOBS:
            raise UserInputError(f"--vary: unknown knob {name!r} (known: {', '.join(KNOBS)})")
        if any(n == name for n, _ in axes):
            raise UserInputError(f"--vary: {name} given twice")
        axes.append((name, vals))
    return axes


def check_vary(scenario: Scenario, axes: Sequence[tuple[str, Sequence[str]]]) -> None:
    """Raise one `UserInputError` line naming `--vary` and the value where a value cannot be a setting of its knob
    for this model, whatever the other knobs are: not a number, not one of the choices, out of range, a TP that
    does not split the heads, an EP that does not split the experts, speculation without a draft, an unknown GPU.
    What only a combination rules out (EP 2 beside TP 1) stays a variant that says why it cannot be served."""
    for name, values in axes:
        for value in values:
            try:
                _check_value(scenario, name, value)
            except UserInputError as exc:
                why, prefix = str(exc), f"--vary {name}={shown(value)}: "
                if why.startswith(prefix):
                    raise
                head, sep, rest = why.partition(": ")
                if sep and " " not in head and head.startswith(("--", f"{name}=")):
                    why = rest  # "--tp: 3 does not split …" → "3 does not split …"
                raise UserInputError(f"--vary {name}={shown(value)}: {why}") from None


def _check_value(scenario: Scenario, name: str, value: str) -> None:
    """`check_vary` for one value: the knob turned alone, the knobs it depends on set to fit it."""
    spec = scenario.spec
    if name not in KNOBS:
        raise UserInputError(f"unknown knob {name!r} (known: {', '.join(KNOBS)})")
    if name == "gpu":
        gpu_hint(named=value)
    elif name == "weights":
        if value not in WEIGHT_CHOICES:
            raise UserInputError(f"not one of {', '.join(WEIGHT_CHOICES)}")
    elif name == "ep":  # EP must divide TP: a combination, so only its range and the experts decide here
        ep = int(_deployment_change(name, value)["ep"])
        if ep < 1:
            raise UserInputError(f"{ep} is out of range (1 or more)")
        if ep > 1 and not spec.is_moe:
            raise UserInputError(f"{spec.name} has no routed experts to split")
        if ep > 1 and spec.n_experts % ep:
            raise UserInputError(f"{ep} does not split the {spec.n_experts} experts of {spec.name}")
    elif name == "accept":  # with as many draft tokens as it needs
        accept = _deployment_change(name, value)["accept_length"] or 1.0
        draft = min(63, max(1, math.ceil(accept) - 1)) if math.isfinite(accept) else 1
        variant_scenario(scenario, {"accept": value, "draft": str(draft)})
    else:
        variant_scenario(scenario, {name: value, "ep": "1"} if name == "tp" else {name: value})
