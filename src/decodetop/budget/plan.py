"""Provides `build_plan`: the distinct measurements a step inventory needs, grouped by the probe that takes them.

The plan lists every key the inventory's ops use (each once, however many ops share it), plus sweeps for charts
and interpolation: GEMM time vs M (1…256) at each weight shape, and the all-reduce sweep 8 B–128 MiB ×2 with the
model's exact message sizes for 1–64 tokens (docs/reference/probes.md §7.2). Launch cost is planned in both modes (eager
and graph) because the gap between them is itself a finding (docs/architecture.md, "Measurement rules")."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from decodetop.budget.deployment import ACTIVATION_BYTES, LAUNCH_MODES
from decodetop.budget.inventory import StepInventory
from decodetop.budget.keys import PROBES, AllreduceKey, GemmKey, LaunchKey, ProbeKey

DEFAULT_SWEEP_M: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256)
ALLREDUCE_SWEEP_MIN_BYTES = 8
ALLREDUCE_SWEEP_MAX_BYTES = 128 * 1024 * 1024  # docs/reference/probes.md §7.2: default sweep 8 B–128 MB ×2
# docs/reference/probes.md §7.2: hidden·2·tokens for tokens 1..64
EXACT_TOKEN_SIZES: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)


@dataclass(frozen=True)
class GemmSweep:
    """GEMM time vs M at one weight shape (n, k, batch, dtype), for charts and for interpolating missing M."""

    n: int
    k: int
    batch: int
    dtype: str
    ms: tuple[int, ...]

    @property
    def curve_id(self) -> str:
        """Same id as `GemmKey.curve_id` of any point on it."""
        return f"gemm:n={self.n},k={self.k},batch={self.batch},dtype={self.dtype}"

    def keys(self) -> tuple[GemmKey, ...]:
        """One key per M."""
        return tuple(GemmKey(m, self.n, self.k, self.batch, self.dtype) for m in self.ms)


@dataclass(frozen=True)
class ProbePlan:
    """What to measure for one model on one deployment."""

    model: str
    deployment: str
    groups: tuple[tuple[str, tuple[ProbeKey, ...]], ...]
    """(probe name, its distinct keys), in `keys.PROBES` order; probes with no key left out."""
    uses: tuple[tuple[str, tuple[str, ...]], ...]
    """(key id, names of the inventory ops that need it)."""
    gemm_sweeps: tuple[GemmSweep, ...]
    allreduce_sweep_bytes: tuple[int, ...]
    """Message sizes for the all-reduce curve (the exact sizes are in the `allreduce` group)."""
    allreduce_ranks: int

    def by_probe(self, probe: str) -> tuple[ProbeKey, ...]:
        """Keys of one probe (empty when it has none)."""
        return dict(self.groups).get(probe, ())

    def all_keys(self) -> tuple[ProbeKey, ...]:
        """Every distinct key, grouped by probe."""
        return tuple(k for _, keys in self.groups for k in keys)

    def key_ids(self) -> tuple[str, ...]:
        """Every distinct key id."""
        return tuple(k.key_id for k in self.all_keys())

    def ops_using(self, key_id: str) -> tuple[str, ...]:
        """Names of the ops a key times."""
        return dict(self.uses).get(key_id, ())

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (keys as ids and params)."""
        return {
            "model": self.model,
            "deployment": self.deployment,
            "probes": {
                probe: [{"id": k.key_id, "params": k.to_params(), "ops": list(self.ops_using(k.key_id))} for k in keys]
                for probe, keys in self.groups
            },
            "gemm_sweeps": [
                {"curve_id": s.curve_id, "n": s.n, "k": s.k, "batch": s.batch, "dtype": s.dtype, "m": list(s.ms)}
                for s in self.gemm_sweeps
            ],
            "allreduce_sweep_bytes": list(self.allreduce_sweep_bytes),
            "allreduce_ranks": self.allreduce_ranks,
        }


def _pow2_sizes(lo: int, hi: int) -> list[int]:
    out = []
    size = lo
    while size <= hi:
        out.append(size)
        size *= 2
    return out


def build_plan(inventory: StepInventory, *, sweep_m: tuple[int, ...] = DEFAULT_SWEEP_M) -> ProbePlan:
    """The distinct measurements `inventory` needs, plus the sweeps."""
    seen: dict[str, ProbeKey] = {}
    uses: dict[str, list[str]] = {}
    for op in inventory.ops:
        kid = op.key.key_id
        seen.setdefault(kid, op.key)
        if op.name not in uses.setdefault(kid, []):
            uses[kid].append(op.name)
    kernels = inventory.kernels
    for mode in LAUNCH_MODES:
        launch = LaunchKey(mode, kernels)
        seen[launch.key_id] = launch
        uses[launch.key_id] = [f"kernel launches ({kernels} per step)"]

    sweeps: dict[str, GemmSweep] = {}
    for key in seen.values():
        if isinstance(key, GemmKey):
            ms = tuple(sorted(set(sweep_m) | {key.m}))
            sweep = GemmSweep(key.n, key.k, key.batch, key.dtype, ms)
            prev = sweeps.get(sweep.curve_id)
            if prev is not None:
                sweep = GemmSweep(key.n, key.k, key.batch, key.dtype, tuple(sorted(set(prev.ms) | set(ms))))
            sweeps[sweep.curve_id] = sweep

    tp = inventory.deployment.tp
    d = inventory.spec.d_model
    sizes = set(_pow2_sizes(ALLREDUCE_SWEEP_MIN_BYTES, ALLREDUCE_SWEEP_MAX_BYTES))
    sizes |= {d * ACTIVATION_BYTES * t for t in EXACT_TOKEN_SIZES}
    sizes |= {k.bytes for k in seen.values() if isinstance(k, AllreduceKey)}

    groups = []
    for probe in PROBES:
        keys = tuple(k for k in seen.values() if probe == k.PROBE)
        if keys:
            groups.append((probe, keys))
    return ProbePlan(
        model=inventory.spec.name,
        deployment=inventory.deployment.describe(inventory.spec),
        groups=tuple(groups),
        uses=tuple((k, tuple(v)) for k, v in uses.items()),
        gemm_sweeps=tuple(sweeps[c] for c in sorted(sweeps)),
        allreduce_sweep_bytes=tuple(sorted(sizes)) if tp > 1 else (),
        allreduce_ranks=tp,
    )
