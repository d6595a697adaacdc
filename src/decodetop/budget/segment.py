"""A budget's segment: one component's share of the step, its status (measured at its exact keys, predicted from
this host's curves, a roofline estimate, or no figure), where its figure came from, and its 80 % range; and the
range of a sum of segments (`segments_range`). `decodetop.budget.segment_costs` builds segments from an inventory's
ops; `decodetop.budget.compose` stacks them into a `Budget`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from decodetop.budget.components import UNEXPLAINED_KEY, Component
from decodetop.budget.kernels import KernelClass, kernels_text
from decodetop.budget.uncertainty import Combined, Part, combine

STATUSES = ("measured", "interpolated", "extrapolated", "transferred", "estimated", "missing")
"""A segment's status, best first: measured at its exact keys, from the curve engine (interpolated, extrapolated,
transferred), a roofline estimate, or no figure."""
CURVE_STATUSES = ("interpolated", "extrapolated", "transferred")
"""The statuses of a figure the curve engine predicted."""
STATUS_RANK = {s: i for i, s in enumerate(STATUSES)}
"""A status's place in `STATUSES` (higher: weaker)."""
PROVENANCE_KINDS = ("measured_now", "measured_earlier", "measured", "estimate", "not_applicable", "missing")
"""Where a segment's figure came from: measured in this run, measured earlier (read back from the history),
measured (origin not refined: a budget composed from bare key times), a roofline estimate, not applicable here, or
no figure at all."""


@dataclass(frozen=True)
class Segment:
    """One component's share of the step."""

    component: str
    """A `Component` value, or "unexplained"."""
    ms: float | None
    """Sum of what is known; None when nothing is. With status "missing" it is a lower bound."""
    status: str
    """measured | interpolated | estimated | missing (the worst status among its ops)."""
    reason: str
    n_ops: int = 0
    p10_ms: float | None = None
    p90_ms: float | None = None
    missing_keys: tuple[str, ...] = ()
    sources: tuple[str, ...] = ()
    probes: tuple[str, ...] = ()
    """The probes whose measurements the figure uses (for where and when they were taken)."""
    provenance_kind: str = "missing"
    """One of PROVENANCE_KINDS."""
    provenance: str = ""
    """Where the figure came from, in words ("measured in this run", "roofline estimate for NVIDIA H200 (detected
    by NVML)", "measured 3h ago on gpu-host-1 (2 × NVIDIA H200)")."""
    mean_ms: float | None = None
    """Σ count × each op's mean (the median where an op's mean is not known); None with `ms`."""
    std_ms: float = 0.0
    """Standard deviation of the component's step time, the ops' instances taken as independent (0: no samples)."""
    path: str = ""
    """The kernel path the figure assumes, short enough for a label ('custom one-shot', 'NCCL'; '' where there is
    no choice): for the all-reduce, the path of the step's own message sizes (`decodetop.budget.engine_paths`)."""
    path_text: str = ""
    """That path in words with why ('custom one-shot ≤ 4 MiB, NCCL above (vLLM at TP 2 over NVLink: …)')."""
    path_rule: str = ""
    """What chose the path: the engine rule's source (a public URL) or the flag ('--allreduce nccl'); '' where the
    figure is simply what was measured."""
    range_p10_ms: float | None = None
    """The 80 % range of the figure (`decodetop.budget.uncertainty`): the repeat spread where every op was measured,
    wider where the curve engine predicted an op (None with `ms`)."""
    range_p90_ms: float | None = None
    shared_sigma_log: float = 0.0
    """The part of its range (σ in log space) every figure carried to another GPU model shares (one GPU-to-GPU ratio
    for all of them): the total's range keeps it whole instead of averaging it away over the components."""
    curve_label: str = ""
    """The weakest label among its ops ('interpolated', 'extrapolated 2 octaves', 'transferred from gemm:…');
    '' where every op was measured."""
    kernels: tuple[KernelClass, ...] = ()
    """The classes of kernel the measured figures came from, distinct, in op order (empty: not said)."""
    torch_ms: float | None = None
    """What the segment would take where its ops ran as torch ops (Σ count × each op's torch-form time, its own
    time where it has none); None when no op's torch form was timed beside a faster kernel."""

    @property
    def kernel_text(self) -> str:
        """The kernel classes in words, '; '-joined, with "torch ops would take X ms" where that was timed."""
        text = kernels_text(self.kernels)
        if self.torch_ms is not None:
            text += ("; " if text else "") + f"torch ops would take {self.torch_ms:.3g} ms"
        return text

    @property
    def mean(self) -> float | None:
        """`mean_ms`, or `ms` where the mean was not composed."""
        return self.ms if self.mean_ms is None else self.mean_ms

    @property
    def estimated(self) -> bool:
        """True when any part of the figure is a roofline estimate rather than a measurement."""
        return self.status == "estimated"

    @property
    def label(self) -> str:
        """Human title."""
        if self.component == UNEXPLAINED_KEY:
            return "unexplained"
        return Component(self.component).label


def segments_range(segments: Sequence[Segment]) -> Combined:
    """The 80 % range of the sum of `segments` (their own ranges, else their figures; missing ones left out):
    `decodetop.budget.uncertainty.combine`. The budget's total range is that of all its segments."""
    return combine(
        [
            Part(s.component, s.ms, s.range_p10_ms if s.range_p10_ms is not None else s.ms,
                 s.range_p90_ms if s.range_p90_ms is not None else s.ms, s.shared_sigma_log)
            for s in segments
            if s.ms is not None
        ]
    )  # fmt: skip
