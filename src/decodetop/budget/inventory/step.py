"""Provides what a step inventory holds: `Op` (one op of a decode step: component, shape, dtype, count, bytes,
FLOPs, kernels, measurement key) and `StepInventory` (the ops of one decode step on the busiest GPU, with totals)."""

from __future__ import annotations

from dataclasses import dataclass, field

from decodetop.budget.components import Component
from decodetop.budget.deployment import Deployment
from decodetop.budget.keys import AllreduceKey, ProbeKey
from decodetop.budget.spec import ModelSpec


@dataclass(frozen=True)
class Op:
    """One op of the decode step on the busiest GPU, repeated `count` times per step. Byte/FLOP fields are per
    instance; the `total_*` properties multiply by `count`."""

    name: str
    component: Component
    kind: str
    """gemm, bmm, attention, kv_write, norm, routing, moe, all_reduce, all_gather, sampling."""
    shape: str
    dtype: str
    count: int
    weight_bytes: float
    kv_bytes: float
    read_bytes: float
    write_bytes: float
    flops: float
    kernels: int
    key: ProbeKey
    layers: str
    """Which layers it runs in ("0-77", "3-77", "mtp", "-" for model-level ops)."""

    @property
    def total_weight_bytes(self) -> float:
        """Weights read per step."""
        return self.count * self.weight_bytes

    @property
    def total_kv_bytes(self) -> float:
        """KV cache read per step."""
        return self.count * self.kv_bytes

    @property
    def total_read_bytes(self) -> float:
        """All bytes read per step."""
        return self.count * self.read_bytes

    @property
    def total_write_bytes(self) -> float:
        """All bytes written per step."""
        return self.count * self.write_bytes

    @property
    def total_flops(self) -> float:
        """FLOPs per step."""
        return self.count * self.flops

    @property
    def total_kernels(self) -> int:
        """Kernels launched per step."""
        return self.count * self.kernels

    @property
    def is_collective(self) -> bool:
        """An all-reduce or all-gather."""
        return self.kind in ("all_reduce", "all_gather")


@dataclass(frozen=True)
class StepInventory:
    """One decode step of `spec` under `deployment`, on the busiest GPU."""

    spec: ModelSpec
    deployment: Deployment
    ops: tuple[Op, ...]
    kv_dtype: str
    resident_weight_bytes: float
    """Weights each GPU holds (replicated modules whole, sharded ones by their share)."""
    assumptions: tuple[str, ...] = field(default=())

    @property
    def tokens_per_step(self) -> float:
        """Tokens each sequence gains per step (the accept length with speculative decoding)."""
        return self.deployment.tokens_per_step

    @property
    def weight_bytes(self) -> float:
        """Weights read per step."""
        return sum(op.total_weight_bytes for op in self.ops)

    @property
    def kv_bytes(self) -> float:
        """KV cache read per step."""
        return sum(op.total_kv_bytes for op in self.ops)

    @property
    def read_bytes(self) -> float:
        """All bytes read per step."""
        return sum(op.total_read_bytes for op in self.ops)

    @property
    def write_bytes(self) -> float:
        """All bytes written per step."""
        return sum(op.total_write_bytes for op in self.ops)

    @property
    def flops(self) -> float:
        """FLOPs per step."""
        return sum(op.total_flops for op in self.ops)

    @property
    def kernels(self) -> int:
        """Kernels launched per step."""
        return sum(op.total_kernels for op in self.ops)

    @property
    def collectives(self) -> tuple[Op, ...]:
        """The all-reduce / all-gather ops."""
        return tuple(op for op in self.ops if op.is_collective)

    def collective_count(self, kind: str = "all_reduce") -> int:
        """Collectives of one kind per step."""
        return sum(op.count for op in self.ops if op.kind == kind)

    def collective_sizes(self, kind: str = "all_reduce") -> dict[int, int]:
        """Message bytes → count per step, for one kind of collective."""
        sizes: dict[int, int] = {}
        for op in self.ops:
            if op.kind == kind and isinstance(op.key, AllreduceKey):
                sizes[op.key.bytes] = sizes.get(op.key.bytes, 0) + op.count
        return sizes

    def by_component(self) -> dict[Component, tuple[Op, ...]]:
        """Ops grouped by component, in Component order (components without ops left out)."""
        out: dict[Component, list[Op]] = {}
        for op in self.ops:
            out.setdefault(op.component, []).append(op)
        return {c: tuple(out[c]) for c in Component if c in out}
