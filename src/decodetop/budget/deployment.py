"""Provides `Deployment`: how a model is served (tensor/expert parallel degrees, batch, context, KV-cache dtype,
speculative decoding, launch mode), checked against the model it is for.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from decodetop.budget.engine_paths import ALLREDUCE_CHOICES
from decodetop.budget.spec import ModelSpec
from decodetop.errors import UserInputError
from decodetop.quantity import shown

DEFAULT_TP = 8
"""The dataclass default for callers that build a `Deployment` by hand; the commands and the UI take TP from the
scenario layer instead (`decodetop.budget.scenario.choose_tp`: --tp, else the probe group's size, else 1)."""
DEFAULT_CONTEXT = 4096
KV_DTYPES = ("auto", "bf16", "fp16", "fp8")
LAUNCH_MODES = ("graph", "eager")
KV_BYTES = {"bf16": 2, "fp16": 2, "fp8": 1}
ACTIVATION_BYTES = 2
"""Activations and collectives run in BF16."""


@dataclass(frozen=True)
class Deployment:
    """One serving configuration. Sizes are per decode step; the batch is the number of concurrent sequences."""

    tp: int = DEFAULT_TP
    ep: int = 1
    """Expert-parallel degree: experts split over `ep` ranks, each expert's width over tp/ep ranks."""
    batch: int = 1
    context_len: int = DEFAULT_CONTEXT
    """Tokens already in each sequence's KV cache."""
    kv_dtype: str = "auto"
    """auto (the checkpoint's declared KV dtype, else BF16), bf16, fp16 or fp8."""
    accept_length: float | None = None
    """Speculative decoding (MTP): mean tokens accepted per step; None = off."""
    draft_tokens: int | None = None
    """Draft tokens verified per step (default: enough for the accept length, at least 1)."""
    draft_model: bool = False
    """Speculative decoding drafts with a separate draft model (`decodetop.budget.speculative`), not the model's own
    MTP layers: the model's step is then the verification of 1 + drafts tokens alone."""
    launch_mode: str = "graph"
    """How kernels are launched: graph (CUDA-graph replay, as SGLang/vLLM decode by default) or eager."""
    allreduce: str = "auto"
    """Which all-reduce the engine runs (`--allreduce`): auto (what vLLM would run at this TP, size and topology),
    nccl, or custom (the P2P one-shot / two-shot class); `decodetop.budget.engine_paths` holds the rule."""

    def validate(self, spec: ModelSpec) -> None:
        """Raise UserInputError naming the flag when this deployment cannot serve `spec`."""
        self._check_ranges(spec)
        self._check_choices()
        self._check_heads(spec)
        self._check_speculation()

    def _check_ranges(self, spec: ModelSpec) -> None:
        """TP, EP, batch and context within their ranges; EP divides TP and the experts."""
        if not 1 <= self.tp <= 1024:
            raise UserInputError(f"--tp: {shown(self.tp)} is out of range (1..1024)")
        if not 1 <= self.ep <= self.tp or self.tp % self.ep:
            raise UserInputError(f"--ep: {self.ep} must divide --tp {self.tp}")
        if self.ep > 1 and (not spec.is_moe or spec.n_experts % self.ep):
            raise UserInputError(f"--ep: {self.ep} does not divide the {spec.n_experts} experts of {spec.name}")
        if not 1 <= self.batch <= 1 << 16:
            raise UserInputError(f"--batch: {shown(self.batch)} is out of range (1..65536)")
        if not 0 <= self.context_len <= 1 << 24:
            raise UserInputError(f"--context: {shown(self.context_len)} is out of range (0..16777216)")

    def _check_choices(self) -> None:
        """KV dtype, launch mode and all-reduce path are among the known choices."""
        if self.kv_dtype not in KV_DTYPES:
            raise UserInputError(f"--kv-dtype: {self.kv_dtype!r} is not one of {', '.join(KV_DTYPES)}")
        if self.launch_mode not in LAUNCH_MODES:
            raise UserInputError(f"--launch-mode: {self.launch_mode!r} is not one of {', '.join(LAUNCH_MODES)}")
        if self.allreduce not in ALLREDUCE_CHOICES:
            raise UserInputError(f"--allreduce: {self.allreduce!r} is not one of {', '.join(ALLREDUCE_CHOICES)}")

    def _check_heads(self, spec: ModelSpec) -> None:
        """TP splits the attention heads, and splits or replicates the KV heads."""
        if spec.n_heads % self.tp and self.tp % spec.n_heads:
            raise UserInputError(f"--tp: {self.tp} does not split the {spec.n_heads} attention heads of {spec.name}")
        if spec.n_heads < self.tp:
            raise UserInputError(f"--tp: {self.tp} is more than the {spec.n_heads} attention heads of {spec.name}")
        kv = spec.n_kv_heads
        if spec.attention_kind == "gqa" and kv > 0 and kv % self.tp and self.tp % kv:
            # vLLM and SGLang split the KV heads evenly, or replicate them when TP is a multiple of their count
            # (vllm/model_executor/layers/linear.py, QKVParallelLinear: num_kv_head_replicas = tp_size // num_kv_heads)
            raise UserInputError(
                f"--tp: {self.tp} neither splits the {kv} KV heads of {spec.name} evenly nor replicates them "
                f"(TP must divide {kv} or be a multiple of it)"
            )

    def _check_speculation(self) -> None:
        """Accept length and draft tokens of speculative decoding within their ranges."""
        if self.accept_length is not None:
            if not math.isfinite(self.accept_length) or not 1.0 <= self.accept_length <= 64:
                raise UserInputError(f"--accept-length: {shown(self.accept_length)} is out of range (1..64)")
            if self.draft_tokens is not None and self.accept_length > self.draft_tokens + 1:
                raise UserInputError(
                    f"--accept-length: {self.accept_length} is more than the {self.draft_tokens} draft tokens + 1"
                )
        if self.draft_tokens is not None and not 1 <= self.draft_tokens <= 63:
            raise UserInputError(f"--draft-tokens: {shown(self.draft_tokens)} is out of range (1..63)")

    @property
    def moe_tp(self) -> int:
        """Ranks each expert's width is split over."""
        return self.tp // self.ep

    @property
    def speculative(self) -> bool:
        """Whether speculative decoding is on."""
        return self.accept_length is not None

    @property
    def n_draft(self) -> int:
        """Draft tokens per step (0 when speculative decoding is off)."""
        if self.accept_length is None:
            return 0
        if self.draft_tokens is not None:
            return self.draft_tokens
        return max(1, math.ceil(self.accept_length - 1))

    @property
    def query_len(self) -> int:
        """Tokens each sequence runs through the main model per step (1, or 1 + drafts when verifying)."""
        return 1 + self.n_draft

    @property
    def tokens_per_step(self) -> float:
        """Tokens each sequence gains per step."""
        return self.accept_length if self.accept_length is not None else 1.0

    def resolved_kv_dtype(self, spec: ModelSpec) -> str:
        """The KV-cache dtype in effect: the flag, else the checkpoint's declaration, else BF16."""
        if self.kv_dtype != "auto":
            return self.kv_dtype
        return spec.quant.kv_cache_dtype or "bf16"

    def describe(self, spec: ModelSpec) -> str:
        """One line for the output."""
        drafter = " by a draft model" if self.draft_model else ""
        spec_text = (
            f", speculative: accept {self.accept_length:g} of {self.n_draft} draft(s){drafter}"
            if self.speculative
            else ""
        )
        allreduce = f", all-reduce {self.allreduce}" if self.allreduce != "auto" else ""
        return (
            f"TP {self.tp}, EP {self.ep}, batch {self.batch}, context {self.context_len}, "
            f"KV {self.resolved_kv_dtype(spec)}, launch {self.launch_mode}{spec_text}{allreduce}"
        )
