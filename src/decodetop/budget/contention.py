"""Provides `Contention`: other processes on the probed GPUs (or foreign work NVML saw on them) while the probes ran,
named as the likely cause of whatever the measurements then show (stdlib only).

Why: a GPU that another process also uses time-slices the two contexts (about 2.4 ms slices on an H200:
docs/reference/h200-machine.md, "A neighbour on one GPU"). The probes' medians mostly land in their own slices, but
their tails, every eager all-reduce and a whole layer timed in one go include the neighbour's slices: the budget's
mean step doubles and the layer check's parts-vs-whole error swings by tens of per cent. Those figures then describe
the neighbour, not the host, so every surface names the neighbour (pid, name, GPU, its SM utilisation during the
run) and a layer composition error beyond `CONTENTION_ERROR_PCT` is called contention, not a figure.

Found by `decodetop.probes.contention` from the NVML snapshots every probe result carries; carried on the Budget
(`Budget.contention`) and in its JSON, so `budget --diff` of the files names it too.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

CONTENTION_ERROR_PCT = 15.0
"""A layer's Σ parts vs whole error beyond this, on a GPU another process used, is contention: composition on a clean
H200 lands within 4–13 % of independent timings of a serving-form step (docs/benchmarks.md, "MoE fidelity …" and the
dense fidelity runs: every model within 15 %), while the GEMM neighbour of docs/benchmarks.md ("Plants on one H200")
moved it to −59 %."""


@dataclass(frozen=True)
class GpuNeighbour:
    """A compute process, not the probe group's, seen on a probed GPU during the run."""

    gpu: int
    """The probe group's CUDA index of that GPU ('GPU 0' on every surface)."""
    pid: int
    name: str
    sm_util_pct: int | None
    """Its highest mean SM utilisation over one probe's run (NVML's per-process samples); None where NVML gave
    none."""
    probes: tuple[str, ...] = ()
    """The probes it ran beside."""

    def text(self) -> str:
        """'GPU 0: pid 1306 (python3, 97 % SM during the run)'."""
        util = f", {self.sm_util_pct} % SM during the run" if self.sm_util_pct is not None else ""
        return f"GPU {self.gpu}: pid {self.pid} ({self.name}{util})"


@dataclass(frozen=True)
class ForeignLoad:
    """A probed GPU busy while the probe group's ranks waited idle, with no other process NVML could name (a process
    in another container or VM, whose pid NVML does not show here)."""

    gpu: int
    util_pct: int
    """NVML's GPU utilisation before the probes (the median over them)."""

    def text(self) -> str:
        """'GPU 0 98 % busy before the probes while their ranks were idle (no process visible from here)'."""
        return f"GPU {self.gpu} {self.util_pct} % busy before the probes while their ranks were idle"


@dataclass(frozen=True)
class Contention:
    """What else ran on the probed GPUs during the run."""

    neighbours: tuple[GpuNeighbour, ...] = ()
    foreign: tuple[ForeignLoad, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.neighbours or self.foreign)

    def who(self) -> str:
        """'GPU 0: pid 1306 (python3, 97 % SM during the run); GPU 1 95 % busy before the probes …'."""
        parts = [n.text() for n in self.neighbours]
        parts += [f.text() + " (no process visible from here)" for f in self.foreign]
        return "; ".join(parts)

    def short(self) -> str:
        """'pid 1306 (python3) on GPU 0' — for the layer check's error column."""
        if self.neighbours:
            return ", ".join(f"pid {n.pid} ({n.name}) on GPU {n.gpu}" for n in self.neighbours)
        return ", ".join(f"foreign work on GPU {f.gpu}" for f in self.foreign)

    def line(self) -> str:
        """The likely-cause line every surface prints ('' when nothing else ran)."""
        if not self:
            return ""
        what = "another process on the probed GPU" if len(self.neighbours) <= 1 else "other processes on the GPUs"
        if not self.neighbours:
            what = "foreign work on the probed GPU"
        return (
            f"likely cause: {what} — {self.who()}: its context time-slices with the probes', so tails, eager "
            "all-reduces and whole-layer timings include its work"
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (what `Budget.to_dict()` writes under "contention")."""
        return {
            "neighbours": [
                {"gpu": n.gpu, "pid": n.pid, "name": n.name, "sm_util_pct": n.sm_util_pct, "probes": list(n.probes)}
                for n in self.neighbours
            ],
            "foreign": [{"gpu": f.gpu, "util_pct": f.util_pct} for f in self.foreign],
            "line": self.line(),
        }


def contention_error(error_pct: float, contention: Contention | None) -> str:
    """The layer check's error as text: the figure ('+3.2%'), or 'contention (pid 1306 (python3) on GPU 0)' where it
    is beyond `CONTENTION_ERROR_PCT` on a GPU another process used (the figure then measures the neighbour)."""
    if contention and abs(error_pct) > CONTENTION_ERROR_PCT:
        return f"contention ({contention.short()}), not a composition figure"
    return f"{error_pct:+.1f}%"


def contention_in(budget: Mapping[str, Any]) -> str:
    """The likely-cause line a budget JSON carries ('' where it has none: a clean run, or an older file)."""
    found = budget.get("contention")
    line = found.get("line") if isinstance(found, Mapping) else None
    # a file is outside text: control characters (escape sequences) are dropped, never sent to the terminal
    return "".join(ch for ch in line if ch.isprintable()) if isinstance(line, str) else ""
