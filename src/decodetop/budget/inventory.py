"""Provides `build_inventory`: the ops of one decode step on the busiest GPU, each with its budget component,
shape, dtype, count, bytes read and written, FLOPs, kernels launched and the measurement key that times it.

Sharding follows SGLang/vLLM for these families (the output states it; `StepInventory.assumptions`):
- attention heads split over TP ranks: q_b/q_proj, kv_b and the GQA q/k/v projections column-parallel, o_proj
  row-parallel; GQA KV heads split too, or replicated (one per rank) when there are fewer KV heads than ranks;
- MLA's q_a and kv_a projections (fused_qkv_a_proj_with_mqa), their norms, and the DSA indexer are replicated
  (ReplicatedLinear): every rank reads them whole; the MLA latent KV cache is replicated on every rank;
- dense and shared-expert MLPs column/row-parallel; routers replicated; routed experts split by width over
  tp/ep ranks and by count over ep ranks (EP keeps the all-reduce, as SGLang's default EP without DeepEP);
- vocab-parallel embedding (one all-reduce after it) and lm_head (logits all-gathered);
- two all-reduces per layer (after attention, after the MLP/MoE), of batch × tokens × hidden × 2 bytes.

Kernel counts per op are estimates of what SGLang/vLLM launch (documented in `_KERNELS`); a profiler trace
(`decodetop trace`) gives the real count.
"""

# ruff: noqa: PLR0917 - the private op makers take a shape row positionally, like the Op they build
from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable
from dataclasses import dataclass, field

from decodetop.budget.components import Component
from decodetop.budget.deployment import ACTIVATION_BYTES, KV_BYTES, Deployment
from decodetop.budget.keys import (
    AllreduceKey,
    AttentionKey,
    GemmKey,
    KvcastKey,
    MoeKey,
    NormKey,
    ProbeKey,
    RoutingKey,
    SamplingKey,
)
from decodetop.budget.quant import WeightFormat
from decodetop.budget.spec import ModelSpec, WeightModule
from decodetop.errors import UserInputError

# Kernels launched per op instance (estimates; see module docstring).
_KERNELS = {
    "gemm": 1,
    "act_quant": 1,  # dynamic per-token FP8 / NVFP4 activation quantization before a low-precision GEMM
    "norm": 1,
    "kv_write": 1,
    "attention_gqa": 1,  # FlashInfer/FA decode kernel
    "attention_mla": 1,  # absorbed MLA decode over the latent cache
    "attention_mla_dsa": 3,  # indexer logits, top-k selection, sparse MLA
    "routing": 2,  # router GEMM + (grouped) top-k
    "moe": 5,  # align/sort, gate_up grouped GEMM, activation, down grouped GEMM, combine
    "collective": 1,
    "sampling": 3,  # lm_head GEMM, logits processing, sampling / argmax
}

DSA_INDEX_SCALE_GROUP = 128
"""DeepSeek-V3.2's indexer caches FP8 keys with one FP32 scale per 128 values (assumed for GLM-5;
docs/reference/models.md §7)."""


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


# --- building ------------------------------------------------------------------------------------------------


def _ranges(layers: Iterable[int]) -> str:
    items = sorted(set(layers))
    if not items:
        return "-"
    parts: list[str] = []
    start = prev = items[0]
    for v in [*items[1:], None]:
        if v is not None and v == prev + 1:
            prev = v
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if v is not None:
            start = prev = v
    return ",".join(parts)


def _low_precision(dtype: str) -> bool:
    # MXFP4 experts (gpt-oss) run weight-only with BF16 activations; FP8 and NVFP4 quantize activations too.
    return dtype in ("fp8", "nvfp4")


