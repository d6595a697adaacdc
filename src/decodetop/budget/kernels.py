"""Provides `KernelClass`: which class of kernel a measured figure came from (stdlib only).

A probe times the best kernel it can run on its rank and says which (docs/architecture.md, "Measurement rules"):

- `engine`: a serving engine's own kernel, imported in the probe rank (FlashMLA, FlashInfer, vLLM's or SGLang's
  custom ops): "engine kernel: flashinfer 0.2.5 flashinfer.norm.fused_add_rmsnorm";
- `triton`: decodetop's own fused Triton kernel (`decodetop.probes.worker.kernels`), written to approach the
  roofline where no engine kernel is importable;
- `torch`: the op as plain torch calls on a GPU (a diagnostic beside the others: "torch ops would take X µs", and
  the figure where nothing better runs);
- `cpu`: the torch form on a CPU rank (the method, not a GPU's time).

The class travels on the probe's result points (`Measurement.kernel`), through the read hooks
(`MeasuredTime.kernel`) into the budget's segments (`Segment.kernels`), so every surface can say which class each
figure came from.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from decodetop.errors import UserInputError

KERNEL_KINDS = ("engine", "triton", "torch", "cpu")
"""The classes, best first: a probe picks the first it can run."""
_SHORT = {"engine": "engine", "triton": "Triton", "torch": "torch", "cpu": "CPU"}


@dataclass(frozen=True)
class KernelClass:
    """The class of kernel a figure came from, and which one."""

    kind: str
    """One of KERNEL_KINDS."""
    function: str
    """What ran: the engine's function ('flashinfer.norm.fused_add_rmsnorm'), decodetop's kernel ('mla_decode
    split-K'), or the torch ops ('bmm, softmax, bmm')."""
    package: str = ""
    """The engine's package (engine kernels only)."""
    version: str = ""
    """The engine package's version (engine kernels only)."""

    def __post_init__(self) -> None:
        if self.kind not in KERNEL_KINDS:
            raise UserInputError(f"kernel class {self.kind!r} is not one of {', '.join(KERNEL_KINDS)}")

    @property
    def text(self) -> str:
        """'engine kernel: flashinfer 0.2.5 flashinfer.norm.fused_add_rmsnorm', 'decodetop Triton: mla_decode
        split-K', 'torch ops: bmm, softmax, bmm', 'CPU: torch ops: …'."""
        if self.kind == "engine":
            return f"engine kernel: {self.package} {self.version} {self.function}".replace("  ", " ")
        if self.kind == "triton":
            return f"decodetop Triton: {self.function}"
        if self.kind == "torch":
            return f"torch ops: {self.function}"
        return f"CPU: torch ops: {self.function}"

    @property
    def short(self) -> str:
        """A label for a table cell: 'engine flashinfer', 'Triton', 'torch', 'CPU'."""
        if self.kind == "engine":
            return f"engine {self.package}"
        return _SHORT[self.kind]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {"kind": self.kind, "function": self.function, "package": self.package, "version": self.version}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> KernelClass:
        """The inverse of `to_dict` (a malformed entry raises a one-line UserInputError)."""
        try:
            return cls(
                str(data["kind"]), str(data["function"]), str(data.get("package", "")), str(data.get("version", ""))
            )
        except (KeyError, TypeError) as exc:
            raise UserInputError(f"kernel class {data!r} is malformed: {exc}") from None


def kernels_text(kernels: tuple[KernelClass, ...]) -> str:
    """The kernel classes of a figure in words, '; '-joined ('' for none)."""
    return "; ".join(k.text for k in kernels)


def kernels_short(kernels: tuple[KernelClass, ...]) -> str:
    """The short labels of a figure's kernel classes, distinct, '+'-joined ('' for none)."""
    return "+".join(dict.fromkeys(k.short for k in kernels))
