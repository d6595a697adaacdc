"""Provides `build_plan`: the distinct measurements a step inventory needs, grouped by the probe that takes them.

The plan lists every key the inventory's ops use (each once, however many ops share it), plus sweeps for charts
and interpolation: GEMM time vs M (1…256) at each weight shape, and the all-reduce sweep 8 B–128 MiB ×2 with the
model's exact message sizes for 1–64 tokens (docs/reference/probes.md §7.2). Launch cost is planned in both modes (eager
and graph) because the gap between them is itself a finding (docs/architecture.md, "Measurement rules")."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from decodetop.budget.deployment import ACTIVATION_BYTES, LAUNCH_MODES, Deployment
from decodetop.budget.inventory import StepInventory, build_inventory, expected_distinct_experts
from decodetop.budget.keys import (
    PROBES,
    AllreduceKey,
    AttentionKey,
    GemmKey,
    KvcastKey,
    LaunchKey,
    MoeKey,
    NormKey,
    ProbeKey,
    RoutingKey,
    SamplingKey,
)
from decodetop.budget.keywork import attention_cache_bytes, key_work
from decodetop.budget.spec import ModelSpec
from decodetop.errors import UserInputError

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


def allreduce_sweep_sizes(inventory: StepInventory) -> tuple[int, ...]:
    """The all-reduce curve's message sizes: powers of two from `ALLREDUCE_SWEEP_MIN_BYTES` to
    `ALLREDUCE_SWEEP_MAX_BYTES`, plus one activation row of the model at each of `EXACT_TOKEN_SIZES` tokens."""
    d = inventory.spec.d_model
    sizes = set(_pow2_sizes(ALLREDUCE_SWEEP_MIN_BYTES, ALLREDUCE_SWEEP_MAX_BYTES))
    sizes |= {d * ACTIVATION_BYTES * t for t in EXACT_TOKEN_SIZES}
    return tuple(sorted(sizes))


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
    sizes = set(allreduce_sweep_sizes(inventory))
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


# --- the curve plan: what a what-if will ask for ----------------------------------------------------------------

CURVE_TP_DEGREES: tuple[int, ...] = (1, 2, 4, 8)
"""The TP shards whose shapes a plan measures beside its own (those the model's heads and experts divide)."""
CURVE_EP_DEGREES: tuple[int, ...] = (1, 2, 4, 8)
"""The expert-parallel degrees whose local-expert counts a plan measures (where they divide TP and the experts)."""
CURVE_MIN_M = 256
"""GEMMs are swept up to M = batch × tokens per sequence verified, and at least to 256 (batch 64 × 1 + 3 drafts)."""
ATTENTION_BATCHES: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
ATTENTION_CONTEXTS: tuple[int, ...] = (1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072)
"""Context × 2 from 1K to 128K at batch 1 (decode attention is near-affine in context: ×2 steps interpolate to a
few %, docs/benchmarks.md 'Curves'); ×4 steps at the larger batches and on the other TP shards."""
ATTENTION_COARSE_CONTEXTS: tuple[int, ...] = (1024, 4096, 16384, 65536)
GQA_FINE_CONTEXTS: tuple[int, ...] = tuple(round(1024 * 2 ** (i / 2) / 16) * 16 for i in range(15))
"""GQA's grid is one step finer: context × √2 from 1K to 128K at batch 1 and on the other shards, × 2 at the larger
batches. Its kernel's time steps where the launch changes shape or programs per SM (docs/benchmarks.md,
"Kernels, fifth round"), and a point between two ×4 neighbours of other launches missed by 7 % median there."""
ATTENTION_SHARD_BATCHES: tuple[int, ...] = (1, 32)
"""Batches of the other TP shards' MLA grid (× `ATTENTION_COARSE_CONTEXTS`): their heads differ, their batch curve
between 1 and 32 follows the scenario's shard (a shard's batch 8 cost the GLM-5 plan 12 points)."""
ATTENTION_QUERY_LENGTHS: tuple[int, ...] = (2, 4)
"""Verification steps of speculative decoding attend with 1 + drafts query tokens per sequence."""
ATTENTION_KV_DTYPES: tuple[str, ...] = ("bf16", "fp8")
GPU_POINT_BYTES = 1 << 30
"""Largest KV cache one attention curve point reads or holds on a GPU: 1 GiB is ~0.25 ms on an H200, and the grid's
points beyond it are bandwidth-bound, where the engine's extrapolation is accurate. Routed-expert points are not capped
on GPUs: the moe probe holds every local expert for the budget's own key already."""
CPU_POINT_BYTES = 16 << 20
"""On CPU ranks (2 cores in CI) a curve point reads at most 16 MiB: ~10 ms on a laptop core."""
MOE_TOKENS: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
MOE_COARSE_TOKENS: tuple[int, ...] = (1, 4, 16, 64)
TOKEN_SCALES: tuple[int, ...] = (1, 4, 16, 64, 256)
"""Token counts (× the key's tokens per sequence) of the norms, routing, lm_head and KV-write curves."""
CPU_TOKEN_SCALES: tuple[int, ...] = (1, 4, 16)


@dataclass(frozen=True)
class CurvePlan:
    """The points a plan measures beside its own keys so the curve engine can answer what-ifs on this host: the
    model's GEMMs at the other TP shards' shapes, attention over batch × context × KV dtype (and the other shards'
    heads), routed experts over tokens at each EP degree's local experts, norms, routing, lm_head and KV writes
    over tokens (`build_curve_plan`). The all-reduce sweep already covers 8 B–128 MiB at the group's size."""

    groups: tuple[tuple[str, tuple[ProbeKey, ...]], ...] = ()
    sweep_m: tuple[int, ...] = ()
    """M values of every GEMM sweep (the plan's own and the other shards')."""
    notes: tuple[str, ...] = ()

    def by_probe(self, probe: str) -> tuple[ProbeKey, ...]:
        """The extra keys of one probe (empty when it has none)."""
        return dict(self.groups).get(probe, ())

    def key_ids(self) -> tuple[str, ...]:
        return tuple(k.key_id for _p, keys in self.groups for k in keys)

    def to_dict(self) -> dict[str, Any]:
        return {
            "probes": {p: [k.key_id for k in keys] for p, keys in self.groups},
            "sweep_m": list(self.sweep_m),
            "notes": list(self.notes),
        }


def _pow2_ceil(n: int) -> int:
    return 1 << max(0, math.ceil(math.log2(max(1, n))))


def curve_sweep_m(deployment: Deployment, sweep_m: tuple[int, ...] = DEFAULT_SWEEP_M) -> tuple[int, ...]:
    """The GEMM sweep over M: powers of two to max(256, batch × tokens verified per sequence)."""
    top = max(CURVE_MIN_M, _pow2_ceil(deployment.batch * deployment.query_len))
    return tuple(sorted(set(sweep_m) | set(_pow2_sizes(1, top))))


def _variant(spec: ModelSpec, dep: Deployment, **changes: Any) -> StepInventory | None:
    """The inventory of `dep` with `changes`, or None where the model cannot be served so."""
    try:
        return build_inventory(spec, dataclasses.replace(dep, **changes))
    except UserInputError:
        return None


def _tp_variants(inventory: StepInventory) -> list[StepInventory]:
    """The inventory at each TP degree of `CURVE_TP_DEGREES` the model allows (EP 1), the scenario's own first."""
    spec, dep = inventory.spec, inventory.deployment
    out = [inventory]
    for tp in CURVE_TP_DEGREES:
        if tp != dep.tp:
            found = _variant(spec, dep, tp=tp, ep=1)
            if found is not None:
                out.append(found)
    return out


def build_curve_plan(inventory: StepInventory, *, device_kind: str = "cuda") -> CurvePlan:
    """The extra points of `inventory`'s plan (see `CurvePlan`), capped per point at `GPU_POINT_BYTES` of KV or
    expert weights on GPUs and at `CPU_POINT_BYTES` moved on CPU ranks (and coarser grids there)."""
    cpu = device_kind != "cuda"
    cap = CPU_POINT_BYTES if cpu else GPU_POINT_BYTES
    variants = _tp_variants(inventory)
    found: dict[str, dict[str, ProbeKey]] = {}

    def add(keys: Iterable[ProbeKey]) -> None:
        for key in keys:
            if not cpu or key_work(key).moved_bytes <= cap:
                found.setdefault(key.PROBE, {}).setdefault(key.key_id, key)

    add(_gemm_shard_keys(variants))
    add(_attention_grid(variants, cap=cap, cpu=cpu))
    add(_moe_grid(inventory, cap=cap, cpu=cpu))
    add(_token_grid(variants, cpu=cpu))
    own = set(build_plan(inventory).key_ids())
    groups = []
    for probe in PROBES:
        keys = tuple(k for kid, k in found.get(probe, {}).items() if kid not in own)
        if keys:
            groups.append((probe, keys))
    notes: tuple[str, ...] = ()
    if cpu:
        notes = (f"CPU ranks: curve points capped at {CPU_POINT_BYTES >> 20} MiB moved, coarse grids",)
    return CurvePlan(tuple(groups), curve_sweep_m(inventory.deployment), notes)


def _gemm_shard_keys(variants: Sequence[StepInventory]) -> list[ProbeKey]:
    """The GEMMs of every TP shard at the scenario's M (the gemm probe sweeps each over M)."""
    m = variants[0].deployment.batch * variants[0].deployment.query_len
    return [dataclasses.replace(op.key, m=m) for inv in variants for op in inv.ops if isinstance(op.key, GemmKey)]


def _attention_grid(variants: Sequence[StepInventory], *, cap: int, cpu: bool) -> list[ProbeKey]:
    """Attention over batch × context × KV dtype at the scenario's shard (× 2 contexts at batch 1, × 4 above), a
    coarser grid at the other shards' heads, and verification query lengths; each point under `cap` bytes read and
    `cap` bytes of cache held (a DSA key reads its top-k but holds, and indexes, every token: GLM-5's latent cache
    at batch 64 × 64K is 2.4 GB, past the 2³¹ offsets a kernel's int32 arithmetic spans)."""
    own = variants[0].deployment
    own_kv_heads = {op.key.kind: op.key.kv_heads for op in variants[0].ops if isinstance(op.key, AttentionKey)}
    out: list[ProbeKey] = []
    for index, inv in enumerate(variants):
        templates = {op.key.key_id: op.key for op in inv.ops if isinstance(op.key, AttentionKey)}
        for key in templates.values():
            if cpu:
                grid = _cpu_attention_grid(key, own.context_len)
            elif index == 0:
                grid = _own_attention_grid(key, own.batch, own.context_len)
            else:
                grid = _shard_attention_grid(key, own_kv_heads.get(key.kind, 0))
            for q_len, batch, context, kv in grid:
                point = dataclasses.replace(key, q_len=q_len, batch=batch, context=context, kv_dtype=kv)
                if max(key_work(point).moved_bytes, attention_cache_bytes(point)) <= cap:
                    out.append(point)
    return out


def _own_attention_grid(key: AttentionKey, batch: int, context: int) -> list[tuple[int, int, int, str]]:
    """(q_len, batch, context, KV dtype) of the scenario's shard."""
    grid: list[tuple[int, int, int, str]] = []
    for kv in sorted({*ATTENTION_KV_DTYPES, key.kv_dtype}):
        for b in sorted({*ATTENTION_BATCHES, batch}):
            if key.kind == "gqa":
                contexts = GQA_FINE_CONTEXTS if b == 1 else ATTENTION_CONTEXTS
            else:
                contexts = ATTENTION_CONTEXTS if b == 1 else ATTENTION_COARSE_CONTEXTS
            grid.extend((key.q_len, b, c, kv) for c in sorted({*contexts, context}))
        grid.extend((q, b, context, kv) for q in ATTENTION_QUERY_LENGTHS for b in (1, 8) if q != key.q_len)
    return grid


def _shard_attention_grid(key: AttentionKey, own_kv_heads: int) -> list[tuple[int, int, int, str]]:
    """(q_len, batch, context, KV dtype) of another TP shard. A GQA kernel's time is a function of its (sequence,
    KV head) pairs and context (`decodetop.budget.curve_points.coords_of`): the scenario's own grid holds every pair
    count from its KV heads up, so a shard with fewer KV heads adds the pair counts below (batch 1 × its KV heads),
    where decode attention is latency-bound and steps with the kernel's split choice: × 2 contexts. MLA shards
    differ in their query heads: a coarse batch × context grid each."""
    if key.kind == "gqa" and own_kv_heads > 0:
        return [(1, 1, c, key.kv_dtype) for c in GQA_FINE_CONTEXTS if key.kv_heads < own_kv_heads]
    return [(1, b, c, key.kv_dtype) for b in ATTENTION_SHARD_BATCHES for c in ATTENTION_COARSE_CONTEXTS]


def _cpu_attention_grid(key: AttentionKey, context: int) -> list[tuple[int, int, int, str]]:
    """A small grid on CPU ranks: batch 1 and 4 at a quarter, the same and four times the scenario's context."""
    contexts = sorted({max(16, context // 4), max(16, context), max(64, context * 4)})
    return [(key.q_len, b, c, key.kv_dtype) for b in (1, 4) for c in contexts]


def _moe_grid(inventory: StepInventory, *, cap: int, cpu: bool) -> list[ProbeKey]:
    """Routed experts over tokens for the local experts and expert widths of pure TP and pure EP at each degree the
    model allows (EP 1/2/4/8 local experts, TP 1/2/4/8 expert widths); the scenario's own at every token count of
    `MOE_TOKENS`, the others at `MOE_COARSE_TOKENS`."""
    spec, dep = inventory.spec, inventory.deployment
    if not spec.is_moe:
        return []
    own = [op.key for op in inventory.ops if isinstance(op.key, MoeKey)]
    combos: list[tuple[MoeKey, int, tuple[int, ...]]] = []
    for key in own:
        combos.append((key, dep.ep, (1, 4) if cpu else MOE_TOKENS))
    if not cpu:  # pure TP at each degree and pure EP at each degree: the others lie between them on the axes
        for tp in CURVE_TP_DEGREES:
            for ep in CURVE_EP_DEGREES:
                if ep not in (1, tp) or (tp, ep) == (dep.tp, dep.ep):
                    continue
                inv = _variant(spec, dep, tp=tp, ep=ep)
                if inv is not None:
                    combos.extend((k, ep, MOE_COARSE_TOKENS) for k in (o.key for o in inv.ops) if isinstance(k, MoeKey))
    out: list[ProbeKey] = []
    for key, ep, tokens in combos:
        for t in sorted({*tokens, key.tokens}):
            active = math.ceil(expected_distinct_experts(spec.n_experts, spec.top_k, t) / ep - 1e-9)
            point = dataclasses.replace(key, tokens=t, experts_active=max(1, min(active, key.experts_local)))
            if not cpu or key_work(point).moved_bytes <= cap:  # the probe holds every local expert anyway
                out.append(point)
    return out


def _token_grid(variants: Sequence[StepInventory], *, cpu: bool) -> list[ProbeKey]:
    """Norms, routing, lm_head and KV writes of every shard (the scenario's only on CPU ranks) over tokens (× the
    key's tokens per sequence); the KV writes at every KV dtype the attention grid measures."""
    dep = variants[0].deployment
    m = dep.batch * dep.query_len
    scales = CPU_TOKEN_SCALES if cpu else TOKEN_SCALES
    out: list[ProbeKey] = []
    for inv in variants[:1] if cpu else variants:
        for op in inv.ops:
            key = op.key
            if not isinstance(key, (NormKey, RoutingKey, SamplingKey, KvcastKey)) or op.name.startswith("mtp "):
                continue
            per_token = max(1, key.tokens // m)
            out.extend(dataclasses.replace(key, tokens=per_token * s) for s in scales)
            if isinstance(key, KvcastKey) and key.layout != "dsa_index":  # the index keys are FP8 by format
                for kv in sorted(set(ATTENTION_KV_DTYPES) - {key.kv_dtype}):  # a KV-dtype what-if's cache write
                    out.extend(dataclasses.replace(key, tokens=per_token * s, kv_dtype=kv) for s in scales)
    return out
