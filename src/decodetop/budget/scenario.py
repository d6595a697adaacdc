"""Provides the scenario: one model on one deployment, resolved the same way by every command, the live UI and the
exporter (stdlib only).

    source = model_source(model=args.model, config=args.config)          # exactly one of them
    tp = choose_tp(args.tp, group_size=2, group_label="CPU ranks")       # --tp, else the probe group's size, else 1
    scenario = build_scenario(source, tp, batch=1, context_len=4096)
    scenario.tp_text          # "TP 2 (default: the 2 CPU ranks of the probe group)"
    scenario.fingerprint_id   # "model=preset:llama-3.1-70b;tp=2;ep=1;batch=1;context=4096;kv=bf16;…"
    scenario.allreduce        # "auto": which all-reduce the engine runs (--allreduce auto|nccl|custom)
    parse_gpu_list("0-3,5")   # (0, 1, 2, 3, 5): the one GPU-list grammar of every --gpus flag

The rules, said once here and repeated on every surface:

- the model is a built-in preset (`--model NAME`) or a local checkpoint (`--config PATH`: a regular file, or a
  directory holding config.json); never both, never empty. Anything else at the path (a FIFO, a device such as
  /dev/zero) is refused before it is opened, so nothing blocks on it.
- TP is `--tp` (or the settings file's `tp`), else the number of ranks in the probe group (the GPUs it would use,
  or its CPU ranks), else 1 where there is no probe group. The choice is said with the number.
- a TP that neither splits the KV heads evenly nor replicates them (TP a multiple of the KV heads, as vLLM does)
  is refused with the reason (`Deployment.validate`).
- the all-reduce is `--allreduce auto` (what vLLM runs at this TP, message size and topology), `nccl` or `custom`
  (`decodetop.budget.engine_paths`); a choice other than auto is part of the scenario's fingerprint.
"""

from __future__ import annotations

import functools
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path

from decodetop.budget.deployment import DEFAULT_CONTEXT, Deployment
from decodetop.budget.inventory import StepInventory, build_inventory
from decodetop.budget.spec import ModelSpec, load_config, load_preset
from decodetop.budget.speculative import with_draft_model
from decodetop.errors import UserInputError

GPU_LIST_HELP = "GPU indices: a comma list of indices and ranges, e.g. 0,1 or 0-3,5 (no negatives, no duplicates)"
MAX_GPU_INDEX = 1023
"""Larger indices are typing mistakes: NVML numbers at most a few dozen devices per host."""
_GPU_ITEM = re.compile(r"^(\d+)(?:-(\d+))?$")


def parse_gpu_list(text: str, flag: str = "--gpus") -> tuple[int, ...]:
    """'0-3,5' → (0, 1, 2, 3, 5): the one GPU-list grammar (comma-separated indices and ascending ranges). Empty
    lists, negatives, descending ranges and duplicates are one-line `UserInputError`s naming the flag."""
    items = [p.strip() for p in text.split(",")]
    if not text.strip() or any(not p for p in items):
        raise UserInputError(f"{flag}: {text!r} is not a GPU list (give e.g. 0,1 or 0-3,5)")
    out: list[int] = []
    for item in items:
        m = _GPU_ITEM.match(item)
        if m is None:
            raise UserInputError(f"{flag}: {item!r} is not a GPU index or range (give e.g. 0,1 or 0-3,5)")
        lo = int(m.group(1))
        hi = int(m.group(2)) if m.group(2) is not None else lo
        if hi < lo:
            raise UserInputError(f"{flag}: range {item!r} runs backwards (give {hi}-{lo})")
        if hi > MAX_GPU_INDEX:
            raise UserInputError(f"{flag}: GPU index {hi} is out of range (0..{MAX_GPU_INDEX})")
        out.extend(range(lo, hi + 1))
    dupes = sorted({i for i in out if out.count(i) > 1})
    if dupes:
        raise UserInputError(f"{flag}: GPU {dupes[0]} is listed twice in {text!r}")
    return tuple(out)


