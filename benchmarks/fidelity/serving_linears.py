"""Provides the fused projections of a serving engine's decode step, for the fidelity reference.

Engines run the linear layers that read the same input as one GEMM over their weights stacked along the output:
q, k and v as one `qkv_proj` (vLLM's `QKVParallelLinear`, SGLang's the same), an MLP's gate and up as one
`gate_up_proj` (`MergedColumnParallelLinear`), and MLA's q_a and kv_a as one `fused_qkv_a_proj_with_mqa` (SGLang's
DeepSeek-V2/V3). decodetop's budget costs them so (`budget/inventory`: `qkv_proj`, `gate_up_proj`, the fused q_a/kv_a
GEMM). transformers calls each as its own `nn.Linear`, one GEMM each. `ServingLinears` stacks each group's weights
into one tensor (bias too where every member has one), points every member's weight at its rows of it (no second
copy: the values and the model's other forms stay as they were), and makes the members share one GEMM: the first
member called with an input computes the whole group's output and returns its own columns; the others, called with
that same tensor, take theirs without a GEMM. A member called with another input (or out of the pattern) computes
the group's GEMM afresh, so the result is always the stock one up to the GEMM's summation order.
"""

from __future__ import annotations

import types
from typing import Any

#: The groups of sibling linears that engines run as one GEMM, by attribute name on their parent module.
GROUPS: tuple[tuple[str, ...], ...] = (
    ("q_proj", "k_proj", "v_proj"),
    ("q_a_proj", "kv_a_proj_with_mqa"),
    ("q_proj", "kv_a_proj_with_mqa"),  # MLA without a q LoRA (DeepSeek-V2-Lite's form)
    ("gate_proj", "up_proj"),
)


class _Group:
    """The stacked weight of one group of linears and the outputs its last GEMM left for the members not yet called."""

    def __init__(self, names: tuple[str, ...], members: list[Any]) -> None:
        import torch

        self.names = names
        self.members = members
        self.widths = [int(m.out_features) for m in members]
        self.weight = torch.cat([m.weight.detach() for m in members], 0)
        self.bias = torch.cat([m.bias.detach() for m in members], 0) if members[0].bias is not None else None
        self.input: Any | None = None
        self.pending: dict[int, Any] = {}

    def output_of(self, member: Any, x: Any) -> Any:
        """`member`'s output for `x`: its columns of the group's GEMM, computed now unless a sibling already did."""
        import torch.nn.functional as F  # noqa: N812

        key = id(member)
        if self.input is x and key in self.pending:
            out = self.pending.pop(key)
            if not self.pending:
                self.input = None
            return out
        pieces = F.linear(x, self.weight, self.bias).split(self.widths, dim=-1)
        self.input = x
        self.pending = {id(m): p for m, p in zip(self.members, pieces, strict=True) if m is not member}
        return pieces[self.members.index(member)]

    def clear(self) -> None:
        self.input = None
        self.pending = {}


def _plain_linear(m: Any) -> bool:
    import torch

    return type(m) is torch.nn.Linear


def _group_of(parent: Any, names: tuple[str, ...]) -> list[Any] | None:
    """The members of `names` under `parent` when they can share one GEMM: plain `nn.Linear`s over the same input
    width, one dtype and device, all with a bias or none."""
    members = [getattr(parent, n, None) for n in names]
    if not all(m is not None and _plain_linear(m) for m in members):
        return None
    first = members[0]
    same = all(
        m.in_features == first.in_features
        and m.weight.dtype == first.weight.dtype
        and m.weight.device == first.weight.device
        and (m.bias is None) == (first.bias is None)
        for m in members
    )
    return members if same else None


def _member_forward(self: Any, x: Any) -> Any:
    return self._decodetop_group.output_of(self, x)


class ServingLinears:
    """Makes every group of sibling linears of a transformers model share one GEMM, and back. `reason` says why it does
    not apply (no such group)."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.found: list[tuple[tuple[str, ...], list[Any]]] = []
        claimed: set[int] = set()
        for parent in model.modules():
            for names in GROUPS:
                members = _group_of(parent, names)
                if members is not None and not any(id(m) in claimed for m in members):
                    self.found.append((names, members))
                    claimed.update(id(m) for m in members)
        self.groups: list[_Group] = []
        self._hook: Any = None
        self.reason = "" if self.found else "no sibling linears over one input (q/k/v, gate/up, q_a/kv_a)"

    def __enter__(self) -> ServingLinears:
        if self.reason:
            raise ValueError(f"fused projections do not apply: {self.reason}")
        for names, members in self.found:
            group = _Group(names, members)
            start = 0
            for m, width in zip(members, group.widths, strict=True):
                m.weight.data = group.weight[start : start + width]
                if group.bias is not None:
                    m.bias.data = group.bias[start : start + width]
                start += width
                m._decodetop_group = group
                m.forward = types.MethodType(_member_forward, m)
            self.groups.append(group)

        def clear(*_: Any) -> None:
            for group in self.groups:
                group.clear()

        self._hook = self.model.register_forward_pre_hook(clear)
        return self

    def __exit__(self, *exc: object) -> None:
        for group in self.groups:
            group.clear()
            for m in group.members:
                m.__dict__.pop("forward", None)
                m.__dict__.pop("_decodetop_group", None)
        self.groups = []
        if self._hook is not None:
            self._hook.remove()
            self._hook = None

    def describe(self) -> str:
        if self.reason:
            return f"projections: transformers' own ({self.reason})"
        counts: dict[str, int] = {}
        for names, _ in self.found:
            label = "/".join(n.removesuffix("_proj").removesuffix("_proj_with_mqa") for n in names)
            counts[label] = counts.get(label, 0) + 1
        parts = ", ".join(f"{label} ×{n}" for label, n in counts.items())
        return f"sibling projections as one GEMM each ({parts})"