class _Builder:
    def __init__(self, spec: ModelSpec, dep: Deployment) -> None:
        self.spec = spec
        self.dep = dep
        self.kv_dtype = dep.resolved_kv_dtype(spec)
        self.kvb = KV_BYTES[self.kv_dtype]
        self.tp = dep.tp
        self.h_rank = max(1, spec.n_heads // dep.tp)
        self.kv_rank = max(1, spec.n_kv_heads // dep.tp) if spec.attention_kind == "gqa" else 1
        self._ops: dict[tuple[object, ...], tuple[Op, list[int], set[int]]] = {}
        self._moe = set(spec.moe_layers)
        self._sliding = set(spec.sliding_layers)
        mods: dict[tuple[int, str], WeightModule] = {}
        for m in (*spec.modules, *spec.mtp_modules):
            mods[(m.layer, m.kind)] = m
        self.mods = mods

    def mod(self, layer: int, kind: str) -> WeightModule:
        return self.mods[(layer, kind)]

    def add(self, op: Op, layer: int | None) -> None:
        """Record one op; identical ops (same name, key, bytes) of different layers merge into one with a count."""
        merge = (op.name, op.component, op.kind, op.key, op.weight_bytes, op.kv_bytes, op.dtype, layer is None)
        entry = self._ops.get(merge)
        if entry is None:
            self._ops[merge] = (op, [op.count], {layer} if layer is not None else set())
        else:
            entry[1][0] += op.count
            if layer is not None:
                entry[2].add(layer)

    def ops(self) -> tuple[Op, ...]:
        out = []
        for op, count, layers in self._ops.values():
            label = op.layers if not layers else _ranges(layers)
            if layers and min(layers) >= self.spec.n_layers:
                label = "mtp"
            out.append(dataclasses.replace(op, count=count[0], layers=label))
        return tuple(out)

    # --- op makers -------------------------------------------------------------------------------------------

    def gemm(
        self,
        name: str,
        comp: Component,
        layer: int | None,
        m: int,
        n: int,
        k: int,
        fmt: WeightFormat,
        weight_bytes: float,
        batch: int = 1,
        count: int = 1,
    ) -> None:
        dtype = fmt.probe_dtype
        kernels = _KERNELS["gemm"] + (_KERNELS["act_quant"] if _low_precision(dtype) else 0)
        shape = f"[{m}×{k}]·[{k}×{n}]" + (f" ×{batch}" if batch > 1 else "")
        op = Op(
            name,
            comp,
            "bmm" if batch > 1 else "gemm",
            shape,
            dtype,
            count,
            weight_bytes,
            0.0,
            weight_bytes + batch * m * k * ACTIVATION_BYTES,
            batch * m * n * ACTIVATION_BYTES,
            2.0 * batch * m * n * k,
            kernels,
            GemmKey(m, n, k, batch, dtype),
            "-",
        )
        self.add(op, layer)

    def linear(
        self, name: str, comp: Component, layer: int, m: int, mods: list[WeightModule], share: float, count: int = 1
    ) -> None:
        """A GEMM over one or more fused modules of the same format; this rank holds `share` of each's rows."""
        n = max(1, sum(round(md.out_features * share) for md in mods))
        wbytes = sum(md.bytes_for(1, share) for md in mods)
        self.gemm(name, comp, layer, m, n, mods[0].in_features, mods[0].fmt, wbytes, count=count)

    def row_linear(self, name: str, comp: Component, layer: int, m: int, md: WeightModule, count: int = 1) -> None:
        """A row-parallel GEMM: input features split over TP ranks."""
        k = max(1, md.in_features // self.tp)
        self.gemm(name, comp, layer, m, md.out_features, k, md.fmt, md.bytes_for(1, 1.0, 1 / self.tp), count=count)

    def norm(
        self, name: str, op: str, comp: Component, layer: int | None, tokens: int, width: int, count: int = 1
    ) -> None:
        rw = tokens * width * ACTIVATION_BYTES
        reads = rw * (2 if op == "add_rmsnorm" else 1)
        writes = rw * (2 if op == "add_rmsnorm" else 1)
        shape = f"[{tokens}×{width}]"
        self.add(
            Op(
                name,
                comp,
                "norm",
                shape,
                "bf16",
                count,
                0.0,
                0.0,
                reads,
                writes,
                4.0 * tokens * width,
                _KERNELS["norm"],
                NormKey(op, tokens, width, "bf16"),
                "-",
            ),
            layer,
        )

    def collective(self, name: str, kind: str, layer: int | None, nbytes: int, count: int = 1) -> None:
        if self.tp <= 1:
            return
        op = Op(
            name,
            Component.COMMUNICATION,
            kind,
            f"{nbytes} B × {self.tp} ranks",
            "bf16",
            count,
            0.0,
            0.0,
            float(nbytes),
            float(nbytes),
            0.0,
            _KERNELS["collective"],
            AllreduceKey(kind, nbytes, self.tp, "bf16"),
            "-",
        )
        self.add(op, layer)

    def kv_write(
        self, name: str, layer: int, layout: str, tokens: int, width: int, kvb: float, kv_dtype: str, count: int = 1
    ) -> None:
        op = Op(
            name,
            Component.ATTENTION,
            "kv_write",
            f"[{tokens}×{width}] → cache",
            kv_dtype,
            count,
            0.0,
            0.0,
            tokens * width * ACTIVATION_BYTES,
            tokens * width * kvb,
            0.0,
            _KERNELS["kv_write"],
            KvcastKey(layout, tokens, width, self.dep.context_len, kv_dtype),
            "-",
        )
        self.add(op, layer)


def build_inventory(spec: ModelSpec, deployment: Deployment) -> StepInventory:
    """The ops of one decode step of `spec` served as `deployment`, on the busiest GPU."""
    deployment.validate(spec)
    if deployment.speculative and spec.n_mtp_layers == 0:
        raise UserInputError(f"--accept-length: {spec.name} has no MTP layer (num_nextn_predict_layers) to draft with")
    b = _Builder(spec, deployment)
    dep = deployment
    m_main = dep.batch * dep.query_len
    d = spec.d_model
    ar_bytes = m_main * d * ACTIVATION_BYTES

    b.norm("embedding lookup", "embedding", Component.NORMS, None, m_main, d)
    b.collective("all-reduce (embedding)", "all_reduce", None, ar_bytes)
    for i in range(spec.n_layers):
        _layer(b, i, m_main, dep.query_len)
    b.norm("final norm", "rmsnorm", Component.NORMS, None, m_main, d)
    _lm_head(b, m_main)

    if dep.speculative:  # MTP draft: the MTP layer(s) run once per draft token at one token per sequence
        n = dep.n_draft
        m_d = dep.batch
        for j in range(spec.n_mtp_layers):
            i = spec.n_layers + j
            b.norm("mtp embedding lookup", "embedding", Component.NORMS, i, m_d, d, count=n)
            b.collective("mtp all-reduce (embedding)", "all_reduce", i, m_d * d * ACTIVATION_BYTES, count=n)
            b.norm("mtp enorm+hnorm", "rmsnorm", Component.NORMS, i, m_d, d, count=2 * n)
            eh = b.mod(i, "eh_proj")
            b.linear("mtp eh_proj", Component.ATTENTION_PROJ, i, m_d, [eh], 1.0, count=n)
            _layer(b, i, m_d, 1, count=n, prefix="mtp ")
            b.norm("mtp final norm", "rmsnorm", Component.NORMS, i, m_d, d, count=n)
            _lm_head(b, m_d, count=n, prefix="mtp ")

    return StepInventory(
        spec=spec,
        deployment=dep,
        ops=b.ops(),
        kv_dtype=b.kv_dtype,
        resident_weight_bytes=_resident_bytes(spec, dep),
        assumptions=_assumptions(spec, dep, b),
    )


def _layer(b: _Builder, i: int, m: int, q_len: int, count: int = 1, prefix: str = "") -> None:
    spec, dep = b.spec, b.dep
    d = spec.d_model
    first = i == 0
    b.norm(prefix + "input norm", "rmsnorm" if first else "add_rmsnorm", Component.NORMS, i, m, d, count)
    if spec.attention_kind == "mla":
        _mla(b, i, m, q_len, count, prefix)
    else:
        _gqa(b, i, m, q_len, count, prefix)
    b.collective(prefix + "all-reduce (attention out)", "all_reduce", i, m * d * ACTIVATION_BYTES, count)
    b.norm(prefix + "post-attention norm", "add_rmsnorm", Component.NORMS, i, m, d, count)
    if i in b._moe or (i >= spec.n_layers and spec.is_moe):
        _moe(b, i, m, count, prefix)
    else:
        tp = dep.tp
        gate, up, down = b.mod(i, "gate_proj"), b.mod(i, "up_proj"), b.mod(i, "down_proj")
        _mlp(b, i, m, gate, up, down, tp, Component.DENSE_MLP, count, prefix + "")
    b.collective(prefix + "all-reduce (mlp out)", "all_reduce", i, m * d * ACTIVATION_BYTES, count)


def _mlp(
    b: _Builder,
    i: int,
    m: int,
    gate: WeightModule,
    up: WeightModule,
    down: WeightModule,
    tp: int,
    comp: Component,
    count: int,
    prefix: str,
) -> None:
    label = "shared " if comp is Component.SHARED_EXPERTS else ""
    if gate.fmt is up.fmt:
        b.linear(f"{prefix}{label}gate_up_proj", comp, i, m, [gate, up], 1 / tp, count=count)
    else:
        b.linear(f"{prefix}{label}gate_proj", comp, i, m, [gate], 1 / tp, count=count)
        b.linear(f"{prefix}{label}up_proj", comp, i, m, [up], 1 / tp, count=count)
    b.norm(f"{prefix}{label}silu_and_mul", "silu_mul", comp, i, m, max(1, gate.out_features // tp), count)
    b.row_linear(f"{prefix}{label}down_proj", comp, i, m, down, count)


def _mla(b: _Builder, i: int, m: int, q_len: int, count: int, prefix: str) -> None:
    """Absorbed MLA decode: the latent projections, q·W_kc, the latent attention (with DSA's indexer) and o·W_vc."""
    spec, tp = b.spec, b.dep.tp
    proj = Component.ATTENTION_PROJ
    _mla_projections(b, i, m, count, prefix)
    # Absorbed MLA decode: kv_b's K half (W_kc) folds into q, its V half (W_vc) into the output (DeepSeek-V2 §2.1).
    kv_b = b.mod(i, "kv_b_proj")
    nope, v, lora = spec.qk_nope_head_dim, spec.v_head_dim, spec.kv_lora_rank
    k_frac = nope / (nope + v)
    b.gemm(
        prefix + "q·W_kc (absorb)",
        proj,
        i,
        m,
        lora,
        nope,
        kv_b.fmt,
        kv_b.bytes_for(1, k_frac / tp),
        batch=b.h_rank,
        count=count,
    )
    _mla_attention(b, i, m, q_len, count, prefix)
    b.gemm(
        prefix + "o·W_vc (absorb)",
        proj,
        i,
        m,
        v,
        lora,
        kv_b.fmt,
        kv_b.bytes_for(1, (1 - k_frac) / tp),
        batch=b.h_rank,
        count=count,
    )
    b.row_linear(prefix + "o_proj", proj, i, m, b.mod(i, "o_proj"), count)


def _mla_projections(b: _Builder, i: int, m: int, count: int, prefix: str) -> None:
    """The query and latent-KV projections up to rotary: q_a/kv_a (fused where one format), q_b or q, the norms."""
    spec, tp = b.spec, b.dep.tp
    proj = Component.ATTENTION_PROJ
    kv_a = b.mod(i, "kv_a_proj")
    if spec.q_lora_rank:
        q_a = b.mod(i, "q_a_proj")
        if q_a.fmt is kv_a.fmt:  # SGLang fuses them into one replicated GEMM (fused_qkv_a_proj_with_mqa)
            b.linear(prefix + "q_a+kv_a_proj (replicated)", proj, i, m, [q_a, kv_a], 1.0, count=count)
        else:
            b.linear(prefix + "q_a_proj (replicated)", proj, i, m, [q_a], 1.0, count=count)
            b.linear(prefix + "kv_a_proj (replicated)", proj, i, m, [kv_a], 1.0, count=count)
        b.norm(prefix + "q_a_layernorm", "rmsnorm", Component.NORMS, i, m, spec.q_lora_rank, count)
        b.linear(prefix + "q_b_proj", proj, i, m, [b.mod(i, "q_b_proj")], 1 / tp, count=count)
    else:
        b.linear(prefix + "kv_a_proj (replicated)", proj, i, m, [kv_a], 1.0, count=count)
        b.linear(prefix + "q_proj", proj, i, m, [b.mod(i, "q_proj")], 1 / tp, count=count)
    b.norm(prefix + "kv_a_layernorm", "rmsnorm", Component.NORMS, i, m, spec.kv_lora_rank, count)
    b.norm(prefix + "rotary", "rotary", Component.NORMS, i, m, (b.h_rank + 1) * spec.qk_rope_head_dim, count)


def _dsa_indexer(b: _Builder, i: int, m: int, ctx: int, count: int, prefix: str) -> tuple[float, float]:
    """DSA's lightning indexer ops (its projections, k_norm, index-key cache write); returns its (bytes, flops)."""
    spec = b.spec
    for kind_name, label in (
        ("indexer_wq_b", "indexer wq_b"),
        ("indexer_wk", "indexer wk"),
        ("indexer_weights_proj", "indexer weights_proj"),
    ):
        md = b.mod(i, kind_name)
        b.linear(f"{prefix}{label} (replicated)", Component.ATTENTION_PROJ, i, m, [md], 1.0, count=count)
    b.norm(prefix + "indexer k_norm", "layernorm", Component.NORMS, i, m, spec.index_head_dim, count)
    index_per_token = spec.index_head_dim + 4 * math.ceil(spec.index_head_dim / DSA_INDEX_SCALE_GROUP)
    b.kv_write(prefix + "indexer key cache write", i, "dsa_index", m, spec.index_head_dim, 1.0, "fp8", count)
    index_bytes = b.dep.batch * ctx * index_per_token
    index_flops = 2.0 * m * spec.index_n_heads * ctx * spec.index_head_dim
    return index_bytes, index_flops


def _mla_attention(b: _Builder, i: int, m: int, q_len: int, count: int, prefix: str) -> None:
    """The latent KV-cache write and the latent attention over the context (top-k of it under DSA)."""
    spec, dep = b.spec, b.dep
    h, lora = b.h_rank, spec.kv_lora_rank
    latent = lora + spec.qk_rope_head_dim
    b.kv_write(prefix + "kv cache write", i, "mla", m, latent, b.kvb, b.kv_dtype, count)
    ctx = dep.context_len + q_len
    kind = "mla"
    attended = ctx
    index_bytes = 0.0
    index_flops = 0.0
    if spec.index_topk:
        kind = "mla+dsa"
        attended = min(ctx, spec.index_topk)
        index_bytes, index_flops = _dsa_indexer(b, i, m, ctx, count, prefix)
    kv = dep.batch * attended * latent * b.kvb
    reads = kv + index_bytes + m * h * latent * ACTIVATION_BYTES
    flops = 2.0 * m * h * attended * (latent + lora) + index_flops
    key = AttentionKey(
        kind,
        dep.batch,
        q_len,
        dep.context_len,
        h,
        1,
        latent,
        lora,
        lora,
        spec.qk_rope_head_dim,
        spec.index_n_heads,
        spec.index_head_dim,
        spec.index_topk,
        0,
        b.kv_dtype,
    )
    kernels = _KERNELS["attention_mla_dsa" if spec.index_topk else "attention_mla"]
    shape = f"{h} heads × {attended} of {ctx} tokens × {latent}"
    b.add(
        Op(
            prefix + f"attention ({kind})",
            Component.ATTENTION,
            "attention",
            shape,
            b.kv_dtype,
            count,
            0.0,
            kv + index_bytes,
            reads,
            m * h * lora * ACTIVATION_BYTES,
            flops,
            kernels,
            key,
            "-",
        ),
        i,
    )


def _gqa(b: _Builder, i: int, m: int, q_len: int, count: int, prefix: str) -> None:
    spec, dep = b.spec, b.dep
    proj = Component.ATTENTION_PROJ
    tp = dep.tp
    q, k, v = b.mod(i, "q_proj"), b.mod(i, "k_proj"), b.mod(i, "v_proj")
    hd = spec.head_dim
    kv_share = b.kv_rank / spec.n_kv_heads
    n = (b.h_rank + 2 * b.kv_rank) * hd
    wbytes = q.bytes_for(1, 1 / tp) + k.bytes_for(1, kv_share) + v.bytes_for(1, kv_share)
    if q.fmt is k.fmt is v.fmt:
        b.gemm(prefix + "qkv_proj", proj, i, m, n, spec.d_model, q.fmt, wbytes, count=count)
    else:
        b.linear(prefix + "q_proj", proj, i, m, [q], 1 / tp, count=count)
        b.linear(prefix + "k_proj", proj, i, m, [k], kv_share, count=count)
        b.linear(prefix + "v_proj", proj, i, m, [v], kv_share, count=count)
    if spec.qk_norm:
        b.norm(prefix + "q/k norm", "rmsnorm", Component.NORMS, i, m * (b.h_rank + b.kv_rank), hd, count)
    b.norm(prefix + "rotary", "rotary", Component.NORMS, i, m, (b.h_rank + b.kv_rank) * spec.rotary_dim, count)
    width = 2 * b.kv_rank * hd
    b.kv_write(prefix + "kv cache write", i, "gqa", m, width, b.kvb, b.kv_dtype, count)
    ctx = dep.context_len + q_len
    sliding = i in b._sliding
    attended = min(ctx, spec.sliding_window) if sliding else ctx
    window = spec.sliding_window if sliding else 0
    kv = dep.batch * attended * width * b.kvb
    reads = kv + m * b.h_rank * hd * ACTIVATION_BYTES
    flops = 2.0 * m * b.h_rank * attended * 2 * hd
    key = AttentionKey(
        "gqa",
        dep.batch,
        q_len,
        dep.context_len,
        b.h_rank,
        b.kv_rank,
        hd,
        hd,
        0,
        spec.rotary_dim,
        0,
        0,
        0,
        window,
        b.kv_dtype,
    )
    name = prefix + ("attention (gqa, sliding)" if sliding else "attention (gqa)")
    shape = f"{b.h_rank} q / {b.kv_rank} kv heads × {attended} tokens × {hd}"
    b.add(
        Op(
            name,
            Component.ATTENTION,
            "attention",
            shape,
            b.kv_dtype,
            count,
            0.0,
            kv,
            reads,
            m * b.h_rank * hd * ACTIVATION_BYTES,
            flops,
            _KERNELS["attention_gqa"],
            key,
            "-",
        ),
        i,
    )
    b.row_linear(prefix + "o_proj", proj, i, m, b.mod(i, "o_proj"), count)


def expected_distinct_experts(n_experts: int, top_k: int, tokens: int) -> float:
    """Expected number of distinct experts `tokens` tokens touch with uniform top-k routing: E(1 − (1 − k/E)^T)."""
    return n_experts * (1 - (1 - top_k / n_experts) ** tokens)


def _moe(b: _Builder, i: int, m: int, count: int, prefix: str) -> None:
    spec, dep = b.spec, b.dep
    d = spec.d_model
    router = b.mod(i, "router")
    rdtype = router.fmt.probe_dtype
    rkey = RoutingKey(m, d, spec.n_experts, spec.scoring_func, spec.n_group, spec.topk_group, spec.top_k, rdtype)
    rbytes = router.bytes_for(1)
    b.add(
        Op(
            prefix + "router + top-k",
            Component.ROUTING,
            "routing",
            f"[{m}×{d}]·[{d}×{spec.n_experts}]",
            rdtype,
            count,
            rbytes,
            0.0,
            rbytes + m * d * ACTIVATION_BYTES,
            m * spec.n_experts * 4.0,
            2.0 * m * d * spec.n_experts,
            _KERNELS["routing"],
            rkey,
            "-",
        ),
        i,
    )
    gate, up, down = b.mod(i, "expert_gate_proj"), b.mod(i, "expert_up_proj"), b.mod(i, "expert_down_proj")
    moe_tp = dep.moe_tp
    local = spec.n_experts // dep.ep
    touched = expected_distinct_experts(spec.n_experts, spec.top_k, m) / dep.ep
    per_expert = sum(md.bytes_for(1, 1 / moe_tp) for md in (gate, up)) + down.bytes_for(1, 1.0, 1 / moe_tp)
    wbytes = touched * per_expert
    width = max(1, spec.ffn_expert // moe_tp)
    routed_tokens = m * spec.top_k / dep.ep
    dtype = gate.fmt.probe_dtype
    mkey = MoeKey(m, spec.top_k, local, math.ceil(touched - 1e-9), d, width, dtype, int(spec.expert_bias))
    kernels = _KERNELS["moe"] + (2 * _KERNELS["act_quant"] if _low_precision(dtype) else 0)
    shape = f"{touched:.3g} of {local} experts × [{d}→2×{width}→{d}]"
    b.add(
        Op(
            prefix + "routed experts",
            Component.ROUTED_EXPERTS,
            "moe",
            shape,
            dtype,
            count,
            wbytes,
            0.0,
            wbytes + m * d * ACTIVATION_BYTES,
            m * d * ACTIVATION_BYTES,
            2.0 * routed_tokens * 3 * d * width,
            kernels,
            mkey,
            "-",
        ),
        i,
    )
    if spec.n_shared_experts:
        sg, su, sd = b.mod(i, "shared_gate_proj"), b.mod(i, "shared_up_proj"), b.mod(i, "shared_down_proj")
        _mlp(b, i, m, sg, su, sd, dep.tp, Component.SHARED_EXPERTS, count, prefix)


def _lm_head(b: _Builder, m: int, count: int = 1, prefix: str = "") -> None:
    spec, dep = b.spec, b.dep
    head = b.mod(-1, "lm_head")
    shard = math.ceil(spec.vocab_size / dep.tp)
    dtype = head.fmt.probe_dtype
    wbytes = head.bytes_for(1, shard / spec.vocab_size)
    key = SamplingKey(m, shard, spec.d_model, dtype)
    shape = f"[{m}×{spec.d_model}]·[{spec.d_model}×{shard}]"
    b.add(
        Op(
            prefix + "lm_head + sampling",
            Component.LM_HEAD,
            "sampling",
            shape,
            dtype,
            count,
            wbytes,
            0.0,
            wbytes + m * spec.d_model * ACTIVATION_BYTES,
            m * shard * ACTIVATION_BYTES,
            2.0 * m * spec.d_model * shard,
            _KERNELS["sampling"],
            key,
            "-",
        ),
        None,
    )
    b.collective(prefix + "all-gather (logits)", "all_gather", None, m * shard * ACTIVATION_BYTES, count)


_REPLICATED = {"q_a_proj", "kv_a_proj", "indexer_wq_b", "indexer_wk", "indexer_weights_proj", "router", "eh_proj"}


def _resident_bytes(spec: ModelSpec, dep: Deployment) -> float:
    """Weights one GPU holds (main model; MTP layers too when speculative decoding uses them)."""
    total = 0.0
    mods = spec.modules + (spec.mtp_modules if dep.speculative else ())
    for md in mods:
        if md.kind in _REPLICATED:
            total += md.bytes
        elif md.kind.startswith("expert_"):
            total += md.bytes_for(md.copies / dep.ep, 1 / dep.moe_tp)
        elif md.kind in ("k_proj", "v_proj"):
            kv_rank = max(1, spec.n_kv_heads // dep.tp)
            total += md.bytes_for(1, kv_rank / spec.n_kv_heads)
        else:
            total += md.bytes / dep.tp
    return total


def _assumptions(spec: ModelSpec, dep: Deployment, b: _Builder) -> tuple[str, ...]:
    tp = dep.tp
    out = [
        f"TP {tp}: {spec.n_heads} attention heads split {b.h_rank} per rank; dense MLP and shared experts "
        "column/row-parallel (1/tp of each weight per rank)."
    ]
    if spec.attention_kind == "mla":
        extra = " and the DSA indexer" if spec.index_topk else ""
        out.append(
            f"MLA: q_a/kv_a projections, their norms{extra} replicated (every rank reads them whole, as "
            "SGLang/vLLM ReplicatedLinear); q_b, kv_b split by heads, o_proj row-parallel; the latent KV "
            "cache is replicated on every rank; decode uses the absorbed form (W_kc, W_vc bmm)."
        )
    elif spec.n_kv_heads < tp:
        out.append(f"GQA: {spec.n_kv_heads} KV heads < TP {tp}: each rank holds (and caches) 1 KV head, replicated.")
    else:
        out.append(f"GQA: {spec.n_kv_heads} KV heads split {b.kv_rank} per rank.")
    if spec.is_moe:
        m = dep.batch * dep.query_len
        touched = expected_distinct_experts(spec.n_experts, spec.top_k, m)
        ep_text = (
            f"EP {dep.ep}: {spec.n_experts // dep.ep} experts per rank, each split over {dep.moe_tp} rank(s), "
            "routing balanced across ranks, all-reduce kept (no DeepEP all-to-all)"
            if dep.ep > 1
            else f"each routed expert split by width over all {tp} ranks (MoE TP)"
        )
        out.append(
            f"MoE: routers replicated; {ep_text}; {m} token(s) touch {touched:.3g} distinct experts (uniform routing)."
        )
    out.append(
        f"Vocab-parallel embedding (+1 all-reduce) and lm_head ({math.ceil(spec.vocab_size / tp)} rows per "
        "rank, logits all-gathered)."
    )
    out.append(f"Activations and collectives BF16; KV cache {b.kv_dtype}; weights {spec.quant.describe()}.")
    if spec.index_topk:
        out.append(
            f"DSA: attention reads min(context, {spec.index_topk}) latents; the indexer reads every cached "
            "FP8 index key (+FP32 scale per 128) — layout assumed from DeepSeek-V3.2 (docs/reference/models.md §7)."
        )
    if dep.speculative:
        out.append(
            f"Speculative (MTP): main model verifies {dep.query_len} tokens per sequence; the MTP layer runs "
            f"{dep.n_draft}× per step; {dep.tokens_per_step:g} tokens accepted per step."
        )
    out.append(
        "Kernel counts are estimates (GEMM 1, +1 activation quantize for FP8/NVFP4; fused MoE 5; "
        "MLA+DSA attention 3); a profiler trace gives the real count."
    )
    return tuple(out)