# --- the model ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelSource:
    """What the user named: a preset (`--model NAME`) or a checkpoint's config (`--config PATH`)."""

    kind: str
    """preset or config."""
    value: str
    """The preset's name (lower case) or the config path as an absolute path."""

    @property
    def ref(self) -> str:
        """'preset:llama-3.1-70b' or 'config:/abs/path/config.json': the model in a fingerprint."""
        return f"{self.kind}:{self.value}"

    @property
    def flag_text(self) -> str:
        """How to name it again on a command line: '--model llama-3.1-70b' or '--config /path'."""
        return f"--model {self.value}" if self.kind == "preset" else f"--config {self.value}"


def _check_config_path(text: str) -> str:
    """The config path as an absolute path, after refusing anything that is not a regular file or a directory
    holding a regular config.json (a FIFO or a device would block or never end when read)."""
    path = Path(text).expanduser()
    try:
        st = path.stat()
    except FileNotFoundError:
        raise UserInputError(f"--config {text}: no such file or directory") from None
    except OSError as exc:
        raise UserInputError(f"--config {text}: cannot read ({exc.strerror or exc})") from None
    if stat.S_ISDIR(st.st_mode):
        inner = path / "config.json"
        try:
            inner_st = inner.stat()
        except OSError:
            raise UserInputError(f"--config {text}: no config.json in this directory") from None
        if not stat.S_ISREG(inner_st.st_mode):
            raise UserInputError(f"--config {text}: {inner.name} in this directory is not a regular file")
    elif not stat.S_ISREG(st.st_mode):
        raise UserInputError(f"--config {text}: not a regular file or a directory (a config.json is read whole)")
    return str(path.absolute())


def model_source(model: str | None, config: str | None, *, default_model: str | None = None) -> ModelSource:
    """The model named by `--model NAME` or `--config PATH` (exactly one; `default_model` when neither is given and
    a default exists). Empty values, both flags, and config paths that are not a regular file or a directory holding
    config.json are one-line `UserInputError`s."""
    if model is not None and config is not None:
        raise UserInputError("--model and --config name the model twice: give one of them")
    if config is not None:
        if not config.strip():
            raise UserInputError("--config: empty path")
        return ModelSource("config", _check_config_path(config))
    if model is not None:
        if not model.strip():
            raise UserInputError("--model: empty name (decodetop budget --list-models lists the presets)")
        return ModelSource("preset", model.strip().lower())
    if default_model is not None:
        return ModelSource("preset", default_model.strip().lower())
    raise UserInputError("no model: give --model NAME (decodetop budget --list-models) or --config PATH")


@functools.lru_cache(maxsize=32)
def _load_spec(kind: str, value: str) -> ModelSpec:
    return load_config(value) if kind == "config" else load_preset(value)


def load_model(source: ModelSource) -> ModelSpec:
    """The `ModelSpec` of a source (presets and config files are read once per process)."""
    return _load_spec(source.kind, source.value)


# --- tensor parallelism ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TpChoice:
    """A TP degree and where it came from, in words."""

    tp: int
    source: str
    """'--tp', 'settings file', 'default: the 2 CPU ranks of the probe group', 'default: no probe group'."""

    @property
    def text(self) -> str:
        """'TP 2 (default: the 2 CPU ranks of the probe group)'."""
        return f"TP {self.tp} ({self.source})"


def choose_tp(
    tp: int | None,
    *,
    group_size: int | None = None,
    group_label: str = "ranks",
    group_where: str = "of the probe group",
    tp_from: str = "--tp",
) -> TpChoice:
    """The one TP rule: `tp` when given (from the flag or setting named by `tp_from`), else the number of ranks in
    the probe group (said as "the 2 {group_label} {group_where}": "GPUs of the probe group", "GPUs seen by NVML",
    "fake GPUs of the demo"), else 1 where there is no probe group."""
    if tp is not None:
        if not 1 <= tp <= 1024:
            raise UserInputError(f"{tp_from}: {tp} is out of range (1..1024)")
        return TpChoice(tp, tp_from)
    if group_size is not None and group_size >= 1:
        label = group_label[:-1] if group_size == 1 and group_label.endswith("s") else group_label  # "1 GPU"
        return TpChoice(group_size, f"default: the {group_size} {label} {group_where}")
    return TpChoice(1, "default: no probe group; pass --tp")


# --- the scenario ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Scenario:
    """One model on one deployment: what a budget, a plan and a stored result are for."""

    source: ModelSource
    spec: ModelSpec = field(compare=False, repr=False)
    deployment: Deployment
    tp_source: str
    """Where TP came from, in words (`TpChoice.source`)."""
    model_variant: str = ""
    """What a what-if changed of the model itself ('weights=fp8', 'draft model=…'; '' for the model as named): part of
    the fingerprint, so a variant's results and inventory never pass for the model's."""
    draft_spec: ModelSpec | None = field(default=None, compare=False, repr=False)
    """The draft model of speculative decoding where it is not the model's MTP layers (`Deployment.draft_model`)."""

    @property
    def tp(self) -> int:
        """The tensor-parallel degree."""
        return self.deployment.tp

    @property
    def tp_text(self) -> str:
        """'TP 2 (default: the 2 CPU ranks of the probe group)'."""
        return f"TP {self.deployment.tp} ({self.tp_source})"

    @property
    def kv_dtype(self) -> str:
        """The KV-cache dtype in effect (the flag, else the checkpoint's, else BF16)."""
        return self.deployment.resolved_kv_dtype(self.spec)

    @property
    def fingerprint_id(self) -> str:
        """The canonical scenario string stored with each result: model, TP, EP, batch, context, KV dtype, launch
        mode and speculative decoding, in a fixed order; then the all-reduce choice where it is not `auto` (so the
        records stored before the choice existed, all composed under auto, keep matching)."""
        dep = self.deployment
        spec_text = "off" if dep.accept_length is None else f"accept={dep.accept_length:g},draft={dep.n_draft}"
        allreduce = f";allreduce={dep.allreduce}" if dep.allreduce != "auto" else ""
        variant = f";variant={self.model_variant}" if self.model_variant else ""
        return (
            f"model={self.source.ref};tp={dep.tp};ep={dep.ep};batch={dep.batch};context={dep.context_len};"
            f"kv={self.kv_dtype};launch={dep.launch_mode};spec={spec_text}{allreduce}{variant}"
        )

    @property
    def allreduce(self) -> str:
        """The all-reduce choice (`--allreduce`: auto, nccl or custom)."""
        return self.deployment.allreduce

    @property
    def title(self) -> str:
        """'Llama-3.1-70B · TP2': the short heading of a budget."""
        return f"{self.spec.name} · TP{self.deployment.tp}"

    def describe(self) -> str:
        """'Llama-3.1-70B, TP 2 (default: the 2 CPU ranks of the probe group), EP 1, batch 1, …'."""
        rest = self.deployment.describe(self.spec).split(", ", 1)[1]
        return f"{self.spec.name}, {self.tp_text}, {rest}"

    def inventory(self) -> StepInventory:
        """The decode-step inventory of the busiest GPU (built once per scenario)."""
        return _inventory(self)


@functools.lru_cache(maxsize=32)
def _inventory(scenario: Scenario) -> StepInventory:
    inventory = build_inventory(scenario.spec, scenario.deployment)
    if scenario.deployment.draft_model and scenario.draft_spec is not None:
        inventory = with_draft_model(inventory, scenario.draft_spec)
    return inventory


def build_scenario(
    source: ModelSource,
    tp: TpChoice,
    *,
    ep: int = 1,
    batch: int = 1,
    context_len: int = DEFAULT_CONTEXT,
    kv_dtype: str = "auto",
    accept_length: float | None = None,
    draft_tokens: int | None = None,
    launch_mode: str = "graph",
    allreduce: str = "auto",
) -> Scenario:
    """The scenario for a model source and deployment flags; the deployment is checked against the model (one-line
    `UserInputError` naming the flag: a TP that does not split the heads, an EP that does not divide the experts)."""
    spec = load_model(source)
    dep = Deployment(
        tp=tp.tp,
        ep=ep,
        batch=batch,
        context_len=context_len,
        kv_dtype=kv_dtype,
        accept_length=accept_length,
        draft_tokens=draft_tokens,
        launch_mode=launch_mode,
        allreduce=allreduce,
    )
    dep.validate(spec)
    return Scenario(source=source, spec=spec, deployment=dep, tp_source=tp.source)
